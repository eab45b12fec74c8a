"""Does a residency-aware wave term pick better warp tiles? Regret of each model's pick among the five warp tiles
(TN 8 / 16 / 24 / 32 / 64, unsplit) on every row of an unsplit sweep (CPU):

- shipped: the shipped H200-fitted warp entries (``cost_model.predict_us``);
- kernel M0 / M2: per-kernel fits of ``tail_fit.py`` (M0: slots searched; M2: the kernels' residency with a tail
  floor), fitted leaving the row's layer out, the pick being the lowest predicted gate/up + down time;
- call M0 / M2: the same feature forms fitted jointly on the call time less route preparation and finalize.

Regret of a row = measured call time of the pick / the fastest tile's - 1.

    python docs/perf/2026-12-07-tn8-waves/regret.py docs/perf/2026-12-06-occupancy/unsplit.json
"""
import json, os, sys, types
import numpy as np

sys.path.insert(0, 'python')  # run from the checkout root
here = os.path.dirname(__file__)
src = open(os.path.join(here, 'tail_fit.py')).read().split('obs = load(sys.argv[1:])')[0]
tf = types.ModuleType('tail_fit'); exec(src, tf.__dict__)
from w4a16_moe.kernels.cute import cost_model as cm
from w4a16_moe.kernels.cute.cost_model import row_blocks
from w4a16_moe.kernels.cute.warp import family as wf
from w4a16_moe.formats.schemes import get_scheme

path = sys.argv[1]
obs = tf.load([path])
d = json.load(open(path))
calls, gemms = {}, {}
for r in d['rows']:
    for x in r['results']:
        if x.get('family') == 'warp' and 'us' in x and 'split-K 1' in x['choice']:
            key = (r['layer'], r['tokens'], x['tiles']['tokens_per_tile'])
            ks = [v[1] for v in x['kernels']]
            calls[key], gemms[key] = x['us'], x['us'] - ks[0] - ks[-1]
layers = sorted(set(o['layer'] for v in obs.values() for o in v))
NAME = {8: 'warp t8_k128_s4_w4_m2', 16: 'warp t16_k128_s4_w4_m2', 24: 'warp t24_k128_s4_w4_m2',
        32: 'warp t32_k128_s4_w4_m2', 64: 'warp t64_k64_s4_w4_m2'}


def cfg_of(gemm, tn, kt):
    u, dn = wf.gemm_configs(get_scheme('int4_g128'), 'bf16', 'swiglu', True, 'deterministic',
                            dict(tokens_per_tile=tn, k_tile=kt, stages=4, warps=4, m16_per_warp=2))
    return u if gemm == 'up' else dn


def feat(gemm, tn, kt, x, S, St):
    cfg = cfg_of(gemm, tn, kt)
    rows = cfg.rows_per_cta
    stream = dict(row_blocks=cfg.row_blocks, k_tile=cfg.k_tile) if getattr(cfg, 'streams', False) else None
    n, k = (2 * x['i'], x['h']) if gemm == 'up' else (x['h'], x['i'])
    r = row_blocks(dict(rows=rows, stream=stream), tn, n, k, x['routes'], x['experts'])
    return tf.feats(rows, tn, n, k, x['tiles'], S, r, St)


def nnls_rel(X, y, iters=3000):
    """Non-negative least squares on the relative error (projected gradient)."""
    A = X / y[:, None]; b = np.ones_like(y)
    c = np.clip(np.linalg.lstsq(A, b, rcond=None)[0], 0, None)
    L = np.linalg.norm(A, 2) ** 2
    for _ in range(iters):
        c = np.clip(c - (A.T @ (A @ c - b)) / L, 0, None)
    return c


def report(name, regs):
    a = np.array([r[0] for r in regs])
    print(f"{name:10s} rows {len(a)}: mean regret {a.mean():.3f}, > 5%: {(a > 0.05).sum()}, > 10%: {(a > 0.1).sum()}, "
          f"max {a.max():.3f} {max(regs)[1:]}")


def regrets(pred_of_layer):
    out = []
    for L in layers:
        for T, p in pred_of_layer(L).items():
            m = {tn: calls[(L, T, tn)] for tn in p}
            pick, best = min(p, key=p.get), min(m, key=m.get)
            out.append((m[pick] / m[best] - 1, L, T, pick, best))
    return out


def shipped(L):
    preds = {}
    for r in d['rows']:
        if r['layer'] != L:
            continue
        e, k, g = r['E'], r['top_k'], r.get('E_global', r['E'])
        preds[r['tokens']] = {tn: cm.predict_us(NAME[tn], r['tokens'] * k, e, r['H'], r['I'], True, k,
                                                 g if g > e else None) for tn in NAME}
    return preds


def kernel_fit(mode):
    def pred(L):
        preds = {}
        for (tn, kt), o in obs.items():
            tr = [x for x in o if x['layer'] != L]
            fits = {g: tf.fit(tr, g, tn, kt, mode) for g in ('up', 'down')}
            for x in o:
                if x['layer'] == L:
                    preds.setdefault(x['T'], {})[tn] = sum(
                        float(np.array(feat(g, tn, kt, x, f[1], f[2])) @ f[3]) for g, f in fits.items())
        return preds
    return pred


def call_fit(mode):
    def pred(L):
        preds = {}
        for (tn, kt), o in obs.items():
            tr = [x for x in o if x['layer'] != L]
            res = tf.RES[tn] * 132
            grid = [(S, None) for S in tf.SLOTS] if mode == 'M0' else [(res, f * res) for f in (0, .25, .5, .75, 1.0)]
            best = None
            for S, St in grid:
                X = np.array([feat('up', tn, kt, x, S, St) + feat('down', tn, kt, x, S, St) for x in tr])
                y = np.array([gemms[(x['layer'], x['T'], tn)] for x in tr])
                c = nnls_rel(X, y)
                err = float(np.sqrt(np.mean((X @ c / y - 1) ** 2)))
                if best is None or err < best[0]:
                    best = (err, S, St, c)
            _, S, St, c = best
            for x in o:
                if x['layer'] == L:
                    preds.setdefault(x['T'], {})[tn] = float(
                        np.array(feat('up', tn, kt, x, S, St) + feat('down', tn, kt, x, S, St)) @ c)
        return preds
    return pred


report('shipped', regrets(shipped))
for mode in ('M0', 'M2'):
    report(f'kernel {mode}', regrets(kernel_fit(mode)))
for mode in ('M0', 'M2'):
    report(f'call {mode}', regrets(call_fit(mode)))
