"""Small Hugging Face checkpoint directories for the loader tests, written with the real libraries where
they install (compressed-tensors, transformers' gpt-oss MXFP4 dequantizer, AutoAWQ's unpacking helpers) and
faithful re-implementations of the packers that do not install CPU-only (AutoGPTQ / GPTQModel, AutoAWQ's
``WQLinear_GEMM.from_linear``, ModelOpt). Each writer returns the library's (or the published formula's)
dequantization of every expert, stacked as ``w13 [E, 2I, H]`` (gate rows, then up rows) and ``w2 [E, H, I]``.
"""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Optional

import torch

from w4a16_moe.formats.fp4 import e2m1_decode
from w4a16_moe.formats.quantize import quantize_matrix
from w4a16_moe.formats.weights import unpack_nibbles

PREFIX = "model.layers.0.mlp.experts"
PROJ = ("gate_proj", "up_proj", "down_proj")


def have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def dense_experts(e: int, h: int, i: int, seed: int = 0) -> dict:
    """Random BF16 per-expert projections ``{(e, proj): W [N, K]}``."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for x in range(e):
        out[(x, "gate_proj")] = (torch.randn(i, h, generator=g) * 0.05).bfloat16()
        out[(x, "up_proj")] = (torch.randn(i, h, generator=g) * 0.05).bfloat16()
        out[(x, "down_proj")] = (torch.randn(h, i, generator=g) * 0.05).bfloat16()
    return out


def write_checkpoint(path: str, config: dict, tensors: dict, shards: int = 2) -> str:
    """Write ``tensors`` over ``shards`` safetensors files with a ``model.safetensors.index.json``."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, default=str)
    names = sorted(tensors)
    per = -(-len(names) // shards)
    wmap = {}
    for s in range(shards):
        fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n].contiguous() for n in names[s * per:(s + 1) * per]}
        save_file(part, os.path.join(path, fn), metadata={"format": "pt"})
        wmap.update({n: fn for n in part})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": wmap}, f)
    return path


def _stack(per: dict, e: int) -> tuple[torch.Tensor, torch.Tensor]:
    w13 = torch.stack([torch.cat((per[(x, "gate_proj")], per[(x, "up_proj")]), 0) for x in range(e)])
    w2 = torch.stack([per[(x, "down_proj")] for x in range(e)])
    return w13, w2


# ------------------------------------------------------------------------------------------------
# compressed-tensors (the library compresses and decompresses)
# ------------------------------------------------------------------------------------------------

def ct_args(kind: str):
    from compressed_tensors.quantization import QuantizationArgs

    if kind.startswith("int4_g"):
        g = int(kind[6:].split("_")[0])
        return "pack-quantized", QuantizationArgs(num_bits=4, type="int", symmetric=not kind.endswith("_zp"),
                                                  strategy="group", group_size=g)
    if kind == "int4_channel":
        return "pack-quantized", QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="channel")
    if kind == "nvfp4":
        return "nvfp4-pack-quantized", QuantizationArgs(num_bits=4, type="float", symmetric=True,
                                                        strategy="tensor_group", group_size=16)
    if kind == "mxfp4":
        return "mxfp4-pack-quantized", QuantizationArgs(num_bits=4, type="float", symmetric=True, strategy="group",
                                                        group_size=32, scale_dtype=torch.uint8)
    raise KeyError(kind)


def write_compressed_tensors(path: str, kind: str, e: int = 4, h: int = 128, i: int = 256, seed: int = 0,
                             under_text_config: bool = False, names: tuple = PROJ):
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam

    fmt, args = ct_args(kind)
    scheme = QuantizationScheme(targets=["Linear"], weights=args, format=fmt)
    comp = BaseCompressor.load_from_registry(fmt)
    tensors, deq = {}, {}
    for (x, proj), w in dense_experts(e, h, i, seed).items():
        sd = {"weight": w}
        gs = None
        if kind == "nvfp4":
            gs = generate_gparam(w.float().amin().reshape(1), w.float().amax().reshape(1))
            sd["weight_global_scale"] = gs
        g = w.shape[1] if args.strategy == "channel" else args.group_size
        wg = w.reshape(w.shape[0], -1, g)
        sd["weight_scale"], sd["weight_zero_point"] = calculate_qparams(wg.amin(-1), wg.amax(-1), args, global_scale=gs)
        packed = comp.compress(sd, scheme)
        deq[(x, proj)] = comp.decompress(dict(packed), scheme)["weight"]
        name = dict(zip(PROJ, names))[proj]
        for k, t in packed.items():
            tensors[f"{PREFIX}.{x}.{name}.{k}"] = t
    qc = QuantizationConfig(config_groups={"group_0": scheme}, format=fmt, quant_method="compressed-tensors").to_dict()
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "num_experts": e, "hidden_size": h}
    if under_text_config:
        cfg = {"architectures": ["Qwen3VLMoeForConditionalGeneration"], "text_config": {**cfg, "quantization_config": qc}}
    else:
        cfg["quantization_config"] = qc
    write_checkpoint(path, cfg, tensors)
    return _stack(deq, e)


def ct_nvfp4_dequantize_fp32(path: str, e: int) -> torch.Tensor:
    """compressed-tensors' own ``dequantize`` of the stored NVFP4 w13 tensors, evaluated in FP32."""
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    from safetensors.torch import load_file

    _, args = ct_args("nvfp4")
    t = {}
    for fn in os.listdir(path):
        if fn.endswith(".safetensors"):
            t.update(load_file(os.path.join(path, fn)))
    out = []
    for x in range(e):
        rows = []
        for proj in ("gate_proj", "up_proj"):
            b = f"{PREFIX}.{x}.{proj}."
            p = t[b + "weight_packed"]
            q = unpack_fp4_from_uint8(p, p.shape[0], p.shape[1] * 2, dtype=torch.float32)
            rows.append(dequantize(q, t[b + "weight_scale"].float(), args=args, dtype=torch.float32,
                                   global_scale=t[b + "weight_global_scale"]))
        out.append(torch.cat(rows))
    return torch.stack(out)


# ------------------------------------------------------------------------------------------------
# GPTQ: AutoGPTQ's packer (auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py, QuantLinear.pack; GPTQModel 7.7
# packs the same words in gptqmodel/nn_modules/qlinear/__init__.py PackableQuantLinear.pack, with zeros in v2
# form, and gptqmodel/utils/model.py convert_gptq_v2_to_v1_format stores zero - 1 for checkpoint_format
# "gptq") and the published dequantization (AutoGPTQ's torch QuantLinear.forward; GPTQModel's
# dequantize_weight without the + 1 for v2). Neither installs CPU-only (CUDA extensions), hence the copy.
# ------------------------------------------------------------------------------------------------

def gptq_quantize(w: torch.Tensor, group: Optional[int], sym: bool, g_idx: torch.Tensor):
    """Integer codes ``[K, N]``, scales / zeros ``[G, N]`` of ``w [N, K]`` with group index ``g_idx [K]``."""
    n, k = w.shape
    wt = w.float().t()  # [K, N]
    ng = int(g_idx.max()) + 1
    scales = torch.empty(ng, n)
    zeros = torch.empty(ng, n)
    for gi in range(ng):
        rows = wt[g_idx == gi]
        lo, hi = rows.amin(0).clamp(max=0), rows.amax(0).clamp(min=0)
        if sym:
            amax = torch.maximum(lo.abs(), hi)
            s = (2 * amax / 15).clamp(min=1e-8)
            z = torch.full_like(s, 8.0)
        else:
            s = ((hi - lo) / 15).clamp(min=1e-8)
            z = torch.round(-lo / s).clamp(1, 15)  # >= 1: v1 stores zero - 1 in 4 bits
        scales[gi], zeros[gi] = s, z
    scales = scales.half()
    q = torch.round(wt / scales.float()[g_idx] + zeros[g_idx]).clamp(0, 15).to(torch.int32)
    return q, scales, zeros.to(torch.int32)


def gptq_pack(q: torch.Tensor, zeros: torch.Tensor, v1: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``qweight [K/8, N]`` (row ``k`` in bits ``4 (k % 8)`` of word row ``k // 8``), ``qzeros [G, N/8]``."""
    k, n = q.shape
    qweight = torch.zeros(k // 8, n, dtype=torch.int64)
    for j in range(8):
        qweight |= q[j::8].to(torch.int64) << (4 * j)
    z = (zeros - 1) if v1 else zeros
    qzeros = torch.zeros(z.shape[0], n // 8, dtype=torch.int64)
    for j in range(8):
        qzeros |= (z[:, j::8].to(torch.int64) & 0xF) << (4 * j)
    as_i32 = lambda t: ((t + 2**31) % 2**32 - 2**31).to(torch.int32)  # noqa: E731 - uint32 bits as int32
    return as_i32(qweight), as_i32(qzeros)


def gptq_dequantize(qweight, qzeros, scales, g_idx, v1: bool = True) -> torch.Tensor:
    """AutoGPTQ's torch dequantization, in the scales' dtype: ``W [N, K]``."""
    wf = torch.arange(0, 32, 4, dtype=torch.int32)
    zeros = torch.bitwise_right_shift(qzeros.unsqueeze(2).expand(-1, -1, 8), wf.view(1, 1, 8)).to(torch.int16)
    zeros = torch.bitwise_and(zeros, 15) + (1 if v1 else 0)
    zeros = zeros.reshape(scales.shape)
    weight = torch.bitwise_right_shift(qweight.unsqueeze(1).expand(-1, 8, -1), wf.view(1, 8, 1)).to(torch.int16)
    weight = torch.bitwise_and(weight, 15).reshape(-1, weight.shape[2])
    return (scales[g_idx.long()] * (weight - zeros[g_idx.long()])).t()


def write_gptq(path: str, e: int = 4, h: int = 128, i: int = 256, group: Optional[int] = 128, sym: bool = True,
               desc_act: bool = False, act_order_w13: bool = False, seed: int = 0, bits: int = 4,
               checkpoint_format: str = "gptq"):
    v1 = checkpoint_format == "gptq"
    gen = torch.Generator().manual_seed(seed + 1)
    tensors, deq, shared = {}, {}, {}
    for (x, proj), w in dense_experts(e, h, i, seed).items():
        k = w.shape[1]
        gsz = k if group is None else group
        g_idx = torch.arange(k, dtype=torch.int32) // gsz
        if desc_act and (proj == "down_proj" or act_order_w13):
            g_idx = g_idx[torch.argsort(torch.rand(k, generator=gen))]  # channels scattered over groups
            if proj == "up_proj":  # gate and up see the same input x, hence the same act order (GPTQ's H diag)
                g_idx = shared.get(x, g_idx).clone()
            shared[x] = g_idx
        q, scales, zeros = gptq_quantize(w, group, sym, g_idx)
        qweight, qzeros = gptq_pack(q, zeros, v1)
        base = f"{PREFIX}.{x}.{proj}"
        tensors.update({f"{base}.qweight": qweight, f"{base}.qzeros": qzeros, f"{base}.scales": scales,
                        f"{base}.g_idx": g_idx})
        deq[(x, proj)] = gptq_dequantize(qweight, qzeros, scales, g_idx, v1)
    qc = {"quant_method": "gptq", "bits": bits, "group_size": -1 if group is None else group, "desc_act": desc_act,
          "sym": sym, "checkpoint_format": checkpoint_format}
    write_checkpoint(path, {"num_experts": e, "quantization_config": qc}, tensors)
    return _stack(deq, e)


# ------------------------------------------------------------------------------------------------
# AWQ: AutoAWQ's packer (awq/modules/linear/gemm.py, WQLinear_GEMM.from_linear) and its dequantization
# (awq/utils/packing_utils.py, dequantize_gemm: the library's own function when AutoAWQ is installed)
# ------------------------------------------------------------------------------------------------

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def awq_pack_cols(intweight: torch.Tensor) -> torch.Tensor:
    """``[R, N]`` codes to ``[R, N/8]`` int32 words, nibble ``i`` of word ``col`` = column ``8 col + order[i]``."""
    out = torch.zeros(intweight.shape[0], intweight.shape[1] // 8, dtype=torch.int32)
    for col in range(intweight.shape[1] // 8):
        for i in range(8):
            out[:, col] |= intweight[:, col * 8 + AWQ_ORDER[i]].to(torch.int32) << (i * 4)
    return out


def awq_library_utils():
    """AutoAWQ's ``awq/utils/packing_utils.py`` (torch only), loaded without ``awq/__init__`` (heavy imports)."""
    spec = importlib.util.find_spec("awq")
    if spec is None or not spec.submodule_search_locations:
        return None
    fn = os.path.join(list(spec.submodule_search_locations)[0], "utils", "packing_utils.py")
    mspec = importlib.util.spec_from_file_location("_awq_packing_utils", fn)
    mod = importlib.util.module_from_spec(mspec)
    mspec.loader.exec_module(mod)
    return mod


def awq_dequantize(qweight, qzeros, scales, group: int) -> torch.Tensor:
    """AutoAWQ's ``dequantize_gemm`` (the library's when installed, else the same formula): ``W [N, K]``."""
    lib = awq_library_utils()
    if lib is not None:
        return lib.dequantize_gemm(qweight, qzeros, scales, 4, group).t()
    shifts = torch.arange(0, 32, 4)
    iw = torch.bitwise_right_shift(qweight[:, :, None], shifts[None, None, :]).to(torch.int8).view(qweight.shape[0], -1)
    iz = torch.bitwise_right_shift(qzeros[:, :, None], shifts[None, None, :]).to(torch.int8).view(qzeros.shape[0], -1)
    rev = torch.arange(iw.shape[-1]).view(-1, 8)[:, [0, 4, 1, 5, 2, 6, 3, 7]].view(-1)
    iw, iz = iw[:, rev] & 15, iz[:, rev] & 15
    return ((iw - iz.repeat_interleave(group, 0)) * scales.repeat_interleave(group, 0)).t()


def write_awq(path: str, e: int = 4, h: int = 128, i: int = 256, group: int = 128, seed: int = 0):
    tensors, deq = {}, {}
    for (x, proj), w in dense_experts(e, h, i, seed).items():
        n, k = w.shape
        wg = w.float().reshape(n, k // group, group)
        hi, lo = wg.amax(-1), wg.amin(-1)
        scales = ((hi - lo).clamp(min=1e-5) / 15).half()  # AutoAWQ's pseudo_quantize_tensor (zero_point=True)
        zeros = (-torch.round(lo / scales.float())).clamp(0, 15)
        q = (torch.round(wg / scales.float()[..., None]) + zeros[..., None]).clamp(0, 15).reshape(n, k)
        intweight = q.t().contiguous().to(torch.int32)  # [K, N]
        qweight = awq_pack_cols(intweight)
        qzeros = awq_pack_cols(zeros.t().contiguous().to(torch.int32))
        sc = scales.t().contiguous()  # [G, N]
        base = f"{PREFIX}.{x}.{proj}"
        tensors.update({f"{base}.qweight": qweight, f"{base}.qzeros": qzeros, f"{base}.scales": sc})
        deq[(x, proj)] = awq_dequantize(qweight, qzeros, sc, group)
    qc = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"}
    write_checkpoint(path, {"num_local_experts": e, "quantization_config": qc}, tensors)
    return _stack(deq, e)


# ------------------------------------------------------------------------------------------------
# ModelOpt NVFP4: the exported layout (modelopt/torch/quantization/qtensor/nvfp4_tensor.py) and its
# dequantization e2m1 * (weight_scale * weight_scale_2)
# ------------------------------------------------------------------------------------------------

def write_modelopt_nvfp4(path: str, e: int = 4, h: int = 128, i: int = 256, seed: int = 0, in_config: bool = True):
    tensors, deq = {}, {}
    for (x, proj), w in dense_experts(e, h, i, seed).items():
        qm = quantize_matrix(w[None].float(), "nvfp4")
        base = f"{PREFIX}.{x}.{proj}"
        ws2 = qm.global_scale[0, 0].reshape(())  # amax / (6 * 448), a scalar per projection
        tensors.update({f"{base}.weight": qm.codes[0], f"{base}.weight_scale": qm.scales[0],
                        f"{base}.weight_scale_2": ws2, f"{base}.input_scale": torch.tensor(1.0)})
        vals = e2m1_decode(unpack_nibbles(qm.codes[0])).reshape(w.shape[0], -1, 16)
        deq[(x, proj)] = (vals * (qm.scales[0].float() * ws2)[..., None]).reshape(w.shape)
    cfg = {"num_experts": e}
    if in_config:
        cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}
    write_checkpoint(path, cfg, tensors)
    if not in_config:
        with open(os.path.join(path, "hf_quant_config.json"), "w") as f:
            json.dump({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "group_size": 16}}, f)
    return _stack(deq, e)


# ------------------------------------------------------------------------------------------------
# gpt-oss MXFP4 (fused, interleaved gate/up rows, biases); dequantized with transformers'
# convert_moe_packed_tensors when transformers is installed
# ------------------------------------------------------------------------------------------------

def write_gptoss(path: str, e: int = 4, h: int = 128, i: int = 256, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    gate = torch.randn(e, i, h, generator=gen) * 0.05
    up = torch.randn(e, i, h, generator=gen) * 0.05
    down = torch.randn(e, h, i, generator=gen) * 0.05
    inter = torch.stack((gate, up), dim=2).reshape(e, 2 * i, h)  # row 2j gate j, row 2j+1 up j
    q13 = quantize_matrix(inter, "mxfp4")
    q2 = quantize_matrix(down, "mxfp4")
    b13 = (torch.randn(e, 2 * i, generator=gen) * 0.1).bfloat16()
    b2 = (torch.randn(e, h, generator=gen) * 0.1).bfloat16()
    tensors = {
        f"{PREFIX}.gate_up_proj_blocks": q13.codes.reshape(e, 2 * i, h // 32, 16),
        f"{PREFIX}.gate_up_proj_scales": q13.scales,
        f"{PREFIX}.gate_up_proj_bias": b13,
        f"{PREFIX}.down_proj_blocks": q2.codes.reshape(e, h, i // 32, 16),
        f"{PREFIX}.down_proj_scales": q2.scales,
        f"{PREFIX}.down_proj_bias": b2,
        "model.layers.0.mlp.router.weight": torch.randn(e, h, generator=gen).bfloat16(),
    }
    cfg = {"architectures": ["GptOssForCausalLM"], "num_local_experts": e, "swiglu_limit": 7.0,
           "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}}
    write_checkpoint(path, cfg, tensors)
    return tensors


def gptoss_dequantize(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """transformers' gpt-oss MXFP4 dequantization (``[E, N, K]`` FP32), or the same formula without it."""
    if have("transformers"):
        from transformers.integrations.mxfp4 import convert_moe_packed_tensors

        return convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).transpose(1, 2)
    e, n, g, b = blocks.shape
    vals = e2m1_decode(unpack_nibbles(blocks.reshape(e, n, g * b))).reshape(e, n, g, 32)
    return torch.ldexp(vals, (scales.to(torch.int32) - 127)[..., None]).reshape(e, n, g * 32)
