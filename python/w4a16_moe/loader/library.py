"""Load a kernel library (``.so`` built by :mod:`.build`) with ctypes and call its kernels.

No DSL, torch or CUDA Python package is needed: the library is self-contained (static cudart inside).

Entry points used (see :mod:`.shim` for the full C ABI)::

    const char *w4a16_moe_library_info(void);          // {"abi_version", "arch", "kernels": [...]}
    int32_t     P_module_load(P_Kernel_Module_t *m);   // once per process, lazily, before the first launch
    int32_t     P_launch(P_Kernel_Module_t *m, ...);   // returns cudaError_t of the launch
    const char *P_abi(void);                           // JSON describing the arguments of P_launch

``P_Kernel_Module_t`` is ``{ cudaLibrary_t module; }`` (one pointer); it is allocated here as a
``ctypes.c_void_p`` and kept alive as long as the :class:`Kernel` (libraries are never closed).

Python calling convention of a :class:`Kernel` (positional, in the order of the ``@cute.jit`` parameters):

==============  ===============================================================================
ABI kind        Python value
==============  ===============================================================================
``ptr``         int device address (e.g. ``tensor.data_ptr()``), or None for NULL
``scalar``      int / float (converted to the exact C type: int32_t, float, ...)
``half``        float (converted to IEEE fp16 bits) or int (raw bits)
``bfloat16``    float (round-to-nearest-even to bf16 bits) or int (raw bits)
``tensor``      ``(data_ptr, dynamic_shapes, dynamic_strides)``: only the DYNAMIC modes, in mode
                order (``dynamic_strides`` may be omitted when the struct has none); or a
                ready ``ctypes`` struct from :meth:`Kernel.make_tensor`
``tensor_list`` sequence of tensor tuples (exactly ``count`` of them)
``array``       sequence of ints (``count`` entries)
``stream``      int ``CUstream`` / ``cudaStream_t`` handle (``torch.cuda.current_stream().cuda_stream``);
                0 / None = legacy default stream
==============  ===============================================================================

A non-zero return code raises :class:`KernelLaunchError` naming the CUDA error.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import struct
import threading
import time
from pathlib import Path
from typing import Any, Optional

log = logging.getLogger("w4a16_moe")

__all__ = ["KernelLibrary", "Kernel", "KernelLoadError", "KernelLaunchError", "load_library"]


class KernelLoadError(RuntimeError):
    """The library or a kernel module could not be loaded."""


class KernelLaunchError(RuntimeError):
    """A kernel launch returned a CUDA error."""


_CTYPES = {
    "int8_t": ctypes.c_int8,
    "int16_t": ctypes.c_int16,
    "int32_t": ctypes.c_int32,
    "int64_t": ctypes.c_int64,
    "uint8_t": ctypes.c_uint8,
    "uint16_t": ctypes.c_uint16,
    "uint32_t": ctypes.c_uint32,
    "uint64_t": ctypes.c_uint64,
    "float": ctypes.c_float,
    "double": ctypes.c_double,
    "void *": ctypes.c_void_p,
}


def _f16_bits(v) -> int:
    if isinstance(v, int) and not isinstance(v, bool):
        return v & 0xFFFF
    return struct.unpack("<H", struct.pack("<e", float(v)))[0]


def _bf16_bits(v) -> int:
    if isinstance(v, int) and not isinstance(v, bool):
        return v & 0xFFFF
    u = struct.unpack("<I", struct.pack("<f", float(v)))[0]
    if (u & 0x7F800000) == 0x7F800000 and (u & 0x7FFFFF):  # NaN: keep quiet NaN
        return ((u >> 16) | 0x40) & 0xFFFF
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def _struct_type(name: str, fields: list) -> type:
    cf = []
    for fname, ctype, count in fields:
        t = _CTYPES.get(ctype)
        if t is None:
            raise KernelLoadError(f"unsupported field type {ctype!r} in {name}")
        cf.append((fname, t * count if fname.startswith("dynamic_") else t))
    return type(name, (ctypes.Structure,), {"_fields_": cf})


class Kernel:
    """Callable for one exported kernel. ``kernel(*args)`` launches it (see module docstring)."""

    def __init__(self, library: "KernelLibrary", name: str):
        self.library = library
        self.name = name
        lib = library._lib
        abi_fn = getattr(lib, name + "_abi")
        abi_fn.restype = ctypes.c_char_p
        abi_fn.argtypes = []
        self.abi = json.loads(abi_fn().decode())
        self.signature: str = self.abi["signature"]
        self.arg_names = [a["name"] for a in self.abi["args"]]
        self._load = getattr(lib, name + "_module_load")
        self._load.restype = ctypes.c_int32
        self._load.argtypes = [ctypes.c_void_p]
        self._unload = getattr(lib, name + "_module_unload")
        self._unload.restype = ctypes.c_int32
        self._unload.argtypes = [ctypes.c_void_p]
        self._module = ctypes.c_void_p(0)  # P_Kernel_Module_t: { cudaLibrary_t module; }
        self._module_ref = ctypes.byref(self._module)
        self._loaded_pid: Optional[int] = None
        self._lock = threading.Lock()
        self._struct_types: dict = {}
        argtypes = [ctypes.c_void_p]
        self._conv = []
        for a in self.abi["args"]:
            kind = a["kind"]
            if kind == "ptr":
                argtypes.append(ctypes.c_void_p)
                self._conv.append(_conv_ptr)
            elif kind == "stream":
                argtypes.append(ctypes.c_void_p)
                self._conv.append(_conv_ptr)
            elif kind == "scalar":
                t = _CTYPES[a["ctype"]]
                argtypes.append(t)
                self._conv.append(float if t in (ctypes.c_float, ctypes.c_double) else int)
            elif kind == "half":
                argtypes.append(ctypes.c_uint16)
                self._conv.append(_f16_bits)
            elif kind == "bfloat16":
                argtypes.append(ctypes.c_uint16)
                self._conv.append(_bf16_bits)
            elif kind == "tensor":
                st = _struct_type(f"{name}_Tensor_{a['name']}_t", a["fields"])
                self._struct_types[a["name"]] = st
                argtypes.append(ctypes.POINTER(st))
                self._conv.append(self._tensor_converter(st))
            elif kind == "tensor_list":
                st = _struct_type(f"{name}_Tensor_{a['name']}_t", a["fields"])
                n = int(a["count"])
                lt = type(
                    f"{name}_TensorList_{a['name']}_t",
                    (ctypes.Structure,),
                    {"_fields_": [("elements", st * n), ("count", ctypes.c_int32)]},
                )
                self._struct_types[a["name"]] = st
                argtypes.append(ctypes.POINTER(lt))
                self._conv.append(self._tensor_list_converter(st, lt, n))
            elif kind == "array":
                at = _CTYPES[a["ctype"]] * int(a["count"])
                argtypes.append(ctypes.POINTER(_CTYPES[a["ctype"]]))
                self._conv.append(lambda v, at=at: at(*v))
            else:
                raise KernelLoadError(f"{name}: unsupported ABI argument kind {kind!r}")
        self._launch = getattr(lib, name + "_launch")
        self._launch.restype = ctypes.c_int32
        self._launch.argtypes = argtypes

    # -- tensors ----------------------------------------------------------------------------------------
    def make_tensor(self, arg_name: str, data_ptr: int, shapes=(), strides=()) -> Any:
        """Build the ctypes descriptor struct for tensor argument ``arg_name`` (reusable across calls)."""
        return self._fill(self._struct_types[arg_name](), data_ptr, shapes, strides)

    @staticmethod
    def _fill(s, data_ptr, shapes=(), strides=()):
        s.data = data_ptr
        names = {f[0] for f in s._fields_}
        if "dynamic_shapes" in names:
            if len(shapes) != len(s.dynamic_shapes):
                raise ValueError(f"expected {len(s.dynamic_shapes)} dynamic shapes, got {len(shapes)}")
            s.dynamic_shapes[:] = list(shapes)
        elif shapes:
            raise ValueError("tensor has no dynamic shapes")
        if "dynamic_strides" in names:
            if len(strides) != len(s.dynamic_strides):
                raise ValueError(f"expected {len(s.dynamic_strides)} dynamic strides, got {len(strides)}")
            s.dynamic_strides[:] = list(strides)
        elif strides:
            raise ValueError("tensor has no dynamic strides")
        return s

    def _tensor_converter(self, st):
        def conv(v):
            if isinstance(v, st):
                return ctypes.byref(v)
            return ctypes.byref(self._fill(st(), *v))

        return conv

    def _tensor_list_converter(self, st, lt, n):
        def conv(v):
            if isinstance(v, lt):
                return ctypes.byref(v)
            v = list(v)
            if len(v) != n:
                raise ValueError(f"expected {n} tensors, got {len(v)}")
            lst = lt()
            for i, t in enumerate(v):
                if isinstance(t, st):
                    lst.elements[i] = t
                else:
                    self._fill(lst.elements[i], *t)
            lst.count = n
            return ctypes.byref(lst)

        return conv

    # -- module load ------------------------------------------------------------------------------------
    @property
    def loaded(self) -> bool:
        return self._loaded_pid == os.getpid()

    def ensure_loaded(self) -> None:
        """Run ``P_module_load`` once per process (loads the cubin on every visible device)."""
        pid = os.getpid()
        if self._loaded_pid == pid:
            return
        with self._lock:
            if self._loaded_pid == pid:
                return
            self._module.value = 0  # after fork the parent's handle is meaningless
            t0 = time.perf_counter()
            err = self._load(self._module_ref)
            if err != 0:
                raise KernelLoadError(f"{self.name}: module load failed: {self.library.error_text(err)}")
            self._loaded_pid = pid
            log.debug("loaded module %s in %.2f ms", self.name, (time.perf_counter() - t0) * 1e3)

    def unload(self) -> None:
        with self._lock:
            if self._loaded_pid == os.getpid():
                err = self._unload(self._module_ref)
                self._loaded_pid = None
                if err != 0:
                    raise KernelLoadError(f"{self.name}: module unload failed: {self.library.error_text(err)}")

    # -- launch -----------------------------------------------------------------------------------------
    def __call__(self, *args) -> None:
        if len(args) != len(self._conv):
            raise TypeError(f"{self.name} takes {len(self._conv)} arguments ({', '.join(self.arg_names)}), got {len(args)}")
        if self._loaded_pid != os.getpid():
            self.ensure_loaded()
        err = self._launch(self._module_ref, *[c(v) for c, v in zip(self._conv, args)])
        if err != 0:
            raise KernelLaunchError(f"{self.name}: launch failed: {self.library.error_text(err)}")

    @property
    def launch_address(self) -> int:
        """Address of ``P_launch`` (for callers that bind it from C/C++ instead of ctypes)."""
        return ctypes.cast(self._launch, ctypes.c_void_p).value

    @property
    def module_address(self) -> int:
        """Address of the module struct to pass as first argument of ``P_launch`` (loads it if needed)."""
        self.ensure_loaded()
        return ctypes.addressof(self._module)

    def __repr__(self) -> str:
        return f"<Kernel {self.name} ({self.library.arch}) from {self.library.path}>"


def _conv_ptr(v):
    return v  # int or None; c_void_p argtype converts


class KernelLibrary:
    """A loaded kernel ``.so`` (``RTLD_LOCAL``: libraries never see each other's symbols)."""

    def __init__(self, path):
        self.path = Path(path).resolve()
        t0 = time.perf_counter()
        try:
            self._lib = ctypes.CDLL(str(self.path), mode=ctypes.RTLD_LOCAL)
        except OSError as e:
            raise KernelLoadError(f"cannot dlopen {self.path}: {e}") from e
        try:
            info_fn = self._lib.w4a16_moe_library_info
        except AttributeError:
            raise KernelLoadError(f"{self.path} is not a w4a16_moe kernel library") from None
        info_fn.restype = ctypes.c_char_p
        info_fn.argtypes = []
        self.info = json.loads(info_fn().decode())
        self.arch: str = self.info["arch"]
        self.kernel_names: list = list(self.info["kernels"])
        self._errname = self._lib.w4a16_moe_cuda_error_name
        self._errname.restype = ctypes.c_char_p
        self._errname.argtypes = [ctypes.c_int32]
        self._errstr = self._lib.w4a16_moe_cuda_error_string
        self._errstr.restype = ctypes.c_char_p
        self._errstr.argtypes = [ctypes.c_int32]
        self._kernels: dict = {}
        self._lock = threading.Lock()
        self.dlopen_s = time.perf_counter() - t0

    def error_text(self, code: int) -> str:
        return f"{self._errname(code).decode()} ({code}): {self._errstr(code).decode()}"

    def kernel(self, name: str) -> Kernel:
        k = self._kernels.get(name)
        if k is not None:
            return k
        with self._lock:
            if name not in self._kernels:
                if name not in self.kernel_names:
                    raise KeyError(f"kernel {name!r} not in {self.path} (has {self.kernel_names})")
                self._kernels[name] = Kernel(self, name)
            return self._kernels[name]

    def __contains__(self, name: str) -> bool:
        return name in self.kernel_names

    def __repr__(self) -> str:
        return f"<KernelLibrary {self.path} {self.arch} {len(self.kernel_names)} kernels>"


_LIBS: dict = {}
_LIBS_LOCK = threading.Lock()


def load_library(path) -> KernelLibrary:
    """Load (once per process; never closed) the library at ``path``."""
    key = str(Path(path).resolve())
    lib = _LIBS.get(key)
    if lib is None:
        with _LIBS_LOCK:
            lib = _LIBS.get(key)
            if lib is None:
                lib = KernelLibrary(key)
                _LIBS[key] = lib
    return lib
