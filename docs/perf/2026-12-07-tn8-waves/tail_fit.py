"""Per-kernel fits of the warp tiles on an unsplit sweep (CPU): the shipped feature form with searched slots (M0), the
kernels' residency as slots (M1), and residency with a tail floor of St CTAs (M2); in sample and leave one layer out.

    python docs/perf/2026-12-07-tn8-waves/tail_fit.py docs/perf/2026-12-06-occupancy/unsplit.json
"""
import json, math, sys
import numpy as np
sys.path.insert(0, 'python')  # run from the checkout root
from w4a16_moe.kernels.cute.cost_model import row_blocks
from w4a16_moe.kernels.cute.tiles import expected_tiles
from w4a16_moe.kernels.cute.warp import family as wf
from w4a16_moe.formats.schemes import get_scheme

RES = {8: 5, 16: 4, 24: 3, 32: 3, 64: 4}   # CTAs per SM (ncu: 8/16/24 g32; cta_slots otherwise)
SLOTS = (132, 264, 396, 528, 660)

def load(paths):
    obs = {}
    for p in paths:
        d = json.load(open(p))
        for r in d['rows']:
            e, h, i, k, t = r['E'], r['H'], r['I'], r['top_k'], r['tokens']
            g = r.get('E_global', e)
            for x in r['results']:
                if 'us' not in x or x.get('family') != 'warp' or list(x['splits']) != [1, 1]: continue
                ks = [v[1] if isinstance(v, list) else v for v in x.get('kernels') or []]
                if len(ks) < 4: continue
                tn = x['tiles']['tokens_per_tile']; kt = x['tiles']['k_tile']
                key = (tn, kt)
                tiles = expected_tiles(t * k, e, tn, k, g if g > e else None)
                o = obs.setdefault(key, [])
                o.append(dict(layer=r['layer'], T=t, up=ks[-3], down=ks[-2], h=h, i=i, tiles=tiles, routes=t * k, experts=e))
    return obs

def feats(rows, tn, n, k, tiles, S, rbc, St):
    nrb = max(1, -(-max(1, -(-n // rows)) // rbc))
    ctas = nrb * max(1.0, tiles)
    bcta = rbc * rows * k / 2
    full = math.floor(ctas / S + 1e-9); rem = ctas - full * S
    if St is None:   # current: charge the partial wave as full (max(W, waves*S*...))
        waves = max(1, math.ceil(ctas / S - 1e-6))
        wb = max(tiles * n * k / 2, waves * S * bcta)
    else:
        waves = full + (1 if rem > 1e-9 else 0)
        wb = bcta * (full * S + (max(rem, St) if rem > 1e-9 else 0))
        wb = max(wb, tiles * n * k / 2)
    return [1.0, wb / 1e6, waves * tn * rbc * rows / 1e3, float(waves)]

def fit(obs, gemm, tn, kt, mode):
    cfg_up, cfg_down = wf.gemm_configs(get_scheme('int4_g128'), 'bf16', 'swiglu', True, 'deterministic',
                                       dict(tokens_per_tile=tn, k_tile=kt, stages=4, warps=4, m16_per_warp=2))
    cfg = cfg_up if gemm == 'up' else cfg_down
    rows = cfg.rows_per_cta
    stream = dict(row_blocks=cfg.row_blocks, k_tile=cfg.k_tile) if getattr(cfg, 'streams', False) else None
    g = dict(rows=rows, stream=stream)
    def nk(o): return (2 * o['i'], o['h']) if gemm == 'up' else (o['h'], o['i'])
    rbc = [row_blocks(g, tn, *nk(o), o['routes'], o['experts']) for o in obs]
    y = np.array([o[gemm] for o in obs])
    Sres = RES[tn] * 132
    grid = []
    if mode == 'M0': grid = [(S, None) for S in SLOTS]
    elif mode == 'M1': grid = [(Sres, None)]
    elif mode == 'M2': grid = [(Sres, f * Sres) for f in (0, .125, .25, .375, .5, .625, .75, 1.0)]
    best = None
    for S, St in grid:
        x = np.array([feats(rows, tn, *nk(o), o['tiles'], S, r, St) for o, r in zip(obs, rbc)])
        for keep in ((0, 1, 2, 3), (0, 1, 2), (0, 1, 3), (1, 2, 3), (0, 1), (1, 2), (1, 3), (1,)):
            xs = x[:, keep] / y[:, None]
            coef, *_ = np.linalg.lstsq(xs, np.ones_like(y), rcond=None)
            if (coef < 0).any(): continue
            c = np.zeros(4); c[list(keep)] = coef
            err = float(np.sqrt(np.mean((x @ c / y - 1) ** 2)))
            if best is None or err < best[0]: best = (err, S, St, c, x)
    return best

def predict(best, obs_one, gemm, tn, kt):
    err, S, St, c, _ = best
    return None

obs = load(sys.argv[1:])
for (tn, kt), o in sorted(obs.items()):
    layers = sorted(set(x['layer'] for x in o))
    for gemm in ('up', 'down'):
        line = [f"TN{tn} k{kt} {gemm} n={len(o)}"]
        for mode in ('M0', 'M1', 'M2'):
            b = fit(o, gemm, tn, kt, mode)
            # leave one layer out
            errs = []
            for L in layers:
                tr = [x for x in o if x['layer'] != L]; te = [x for x in o if x['layer'] == L]
                if len(tr) < 6: continue
                bb = fit(tr, gemm, tn, kt, mode)
                # evaluate bb on te with the same feature params
                _, S, St, c, _ = bb
                cfg_up, cfg_down = wf.gemm_configs(get_scheme('int4_g128'), 'bf16', 'swiglu', True, 'deterministic', dict(tokens_per_tile=tn, k_tile=kt, stages=4, warps=4, m16_per_warp=2))
                cfg = cfg_up if gemm == 'up' else cfg_down
                rows = cfg.rows_per_cta
                stream = dict(row_blocks=cfg.row_blocks, k_tile=cfg.k_tile) if getattr(cfg, 'streams', False) else None
                for x in te:
                    n, k = (2 * x['i'], x['h']) if gemm == 'up' else (x['h'], x['i'])
                    r = row_blocks(dict(rows=rows, stream=stream), tn, n, k, x['routes'], x['experts'])
                    pred = np.array(feats(rows, tn, n, k, x['tiles'], S, r, St)) @ c
                    errs.append(pred / x[gemm] - 1)
            loo = float(np.sqrt(np.mean(np.square(errs)))) if errs else float('nan')
            line.append(f"{mode}: rms {b[0]:.3f} (S {b[1]}, St {b[2] if b[2] is None else round(b[2]/b[1],3)}) loo {loo:.3f}")
        print(' | '.join(line))
