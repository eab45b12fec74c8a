"""vLLM 0.33.0's Humming MXFP4 fused-MoE path (gpt-oss: E2M1 weights, E8M0 scales per 32, BF16 activations,
optional per-expert BF16 biases, swiglu_oai or plain SwiGLU) -- without importing vllm.

An overlay on the peers tool's INT4 adapter (``shared/tools/peers/humming_moe.py``, staged as
``.device/peers/bin/humming_moe.py``): :class:`HummingMxfp4MoE` subclasses its ``HummingMoE`` and reuses, unchanged,
its route alignment / permutation (vLLM's ``_moe_C`` or the torch fallbacks it marks), the workspaces, the
indexed / grouped ``apply`` bodies and the Triton top-k reduction. Only the three pieces that differ for MXFP4 are
new here: the weight conversion (a different quant_config, a bias), the activation expression handed to Humming's
input processing, and the bias handed to each Humming GEMM.

Transcribed from vLLM 0.33.0 (wheel vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64, sha256
4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa) and humming-kernels 0.1.19 (sha256
16ad0c8e9c2d5a8db739bdb97bcc510cedc9dc4c4c111098cbb2d7ac9c1dd973). What mirrors what (paths under vllm/):

  quant_config            model_executor/layers/fused_moe/oracle/mxfp4.py:
                          convert_gpt_oss_weight_to_mxfp4_moe_kernel_format (HUMMING branch):
                          {"quant_method": "gpt_oss_mxfp4"}, input_schema=_humming_input_schema(None) (None ->
                          BF16), allow_input_schema_fallback=False -- the gpt-oss model (models/gpt_oss.py,
                          activation="swigluoai", has_bias=True); convert_weight_to_mxfp4_moe_kernel_format
                          (HUMMING branch): {"quant_method": "mxfp4"} -- other MXFP4 checkpoints (the 'plain'
                          SwiGLU, no-bias case). Humming: humming/schema/gpt_oss_mxfp4.py GptOssMxfp4WeightSchema,
                          humming/schema/mxfp4.py Mxfp4WeightSchema (_convert_humming: weight viewed as int32,
                          scale as float8_e8m0fnu, bias passed through; to_humming_schema: float4e2m1 /
                          float8e8m0 / group 32)
  tensors / shapes        model_executor/layers/quantization/mxfp4.py: Mxfp4MoEMethod.create_weights (w13_weight
                          uint8 [E, 2I, H/2], w13_weight_scale uint8 [E, 2I, H/32], w2 likewise, w13_bias /
                          w2_bias BF16 [E, 2I] / [E, H]); models/gpt_oss.py _load_weights_mxfp4 keeps the
                          checkpoint's interleaved gate/up rows (even rows gate, odd rows up) for swigluoai
  _convert_sublayer       model_executor/layers/quantization/utils/humming/moe.py: _process_single_sublayer,
                          _convert_sublayer_to_humming (sublayer state dict without the "w13_" prefix:
                          weight / weight_scale / bias), _prepare_and_transform_sublayer (pad_n_to_multiple=256,
                          pad_k_to_multiple=128, has_bias=moe_config.has_bias); quantization/utils/humming/
                          schema.py: check_and_fallback_input_schema with allow_fallback=False (a compatible BF16
                          input schema is kept as is; an incompatible one raises)
  _ACTIVATIONS            quantization/utils/humming/activation.py: get_humming_activation (SWIGLUOAI ->
                          binary_interleaved + _CLAMPED_SILU_IMPL formatted with limit 7.0, alpha 1.702, beta 1.0;
                          SILU without clamp -> binary_split "(a / (1.f + expf(-a))) * b")
  _process_input          fused_moe/experts/fused_humming_moe.py: HummingExpertsBase.process_input (the activation
                          kwargs above instead of the INT4 adapter's fixed SiLU)
  _humming_forward        fused_moe/experts/fused_humming_moe.py: HummingExpertsBase.humming_forward (bias =
                          quant_config.w{1,2}_bias = the transformed layer.w13_bias / w2_bias; weight_scale_2 =
                          g{1,2}_alphas = w13/w2_weight_scale_2, absent for BF16 MXFP4); humming/moe.py:
                          get_humming_moe_quant_config
  everything else         the INT4 adapter (its header maps each piece to vLLM)

Which experts class: the INT4 adapter's rule (VLLM_HUMMING_MOE_GEMM_TYPE, else indexed without EP). Note that vLLM
0.33 on an H200 does NOT pick Humming for gpt-oss by default: oracle/mxfp4.py _get_priority_backends_for_gpt_oss
lists TRITON (OAI triton_kernels, bundled as vllm.third_party.triton_kernels, supported on SM90) ahead of MARLIN and
HUMMING (prioritize_humming only moves HUMMING ahead of MARLIN). Humming is what ``--moe-backend humming`` gives;
for other MXFP4 checkpoints (_get_priority_backends) it is the SM90 default.
"""
import os
import time

import torch

import humming_moe as _base  # the peers tool's INT4 adapter (put its directory on sys.path first)

STATUS = _base.STATUS

# quantization/utils/humming/activation.py: get_humming_activation(...) results, formatted
_SILU_IMPL = "a / (1.f + expf(-a))"
_CLAMPED_SILU_OAI = """[](float a, float b) {
    const float gate = fminf(a, (7.0f));
    const float up = fmaxf(fminf(b, (7.0f)), -(7.0f));
    const float activated_gate = gate / (1.f + expf(-(1.702f) * gate));
    return activated_gate * (up + (1.0f));
}(a, b)"""
_ACTIVATIONS = {
    # MoEActivation.SWIGLUOAI (gpt-oss): gate / up interleaved element by element
    'swiglu_oai': {"activation_type": "binary_interleaved", "activation_impl": _CLAMPED_SILU_OAI},
    # MoEActivation.SILU (no clamp limit): gate half then up half
    'swiglu': {"activation_type": "binary_split", "activation_impl": f"({_SILU_IMPL}) * b"},
}
# which Humming weight schema vLLM uses for each activation (see the header)
_QUANT_METHOD = {'swiglu_oai': 'gpt_oss_mxfp4', 'swiglu': 'mxfp4'}


def interleave_gate_up(t):
    """[E, 2I, ...] gate rows then up rows -> gpt-oss order (row 2i = gate i, row 2i+1 = up i); biases [E, 2I] too."""
    e, n2 = t.shape[:2]
    assert n2 % 2 == 0, f'expected an even gate/up row count, got {n2}'
    rest = t.shape[2:]
    return t.reshape(e, 2, n2 // 2, *rest).transpose(1, 2).reshape(e, n2, *rest).contiguous()


class HummingMxfp4MoE(_base.HummingMoE):
    """w13_blocks uint8 [E, 2I, H/2] (E2M1 pairs, low nibble first), w13_scales uint8 E8M0 [E, 2I, H/32],
    w2_blocks uint8 [E, H, I/2], w2_scales uint8 [E, H, I/32], optional BF16 w13_bias [E, 2I] / w2_bias [E, H].
    Row order of w13 (and w13_bias) as Humming reads it: interleaved (gpt-oss) for activation 'swiglu_oai', gate
    rows then up rows for 'swiglu' -- build the former with :func:`interleave_gate_up`. Call:
    ``module(x, topk_ids, topk_weights)``."""

    def __init__(self, w13_blocks, w13_scales, w2_blocks, w2_scales, w13_bias=None, w2_bias=None,
                 activation='swiglu_oai', global_num_experts=None, expert_map=None, gemm_type=None,
                 precompile_topk=None, param_dtype=torch.bfloat16):
        t_start = time.time()
        if activation not in _ACTIVATIONS:
            raise ValueError(f'activation: expected one of {sorted(_ACTIVATIONS)}, got {activation!r}')
        if (w13_bias is None) != (w2_bias is None):
            raise ValueError('w13_bias / w2_bias: give both or neither (vLLM: moe_config.has_bias covers both)')
        _base._load_moe_c()
        import humming
        from humming.config import GemmType
        from humming.tune import get_heuristics_config
        STATUS['humming'] = getattr(humming, '__version__', '?')
        STATUS['humming_path'] = os.path.dirname(humming.__file__)
        _base._jit_env()
        E, N2, Kb = w13_blocks.shape
        H, I = Kb * 2, N2 // 2
        for name, t, shape in (('w13_blocks', w13_blocks, (E, 2 * I, H // 2)), ('w13_scales', w13_scales,
                               (E, 2 * I, H // 32)), ('w2_blocks', w2_blocks, (E, H, I // 2)),
                               ('w2_scales', w2_scales, (E, H, I // 32))):
            if t.dtype != torch.uint8 or tuple(t.shape) != shape:
                raise ValueError(f'{name}: expected uint8 {shape}, got {t.dtype} {tuple(t.shape)}')
        for name, b, shape in (('w13_bias', w13_bias, (E, 2 * I)), ('w2_bias', w2_bias, (E, H))):
            if b is not None and (b.dtype != param_dtype or tuple(b.shape) != shape):
                raise ValueError(f'{name}: expected {param_dtype} {shape} (vLLM keeps MoE biases in BF16), got '
                                 f'{b.dtype} {tuple(b.shape)}')
        self.E, self.H, self.I, self.g = E, H, I, 32
        self.activation = activation
        self.has_bias = w13_bias is not None
        self.global_num_experts = E if global_num_experts is None else global_num_experts
        self.expert_map = expert_map
        self.device = w13_blocks.device
        self.param_dtype = param_dtype
        use_ep = expert_map is not None or self.global_num_experts != E
        self.gemm_type = gemm_type or _base._gemm_type_from_env(use_ep)
        assert self.gemm_type in ('indexed', 'grouped_contiguous'), self.gemm_type
        assert not (use_ep and expert_map is None), 'EP needs expert_map (global -> local or -1)'
        STATUS.update(gemm_type=self.gemm_type, activation=activation, has_bias=self.has_bias,
                      quant_method=_QUANT_METHOD[activation],
                      experts_class='HummingIndexedExperts' if self.gemm_type == 'indexed' else 'HummingGroupedExperts',
                      humming_activation=_ACTIVATIONS[activation]['activation_type'])
        quant_config = {"quant_method": _QUANT_METHOD[activation]}
        self.configs, self.tensors, self.weight_schemas, self.input_schemas = {}, {}, {}, {}
        with torch.cuda.device(self.device):
            for name, q, s, b, n, k in (('w13', w13_blocks, w13_scales, w13_bias, 2 * I, H),
                                        ('w2', w2_blocks, w2_scales, w2_bias, H, I)):
                self._convert_mxfp4_sublayer(name, q, s, b, n, k, quant_config)
            self.locks = torch.zeros(_base._num_sms(self.device) * 8, dtype=torch.int32, device=self.device)
            # HummingExpertsBase.init_humming_moe (VLLM_BATCH_INVARIANT=0, VLLM_HUMMING_USE_F16_ACCUM=0)
            self.compute_config = {"use_batch_invariant": False, "use_f16_accum": False, "gemm_type": self.gemm_type}
            self.tuning = {}
            for name in ('w13', 'w2'):
                self.tuning[name] = get_heuristics_config(layer_config=self.configs[name], use_f16_accum=False,
                                                          use_batch_invariant=False, gemm_type=GemmType(self.gemm_type))
        import json
        self.compute_config_str = json.dumps(self.compute_config)
        self.tuning_str = {k: json.dumps(v) for k, v in self.tuning.items()}
        self.num_sms = _base._num_sms(self.device)
        self._scratch = {}
        for name in ('w13', 'w2'):
            c = self.configs[name]
            uniq = {json.dumps(t[2], sort_keys=True) for t in self.tuning[name]}
            STATUS[f'{name}_layer'] = dict(shape_n=c.shape_n, shape_k=c.shape_k, pad_n=c.pad_shape_n,
                                           pad_k=c.pad_shape_k, num_experts=c.num_experts, b_dtype=str(c.b_dtype),
                                           bs_dtype=str(c.bs_dtype), a_dtype=str(c.a_dtype),
                                           group=c.weight_scale_group_size, has_bias=bool(c.has_bias))
            STATUS[f'{name}_tuning'] = dict(intervals=len(self.tuning[name]), unique_kernels=len(uniq))
        STATUS['setup_s'] = round(time.time() - t_start, 2)
        self.info = dict(STATUS)
        if precompile_topk:
            self.precompile(precompile_topk)

    def _convert_mxfp4_sublayer(self, name, q, s, b, shape_n, shape_k, quant_config):
        """humming/moe.py: _process_single_sublayer (no force_weight_schema, allow_input_schema_fallback=False)."""
        from humming.schema import BaseWeightSchema, HummingInputSchema
        from humming.transform import prepare_and_transform_humming_tensors
        pd = self.param_dtype
        weight_schema = BaseWeightSchema.from_config(quant_config)
        input_schema = HummingInputSchema()  # _humming_input_schema(None) -> None -> humming_is_layer_skipped({})
        tensors = {"weight": q.contiguous(), "weight_scale": s.contiguous()}
        if b is not None:
            tensors["bias"] = b.contiguous()
        shape_k_stacks = [shape_k]
        shape_n_stacks = [shape_n // 2] * 2 if name == 'w13' else [shape_n]  # both activations are gated
        ws, conv = weight_schema.convert_humming(tensors=tensors, shape_n_stacks=shape_n_stacks,
                                                 shape_k_stacks=shape_k_stacks, param_dtype=pd, num_experts=self.E)
        ins, in_tensors = input_schema.convert_humming(tensors=tensors, shape_n_stacks=shape_n_stacks,
                                                       shape_k_stacks=shape_k_stacks, param_dtype=pd,
                                                       num_experts=self.E)
        conv.update(in_tensors)
        # check_and_fallback_input_schema(allow_fallback=False): keep a compatible schema, else raise
        hws, hins = ws.to_humming_schema(pd), ins.to_humming_schema(pd)
        if not hins.is_compatible_with(hws, pd):
            raise ValueError(f'No compatible Humming input schema for {hins} with weight schema {hws} '
                             '(allow_fallback=False)')
        source = dict(conv)
        for n_ in ("input_scale", "input_scale_2"):
            if n_ != hins.static_tensor_scale_name:
                source.pop(n_, None)
        config, out = prepare_and_transform_humming_tensors(
            tensors=source, shape_n=shape_n, shape_k=shape_k, pad_n_to_multiple=256, pad_k_to_multiple=128,
            input_schema=hins, weight_schema=hws, has_bias=b is not None, num_experts=self.E, torch_dtype=pd,
            device=q.device)
        allowed = {"weight", "weight_scale", "bias", "weight_scale_2"}
        assert set(out) <= allowed and {"weight", "weight_scale"} <= set(out), sorted(out)
        assert ("bias" in out) == (b is not None), sorted(out)
        self.configs[name], self.tensors[name] = config, out
        self.weight_schemas[name], self.input_schemas[name] = hws, hins
        STATUS[f'{name}_weight_schema'] = dict(b_dtype=str(hws.b_dtype), bs_dtype=str(hws.bs_dtype),
                                               group=hws.weight_scale_group_size,
                                               hadamard=getattr(hws, 'hadamard_block_size', None),
                                               tensors=sorted(out))
        assert getattr(hws, 'hadamard_block_size', None) in (0, 1, None)

    def _process_input(self, sublayer, inputs, quanted_input, input_scale=None, activation=False, scatter_idx=None,
                       num_valid_tokens=None):
        """HummingExpertsBase.process_input with this layer's activation expression."""
        from humming.forward import may_process_input
        config = self.configs[sublayer]
        if input_scale is not None:
            assert scatter_idx is None and not activation
            return inputs, input_scale, None
        activation_kwargs = dict(_ACTIVATIONS[self.activation]) if activation else {}
        scale = scale2 = None  # no input scales: BF16 activations
        mode = config.input_quant_mode
        layout = "scatter" if scatter_idx is not None else "normal"
        hadamard_block_size = getattr(self.weight_schemas[sublayer], 'hadamard_block_size', None)
        has_input_processing = (mode.should_quantize or (hadamard_block_size is not None and hadamard_block_size > 1)
                                or activation or scatter_idx is not None or num_valid_tokens is not None)
        inputs, group_scales, token_scales = may_process_input(
            config, inputs=inputs, outputs=quanted_input if has_input_processing else None,
            token_scales=scale2 if mode.has_secondary_scale else scale, hadamard_block_size=hadamard_block_size,
            layout=layout, expert_tokens=None, scatter_idx=scatter_idx, num_valid_tokens=num_valid_tokens,
            **activation_kwargs)
        input_scale = group_scales if mode.has_group_scale else token_scales
        input_scale_2 = token_scales if mode.has_secondary_scale else None
        return inputs, input_scale, input_scale_2

    def _humming_forward(self, sublayer, inputs, input_scale, outputs, input_scale_2=None, **kwargs):
        """HummingExpertsBase.humming_forward: the transformed bias and (absent here) weight_scale_2."""
        from humming.forward import humming_forward
        t = self.tensors[sublayer]
        return humming_forward(self.configs[sublayer], inputs=inputs, weight=t["weight"],
                               weight_scale=t["weight_scale"], zero_point=None, bias=t.get("bias"),
                               weight_scale_2=t.get("weight_scale_2"), input_scale=input_scale,
                               input_scale_2=input_scale_2, outputs=outputs, locks=self.locks, **kwargs)
