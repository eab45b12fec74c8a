"""Fit the grouped path's cost model (:mod:`w4a16_moe.kernels.cute.cost_model`) on ``sweep_tiles.py --kernels``
data and write its JSON (CPU; no GPU needed).

    python scripts/fit_cost_model.py docs/perf/2026-12-01-cost-model/sweep_*.json \\
        --out python/w4a16_moe/kernels/cute/cost_model.json [--revision REV] [--date D]

Each unsplit grouped choice of each row gives two observations (its gate/up and its down GEMM's kernel times);
per choice and GEMM, the slots ``S`` (132, 264, ..., 660 CTAs) and the coefficients ``a, b, c, d >= 0`` that
minimise the relative squared error are kept (a coefficient that would come out negative is dropped: the model
must not go below zero on layers outside the sweep). A choice needs observations on at least
``--min-rows`` rows; rows outside the layers the family lets the model choose it for
(``sm90.family.in_model_domain``: the ping-pong down GEMMs only where their activation tile stays resident) are
not used. Sweeps after ``--extend`` add choices: each one's rows fit only the choices that neither the main sweeps
nor an earlier ``--extend`` sweep measured, so the entries fitted before stay as they are (new tile shapes timed
beside the defaults extend the model without re-fitting it on another day's clocks). An extension choice whose
gate/up kernel is the gate/up kernel of a choice fitted before (same config: a new down GEMM behind a known gate/up
tile) takes that choice's gate/up fit (``up_from``) instead of a fit of its own: one kernel, one fit, from the
larger data set.

``--target call`` (what the shipped model is fitted with since docs/perf/2026-12-06-refit16) fits each choice's
two GEMMs together on its call time less the row's routing and finalize (the median of the row's route-preparation
kernels plus its shortest finalize kernel): one set of ``a`` (kept in the gate/up entry; the down entry's is 0),
``b, c, d`` per GEMM, slots per GEMM, so that the overlap of the launch chain (PDL: a kernel launched early waits
on its predecessor inside its own profiled time, so per-kernel times double-count it) is charged where it
happens. Each entry's ``rms_rel`` is then the joint fit's. Extensions fit their new choices the same way (no
``up_from``). ``--time-scale F`` multiplies those targets by ``F`` (an H100 sweep on the H200's clock: 0.96, the
median H200 / H100 ratio of the same GEMM kernels, docs/perf/2026-12-05-wide-pp-down/to_h200.py).

``--families sm90`` fits only that family's choices; ``--base MODEL.json`` takes the entries of the other families
from another model JSON (the shipped model: the warp family's H200 fits of the previous model, see
docs/perf/2026-12-06-refit16).
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

SLOTS = (132, 264, 396, 528, 660)


def _configs(family: str, tiles: dict) -> list:
    """The kernel configs of a choice's gate/up and down GEMMs (INT4 g128, BF16, SwiGLU: the sweeps' calls)."""
    from w4a16_moe.formats.schemes import get_scheme
    from w4a16_moe.kernels.cute import registry

    return registry.get(family).configs(get_scheme("int4_g128"), "bf16", "swiglu", True, "deterministic", tiles)


def _gemm_shapes(family: str, configs: list) -> tuple:
    """``(rows, stream)`` of the gate/up and the down GEMM of a choice (its :func:`_configs`): weight rows per row
    block, and the warp family's streaming parameters (``{"row_blocks", "k_tile"}``, or None)."""
    from w4a16_moe.kernels.cute import registry

    fam = registry.get(family)
    out = []
    for cfg in configs:
        stream = None
        if getattr(cfg, "streams", False):
            stream = dict(row_blocks=cfg.row_blocks, k_tile=cfg.k_tile)
        out.append((fam.rows_per_cta(cfg), stream))
    return tuple(out)


def _fit(obs: list, rows: int, tn: int, stream) -> dict:
    from w4a16_moe.kernels.cute.cost_model import features, row_blocks

    best = None
    y = np.array([o["t"] for o in obs])
    g = dict(rows=rows, stream=stream)
    rbc = [row_blocks(g, tn, o["n"], o["k"], o["routes"], o["experts"]) for o in obs]
    for slots in SLOTS:
        x = np.array([features(rows, tn, o["n"], o["k"], o["tiles"], slots, r) for o, r in zip(obs, rbc)])
        for keep in ((0, 1, 2, 3), (0, 1, 2), (0, 1, 3), (1, 2, 3), (0, 1), (1, 2), (1, 3), (1,)):
            xs = x[:, keep] / y[:, None]
            coef, *_ = np.linalg.lstsq(xs, np.ones_like(y), rcond=None)
            if (coef < 0).any():
                continue
            full = np.zeros(4)
            full[list(keep)] = coef
            err = float(np.sqrt(np.mean((x @ full / y - 1.0) ** 2)))
            if best is None or err < best[0]:
                best = (err, slots, full)
    err, slots, c = best
    out = dict(slots=slots, rows=rows, a=round(float(c[0]), 4), b=round(float(c[1]), 6), c=round(float(c[2]), 6),
               d=round(float(c[3]), 4), rms_rel=round(err, 4), n=len(obs))
    if stream:
        out["stream"] = stream
    return out


def _fit_call(obs: list, shapes: tuple, tn: int, scale: float = 1.0) -> tuple:
    """``(up, down)`` entries of one choice fitted together on its call observations (``--target call``): the
    non-negative ``a, b_up, c_up, d_up, b_down, c_down, d_down`` and slots per GEMM of least relative squared error
    over ``t`` (the call time less routing and finalize)."""
    from w4a16_moe.kernels.cute.cost_model import features, row_blocks

    (r_up, s_up), (r_down, s_down) = shapes
    y = np.array([o["t"] for o in obs]) * scale
    g_up, g_down = dict(rows=r_up, stream=s_up), dict(rows=r_down, stream=s_down)
    rb_up = [row_blocks(g_up, tn, 2 * o["i"], o["h"], o["routes"], o["experts"]) for o in obs]
    rb_down = [row_blocks(g_down, tn, o["h"], o["i"], o["routes"], o["experts"]) for o in obs]
    x_up = {s: np.array([features(r_up, tn, 2 * o["i"], o["h"], o["tiles"], s, r) for o, r in zip(obs, rb_up)])
            for s in SLOTS}
    x_down = {s: np.array([features(r_down, tn, o["h"], o["i"], o["tiles"], s, r) for o, r in zip(obs, rb_down)])
              for s in SLOTS}
    best = None
    for s1 in SLOTS:
        for s2 in SLOTS:
            x = np.hstack([x_up[s1][:, :1], x_up[s1][:, 1:], x_down[s2][:, 1:]])  # one intercept, 7 terms
            xs = x / y[:, None]
            for mask in range(1, 128):
                keep = [j for j in range(7) if mask >> j & 1]
                if 1 not in keep and 4 not in keep:  # a weight-stream term of at least one GEMM
                    continue
                coef, *_ = np.linalg.lstsq(xs[:, keep], np.ones_like(y), rcond=None)
                if (coef < 0).any():
                    continue
                full = np.zeros(7)
                full[keep] = coef
                err = float(np.sqrt(np.mean((x @ full / y - 1.0) ** 2)))
                if best is None or err < best[0]:
                    best = (err, s1, s2, full)
    err, s1, s2, c = best
    common = dict(rms_rel=round(err, 4), n=len(obs))
    up = dict(slots=s1, rows=r_up, a=round(float(c[0]), 4), b=round(float(c[1]), 6), c=round(float(c[2]), 6),
              d=round(float(c[3]), 4), **common)
    down = dict(slots=s2, rows=r_down, a=0.0, b=round(float(c[4]), 6), c=round(float(c[5]), 6),
                d=round(float(c[6]), 4), **common)
    if s_up:
        up["stream"] = s_up
    if s_down:
        down["stream"] = s_down
    return up, down


def parse_scale(text: str) -> dict:
    """``--down-scale`` ``KIND=F[,...]`` -> ``{kind: factor}`` (kinds ``pp``, ``wg4``, ``rb1``; 0 < F <= 2)."""
    out = {}
    for item in filter(None, (v.strip() for v in (text or "").split(","))):
        kind, sep, val = item.partition("=")
        try:
            f = float(val)
        except ValueError:
            f = None
        if not sep or kind not in ("pp", "wg4", "rb1") or f is None or not 0 < f <= 2:
            raise SystemExit(f"--down-scale: expected KIND=F items (KIND pp, wg4 or rb1; 0 < F <= 2), got {item!r}")
        out[kind] = f
    return out


def down_kind(family: str, tiles: dict, min_tn: int):
    """The ``--down-scale`` kind of a choice's down GEMM, or None (not SM90, or a token tile under ``min_tn``)."""
    if family != "sm90" or tiles["tokens_per_tile"] < min_tn:
        return None
    if tiles.get("down_pingpong"):
        return "pp"
    return "wg4" if tiles.get("down_consumer_wgs", tiles.get("consumer_wgs")) == 4 else "rb1"


def _scaled(g: dict, f: float) -> dict:
    return dict(g, a=round(g["a"] * f, 4), b=round(g["b"] * f, 6), c=round(g["c"] * f, 6), d=round(g["d"] * f, 4),
                scaled=f)


def _observe(path: str, obs: dict, devices: set, skip: frozenset = frozenset()) -> None:
    """Add the unsplit grouped choices of one sweep file to ``obs`` (per choice name: its gate/up and down
    observations, and its call observations for ``--target call``), except the choices named in ``skip``; record
    the sweep's device in ``devices``."""
    from w4a16_moe.kernels.cute.sm90.family import in_model_domain
    from w4a16_moe.kernels.cute.sm90.tuned import candidate_name
    from w4a16_moe.kernels.cute.tiles import expected_tiles

    with open(path) as f:
        data = json.load(f)
    devices.add((data["device"], data["sm_count"]))
    for r in data["rows"]:
        e, h, i, k, t = r["E"], r["H"], r["I"], r["top_k"], r["tokens"]
        g = r.get("E_global", e)
        # each grouped result's kernel times ([name, us] or us), where it has all four stages
        kern = [(x, [v[1] if isinstance(v, list) else v for v in x["kernels"]]) for x in r["results"]
                if "us" in x and not x.get("decode") and len(x.get("kernels") or ()) >= 4]
        # the row's routing (its route-preparation kernels, median over choices) and finalize (its shortest: a
        # finalize launched early under PDL waits for the down GEMM inside its own profiled time)
        base = float(np.median([sum(ks[:-3]) for _, ks in kern]) + min(ks[-1] for _, ks in kern)) if kern else None
        for x, ks in kern:
            if list(x["splits"]) != [1, 1]:
                continue
            if not in_model_domain(x["family"], x["tiles"], i):  # outside the domain the family lets the model choose it
                continue
            name = f"{x['family']} {candidate_name(x['tiles'])}"
            if name in skip:
                continue
            tn = x["tiles"]["tokens_per_tile"]
            tiles = expected_tiles(t * k, e, tn, k, g if g > e else None)
            ent = obs.setdefault(name, dict(family=x["family"], tiles=x["tiles"], up=[], down=[], call=[]))
            ent["up"].append(dict(t=ks[-3], n=2 * i, k=h, tiles=tiles, routes=t * k, experts=e))
            ent["down"].append(dict(t=ks[-2], n=h, k=i, tiles=tiles, routes=t * k, experts=e))
            ent["call"].append(dict(t=x["us"] - base, h=h, i=i, tiles=tiles, routes=t * k, experts=e))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweeps", nargs="+")
    ap.add_argument("--extend", nargs="+", default=[], help="sweeps whose rows fit only choices the main sweeps "
                    "do not measure")
    ap.add_argument("--out", required=True)
    ap.add_argument("--min-rows", type=int, default=8)
    ap.add_argument("--revision", default="unknown")
    ap.add_argument("--date", default="unknown")
    ap.add_argument("--down-scale", default="", help="KIND=F,...: scale the fitted down-GEMM coefficients of SM90 "
                    "choices per kind (pp, wg4, rb1; see above)")
    ap.add_argument("--down-scale-min-tn", type=int, default=32, help="the narrowest token tile --down-scale applies to")
    ap.add_argument("--target", choices=("kernels", "call"), default="kernels",
                    help="fit each GEMM on its kernel time (kernels), or both together on the call time (call)")
    ap.add_argument("--time-scale", type=float, default=1.0, help="--target call: multiply the fitted times by this")
    ap.add_argument("--families", default="", help="fit only these families' choices (comma-separated)")
    ap.add_argument("--base", help="a model JSON whose entries of the families not fitted here are kept")
    args = ap.parse_args(argv)
    if args.time_scale != 1.0 and args.target != "call":
        raise SystemExit("--time-scale: only with --target call")
    if not 0.5 <= args.time_scale <= 2.0:
        raise SystemExit(f"--time-scale: expected a factor in [0.5, 2], got {args.time_scale}")
    families = {f.strip() for f in args.families.split(",") if f.strip()}
    if args.target == "call" and args.down_scale:
        raise SystemExit("--down-scale scales per-kernel fits: not with --target call")
    scale = parse_scale(args.down_scale)

    obs: dict = {}
    devices = set()
    for path in args.sweeps:
        _observe(path, obs, devices)
    fitted = frozenset(obs)  # the choices the main sweeps fit: extension rows leave them alone
    source = dict.fromkeys(obs, 0)  # per choice: 0 for the main sweeps, j for the j-th extension sweep
    for j, path in enumerate(args.extend, 1):
        _observe(path, obs, devices, skip=fitted)
        source.update(dict.fromkeys(set(obs) - fitted, j))
        fitted = frozenset(obs)  # and a later extension leaves the earlier ones' choices alone
    if len(devices) != 1:
        raise SystemExit(f"sweeps from more than one device: {sorted(devices)}")
    (device, sms), = devices
    entries, up_cfg = {}, {}  # up_cfg: per fitted choice, (family, its gate/up kernel config)
    # the main sweeps' choices first, then each extension's, so that an extension choice finds the gate/up fit of
    # a choice of an earlier sweep with the same gate/up kernel
    for name, ent in sorted(obs.items(), key=lambda kv: (source[kv[0]], kv[0])):
        if len(ent["up"]) < args.min_rows or (families and ent["family"] not in families):
            continue
        cfgs = _configs(ent["family"], ent["tiles"])
        up_cfg[name] = (ent["family"], cfgs[0])
        shapes = _gemm_shapes(ent["family"], cfgs)
        (r_up, s_up), (r_down, s_down) = shapes
        tn = ent["tiles"]["tokens_per_tile"]
        if args.target == "call":
            up, down = _fit_call(ent["call"], shapes, tn, args.time_scale)
            entries[name] = dict(tokens_per_tile=tn, up=up, down=down)
            print(f"{name:70s} call rms {up['rms_rel']:.3f}")
            continue
        same = None
        if source[name]:
            same = next((n for n in entries if source[n] < source[name] and up_cfg[n] == up_cfg[name]), None)
        up = dict(entries[same]["up"], up_from=same) if same else _fit(ent["up"], r_up, tn, s_up)
        down = _fit(ent["down"], r_down, tn, s_down)
        kind = down_kind(ent["family"], ent["tiles"], args.down_scale_min_tn)
        if kind in scale:
            down = _scaled(down, scale[kind])
        entries[name] = dict(tokens_per_tile=tn, up=up, down=down)
        print(f"{name:70s} up rms {entries[name]['up']['rms_rel']:.3f}  down rms {entries[name]['down']['rms_rel']:.3f}")
    base = {}
    if args.base:
        with open(args.base) as f:
            kept = json.load(f)
        base = {n: e for n, e in kept["entries"].items() if n.split(" ", 1)[0] not in families}
        if not families or not base:
            raise SystemExit("--base keeps the entries of the families --families does not fit: give both")
        for n in sorted(base):
            print(f"{n:70s} from {args.base}")
    entries.update({n: e for n, e in base.items() if n not in entries})
    out = dict(format=1, device=device, sm_count=sms, revision=args.revision, date=args.date, target=args.target,
               **(dict(time_scale=args.time_scale) if args.time_scale != 1.0 else {}),
               **(dict(families=sorted(families), base=args.base, base_device=kept.get("device"),
                       base_revision=kept.get("revision")) if args.base else {}),
               sources=list(args.sweeps), extended_by=list(args.extend),
               **(dict(down_scale=dict(scale, min_tn=args.down_scale_min_tn)) if scale else {}),
               command="python scripts/fit_cost_model.py " + " ".join(sys.argv[1:]),
               entries=dict(sorted(entries.items())))
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
