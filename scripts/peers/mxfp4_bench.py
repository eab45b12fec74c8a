#!/usr/bin/env python3
"""mxfp4_bench.py: the project beside Humming's MXFP4 MoE (vLLM 0.33's Humming path) on the gpt-oss layer, one H200.

  python3 scripts/peers/mxfp4_bench.py --preset gpt-oss-120b [--tokens 1,4,16] [--variants full,plain] --out DIR
  python3 scripts/peers/mxfp4_bench.py --layer E,H,I,topk[,E_global] ...
  python3 scripts/peers/mxfp4_bench.py --cpu-smoke [--out DIR]     (CPU: no timing, no Humming kernels)

Usually run through scripts/peers/run_mxfp4.sh on the GPU machine (README.md there). The layer: MXFP4 expert
weights (E2M1 codes, E8M0 scales per 32), BF16 activations and output, FP32 routing weights, int32 ids, routing
precomputed, no renormalization. Variants (--variants, each a layer name of its own in the records):

  full   the gpt-oss layer: per-expert BF16 biases + swiglu_oai (glu = min(gate, 7), lin = clamp(up, -7, 7),
         glu * sigmoid(1.702 glu) * (lin + 1)). Humming: vLLM's gpt-oss path (gpt_oss_mxfp4 schema, gate/up rows
         interleaved, binary_interleaved clamped-SiLU expression, bias in both GEMM epilogues).
         Layer name: the preset's (gpt-oss-120b).
  plain  MXFP4 + plain SwiGLU, no bias: vLLM's Humming path for other MXFP4 checkpoints (mxfp4 schema, SiLU).
         Same codes and scales. Layer name: <preset>-swiglu-nobias.

Implementations (--impls): w4a16_moe (fused_moe(finalize="deterministic")), w4a16_moe_fused (finalize="fused"),
humming (humming_mxfp4.py over the peers tool's humming_moe.py). Every project record names the provider the
project's own rules chose (``provider``; marked ``^`` when it is not ``cute``).

Method (peer_bench.py's): data mxfp4_data.py (seed 20260908); every output checked against the FP32 reference
(the project's reference_moe), NRMSE < 0.02 before it is timed; triton.testing.do_bench_cudagraph(rep) per
sample, --samples samples in alternating impl order, median. Timed: the whole local MoE call. Not timed: weight
conversion, JIT compilation (Humming precompiles in setup), first calls. Output per variant: DIR/<layer>.json
(a list of records, the schema of w4a16_moe.bench.records / docs/benchmarks) and DIR/<layer>.md.
"""
import time

_T_PROCESS = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import torch  # noqa: E402

import mxfp4_data as md  # noqa: E402

TOOL = 'scripts/peers/mxfp4_bench.py'
TOOL_VERSION = '1.0'
DEFAULT_TOKENS = (1, 4, 16, 64, 256, 1024, 4096)
IMPLS = ('w4a16_moe', 'w4a16_moe_fused', 'humming')
PROJECT = ('w4a16_moe', 'w4a16_moe_fused')
# name: (E_local, H, I, topk, E_global, what)
PRESETS = {'gpt-oss-120b': (128, 2880, 2880, 4, 128, 'gpt-oss-120b MoE layer, whole (MXFP4, biases, swiglu_oai)')}
VARIANTS = {  # variant: (activation, bias, layer-name suffix, what)
    'full': ('swiglu_oai', True, '', 'gpt-oss layer: biases + swiglu_oai (both sides)'),
    'plain': ('swiglu', False, '-swiglu-nobias', 'MXFP4 + plain SwiGLU, no bias (both sides)'),
}
MARK_HUMMING_FALLBACK, MARK_NOT_CUTE, MARK_PARTIAL = '*', '^', '~'


def log(*a):
    print(*a, flush=True)


def loud(msg):
    bar = '#' * 100
    log(f'{bar}\n# WARNING: {msg}\n{bar}')


# ================================================================================================= where things are
def peers_bin_dirs():
    """Candidate directories of the peers tool's humming_moe.py: $PEERS_BIN, the staged copy, the shared tool."""
    c = [os.environ.get('PEERS_BIN'), os.path.join(ROOT, '.device', 'peers', 'bin'),
         os.path.join(ROOT, '..', 'shared', 'tools', 'peers'), os.path.join(ROOT, '..', '..', 'shared', 'tools', 'peers'),
         '/work/shared/tools/peers']
    return [d for d in c if d and os.path.isfile(os.path.join(d, 'humming_moe.py'))]


def import_humming_glue():
    dirs = peers_bin_dirs()
    if not dirs:
        raise ImportError('humming_moe.py (the peers tool\'s INT4 Humming adapter) not found: stage with '
                          'shared/tools/peers/stage --no-project and carry .device/peers/bin, or set PEERS_BIN')
    if dirs[0] not in sys.path:
        sys.path.insert(1, dirs[0])
    import humming_mxfp4
    return humming_mxfp4


def revision():
    try:
        from w4a16_moe import settings
        if settings.get().revision:
            return settings.get().revision
    except Exception:  # noqa
        pass
    try:
        r = subprocess.run(['git', 'rev-parse', '--short=12', 'HEAD'], cwd=ROOT, capture_output=True, text=True,
                           timeout=10)
        if r.returncode == 0 and r.stdout.strip():
            d = subprocess.run(['git', 'status', '--porcelain'], cwd=ROOT, capture_output=True, text=True, timeout=10)
            return r.stdout.strip() + ('+dirty' if d.stdout.strip() else '')
    except Exception:  # noqa
        pass
    for d in peers_bin_dirs():
        p = os.path.join(d, 'STAGED.json')
        if os.path.isfile(p):
            try:
                st = json.load(open(p))
                return str(st['revision']) + ('+dirty' if st.get('dirty_files') else '') + ' (staged)'
            except Exception:  # noqa
                pass
    return None


def versions():
    v = dict(torch=torch.__version__, python=sys.version.split()[0], mxfp4_bench=TOOL_VERSION,
             cuda=torch.version.cuda)
    for name in ('triton', 'humming', 'w4a16_moe'):
        m = sys.modules.get(name)
        if m is None and name != 'humming':
            try:
                m = __import__(name)
            except Exception:  # noqa
                m = None
        v[name] = getattr(m, '__version__', None) if m is not None else None
    return v


def device_name(device):
    if str(device).startswith('cuda'):
        return torch.cuda.get_device_properties(0).name
    return 'cpu'


def sync(device):
    if str(device).startswith('cuda'):
        torch.cuda.synchronize()


# ================================================================================================= impls
class Impl:
    def __init__(self, name, fn, info=None, marks=''):
        self.name, self.fn, self.info, self.marks = name, fn, dict(info or {}), marks


def project_decision(mw, x, ids, wts, activation, backend):
    """(provider, reason) the project's own rules pick for this call (as peer_bench.py asks them)."""
    try:
        from w4a16_moe.providers import resolve_backend, select_provider
        from w4a16_moe.validate import check_moe_call
        call = check_moe_call(x, mw, wts, ids, activation=activation, expert_offset=0)
        d = select_provider(call, resolve_backend(backend))
        return d.provider, d.reason
    except Exception as e:  # noqa
        return None, f'{type(e).__name__}: {str(e)[:300]}'


def _sig(layer):
    return tuple(int(t.sum(dtype=torch.int64)) if not t.is_floating_point() else float(t.double().sum())
                 for t in (layer.w13_blocks, layer.w13_scales, layer.w2_blocks, layer.w2_scales, layer.w13_bias,
                           layer.w2_bias))


def build_impls(names, layer, variant, cfg, args, device, humming_factory=None):
    """{name: Impl} for one variant, {name: reason} for the skipped ones. ``humming_factory`` (tests) replaces
    humming_mxfp4.HummingMxfp4MoE."""
    activation, bias = VARIANTS[variant][:2]
    impls, skipped = {}, {}
    sig = _sig(layer)
    mw = None
    for name in names:
        t0 = time.time()
        try:
            if name in PROJECT:
                import w4a16_moe as wm
                if mw is None:
                    mw = md.project_weights(layer, bias, activation)
                fin = 'fused' if name == 'w4a16_moe_fused' else 'deterministic'
                kw = dict(activation=activation, finalize=fin, expert_offset=0)
                if args.w4a16_backend != 'auto':
                    kw['backend'] = args.w4a16_backend

                def fn(x, ids, wts, mw=mw, kw=kw, wm=wm):
                    return wm.fused_moe(x, mw, wts, ids, **kw)
                info = dict(version=getattr(wm, '__version__', '?'), file=getattr(wm, '__file__', '?'), finalize=fin,
                            backend=args.w4a16_backend,
                            env={k: v for k, v in os.environ.items() if k.startswith('W4A16_MOE_')})
                want = os.environ.get('PEERS_EXPECT_W4A16')
                if want and not os.path.realpath(info['file']).startswith(os.path.realpath(want) + os.sep):
                    info['unexpected_source'] = True
                    loud(f'w4a16_moe was imported from {info["file"]}, not from {want}')
                imp = Impl(name, fn, info)
                imp.weights = mw
            elif name == 'humming':
                if humming_factory is None:
                    hm = import_humming_glue()
                    factory, status = hm.HummingMxfp4MoE, hm.STATUS
                    inter = hm.interleave_gate_up
                else:
                    factory, status, inter = humming_factory
                ep = cfg['E_global'] != cfg['E_local']
                emap = None
                if ep:
                    emap = torch.full((cfg['E_global'], ), -1, dtype=torch.int32, device=device)
                    emap[:cfg['E_local']] = torch.arange(cfg['E_local'], dtype=torch.int32, device=device)
                if activation == 'swiglu_oai':  # the gpt-oss checkpoint order vLLM keeps for swigluoai
                    w13q, w13s = inter(layer.w13_blocks), inter(layer.w13_scales)
                    b13 = inter(layer.w13_bias) if bias else None
                else:
                    w13q, w13s, b13 = layer.w13_blocks, layer.w13_scales, layer.w13_bias if bias else None
                mm = factory(w13q, w13s, layer.w2_blocks, layer.w2_scales, w13_bias=b13,
                             w2_bias=layer.w2_bias if bias else None, activation=activation,
                             global_num_experts=cfg['E_global'] if ep else None, expert_map=emap,
                             precompile_topk=cfg['topk'] if str(device).startswith('cuda') else None)
                del w13q, w13s, b13
                sync(device)
                info = dict(status)
                ok = info.get('moe_C') in ('loaded', 'already registered')
                imp = Impl(name, lambda x, ids, wts, mm=mm: mm(x, ids, wts), info, '' if ok else MARK_HUMMING_FALLBACK)
                imp.module = mm
            else:
                raise ValueError(f'unknown impl {name!r}; expected one of {IMPLS}')
            sync(device)
            imp.info['setup_s'] = round(time.time() - t0, 2)
            impls[name] = imp
            short = {k: imp.info[k] for k in ('version', 'file', 'humming', 'moe_C', 'gemm_type', 'quant_method',
                                              'humming_activation', 'has_bias', 'precompile_s', 'unexpected_source')
                     if k in imp.info}
            log(f'  {name}: ready in {imp.info["setup_s"]:.1f} s  {json.dumps(short, default=str)}')
        except Exception as e:  # noqa
            log(traceback.format_exc()[-2500:])
            skipped[name] = f'{"import" if isinstance(e, ImportError) else "setup"} failed: {type(e).__name__}: ' \
                            f'{str(e)[:500]}'
        if _sig(layer) != sig:
            raise SystemExit(f'mxfp4_bench: the setup of {name} modified the shared weights in place')
    return impls, skipped


# ================================================================================================= run
def cuda_graph_timer(fn, rep):
    import triton.testing
    return triton.testing.do_bench_cudagraph(fn, rep=rep) * 1e3  # ms -> us


def layer_name(cfg, variant):
    base = cfg.get('preset') or (f'E{cfg["E_local"]}-H{cfg["H"]}-I{cfg["I"]}-k{cfg["topk"]}'
                                 + (f'-of{cfg["E_global"]}' if cfg['E_global'] != cfg['E_local'] else '') + '-mxfp4')
    if cfg.get('preset'):
        return base + VARIANTS[variant][2]
    return base + ('-swiglu_oai-bias' if variant == 'full' else '')


def measure_variant(variant, layer, rows, cfg, args, device, timer, t_start, humming_factory=None):
    """Records (one per token count and impl) and notes of one variant."""
    activation, bias = VARIANTS[variant][:2]
    name = layer_name(cfg, variant)
    log(f'== {name}: {VARIANTS[variant][3]}; E={cfg["E_local"]} (of {cfg["E_global"]}) H={cfg["H"]} I={cfg["I"]} '
        f'top-{cfg["topk"]}, tokens {",".join(map(str, args.tokens))}')
    impls, skipped = build_impls(list(args.impls), layer, variant, cfg, args, device, humming_factory)
    notes = [f'{VARIANTS[variant][3]}; data mxfp4_data.py seed {md.SEED}; {TOOL} {TOOL_VERSION}']
    for n, why in skipped.items():
        log(f'  SKIP {n}: {why}')
        notes.append(f'skipped {n}: {why}')
    if 'humming' in impls:
        h = impls['humming'].info
        notes.append('humming: ' + ', '.join(f'{k}={h.get(k)}' for k in (
            'humming', 'experts_class', 'quant_method', 'humming_activation', 'has_bias', 'moe_C', 'align',
            'permute', 'precompile_s') if k in h))
        if impls['humming'].marks:
            w = (f"vLLM's compiled _moe_C is NOT loaded ({h.get('moe_C')}): humming's route preparation ran as "
                 f"torch fallbacks, so humming is slower here than in vLLM (marked '{MARK_HUMMING_FALLBACK}')")
            loud(w)
            notes.append('WARNING: ' + w)
    dev_name, rev, vers = device_name(device), args.revision, versions()
    date = time.strftime('%Y-%m-%d', time.gmtime())
    shape = dict(E=cfg['E_local'], H=cfg['H'], I=cfg['I'], topk=cfg['topk'], E_global=cfg['E_global'])
    records, warned_provider, not_measured = [], False, []
    mw_ref = None
    for T in args.tokens:
        if args.deadline and time.time() - t_start > args.deadline:
            not_measured.append(T)
            continue
        x, ids, wts = rows[T]
        if mw_ref is None:
            mw_ref = md.project_weights(layer, bias, activation)
        fl = md.floor_model(ids, cfg['E_local'], cfg['H'], cfg['I'], T)
        ref = md.reference(x, ids, wts, mw_ref, activation)
        base = dict(layer=name, tokens=T, floor_eff_us=fl['floor_eff_us'], device=dev_name, revision=rev,
                    dtype='bf16', scheme='mxfp4', activation=activation, bias=bias, variant=variant, date=date,
                    source=f'{TOOL} ({name}.json)', floor_us=fl['floor_us'], experts_present=fl['experts_present'],
                    local_routes=fl['local_routes'], bound=fl['bound'], layer_shape=shape, versions=vers)
        recs, ok = {}, []
        for n, imp in impls.items():
            r = dict(base, impl=n, median_us=None, nrmse=None, marks=imp.marks)
            if n in PROJECT:
                prov, why = project_decision(imp.weights, x, ids, wts, activation, args.w4a16_backend)
                r['provider'], r['provider_reason'] = prov, why
                if prov != 'cute':
                    r['marks'] += MARK_NOT_CUTE
                    if not warned_provider:
                        warned_provider = True
                        w = f"w4a16_moe ran on provider {prov!r}, not its CuTe kernels (T={T}: {why})"
                        loud(w)
                        notes.append('WARNING: ' + w)
            try:
                t0 = time.time()
                out = imp.fn(x, ids, wts)
                sync(device)
                r['first_call_s'] = round(time.time() - t0, 3)
                if tuple(out.shape) != tuple(x.shape):
                    raise RuntimeError(f'output shape {tuple(out.shape)} != {tuple(x.shape)}')
                e = md.nrmse(out, ref)
                r['nrmse'] = e if e == e and e != float('inf') else None
                if e < md.NRMSE_GATE:
                    ok.append(n)
                else:
                    r['error'] = f'NRMSE {e:.4g} >= {md.NRMSE_GATE}: not timed'
                del out
            except Exception as ex:  # noqa
                r['error'] = f'{type(ex).__name__}: {str(ex)[:400]}'
                log(traceback.format_exc()[-2000:])
            recs[n] = r
        del ref
        samples = {n: [] for n in ok}
        if not args.no_time:
            for s in range(args.samples):
                if args.deadline and s > 0 and time.time() - t_start > args.deadline:
                    break
                for n in (ok if s % 2 == 0 else ok[::-1]):
                    if 'error' in recs[n]:
                        continue
                    try:
                        samples[n].append(timer(lambda fn=impls[n].fn: fn(x, ids, wts), args.rep))
                    except Exception as ex:  # noqa
                        recs[n]['error'] = f'timing: {type(ex).__name__}: {str(ex)[:300]}'
                        log(traceback.format_exc()[-1500:])
        for n in ok:
            sv = samples[n]
            if sv and 'error' not in recs[n]:
                recs[n]['samples_us'] = [round(v, 3) for v in sv]
                recs[n]['median_us'] = sorted(sv)[len(sv) // 2]
                if len(sv) < args.samples:
                    recs[n]['marks'] += MARK_PARTIAL
        line = f'  T={T:>5} hit {fl["experts_present"]:>3} routes {fl["local_routes"]:>5} floor_eff ' \
               f'{fl["floor_eff_us"]:8.2f}'
        for n, r in recs.items():
            cell = (f'{r["median_us"]:.2f}{r["marks"]}' if r['median_us'] else
                    (r.get('error', 'n/t')[:40] if 'error' in r else f'ok {r["nrmse"]:.4f}'))
            line += f' | {n} {cell} (nrmse {r["nrmse"] if r["nrmse"] is None else round(r["nrmse"], 4)})'
        log(line)
        records += list(recs.values())
        if args.out:
            write_outputs(records, notes, name, args.out)
    if not_measured:
        notes.append(f'not measured (deadline): {",".join(map(str, not_measured))}')
    if args.out:
        write_outputs(records, notes + [f'command: {" ".join(args.argv)}'], name, args.out)
    for imp in impls.values():  # free this variant's weights before the next one
        imp.fn = None
        for a in ('module', 'weights'):
            if hasattr(imp, a):
                delattr(imp, a)
    if str(device).startswith('cuda'):
        torch.cuda.empty_cache()
    return records, notes


def write_outputs(records, notes, name, out_dir):
    from w4a16_moe.bench import records as rec
    os.makedirs(out_dir, exist_ok=True)
    clean = [{k: v for k, v in r.items()} for r in records]
    rec.write_json(clean, os.path.join(out_dir, f'{name}.json'))
    rec.write_markdown(clean, os.path.join(out_dir, f'{name}.md'), notes=notes)


def run(cfg, args, device='cuda', timer=cuda_graph_timer, humming_factory=None):
    t_start = _T_PROCESS if device == 'cuda' else time.time()
    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed)
    layer = md.make_layer(cfg['E_local'], cfg['H'], cfg['I'], gen, device)
    rows = md.make_rows(args.tokens, DEFAULT_TOKENS if cfg.get('preset') else (), cfg['H'], cfg['E_global'],
                        cfg['topk'], gen, device)
    out = {}
    for v in args.variants:
        if args.deadline and time.time() - t_start > args.deadline:
            log(f'== {layer_name(cfg, v)}: not measured (deadline {args.deadline:.0f} s reached)')
            continue
        out[v] = measure_variant(v, layer, rows, cfg, args, device, timer, t_start, humming_factory)
    return out


# ================================================================================================= CLI
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument('--preset', default=None, help=f'one of {", ".join(PRESETS)} (default gpt-oss-120b)')
    ap.add_argument('--layer', default=None, help='E_local,H,I,topk[,E_global] instead of a preset')
    ap.add_argument('--variants', default='full,plain', help='full (biases + swiglu_oai) and/or plain (SwiGLU, no '
                                                             'bias); default %(default)s')
    ap.add_argument('--tokens', default=','.join(map(str, DEFAULT_TOKENS)), help='default %(default)s')
    ap.add_argument('--impls', default=','.join(IMPLS), help='default %(default)s')
    ap.add_argument('--samples', type=int, default=3)
    ap.add_argument('--rep', type=int, default=150, help='do_bench_cudagraph rep (ms), default %(default)s')
    ap.add_argument('--deadline', type=float, default=0, help='seconds from process start; rows after it are '
                                                              'not measured (0: none)')
    ap.add_argument('--seed', type=int, default=md.SEED)
    ap.add_argument('--w4a16-backend', default='auto', choices=('auto', 'cute', 'triton'))
    ap.add_argument('--no-time', action='store_true', help='check only (no timing)')
    ap.add_argument('--out', default=os.environ.get('OUT'), help='output directory (default $OUT)')
    ap.add_argument('--revision', default=None, help='the project revision to record (default: git / STAGED.json)')
    ap.add_argument('--cpu-smoke', action='store_true', help='CPU checks (see mxfp4_smoke.py)')
    args = ap.parse_args(argv)
    args.argv = [TOOL] + list(sys.argv[1:] if argv is None else argv)
    return ap, args


def resolve(ap, args):
    if args.preset and args.layer:
        ap.error('give at most one of --preset and --layer')
    if args.layer:
        p = [int(v) for v in args.layer.split(',') if v.strip()]
        if len(p) not in (4, 5):
            ap.error(f'--layer wants E_local,H,I,topk[,E_global], got {args.layer!r}')
        cfg = dict(E_local=p[0], H=p[1], I=p[2], topk=p[3], E_global=p[4] if len(p) == 5 else p[0], preset=None)
    else:
        name = args.preset or 'gpt-oss-120b'
        if name not in PRESETS:
            ap.error(f'--preset: unknown preset {name!r}; presets: {", ".join(PRESETS)}')
        E, H, I, k, Eg, _ = PRESETS[name]
        cfg = dict(E_local=E, H=H, I=I, topk=k, E_global=Eg, preset=name)
    errs = []
    if min(cfg['E_local'], cfg['H'], cfg['I'], cfg['topk']) < 1 or cfg['E_global'] < cfg['E_local']:
        errs.append('sizes must be positive and E_global >= E_local')
    if cfg['topk'] > cfg['E_global']:
        errs.append(f'topk {cfg["topk"]} > E_global {cfg["E_global"]}')
    for n in ('H', 'I'):
        if cfg[n] % 32:
            errs.append(f'{n}={cfg[n]} is not a multiple of 32 (MXFP4 groups)')
    try:
        args.tokens = [int(t) for t in args.tokens.split(',') if t.strip()]
    except ValueError:
        errs.append(f'--tokens: expected comma-separated integers, got {args.tokens!r}')
    if any(t < 1 for t in args.tokens) or len(set(args.tokens)) != len(args.tokens) or not args.tokens:
        errs.append('--tokens: positive, distinct token counts')
    args.variants = [v.strip() for v in args.variants.split(',') if v.strip()]
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad or not args.variants:
        errs.append(f'--variants: expected a list of {", ".join(VARIANTS)}, got {bad or "nothing"}')
    args.impls = [v.strip() for v in args.impls.split(',') if v.strip()]
    bad = [v for v in args.impls if v not in IMPLS]
    if bad or not args.impls:
        errs.append(f'--impls: expected a list of {", ".join(IMPLS)}, got {bad or "nothing"}')
    if args.samples < 1 or args.rep < 1:
        errs.append('--samples and --rep must be >= 1')
    if errs:
        ap.error('; '.join(errs))
    return cfg


def main(argv=None):
    ap, args = parse_args(argv)
    if args.cpu_smoke:
        import mxfp4_smoke
        return mxfp4_smoke.main(args)
    cfg = resolve(ap, args)
    if not torch.cuda.is_available():
        ap.error('no CUDA GPU here (use --cpu-smoke for the CPU checks)')
    if args.revision is None:
        args.revision = revision()
    log(f'mxfp4_bench {TOOL_VERSION}: {json.dumps(cfg)} variants {args.variants} impls {args.impls} revision '
        f'{args.revision} gpu {device_name("cuda")}')
    run(cfg, args)
    return 0


if __name__ == '__main__':
    sys.exit(main())
