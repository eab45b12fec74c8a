"""``load_experts``: one MoE layer of a Hugging Face checkpoint directory as :class:`MoEWeights`.

The layer is read tensor by tensor from the memory-mapped shards, only for the requested experts
and, with ``tp``, only the rank's slice of the intermediate dimension (the slice is taken before
reading, except for GPTQ act order, whose permutation of ``I`` is applied to whole experts first; GPTQ act
order over ``H``, the gate/up projections' input, is kept as ``MoEWeights.w13_perm`` and is not cut by ``tp``).
The tensors are then handed to the in-memory converters of :mod:`w4a16_moe.formats.converters`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from ..activations import get_activation
from ..formats import converters as conv
from ..formats.schemes import get_scheme
from ..formats.weights import MoEWeights, QuantizedMatrix
from .config import QuantFormat, config_num_experts, detect_format
from .shards import CheckpointError, ShardReader, read_config

__all__ = ["load_experts"]

_NVFP4_LIMIT = 1.0  # see formats.converters._NVFP4_GLOBAL_LIMIT


@dataclass(frozen=True)
class _Spec:
    """One per-projection tensor: its suffix, and which axis (and unit) holds N and K."""

    suffix: str
    n_axis: Optional[int]
    n_unit: int
    k_axis: Optional[int]
    k_unit: object  # int, or "g" for the group size
    required: bool = True


def _specs(fmt: QuantFormat) -> list[_Spec]:
    g = "g" if fmt.group_size is not None else None
    if fmt.kind == "ct_int4":
        return [_Spec("weight_packed", 0, 1, 1, 8), _Spec("weight_scale", 0, 1, 1 if g else None, g or 1),
                *([] if fmt.symmetric else [_Spec("weight_zero_point", 0, 8, 1, "g")])]
    if fmt.kind in ("ct_nvfp4", "ct_mxfp4"):
        out = [_Spec("weight_packed", 0, 1, 1, 2), _Spec("weight_scale", 0, 1, 1, fmt.group_size)]
        if fmt.kind == "ct_nvfp4":
            out.append(_Spec("weight_global_scale", None, 1, None, 1))
        return out
    if fmt.kind == "modelopt_nvfp4":
        return [_Spec("weight", 0, 1, 1, 2), _Spec("weight_scale", 0, 1, 1, 16), _Spec("weight_scale_2", None, 1, None, 1)]
    if fmt.kind == "gptq":
        return [_Spec("qweight", 1, 1, 0, 8), _Spec("qzeros", 1, 8, 0 if g else None, g or 1, required=not fmt.symmetric),
                _Spec("scales", 1, 1, 0 if g else None, g or 1), _Spec("g_idx", None, 1, 0, 1, required=False)]
    if fmt.kind == "awq":
        return [_Spec("qweight", 1, 8, 0, 1), _Spec("qzeros", 1, 8, 0, "g"), _Spec("scales", 1, 1, 0, "g")]
    raise AssertionError(fmt.kind)  # pragma: no cover


def _index(spec: _Spec, ndim: int, rows: Optional[tuple], cols: Optional[tuple], group: Optional[int]) -> tuple:
    idx = [slice(None)] * ndim
    for axis, unit, rng in ((spec.n_axis, spec.n_unit, rows), (spec.k_axis, spec.k_unit, cols)):
        if axis is None or rng is None:
            continue
        u = group if unit == "g" else unit
        idx[axis] = slice(rng[0] // u, rng[1] // u)
    return tuple(idx)


def _check_global(fmt: QuantFormat, name: str, t: torch.Tensor) -> None:
    if t.dtype != torch.float32:
        raise CheckpointError(f"{name}: expected a float32 global scale, got {t.dtype}")
    v = t.float()
    if fmt.kind == "ct_nvfp4" and not bool((v >= _NVFP4_LIMIT).all()):
        raise CheckpointError(
            f"{name}: {v.min().item():.4g} is implausible for compressed-tensors' weight_global_scale, which is "
            f"stored inverted (6 * 448 / amax, >= {_NVFP4_LIMIT}); this looks like a ModelOpt weight_scale_2 "
            "(amax / (6 * 448)): is quantization_config right?"
        )
    if fmt.kind == "modelopt_nvfp4" and not bool(((v > 0) & (v <= _NVFP4_LIMIT)).all()):
        raise CheckpointError(
            f"{name}: {v.max().item():.4g} is implausible for ModelOpt's weight_scale_2 (amax / (6 * 448), "
            f"<= {_NVFP4_LIMIT}); this looks like compressed-tensors' inverted weight_global_scale (6 * 448 / amax)"
        )


class _Layer:
    """The tensors of one layer's experts, named and sliced per format."""

    def __init__(self, reader: ShardReader, prefix: str, fmt: QuantFormat, gated: bool) -> None:
        self.r, self.prefix, self.fmt, self.gated = reader, prefix, fmt, gated
        pat = re.compile(re.escape(prefix) + r"\.(\d+)\.([^.]+)\.")
        ids: set[int] = set()
        projs: set[str] = set()
        for key in reader.keys():
            m = pat.match(key)
            if m:
                ids.add(int(m.group(1)))
                projs.add(m.group(2))
        if not ids:
            raise CheckpointError(
                f"prefix: no tensors named {prefix}.<expert>.<projection>.* (nor fused {prefix}.gate_up_proj_*) "
                f"in the checkpoint"
            )
        self.num_experts = max(ids) + 1
        missing = sorted(set(range(self.num_experts)) - ids)
        if missing:
            raise CheckpointError(f"{prefix}.{missing[0]}: expert missing (the checkpoint has experts up to "
                                  f"{self.num_experts - 1}, but not {missing[:8]})")
        if {"gate_proj", "up_proj", "down_proj"} & projs:
            self.names = ("gate_proj", "up_proj", "down_proj") if gated else ("up_proj", "down_proj")
        elif {"w1", "w2", "w3"} & projs:
            self.names = ("w1", "w3", "w2") if gated else ("w1", "w2")
        else:
            raise CheckpointError(f"{prefix}.0: expected projections gate_proj/up_proj/down_proj or w1/w3/w2, "
                                  f"found {sorted(projs)}")

    def name(self, e: int, proj: str, suffix: str) -> str:
        return f"{self.prefix}.{e}.{proj}.{suffix}"

    def shape(self, proj: str, suffix: str) -> tuple[int, ...]:
        return self.r.shape(self.name(0, proj, suffix))

    def read(self, experts: Sequence[int], proj: str, rows: Optional[tuple], cols: Optional[tuple]) -> dict:
        """``{suffix: tensor [E_local, ...]}`` for one projection, sliced to ``rows`` (N) / ``cols`` (K)."""
        out: dict[str, torch.Tensor] = {}
        for spec in _specs(self.fmt):
            names = [self.name(e, proj, spec.suffix) for e in experts]
            present = [self.r.has(n) for n in names]
            if not any(present) and not spec.required:
                continue
            for n, ok in zip(names, present):
                if not ok:
                    rule = ""
                    if spec.suffix in ("weight_zero_point", "qzeros"):
                        rule = " (required: the config is asymmetric)"
                    raise CheckpointError(f"{n}: missing{rule}")
            parts = []
            for n in names:
                nd = len(self.r.shape(n))
                t = self.r.get(n, _index(spec, nd, rows, cols, self.fmt.group_size))
                if spec.suffix in ("weight_global_scale", "weight_scale_2"):
                    _check_global(self.fmt, n, t)
                    t = t.reshape(())
                if spec.suffix == "g_idx" and cols is not None and self.fmt.group_size is not None:
                    t = t - cols[0] // self.fmt.group_size  # global group ids to the slice's own
                parts.append(t)
            shapes = {tuple(p.shape) for p in parts}
            if len(shapes) > 1:
                raise CheckpointError(f"{names[0]}: experts disagree on its shape ({sorted(shapes)})")
            out[spec.suffix] = torch.stack(parts)
        return out


def _cat_w13(gate: dict, up: dict, fmt: QuantFormat) -> dict:
    out = {}
    for spec in _specs(fmt):
        if spec.suffix not in gate:
            continue
        g, u = gate[spec.suffix], up[spec.suffix]
        if spec.n_axis is None:
            out[spec.suffix] = torch.stack((g, u), dim=1) if g.dim() == 1 else g  # [E, 2] global scales
        elif spec.suffix == "g_idx":
            if not torch.equal(g, u):
                raise CheckpointError("g_idx: the gate and up projections of an expert have different act orders")
            out[spec.suffix] = g
        else:
            out[spec.suffix] = torch.cat((g, u), dim=spec.n_axis + 1)
    return out


def _convert(fmt: QuantFormat, w13: dict, w2: dict, activation: str) -> MoEWeights:
    k = fmt.kind
    if k == "ct_int4":
        return conv.from_compressed_tensors(
            w13["weight_packed"], w13["weight_scale"], w2["weight_packed"], w2["weight_scale"],
            group_size=fmt.group_size, w13_weight_zero_point=w13.get("weight_zero_point"),
            w2_weight_zero_point=w2.get("weight_zero_point"), symmetric=fmt.symmetric, activation=activation)
    if k in ("ct_nvfp4", "ct_mxfp4"):
        return conv.from_compressed_tensors_fp4(
            w13["weight_packed"], w13["weight_scale"], w2["weight_packed"], w2["weight_scale"],
            w13_weight_global_scale=w13.get("weight_global_scale"),
            w2_weight_global_scale=w2.get("weight_global_scale"), activation=activation)
    if k == "modelopt_nvfp4":
        return conv.from_modelopt_nvfp4(
            w13["weight"], w13["weight_scale"], w13["weight_scale_2"], w2["weight"], w2["weight_scale"],
            w2["weight_scale_2"], activation=activation)
    if k == "gptq":
        return conv.from_gptq(
            w13["qweight"], w13["scales"], w2["qweight"], w2["scales"], group_size=fmt.group_size,
            w13_qzeros=w13.get("qzeros"), w2_qzeros=w2.get("qzeros"), w13_g_idx=w13.get("g_idx"),
            w2_g_idx=w2.get("g_idx"), sym=fmt.symmetric, checkpoint_format=fmt.checkpoint_format,
            activation=activation)
    if k == "awq":
        return conv.from_awq(w13["qweight"], w13["qzeros"], w13["scales"], w2["qweight"], w2["qzeros"],
                             w2["scales"], group_size=fmt.group_size, activation=activation)
    raise AssertionError(k)  # pragma: no cover


def _tp_range(tp: object, inter: int, fmt: QuantFormat) -> Optional[tuple[int, int]]:
    if tp is None:
        return None
    if (not isinstance(tp, tuple) or len(tp) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in tp)):
        raise TypeError(f"tp: expected a (rank, size) tuple of ints, got {tp!r}")
    rank, size = tp
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"tp: expected 0 <= rank < size, got rank {rank}, size {size}")
    if inter % size:
        raise ValueError(f"tp: intermediate size {inter} is not divisible by the TP size {size}")
    s = inter // size
    mult = 8 if fmt.group_size is None else max(fmt.group_size, 8)
    if s % mult:
        raise ValueError(f"tp: intermediate shard {s} (I={inter} / {size}) is not a multiple of {mult} "
                         f"(group size {fmt.group_size})")
    return rank * s, (rank + 1) * s


def _expert_list(experts: object, total: int) -> list[int]:
    if experts is None:
        return list(range(total))
    if not isinstance(experts, range) or experts.step != 1 or len(experts) == 0:
        raise TypeError(f"experts: expected a non-empty range(a, b) of local experts, got {experts!r}")
    if experts.start < 0 or experts.stop > total:
        raise ValueError(f"experts: {experts} is outside the checkpoint's {total} experts")
    return list(experts)


def _load_per_expert(r: ShardReader, prefix: str, fmt: QuantFormat, act, experts, tp, num_cfg) -> MoEWeights:
    layer = _Layer(r, prefix, fmt, act.gated)
    if num_cfg is not None and num_cfg != layer.num_experts:
        raise CheckpointError(f"{prefix}: the checkpoint has {layer.num_experts} experts, but config.json says "
                              f"{num_cfg} (mismatched expert counts)")
    ids = _expert_list(experts, layer.num_experts)
    down = layer.names[-1]
    spec0 = _specs(fmt)[0]
    shp = layer.shape(down, spec0.suffix)
    inter = shp[spec0.k_axis] * (spec0.k_unit if isinstance(spec0.k_unit, int) else 1)
    rng = _tp_range(tp, inter, fmt)
    act_order = fmt.kind == "gptq" and fmt.desc_act and r.has(layer.name(0, down, "g_idx"))
    rows, cols = (None, None) if act_order else (rng, rng)
    w2 = layer.read(ids, down, None, cols)
    if act.gated:
        w13 = _cat_w13(layer.read(ids, layer.names[0], rows, None), layer.read(ids, layer.names[1], rows, None), fmt)
    else:
        w13 = layer.read(ids, layer.names[0], rows, None)
    try:
        w = _convert(fmt, w13, w2, act.name)
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"{prefix} ({fmt.kind}): {exc}") from None
    if act_order and rng is not None:
        from ..distributed import shard_intermediate

        w = shard_intermediate(w, tp[0], tp[1])
    return w


def _deinterleave(t: torch.Tensor) -> torch.Tensor:
    return torch.cat((t[:, 0::2], t[:, 1::2]), dim=1).contiguous()


def _load_gptoss(r: ShardReader, prefix: str, act, experts, tp, num_cfg) -> MoEWeights:
    if not act.gated:
        raise ValueError(f"activation: gpt-oss experts are gated (fused gate_up_proj), got {act.name!r}")
    names = {p: f"{prefix}.{p}" for p in ("gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks",
                                          "down_proj_scales")}
    for n in names.values():
        if not r.has(n):
            raise CheckpointError(f"{n}: missing (gpt-oss MXFP4 layers have gate_up_proj_blocks/_scales and "
                                  "down_proj_blocks/_scales)")
    sh = r.shape(names["gate_up_proj_blocks"])
    sd = r.shape(names["down_proj_blocks"])
    if len(sh) != 4 or len(sd) != 4 or sh[3] != 16 or sd[3] != 16:
        raise CheckpointError(f"{names['gate_up_proj_blocks']}: expected MXFP4 blocks [E, 2I, H/32, 16] and "
                              f"[E, H, I/32, 16], got {sh} and {sd}")
    total = sh[0]
    for n in names.values():
        if r.shape(n)[0] != total:
            raise CheckpointError(f"{n}: {r.shape(n)[0]} experts, but {names['gate_up_proj_blocks']} has {total} "
                                  "(mismatched expert counts)")
    if num_cfg is not None and num_cfg != total:
        raise CheckpointError(f"{prefix}: the checkpoint has {total} experts, but config.json says {num_cfg} "
                              "(mismatched expert counts)")
    ids = _expert_list(experts, total)
    ex = slice(ids[0], ids[-1] + 1)
    rng = _tp_range(tp, sd[2] * 32, QuantFormat("gptoss_mxfp4", 32))
    rows = slice(None) if rng is None else slice(2 * rng[0], 2 * rng[1])  # interleaved gate/up rows
    kcols = slice(None) if rng is None else slice(rng[0] // 32, rng[1] // 32)
    w13_blocks = _deinterleave(r.get(names["gate_up_proj_blocks"], (ex, rows)))
    w13_scales = _deinterleave(r.get(names["gate_up_proj_scales"], (ex, rows)))
    w2_blocks = r.get(names["down_proj_blocks"], (ex, slice(None), kcols))
    w2_scales = r.get(names["down_proj_scales"], (ex, slice(None), kcols))
    b13 = b2 = None
    if r.has(f"{prefix}.gate_up_proj_bias"):
        b13 = _deinterleave(r.get(f"{prefix}.gate_up_proj_bias", (ex, rows)))
    if r.has(f"{prefix}.down_proj_bias") and (rng is None or tp[0] == 0):
        b2 = r.get(f"{prefix}.down_proj_bias", (ex,)).contiguous()  # added once: by TP rank 0 only
    for name, b in (("gate_up_proj_bias", b13), ("down_proj_bias", b2)):
        if b is not None and b.dtype not in (torch.float32, torch.bfloat16):
            raise CheckpointError(f"{prefix}.{name}: expected float32 or bfloat16, got {b.dtype}")
    try:
        return conv.from_mxfp4(w13_blocks, w13_scales, w2_blocks, w2_scales, w13_bias=b13, w2_bias=b2,
                               activation=act.name)
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"{prefix} (gpt-oss mxfp4): {exc}") from None


def _finish(w: MoEWeights, device: "torch.device | str", dtype: Optional[torch.dtype]) -> MoEWeights:
    if dtype is not None:
        if dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise TypeError(f"dtype: expected torch.bfloat16, float16 or float32, got {dtype}")

        def cast_scales(m: QuantizedMatrix) -> QuantizedMatrix:
            if not m.scheme.is_int4:
                return m
            return QuantizedMatrix(m.scheme, m.codes, m.scales.to(dtype).contiguous(), m.zeros, m.global_scale)

        bias_dt = dtype if dtype in (torch.bfloat16, torch.float32) else torch.float32
        w = MoEWeights(w.scheme, cast_scales(w.w13), cast_scales(w.w2), w.gated,
                       None if w.w13_bias is None else w.w13_bias.to(bias_dt).contiguous(),
                       None if w.w2_bias is None else w.w2_bias.to(bias_dt).contiguous(), w.w13_perm)
    return w if torch.device(device) == w.device else w.to(device)


def load_experts(
    path: str,
    prefix: str,
    *,
    activation: str = "swiglu",
    experts: Optional[range] = None,
    tp: Optional[tuple[int, int]] = None,
    device: "torch.device | str" = "cpu",
    dtype: Optional[torch.dtype] = None,
) -> MoEWeights:
    """Load one MoE layer's experts from a Hugging Face checkpoint directory.

    Args:
        path: the directory holding ``config.json``, the ``*.safetensors`` shards and (when sharded)
            ``model.safetensors.index.json``.
        prefix: the experts' module path, e.g. ``"model.layers.3.mlp.experts"``; tensors are
            ``{prefix}.{e}.gate_proj|up_proj|down_proj.*`` (or ``w1|w3|w2``), or gpt-oss' fused
            ``{prefix}.gate_up_proj_blocks`` ... (gate/up rows interleaved; de-interleaved here).
        activation: the layer's activation (``"swiglu_oai"`` for gpt-oss); decides whether w13 is gated.
        experts: ``range(a, b)``: load only these experts (an expert-parallel rank's local experts).
        tp: ``(rank, size)``: load only this rank's slice of the intermediate dimension, the same slice
            :func:`w4a16_moe.distributed.shard_intermediate` cuts (``w2_bias`` goes to rank 0 only, so the
            all-reduced sum adds it once).
        device: where the returned weights live.
        dtype: cast INT4 scales and the biases to this dtype (default: as stored).

    The format comes from ``quantization_config`` (top level or ``text_config``): compressed-tensors
    ``pack-quantized`` (INT4 group 32/64/128, zero points, channel), ``nvfp4-pack-quantized``,
    ``mxfp4-pack-quantized``; GPTQ; AWQ (GEMM); ModelOpt NVFP4; gpt-oss MXFP4. Raises
    :class:`CheckpointError` (a ValueError) naming the tensor and the rule it breaks.
    """
    if not isinstance(path, str) and not hasattr(path, "__fspath__"):
        raise TypeError(f"path: expected a directory path, got {type(path).__name__}")
    if not isinstance(prefix, str) or not prefix.strip("."):
        raise TypeError(f"prefix: expected the experts' module path (str), got {prefix!r}")
    import os

    path = os.fspath(path)
    prefix = prefix.rstrip(".")
    act = get_activation(activation)
    cfg = read_config(path)
    fmt = detect_format(cfg, path)
    num_cfg = config_num_experts(cfg)
    with ShardReader(path) as r:
        fused = r.has(f"{prefix}.gate_up_proj_blocks")
        if fmt.kind == "gptoss_mxfp4" or fused:
            if fmt.kind != "gptoss_mxfp4":
                raise CheckpointError(f"{prefix}.gate_up_proj_blocks: fused MXFP4 blocks, but quantization_config "
                                      f"describes {fmt.kind}")
            w = _load_gptoss(r, prefix, act, experts, tp, num_cfg)
        else:
            w = _load_per_expert(r, prefix, fmt, act, experts, tp, num_cfg)
    return _finish(w, device, dtype)
