"""The grouped path's cost model: the predicted time of one grouped-GEMM choice on a layer, from which the SM90
family picks the tiles of a call nobody tuned (host side, no DSL import).

Each GEMM of a choice (gate/up: N = 2I or I, K = H; down: N = H, K = I) is a grid of CTAs, each streaming
``rbc`` row blocks of ``rows`` weight rows x K of one expert for one token tile; every token tile re-reads its
expert's weights. With ``tiles`` the expected token tiles of the call (:func:`.tiles.expected_tiles`: uniform
routing, the expert-parallel hint's expected local routes), ``ctas = cdiv(N / rows, rbc) * max(1, tiles)``
(the expected CTA count: tiles are not rounded up before the waves are counted, so a layer whose experts each
get a fraction of a tile is not charged a full tile per expert) and ``waves = ceil(ctas / S)``::

    t_gemm = a + b * max(W, waves * S * rbc * rows * K / 2) / 1e6 + c * waves * TN * rbc * rows / 1e3 + d * waves  [us]

``W = tiles * N * K / 2`` is the 4-bit weight bytes streamed with re-reads; the ``max`` charges a partial
wave as a full one (fewer CTAs than ``S`` slots leave SMs idle); the third term is the epilogue (outputs of a
wave), the last one each wave's fixed latency (a CTA's expert search, first loads and last stores: what a
short-K grid of small CTAs pays per wave). ``rbc`` is 1 except for the warp family's row-block streaming
(:func:`.warp.config.stream_row_blocks`, from the entry's ``stream`` = its ``row_blocks`` and ``k_tile``).
``S``, ``a``, ``b``, ``c``, ``d`` are fitted per choice and GEMM (``scripts/fit_cost_model.py``; ``S`` scales with
the SM count; an entry without ``d`` has none): the SM90 entries on both GEMMs together, on the call time less the
row's routing and finalize (``--target call``: what a choice adds to the call, the launch chain's overlap under PDL
included; its ``a`` in the gate/up entry), from one H100 sweep of every choice put on the H200's clock; the warp
entries on each kernel's time in H200 sweeps (``cost_model.json``'s ``sources``, ``base`` and ``command``;
docs/perf/2026-12-06-refit16). The model predicts the unsplit GEMMs; the family's split-K rule runs after it.
"""

from __future__ import annotations

import functools
import json
import math
import os
from typing import Iterable, Optional

from . import tiles as tiles_rule

__all__ = ["MODEL_PATH", "model", "TWINS", "entry", "features", "row_blocks", "gemm_us", "predict_us", "best"]

MODEL_PATH = os.path.join(os.path.dirname(__file__), "cost_model.json")
#: the SM count the model's slots were fitted at (the H100 and the H200 both have 132)
FIT_SM_COUNT = 132


@functools.lru_cache(maxsize=4)
def model(path: str = MODEL_PATH) -> dict:
    """The fitted model: ``{"entries": {"<family> <candidate name>": {"tokens_per_tile", "up": {...},
    "down": {...}}}, ...}`` (each GEMM: ``slots``, ``rows``, ``a``, ``b``, ``c``); empty entries when the
    file is missing (the families then use their bucket rule)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return {"entries": {}}
    if not isinstance(data.get("entries"), dict):
        raise ValueError(f"{path}: 'entries' must be an object")
    return data


#: choices priced with another choice's fitted entry, its down GEMM streaming with their own K tile
#: (``{name: (twin's name, down k_tile)}``): the warp family's K-tile-64 TN 8 / 16 tiles (``warp.family.K64_TILES``),
#: which stream at least at their K-128 twins' rate at the sizes they run (H100, docs/perf/2026-12-07-k64: both
#: GEMMs' kernel time over the H200-fitted prediction, geometric mean of 24 unsplit launches each, 1.30 for the K-64
#: tiles at their own sizes, 1.39 for their twins at the padded sizes they run)
TWINS = {"warp t8_k64_s4_w4_m2": ("warp t8_k128_s4_w4_m2", 64), "warp t16_k64_s4_w4_m2": ("warp t16_k128_s4_w4_m2", 64)}


def entry(name: str) -> Optional[dict]:
    """The model's entry of choice ``name``: its own, else its :data:`TWINS` entry's, else None."""
    entries = model()["entries"]
    if name in entries or name not in TWINS:
        return entries.get(name)
    twin, k_tile = TWINS[name]
    e = entries.get(twin)
    if e is None:
        return None
    down = dict(e["down"])
    if down.get("stream"):
        down["stream"] = dict(down["stream"], k_tile=k_tile)
    return dict(e, down=down)


def features(rows: int, tn: int, n: int, k: int, tiles: float, slots: int, rbc: int = 1) -> tuple:
    """The model's terms ``(1, max(W, waves * S * rbc * rows * K / 2) / 1e6, waves * TN * rbc * rows / 1e3,
    waves)`` of one GEMM of ``n`` x ``k`` over ``tiles`` expected token tiles of ``tn`` tokens, ``rows`` weight
    rows per row block, ``rbc`` row blocks per CTA and ``slots`` CTAs per wave (what :func:`gemm_us` weighs with
    ``a, b, c, d`` and ``scripts/fit_cost_model.py`` fits)."""
    ctas = max(1, -(-max(1, -(-n // rows)) // rbc)) * max(1.0, tiles)
    waves = max(1, math.ceil(ctas / slots - 1e-6))
    w = tiles * n * k / 2
    return 1.0, max(w, waves * slots * rbc * rows * k / 2) / 1e6, waves * tn * rbc * rows / 1e3, float(waves)


def row_blocks(g: dict, tn: int, n: int, k: int, num_routes: int, num_experts: int) -> int:
    """Row blocks per CTA of a GEMM entry ``g`` on a call: the warp kernels' own rule
    (:func:`.warp.config.stream_row_blocks`, unsplit, over the launch's token-tile bound) where the entry has
    ``stream`` (``{"row_blocks", "k_tile"}``), else 1."""
    st = g.get("stream")
    if not st:
        return 1
    from types import SimpleNamespace

    from .warp.config import stream_row_blocks
    from .warp.family import max_tiles

    cfg = SimpleNamespace(streams=True, row_blocks=st["row_blocks"], k_tile=st["k_tile"], rows_per_cta=g["rows"])
    return stream_row_blocks(cfg, n, k, max_tiles(num_routes, num_experts, tn), 1)


def gemm_us(g: dict, tn: int, n: int, k: int, tiles: float, sm_count: int = FIT_SM_COUNT, rbc: int = 1) -> float:
    """Predicted microseconds of one GEMM (fields of one ``up`` / ``down`` entry) of ``n`` x ``k`` over
    ``tiles`` expected token tiles of ``tn`` tokens, ``rbc`` row blocks per CTA."""
    slots = max(1, round(g["slots"] * sm_count / FIT_SM_COUNT))
    one, wbytes, epi, waves = features(g["rows"], tn, n, k, tiles, slots, rbc)
    return max(0.5, g["a"] * one + g["b"] * wbytes + g["c"] * epi + g.get("d", 0.0) * waves)


def predict_us(name: str, num_routes: int, num_experts: int, hidden: int, intermediate: int, gated: bool = True,
               top_k: Optional[int] = None, global_experts: Optional[int] = None,
               sm_count: int = FIT_SM_COUNT) -> Optional[float]:
    """Predicted microseconds of both GEMMs of choice ``name`` (``"<family> <candidate name>"``) on a call (for
    the SM90 entries: what they add to the call beside routing and finalize), or None when the model has no entry
    for it."""
    e = entry(name)
    if e is None:
        return None
    tn = e["tokens_per_tile"]
    t = tiles_rule.expected_tiles(num_routes, num_experts, tn, top_k, global_experts)
    n13 = 2 * intermediate if gated else intermediate
    up, down = e["up"], e["down"]
    r_up = row_blocks(up, tn, n13, hidden, num_routes, num_experts)
    r_down = row_blocks(down, tn, hidden, intermediate, num_routes, num_experts)
    return (gemm_us(up, tn, n13, hidden, t, sm_count, r_up) + gemm_us(down, tn, hidden, intermediate, t, sm_count, r_down))


def best(names: Iterable[str], num_routes: int, num_experts: int, hidden: int, intermediate: int,
         gated: bool = True, top_k: Optional[int] = None, global_experts: Optional[int] = None,
         sm_count: int = FIT_SM_COUNT, sizes: Optional[dict] = None) -> Optional[tuple]:
    """``(name, predicted us)`` of the fastest of ``names`` the model knows, or None when it knows none.
    ``sizes``: ``{name: (Hp, Ip)}``, the padded sizes a choice runs the layer at (a padded layer streams its padded
    weights; default: ``(hidden, intermediate)``)."""
    sizes = sizes or {}
    scored = [(predict_us(n, num_routes, num_experts, *sizes.get(n, (hidden, intermediate)), gated, top_k,
                          global_experts, sm_count), n)
              for n in names]
    scored = [(t, n) for t, n in scored if t is not None]
    if not scored:
        return None
    t, n = min(scored)
    return n, t
