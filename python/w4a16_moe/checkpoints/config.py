"""The checkpoint's quantization format, read from ``config.json``'s ``quantization_config``.

``quantization_config`` is looked up at the top level, then under ``text_config`` (multimodal
models); without it, ModelOpt exports are recognized by ``hf_quant_config.json`` and AutoGPTQ ones by
``quantize_config.json``. Every field a format
needs is checked here, so a later tensor error is about tensors only.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Optional

from .shards import CheckpointError

__all__ = ["QuantFormat", "detect_format", "config_num_experts"]

_GROUPS = (32, 64, 128)


@dataclass(frozen=True)
class QuantFormat:
    """What :func:`w4a16_moe.load_experts` needs to know about a checkpoint's 4-bit format.

    ``kind``: ``ct_int4``, ``ct_nvfp4``, ``ct_mxfp4``, ``gptq``, ``awq``, ``modelopt_nvfp4`` or
    ``gptoss_mxfp4``; ``group_size`` ``None`` means per channel.
    """

    kind: str
    group_size: Optional[int]
    symmetric: bool = True
    desc_act: bool = False
    checkpoint_format: str = "gptq"


def _quant_config(cfg: dict) -> Optional[dict]:
    for holder in (cfg, cfg.get("text_config") or {}):
        qc = holder.get("quantization_config") if isinstance(holder, dict) else None
        if qc:
            return qc
    return None


def config_num_experts(cfg: dict) -> Optional[int]:
    """The routed expert count named by the model config (``num_local_experts``, ``num_experts``, ...)."""
    for holder in (cfg, cfg.get("text_config") or {}):
        for key in ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"):
            v = holder.get(key) if isinstance(holder, dict) else None
            if isinstance(v, int) and not isinstance(v, bool):
                return v
    return None


def _group(value: object, where: str, allow_channel: bool = True) -> Optional[int]:
    if value in (None, -1) and allow_channel:
        return None
    if value not in _GROUPS:
        raise CheckpointError(
            f"{where}: group_size must be one of {', '.join(map(str, _GROUPS))}"
            f"{' or -1/None (per channel)' if allow_channel else ''}, got {value!r}"
        )
    return int(value)  # type: ignore[arg-type]


def _bits(value: object, where: str) -> None:
    if value != 4:
        raise CheckpointError(f"{where}: only 4-bit weights are supported, got {value!r}")


def _compressed_tensors(qc: dict) -> QuantFormat:
    groups = qc.get("config_groups") or {}
    weights = []
    fmts = set()
    for name, grp in groups.items():
        w = (grp or {}).get("weights")
        if w:
            weights.append((name, w))
            fmts.add(grp.get("format") or qc.get("format"))
    if not weights:
        raise CheckpointError("quantization_config.config_groups: no group quantizes weights")
    first = weights[0][1]
    keys = ("num_bits", "type", "strategy", "group_size", "symmetric")
    for name, w in weights[1:]:
        if any(w.get(k) != first.get(k) for k in keys):
            raise CheckpointError(
                f"quantization_config.config_groups.{name}: weights differ from {weights[0][0]}'s; "
                "one MoE layer must use one scheme"
            )
    fmts.discard(None)
    if len(fmts) > 1:
        raise CheckpointError(f"quantization_config: several formats {sorted(fmts)}; expected one")
    fmt = fmts.pop() if fmts else qc.get("format")
    where = f"quantization_config.config_groups.{weights[0][0]}.weights"
    _bits(first.get("num_bits"), f"{where}.num_bits")
    strategy = first.get("strategy")
    sym = first.get("symmetric", True)
    if fmt == "pack-quantized":
        if first.get("type", "int") != "int":
            raise CheckpointError(f"{where}.type: pack-quantized needs type 'int', got {first.get('type')!r}")
        if strategy == "channel":
            if not sym:
                raise CheckpointError(f"{where}: strategy 'channel' with symmetric: false is not supported")
            return QuantFormat("ct_int4", None, True)
        if strategy != "group":
            raise CheckpointError(f"{where}.strategy: expected 'group' or 'channel', got {strategy!r}")
        return QuantFormat("ct_int4", _group(first.get("group_size"), f"{where}.group_size", False), bool(sym))
    if fmt in ("nvfp4-pack-quantized", "mxfp4-pack-quantized"):
        if not sym:
            raise CheckpointError(f"{where}.symmetric: {fmt} is symmetric only")
        want = 16 if fmt.startswith("nv") else 32
        if first.get("group_size") != want:
            raise CheckpointError(f"{where}.group_size: {fmt} needs {want}, got {first.get('group_size')!r}")
        return QuantFormat("ct_nvfp4" if want == 16 else "ct_mxfp4", want)
    raise CheckpointError(
        f"quantization_config.format: {fmt!r} is not supported; expected pack-quantized, "
        "nvfp4-pack-quantized or mxfp4-pack-quantized"
    )


def detect_format(cfg: dict, path: str) -> QuantFormat:
    """The :class:`QuantFormat` of the checkpoint at ``path`` with config ``cfg``."""
    qc = _quant_config(cfg)
    if qc is None:
        hf = os.path.join(path, "hf_quant_config.json")
        autogptq = os.path.join(path, "quantize_config.json")
        if os.path.isfile(hf):
            with open(hf) as f:
                q = json.load(f).get("quantization") or {}
            qc = {"quant_method": "modelopt", **q}
        elif os.path.isfile(autogptq):  # AutoGPTQ / GPTQModel save their config beside config.json
            with open(autogptq) as f:
                qc = {"quant_method": "gptq", **json.load(f)}
        else:
            raise CheckpointError(
                "config.json: no quantization_config (top level or text_config): not a quantized checkpoint"
            )
    method = str(qc.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    if method == "gptq":
        _bits(qc.get("bits"), "quantization_config.bits")
        fmt = qc.get("checkpoint_format", qc.get("format", "gptq"))
        if fmt not in ("gptq", "gptq_v2"):
            raise CheckpointError(f"quantization_config.checkpoint_format: expected gptq or gptq_v2, got {fmt!r}")
        return QuantFormat("gptq", _group(qc.get("group_size"), "quantization_config.group_size"),
                           bool(qc.get("sym", True)), bool(qc.get("desc_act", False)), fmt)
    if method == "awq":
        _bits(qc.get("bits", qc.get("w_bit")), "quantization_config.bits")
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise CheckpointError(f"quantization_config.version: only AWQ 'gemm' packing is supported, got {version!r}")
        if not qc.get("zero_point", True):
            raise CheckpointError("quantization_config.zero_point: AWQ without zero points is not supported")
        return QuantFormat("awq", _group(qc.get("group_size", qc.get("q_group_size")), "quantization_config.group_size",
                                         False), False)
    if method == "modelopt":
        qc = {**(qc.get("quantization") or {}), **qc}  # hf_quant_config.json nests the fields
        algo = str(qc.get("quant_algo", "")).upper()
        if algo != "NVFP4":
            raise CheckpointError(f"quantization_config.quant_algo: only ModelOpt NVFP4 is supported, got {algo!r}")
        if qc.get("group_size", 16) != 16:
            raise CheckpointError(f"quantization_config.group_size: NVFP4 needs 16, got {qc.get('group_size')!r}")
        return QuantFormat("modelopt_nvfp4", 16)
    if method == "mxfp4":
        return QuantFormat("gptoss_mxfp4", 32)
    raise CheckpointError(
        f"quantization_config.quant_method: {qc.get('quant_method')!r} is not supported; expected compressed-tensors, "
        "gptq, awq, modelopt or mxfp4"
    )
