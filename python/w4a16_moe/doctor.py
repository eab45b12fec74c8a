"""``python -m w4a16_moe doctor [--json]``: what this machine can run, and which provider a case gets.

Prints the device and its arch, the providers and why each is or is not available, the kernel
cache location, prebuilt kernels and the torch op library, the provider decision for a case
(``--scheme``, ``--dtype``, ``--hidden``, ``--intermediate``, ``--experts``, ``--activation``,
``--backend``, ``--tokens``, ``--global-experts``: the ``global_num_experts`` hint of an expert-parallel rank) and where the CuTe kernels of that case would come from on ``--arch`` (default: this
GPU's arch, else sm_90a): prebuilt, JIT cache, JIT compile, or not available and why; and the plan of a call of the case
(one token unless ``--tokens``)
(provider, kernel family, tiles, split-K, decode or not, kernels, and where the choice came from: an
autotuned row, the tuned table, the rule or the decode cost model); where the autotuner's results live.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import platform
import sys
from typing import Optional

import torch

from . import __version__, cli
from .activations import get_activation
from .device import DeviceInfo, probe
from .formats.schemes import SCHEMES, get_scheme
from .providers import (
    BACKENDS,
    ProviderUnavailable,
    cute_unavailable_reason,
    resolve_backend,
    select_provider,
    triton_unavailable_reason,
)
from .validate import MoECall

__all__ = ["report", "main"]


def _ver(name: str) -> Optional[str]:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def _loader_info() -> dict:
    try:
        from . import loader

        describe = getattr(loader, "describe", None)
        return describe() if describe else {"status": "loader not available in this version"}
    except Exception as exc:  # the doctor must always print something useful
        return {"error": f"{type(exc).__name__}: {exc}"}


def _autotune_info() -> dict:
    """Where the autotuner's results live, how many layers it holds, and warmup's default."""
    try:
        from . import settings
        from .kernels.cute.autotune_store import store_dir

        d = store_dir()
        n = len(list(d.glob("*.json"))) if d.is_dir() else 0
        return {"dir": str(d), "layers": n, "warmup_default": bool(settings.get().autotune)}
    except Exception as exc:  # the doctor must always print something useful
        return {"error": f"{type(exc).__name__}: {exc}"}


def _kernel_lookup(scheme: str, dtype: str, activation: str, experts: int, top_k: int, arch: str) -> dict:
    """Where the CuTe kernels of a one-token call of the case (the rule's tiles of the family serving
    ``arch``) come from on ``arch`` (no build, no load)."""
    try:
        from .formats.schemes import get_scheme
        from .kernels.cute.provider import family_for
        from .loader import kernel_status

        sch = get_scheme(scheme)
        dt = {"bfloat16": "bf16", "float16": "fp16"}[dtype]
        major, minor = divmod(int(arch[3:].rstrip("a")), 10)
        family, why = family_for(DeviceInfo("cuda", arch, (major, minor)))
        if family is None:
            return {"arch": arch, "note": why}
        gated = get_activation(activation).gated
        up, down = family.configs(sch, dt, activation, gated, "deterministic", family.select_tiles(top_k, experts))
        out = {"arch": arch, "family": family.name}
        for which, cfg in (("gate_up", up), ("down", down)):
            spec = family.spec_for(cfg)
            src, why = kernel_status(spec, arch)
            out[which] = {"spec": spec.name, "source": src, "reason": why}
        return out
    except Exception as exc:  # the doctor must always print something useful
        return {"arch": arch, "error": f"{type(exc).__name__}: {exc}"}


def _cute_plan(call, arch: str, gpu: str) -> str:
    """The CuTe provider's plan of ``call`` on a GPU named ``gpu`` of ``arch`` (this machine's, or assumed)."""
    try:
        from .kernels.cute import provider

        major = int(arch[3:].rstrip("a")) // 10
        minor = int(arch[3:].rstrip("a")) % 10
        info = DeviceInfo("cuda", gpu, (major, minor))
        why = provider.unavailable_reason(call, info)
        return f"{gpu} ({arch}): " + (f"unavailable: {why}" if why else provider.plan(call, info).describe())
    except Exception as exc:  # the doctor must always print something useful
        return f"{type(exc).__name__}: {exc}"


def report(scheme="int4_g32", dtype="bfloat16", hidden=7168, intermediate=256, experts=384, top_k=8,
           activation="swiglu", backend="auto", device: Optional[str] = None, arch: Optional[str] = None,
           tokens: int = 1, global_experts: Optional[int] = None) -> dict:
    from .validate import check_global_experts

    dev = torch.device(device) if device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    info = probe(dev)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"tokens: expected a positive int, got {tokens!r}")
    call = MoECall(
        tokens=tokens, top_k=top_k, hidden=hidden, intermediate=intermediate, experts=experts,
        dtype=getattr(torch, dtype), device=dev, activation=get_activation(activation), finalize="deterministic",
        expert_offset=0, scheme=get_scheme(scheme).name,
        global_experts=check_global_experts(global_experts, experts),
    )
    providers = {
        "cute": cute_unavailable_reason(call, info) or "available",
        "triton": triton_unavailable_reason(call, info) or "available",
        "reference": "available (FP32, any device)",
    }
    try:
        resolved = resolve_backend(backend)
        d = select_provider(call, resolved, info)
        decision = {"backend": resolved, "provider": d.provider, "reason": d.reason,
                    "plan": d.plan.describe() if d.plan else None}
    except (ProviderUnavailable, ValueError) as exc:
        decision = {"backend": backend, "provider": None, "reason": str(exc)}
    try:
        from .kernels.cute.provider import routing_choice

        routing = routing_choice(arch or info.arch or "sm_90a", experts)
    except Exception as exc:  # the doctor must always print something useful
        routing = f"{type(exc).__name__}: {exc}"
    return {
        "routing": routing,
        "cute_plan": _cute_plan(call, arch or info.arch or "sm_90a", info.name if info.is_cuda and not arch else
                                ("NVIDIA H200" if (arch or "sm_90a") == "sm_90a" else f"a {arch} GPU")),
        "w4a16_moe": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _ver("triton"),
        "nvidia-cutlass-dsl": _ver("nvidia-cutlass-dsl"),
        "device": {"type": info.type, "name": info.name, "arch": info.arch,
                   "capability": list(info.capability) if info.capability else None, "sm_count": info.sm_count},
        "providers": providers,
        "kernels": _loader_info(),
        "autotune": _autotune_info(),
        "case": {"scheme": call.scheme, "dtype": dtype, "hidden": hidden, "intermediate": intermediate,
                 "experts": experts, "top_k": top_k, "activation": activation, "tokens": tokens,
                 "global_experts": call.global_experts},
        "decision": decision,
        "kernel_lookup": _kernel_lookup(scheme, dtype, activation, experts, top_k, arch or info.arch or "sm_90a"),
    }


def main(argv: Optional[list[str]] = None) -> int:
    ap = cli.parser("doctor", __doc__)
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--scheme", default="int4_g32", choices=list(SCHEMES))
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--intermediate", type=int, default=256)
    ap.add_argument("--experts", type=int, default=384)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=1, help="tokens of the planned call (default 1)")
    ap.add_argument("--global-experts", type=int, default=None,
                    help="global_num_experts hint: the model's expert count when --experts is one EP rank's")
    ap.add_argument("--activation", default="swiglu")
    ap.add_argument("--backend", default="auto", choices=list(BACKENDS))
    ap.add_argument("--device", default=None, help="e.g. cuda:1 (default: cuda if available, else cpu)")
    ap.add_argument("--arch", default=None, help="arch for the kernel lookup (default: the device's, else sm_90a)")
    a = ap.parse_args(argv)
    from .validate import check_global_experts

    try:
        check_global_experts(a.global_experts, a.experts)
        if a.tokens < 1:
            raise ValueError(f"--tokens: expected a positive int, got {a.tokens}")
    except ValueError as exc:
        ap.error(f"--global-experts / --tokens: {exc}")
    r = report(a.scheme, a.dtype, a.hidden, a.intermediate, a.experts, a.top_k, a.activation, a.backend, a.device,
               a.arch, a.tokens, a.global_experts)
    if a.json:
        json.dump(r, sys.stdout, indent=1)
        print()
        return 0
    d = r["device"]
    print(f"w4a16_moe {r['w4a16_moe']}  python {r['python']}  torch {r['torch']}  triton {r['triton']}  "
          f"cutlass-dsl {r['nvidia-cutlass-dsl']}")
    print(f"device   : {d['name']} ({d['type']}, arch {d['arch']}, {d['sm_count']} SMs)")
    for p, why in r["providers"].items():
        print(f"provider : {p:9s} {why}")
    for key, val in (r["kernels"] or {}).items():
        print(f"kernels  : {key}: {val}")
    at = r["autotune"]
    print("autotune : " + (at["error"] if "error" in at else
                           f"{at['layers']} tuned layers in {at['dir']} (warmup autotunes by default: "
                           f"{'yes' if at['warmup_default'] else 'no, W4A16_MOE_AUTOTUNE=0'}); plans say "
                           "where their choice came from"))
    c = r["case"]
    ep = f" of {c['global_experts']} (global_num_experts)" if c["global_experts"] else ""
    print(f"case     : {c['scheme']} {c['dtype']} H={c['hidden']} I={c['intermediate']} E={c['experts']}{ep} "
          f"top-{c['top_k']} {c['activation']}, {c['tokens']} token{'s' if c['tokens'] != 1 else ''}")
    dec = r["decision"]
    print(f"decision : backend={dec['backend']} -> {dec['provider'] or 'none'}: {dec['reason']}")
    if dec.get("plan"):
        print(f"plan     : {dec['plan']}")
    print(f"cute plan: {r['cute_plan']}")
    print(f"routing  : {r['routing']}")
    look = r["kernel_lookup"]
    for which in ("gate_up", "down"):
        if which in look:
            k = look[which]
            print(f"kernel   : {look['arch']} {which}: {k['source'] or 'NOT AVAILABLE'}: {k['reason']}")
    for key in ("note", "error"):
        if key in look:
            print(f"kernel   : {look['arch']}: {look[key]}")
    return 0
