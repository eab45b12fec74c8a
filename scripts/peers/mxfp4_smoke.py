"""CPU checks of mxfp4_bench.py (``mxfp4_bench.py --cpu-smoke``): no GPU, no Humming kernels.

1. data: deterministic; the same draws as the project's benchmark for an ``mxfp4`` layer; E8M0 exponents -8/-7 at
   K = 2880 and O(1) outputs of the gpt-oss layer's sizes.
2. the reference (project's reference_moe on MoEWeights.from_mxfp4) against an independent dense FP32 loop
   (own E2M1 table, E8M0, biases, swiglu_oai written out as in the brief); the NRMSE gate catches a missing
   bias, plain SwiGLU for swiglu_oai and swapped gate/up halves.
3. the Humming activation expressions (C source handed to Humming's NVRTC JIT) evaluated in Python against the
   project's activations, clamps included; interleave_gate_up.
4. the Humming glue (humming_mxfp4.py over the peers tool's humming_moe.py) end to end on the CPU with the real
   humming 0.1.19 Python (schemas) and emulated kernels: device-bound calls (schema compatibility, weight
   transform, tuning, input processing, the GEMMs) replaced by torch emulations of their documented semantics;
   vLLM's route alignment runs as the adapter's torch fallback and its top-k reduction in Triton's interpreter.
   Checks the wiring (row interleave, biases, activation kwargs, quant methods) against the reference.
5. the project's Triton provider (Triton interpreter, FP16 x: the interpreter has no BF16) on both variants, with
   and without EP; run() end to end (--no-time, BF16) with the project on backend='reference' and the emulated
   Humming (indexed path; the grouped / EP path of the adapter is not emulated); the records pass
   w4a16_moe.bench.records' schema (provider recorded, '^' marks); JSON and markdown written.

Humming's Python comes from ``import humming`` or, failing that, the wheel in ~/.cache/w4a16-peers (unzipped into
a temporary directory; $PEERS_HUMMING_WHEEL overrides). Without it, step 4 and the humming part of 5 are skipped.
"""
import atexit
import contextlib
import dataclasses
import glob
import json
import os
import re
import shutil
import sys
import tempfile
import zipfile

os.environ.setdefault('TRITON_INTERPRET', '1')  # before triton is imported (the Triton provider and humming_moe)

import torch  # noqa: E402

import mxfp4_data as md  # noqa: E402

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def log(*a):
    print(*a, flush=True)


# ================================================================================================= helpers
def dequant(blocks, scales):
    """Independent FP32 dequantization of uint8 E2M1 pairs (low nibble first) and E8M0 scales per 32."""
    lo, hi = blocks & 0xF, blocks >> 4
    codes = torch.stack([lo, hi], dim=-1).reshape(*blocks.shape[:-1], blocks.shape[-1] * 2).long()
    vals = torch.tensor(E2M1)[codes]
    s = torch.exp2(scales.float() - 127.0).repeat_interleave(32, dim=-1)
    return vals * s


def dense_loop(x, ids, wts, layer, bias, oai):
    """out[t] = sum_j w[t,j] * (W2_e act(W13_e x_t + b13_e) + b2_e), FP32, token by token."""
    W13, W2 = dequant(layer.w13_blocks, layer.w13_scales), dequant(layer.w2_blocks, layer.w2_scales)
    I = W2.shape[2]
    out = torch.zeros(x.shape[0], x.shape[1])
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if e < 0 or e >= W13.shape[0]:
                continue
            h = W13[e] @ x[t].float() + (layer.w13_bias[e].float() if bias else 0)
            g, u = h[:I], h[I:]
            if oai:
                g = torch.clamp(g, max=7.0)
                u = torch.clamp(u, -7.0, 7.0)
                a = g * torch.sigmoid(1.702 * g) * (u + 1)
            else:
                a = torch.nn.functional.silu(g) * u
            y = W2[e] @ a + (layer.w2_bias[e].float() if bias else 0)
            out[t] += wts[t, j] * y
    return out


def c_to_python(impl):
    """A Python function (a, b) -> tensor for one of the C expressions vLLM hands to Humming (its activation.py
    forms: a bare expression in a, b, or an immediately-called lambda of const float statements)."""
    s = re.sub(r'(\d+\.\d*)f\b', r'\1', impl.strip())
    m = re.match(r'^\[\]\(float a(?:, float b)?\)\s*\{(.*)\}\((?:a|a, b)\)$', s, re.S)
    lines = []
    if m:
        for st in [p.strip() for p in m.group(1).split(';') if p.strip()]:
            d = re.match(r'^const float (\w+) = (.*)$', st, re.S)
            if d:
                lines.append(f'{d.group(1)} = {d.group(2)}')
            elif st.startswith('return '):
                lines.append('return ' + st[len('return '):])
            else:
                raise ValueError(f'cannot translate statement {st!r}')
    else:
        lines.append('return ' + s)
    src = 'def _f(a, b):\n' + '\n'.join('    ' + ' '.join(ln.split()) for ln in lines)

    def t(v):
        return v if isinstance(v, torch.Tensor) else torch.tensor(float(v))
    ns = dict(fminf=lambda x, y: torch.minimum(t(x), t(y)), fmaxf=lambda x, y: torch.maximum(t(x), t(y)),
              expf=lambda x: torch.exp(t(x)), erff=lambda x: torch.erf(t(x)), tanhf=lambda x: torch.tanh(t(x)))
    exec(src, ns)  # noqa: S102 -- our own transcribed constants, checked here
    return ns['_f']


def humming_python():
    """Import humming's Python (the real 0.1.19 package), from the wheel in the peers cache if needed."""
    try:
        import humming
        return humming, 'import humming'
    except ImportError:
        pass
    whl = os.environ.get('PEERS_HUMMING_WHEEL') or next(iter(sorted(glob.glob(os.path.expanduser(
        '~/.cache/w4a16-peers/humming_kernels-0.1.19-*.whl')))), None)
    if not whl or not os.path.isfile(whl):
        return None, 'no humming package and no humming_kernels-0.1.19 wheel in ~/.cache/w4a16-peers'
    d = tempfile.mkdtemp(prefix='mxfp4_smoke_humming_')
    atexit.register(shutil.rmtree, d, True)
    with zipfile.ZipFile(whl) as z:
        z.extractall(d, [n for n in z.namelist() if n.startswith('humming/') and not n.startswith('humming/_native')])
    sys.path.insert(0, d)
    import humming
    return humming, f'{os.path.basename(whl)} unzipped into {d}'


# ================================================================================================= emulated Humming
class HummingEmulation:
    """Context manager: the device-bound Humming entry points the glue calls, replaced by torch emulations of
    their documented semantics (calls recorded in ``self.calls``)."""

    BLOCK = 16

    def __init__(self, humming_mod):
        self.h = humming_mod
        self.calls = []
        self._undo = []

    def _patch(self, obj, name, value):
        self._undo.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    def __enter__(self):
        import humming.forward as hf
        import humming.schema as hs
        import humming.transform as ht
        import humming.tune as htu
        from humming.config import InputQuantizationMode

        import humming_moe
        emu = self

        def transform(tensors, shape_n, shape_k, weight_schema, input_schema=None, num_experts=None,
                      pad_n_to_multiple=1, pad_k_to_multiple=1, has_bias=False, torch_dtype=None, device=None):
            emu.calls.append(('transform', shape_n, shape_k, has_bias, sorted(tensors), str(weight_schema.b_dtype),
                              str(weight_schema.bs_dtype), weight_schema.weight_scale_group_size))
            assert tensors['weight'].dtype == torch.int32 and tensors['weight_scale'].dtype == torch.float8_e8m0fnu
            cfg = type('EmulatedLayerConfig', (), {})()
            cfg.shape_n, cfg.shape_k, cfg.pad_shape_n, cfg.pad_shape_k = shape_n, shape_k, 0, 0
            cfg.num_experts, cfg.has_bias, cfg.weight_scale_group_size = num_experts, has_bias, 32
            cfg.a_dtype = cfg.c_dtype = emu.h.dtypes.bfloat16
            cfg.b_dtype, cfg.bs_dtype = weight_schema.b_dtype, weight_schema.bs_dtype
            cfg.input_quant_mode = InputQuantizationMode.Disabled
            return cfg, dict(tensors)

        def tuning(layer_config, **kw):
            return [[0, 1 << 30, {"block_shape": [emu.BLOCK, 128, 64]}]]

        def process_input(config, inputs, *, outputs=None, activation_type='none', activation_impl=None,
                          layout='normal', scatter_idx=None, num_valid_tokens=None, **kw):
            emu.calls.append(('process_input', activation_type, layout))
            if activation_type == 'none':
                if outputs is not None and outputs is not inputs:
                    outputs.copy_(inputs)
                    return outputs, None, None
                return inputs, None, None
            f = c_to_python(activation_impl)
            v = inputs.float()
            if activation_type == 'binary_split':
                half = v.shape[1] // 2
                a, b = v[:, :half], v[:, half:]
            else:
                assert activation_type == 'binary_interleaved', activation_type
                a, b = v[:, 0::2], v[:, 1::2]
            outputs.copy_(f(a, b).to(outputs.dtype))
            return outputs, None, None

        def forward(config, inputs, weight, weight_scale=None, zero_point=None, bias=None, weight_scale_2=None,
                    outputs=None, input_scale=None, input_scale_2=None, sorted_ids=None, expert_ids=None,
                    num_tokens_padded=None, top_k=1, tuning_config=None, **kw):
            emu.calls.append(('gemm', config.shape_n, config.shape_k, bias is not None, top_k))
            assert zero_point is None and weight_scale_2 is None and input_scale is None
            blk = json.loads(tuning_config)[0][2]["block_shape"][0]
            w8 = weight.contiguous().view(torch.uint8)
            numel = outputs.shape[0]
            for b in range(int(num_tokens_padded.item()) // blk):
                e = int(expert_ids[b])
                if e < 0:
                    continue
                ids = sorted_ids[b * blk:(b + 1) * blk].long()
                ids = ids[ids < numel]
                if ids.numel() == 0:
                    continue
                W = dequant(w8[e], weight_scale[e].view(torch.uint8))
                y = inputs[ids // top_k].float() @ W.t()
                if bias is not None:
                    y = y + bias[e].float()
                outputs[ids] = y.to(outputs.dtype)
            return outputs

        self._patch(torch.cuda, 'device', lambda d=None: contextlib.nullcontext())
        self._patch(hs.HummingInputSchema, 'is_compatible_with', lambda self, ws, pd=None: True)
        self._patch(ht, 'prepare_and_transform_humming_tensors', transform)
        self._patch(htu, 'get_heuristics_config', tuning)
        self._patch(hf, 'may_process_input', process_input)
        self._patch(hf, 'humming_forward', forward)
        self._patch(humming_moe, '_num_sms', lambda device: 4)
        return self

    def __exit__(self, *exc):
        for obj, name, old in reversed(self._undo):
            setattr(obj, name, old)
        return False


# ================================================================================================= main
def main(args):
    import mxfp4_bench as mb
    n_ok = n_bad = 0

    def check(name, cond, detail=''):
        nonlocal n_ok, n_bad
        log(('PASS ' if cond else 'FAIL ') + name + (f'  [{detail}]' if detail else ''))
        n_ok += bool(cond)
        n_bad += not cond

    dev = 'cpu'
    import w4a16_moe as wm
    from w4a16_moe.bench import records as rec
    from w4a16_moe.bench.workloads import Workload, make_weights

    # 1. data
    a = md.make_layer(3, 64, 96, torch.Generator().manual_seed(md.SEED), dev)
    b = md.make_layer(3, 64, 96, torch.Generator().manual_seed(md.SEED), dev)
    check('data: deterministic', mb._sig(a) == mb._sig(b))
    wl = Workload('t', 't', 3, 3, 64, 96, 2, 'mxfp4', (1, ))
    pw = make_weights(wl, torch.Generator().manual_seed(md.SEED), dev)
    check('data: the same draws as the project benchmark for an mxfp4 layer (w4a16_moe.bench.workloads)',
          torch.equal(pw.w13.codes, a.w13_blocks) and torch.equal(pw.w13.scales, a.w13_scales) and
          torch.equal(pw.w2.codes, a.w2_blocks) and torch.equal(pw.w2.scales, a.w2_scales))
    check('data: shapes / dtypes', tuple(a.w13_blocks.shape) == (3, 192, 32) and tuple(a.w13_scales.shape) == (3, 192, 2)
          and tuple(a.w2_blocks.shape) == (3, 64, 48) and tuple(a.w2_scales.shape) == (3, 64, 3) and
          a.w13_bias.dtype == torch.bfloat16 and tuple(a.w2_bias.shape) == (3, 64) and a.w13_blocks.dtype == torch.uint8)
    nib = torch.stack([a.w13_blocks & 15, a.w13_blocks >> 4]).flatten()
    hist = torch.bincount(nib.long(), minlength=16).float() / nib.numel()
    check('data: E2M1 codes uniform over 0..15', bool((hist - 1 / 16).abs().max() < 0.02))
    big = md.make_layer(2, 2880, 2880, torch.Generator().manual_seed(md.SEED), dev)
    exps = set((torch.unique(big.w13_scales).int() - 127).tolist()) | set((torch.unique(big.w2_scales).int() - 127).tolist())
    check('data: gpt-oss sizes (K = 2880): E8M0 exponents in {-8, -7}', exps <= {-8, -7}, str(sorted(exps)))
    x, ids, wts = md.make_row(6, 2880, 2, 2, torch.Generator().manual_seed(1), dev)
    for v in ('full', 'plain'):
        act, bias = mb.VARIANTS[v][:2]
        r = md.reference(x, ids, wts, md.project_weights(big, bias, act), act)
        check(f'data: gpt-oss sizes, {v}: output O(1)', 0.2 < r.std().item() < 5, f'std {r.std().item():.3f}')
    del big

    # 2. reference against an independent dense loop; the gate
    lay = md.make_layer(6, 128, 64, torch.Generator().manual_seed(md.SEED), dev)
    x, ids, wts = md.make_row(19, 128, 8, 3, torch.Generator().manual_seed(2), dev)
    for v in ('full', 'plain'):
        act, bias = mb.VARIANTS[v][:2]
        ref = md.reference(x, ids, wts, md.project_weights(lay, bias, act), act)
        dl = dense_loop(x, ids, wts, lay, bias, act == 'swiglu_oai')
        err = ((ref - dl).norm() / dl.norm()).item()
        check(f'reference ({v}: {act}, bias={bias}) == independent dense FP32 loop (E_global 8 > E 6: non-local '
              'ids contribute nothing)', err < 1e-5, f'rel err {err:.2e}')
    ref = md.reference(x, ids, wts, md.project_weights(lay, True, 'swiglu_oai'), 'swiglu_oai')
    e1 = md.nrmse(dense_loop(x, ids, wts, lay, False, True), ref)
    e2 = md.nrmse(dense_loop(x, ids, wts, lay, True, False), ref)
    check(f'gate catches a missing bias (NRMSE {e1:.3f}) and plain SwiGLU for swiglu_oai ({e2:.3f})',
          e1 >= md.NRMSE_GATE and e2 >= md.NRMSE_GATE)
    swapped = md.Mxfp4Layer(torch.cat([lay.w13_blocks[:, 64:], lay.w13_blocks[:, :64]], 1),
                            torch.cat([lay.w13_scales[:, 64:], lay.w13_scales[:, :64]], 1), lay.w2_blocks,
                            lay.w2_scales, torch.cat([lay.w13_bias[:, 64:], lay.w13_bias[:, :64]], 1), lay.w2_bias)
    e3 = md.nrmse(dense_loop(x, ids, wts, swapped, True, True), ref)
    check(f'gate catches swapped gate/up halves (NRMSE {e3:.3f})', e3 >= md.NRMSE_GATE)
    from w4a16_moe.bench.layers import build_workload
    from w4a16_moe.bench.workloads import benchmark_rows, floor_us
    fids = torch.tensor([[0, 1], [1, 9]], dtype=torch.int32)
    fl = md.floor_model(fids, 4, 2880, 2880, 2)
    w_el = 3 * 2880 * 2880
    gwl = build_workload(preset='gpt-oss-120b')[0]
    small = dataclasses.replace(gwl, local_experts=4, global_experts=10)
    pfl = floor_us(small, md.project_weights(md.make_layer(4, 2880, 2880, torch.Generator().manual_seed(0), dev),
                                             True, 'swiglu_oai'), 2, fids)
    check('floor model: hit / routes / bytes (codes + E8M0) == the project benchmark\'s floor_us', fl['experts_present']
          == 2 and fl['local_routes'] == 3 and fl['bytes'] == 2 * (w_el // 2 + w_el // 32) + 2 * 2880 * 4 and
          fl['floor_eff_us'] == max(fl['floor_us'], 6.0) and abs(pfl['floor_eff_us'] - fl['floor_eff_us']) < 1e-9 and
          pfl['bytes'] == fl['bytes'], json.dumps(fl))
    # the project's bench --preset gpt-oss-120b draws the same layer and rows (biases included)
    tiny = dataclasses.replace(gwl, local_experts=3, global_experts=5, hidden=64, intermediate=96, top_k=2)
    g1, g2 = torch.Generator().manual_seed(md.SEED), torch.Generator().manual_seed(md.SEED)
    pw = make_weights(tiny, g1, dev)
    prow = benchmark_rows(tiny, [16, 7], g1, dev)
    ly = md.make_layer(3, 64, 96, g2, dev)
    rows = md.make_rows([16, 7], tiny.tokens, 64, 5, 2, g2, dev)
    same_rows = all(torch.equal(rows[t][0], prow[t][0]) and torch.equal(rows[t][1], prow[t][2]) and
                    torch.equal(rows[t][2], prow[t][1]) for t in (16, 7))
    check('data: == the project\'s bench --preset gpt-oss-120b (weights, biases, rows of a subset run)',
          torch.equal(pw.w13.codes, ly.w13_blocks) and torch.equal(pw.w2.scales, ly.w2_scales) and
          torch.equal(pw.w13_bias, ly.w13_bias) and torch.equal(pw.w2_bias, ly.w2_bias) and same_rows)

    # 3. activation expressions and interleaving (humming_mxfp4 imports humming_moe, not humming)
    sys.path.insert(1, mb.peers_bin_dirs()[0]) if mb.peers_bin_dirs() else None
    try:
        hm = mb.import_humming_glue()
    except ImportError as e:
        hm = None
        check(f'humming_mxfp4 imports ({e})', False)
    if hm is not None:
        from w4a16_moe.activations import apply_activation
        g = torch.linspace(-12, 12, 97)
        A, B = torch.meshgrid(g, g, indexing='ij')
        for act, spec in hm._ACTIVATIONS.items():
            f = c_to_python(spec['activation_impl'])
            want = apply_activation(torch.cat([A, B], -1), act)
            got = f(A, B)
            err = (got - want).abs().max().item()
            check(f'Humming activation expression for {act} ({spec["activation_type"]}) == the project\'s {act} '
                  'on [-12, 12]^2 (clamps included)', err < 1e-4, f'max abs err {err:.2e}')
        t = torch.arange(2 * 6 * 3).reshape(2, 6, 3)
        it = hm.interleave_gate_up(t)
        check('interleave_gate_up: row 2i = gate i, row 2i+1 = up i (weights [E, 2I, K] and biases [E, 2I])',
              torch.equal(it[:, 0::2], t[:, :3]) and torch.equal(it[:, 1::2], t[:, 3:]) and
              torch.equal(hm.interleave_gate_up(t[..., 0])[:, 1::2], t[:, 3:, 0]))

    # 4. the Humming glue end to end with emulated kernels
    hmod, where = humming_python() if hm is not None else (None, 'humming_mxfp4 did not import')
    factory = None
    if hmod is None:
        log(f'SKIP Humming glue emulation: {where}')
    else:
        log(f'humming {getattr(hmod, "__version__", "?")} Python: {where}')
        lay = md.make_layer(6, 128, 64, torch.Generator().manual_seed(md.SEED), dev)
        x, ids, wts = md.make_row(21, 128, 6, 3, torch.Generator().manual_seed(3), dev)
        for v in ('full', 'plain'):
            act, bias = mb.VARIANTS[v][:2]
            ref = md.reference(x, ids, wts, md.project_weights(lay, bias, act), act)
            with HummingEmulation(hmod) as emu:
                inter = hm.interleave_gate_up if act == 'swiglu_oai' else (lambda t: t)
                mm = hm.HummingMxfp4MoE(inter(lay.w13_blocks), inter(lay.w13_scales), lay.w2_blocks, lay.w2_scales,
                                        w13_bias=inter(lay.w13_bias) if bias else None,
                                        w2_bias=lay.w2_bias if bias else None, activation=act)
                out = mm(x, ids, wts)
                e = md.nrmse(out, ref)
                kinds = [c for c in emu.calls if c[0] == 'transform']
                gem = [c for c in emu.calls if c[0] == 'gemm']
                pin = [c for c in emu.calls if c[0] == 'process_input' and c[1] != 'none']
            check(f'humming glue ({v}): output vs reference NRMSE {e:.4f} < {md.NRMSE_GATE}', e < md.NRMSE_GATE)
            check(f'humming glue ({v}): quant_method {hm.STATUS.get("quant_method")}, both sublayers transformed '
                  f'with bias={bias}, float4e2m1 / float8e8m0 / group 32; GEMMs got the bias; activation '
                  f'{pin[0][1] if pin else None}',
                  hm.STATUS.get('quant_method') == hm._QUANT_METHOD[act] and len(kinds) == 2 and
                  all(k[3] == bias and ('bias' in k[4]) == bias and k[5] == 'float4e2m1' and k[6] == 'float8e8m0'
                      and k[7] == 32 for k in kinds) and len(gem) == 2 and all(g_[3] == bias for g_ in gem) and
                  len(pin) == 1 and pin[0][1] == hm._ACTIVATIONS[act]['activation_type'], json.dumps(emu.calls[:6]))
        # the wrong row order must fail the gate (the glue does not reorder by itself)
        with HummingEmulation(hmod):
            mm = hm.HummingMxfp4MoE(lay.w13_blocks, lay.w13_scales, lay.w2_blocks, lay.w2_scales,
                                    w13_bias=lay.w13_bias, w2_bias=lay.w2_bias, activation='swiglu_oai')
            e = md.nrmse(mm(x, ids, wts), md.reference(x, ids, wts, md.project_weights(lay, True, 'swiglu_oai'),
                                                       'swiglu_oai'))
        check(f'humming glue: un-interleaved rows with swiglu_oai fail the gate (NRMSE {e:.3f})', e >= md.NRMSE_GATE)
        try:
            with HummingEmulation(hmod):
                hm.HummingMxfp4MoE(lay.w13_blocks, lay.w13_scales, lay.w2_blocks, lay.w2_scales,
                                   w13_bias=lay.w13_bias.float(), w2_bias=lay.w2_bias.float())
            check('humming glue: FP32 biases refused (vLLM keeps them BF16)', False)
        except ValueError as ex:
            check('humming glue: FP32 biases refused (vLLM keeps them BF16)', 'w13_bias' in str(ex), str(ex)[:80])

        class EmulatedFactory:
            """HummingMxfp4MoE whose calls run under the emulation (for run() below)."""

            def __init__(self, *a, **kw):
                self.emu = HummingEmulation(hmod)
                with self.emu:
                    self.m = hm.HummingMxfp4MoE(*a, **kw)

            def __call__(self, x, ids, wts):
                with self.emu:
                    return self.m(x, ids, wts)
        factory = (EmulatedFactory, hm.STATUS, hm.interleave_gate_up)

    # 5. the project's Triton provider in the interpreter (FP16 there: the interpreter has no BF16), then run()
    from w4a16_moe.providers import triton_unavailable_reason
    from w4a16_moe.device import probe
    why = triton_unavailable_reason(None, probe(torch.device('cpu')))
    if why is not None or os.environ.get('TRITON_INTERPRET') != '1':
        log(f'SKIP project Triton provider: {why or "TRITON_INTERPRET is not 1"}')
    else:
        lay = md.make_layer(6, 128, 64, torch.Generator().manual_seed(md.SEED), dev)
        for eg in (6, 8):
            x, ids, wts = md.make_row(13, 128, eg, 3, torch.Generator().manual_seed(4), dev, torch.float16)
            for v in ('full', 'plain'):
                act, bias = mb.VARIANTS[v][:2]
                w = md.project_weights(lay, bias, act)
                ref = md.reference(x, ids, wts, w, act)
                errs = [md.nrmse(wm.fused_moe(x, w, wts, ids, activation=act, finalize=f, backend='triton'), ref)
                        for f in ('deterministic', 'fused')]
                check(f'project Triton provider ({v}, E 6 of {eg}, FP16 x, interpreter): NRMSE '
                      f'{errs[0]:.4f} / {errs[1]:.4f} (deterministic / fused) < {md.NRMSE_GATE}',
                      max(errs) < md.NRMSE_GATE)
    # run() end to end (--no-time): the project through backend='reference' (BF16 on the CPU; recorded as its
    # provider and marked ^), humming through the emulation above
    out_dir = args.out or tempfile.mkdtemp(prefix='mxfp4_smoke_')
    sa = type('A', (), {})()
    impls = ['w4a16_moe', 'w4a16_moe_fused'] + (['humming'] if factory else [])
    sa.tokens, sa.impls, sa.samples, sa.rep, sa.deadline, sa.seed = [1, 5, 24], impls, 1, 1, 0, md.SEED
    sa.no_time, sa.w4a16_backend, sa.argv, sa.out, sa.revision = True, 'reference', ['--cpu-smoke'], out_dir, None
    sa.variants = ['full', 'plain']
    cfg = dict(E_local=6, H=128, I=64, topk=3, E_global=6, preset=None)
    res = mb.run(cfg, sa, device='cpu', timer=None, humming_factory=factory)
    for v, (recs, notes) in res.items():
        name = mb.layer_name(cfg, v)
        by = {(r['tokens'], r['impl']): r for r in recs}
        okc = all(by.get((t, n), {}).get('nrmse') is not None and by[(t, n)]['nrmse'] < md.NRMSE_GATE
                  for t in sa.tokens for n in impls)
        check(f'run() {name}: {len(recs)} records, {"/".join(impls)} pass the gate at T=1,5,24',
              okc and len(recs) == 3 * len(impls), ', '.join(f'{k[1]}@{k[0]}={r["nrmse"]}' for k, r in by.items()))
        try:
            loaded = json.load(open(os.path.join(out_dir, f'{name}.json')))
            rec.check_records(loaded)
            md_text = open(os.path.join(out_dir, f'{name}.md')).read()
            good = (len(loaded) == len(recs) and all(r['scheme'] == 'mxfp4' and r['variant'] == v for r in loaded)
                    and f'# {name} (bf16)' in md_text and '| tokens |' in md_text)
            proj = [r for r in loaded if r['impl'] in mb.PROJECT]
            check(f'run() {name}: {name}.json passes the records schema, {name}.md renders; every project record '
                  f'names its provider and is marked ^ (not cute)', good and proj and
                  all(r.get('provider') == 'reference' and '^' in r['marks'] for r in proj))
        except Exception as ex:  # noqa
            check(f'run() {name}: outputs', False, f'{type(ex).__name__}: {ex}')
    check('layer names: gpt-oss-120b / gpt-oss-120b-swiglu-nobias', mb.layer_name(
        dict(preset='gpt-oss-120b'), 'full') == 'gpt-oss-120b' and
        mb.layer_name(dict(preset='gpt-oss-120b'), 'plain') == 'gpt-oss-120b-swiglu-nobias')
    try:
        from w4a16_moe.bench.presets import PRESETS as PP
        p = PP.get('gpt-oss-120b')
        check('the project preset gpt-oss-120b matches (128, 2880, 2880, 4, mxfp4, swiglu_oai, biases)', p is not None
              and (p.local_experts, p.hidden, p.intermediate, p.top_k, p.global_experts) ==
              mb.PRESETS['gpt-oss-120b'][:5] and getattr(p, 'scheme', None) == 'mxfp4' and
              getattr(p, 'activation', None) == 'swiglu_oai' and getattr(p, 'bias', None) is True)
    except ImportError as ex:
        check('project presets import', False, str(ex))
    log(f'outputs in {out_dir}')
    log(f'cpu-smoke: {n_ok} passed, {n_bad} failed')
    return 0 if n_bad == 0 else 1


if __name__ == '__main__':
    import mxfp4_bench
    sys.exit(mxfp4_bench.main(['--cpu-smoke'] + sys.argv[1:]))
