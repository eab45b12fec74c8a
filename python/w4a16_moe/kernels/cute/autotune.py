"""The on-device autotuner of the CuTe provider (``w4a16_moe.warmup(..., autotune=True)``).

For one layer (weights, dtype, activation, top-k, finalize mode) and each token count of :func:`token_grid`
up to ``max_tokens``, it times every candidate the loader can provide without compiling (prebuilt or in
the JIT cache; JIT only when allowed): the decode kernels (the default knob sets of
:func:`.decode.family.default_knob_sets` and the tuned table's knob sets
for the scheme and dtype, each with the K split of the decode rule and 1, 2, 4, 8 (:data:`DECODE_SPLITS`), up
to :data:`DECODE_TUNE_MAX_ROUTES` routes), the SM90 family's rule buckets and
tuned candidates (:func:`.sm90.family.selectable_tiles`), the warp family's buckets, each with split-K
chosen by the rule and 1, 2, 4, 8. Candidates whose plans coincide are timed once.

Each token count first runs the choice selection makes without the autotuner (its *default*), so a row is
never worse than that, then the others while its share of the budget lasts (the remaining time over the
remaining token counts: a count that finishes early leaves its time to the next). Each candidate's first
call is checked against the FP32 reference on fresh synthetic inputs (uniform routing, drawn like the
benchmark's); a candidate with an NRMSE of :data:`MAX_NRMSE` or more, or non-finite output, is skipped.
It is then timed with CUDA events over CUDA-graph replays (plain replays where capture fails), and checked
again on the output of one more replay (poisoned with NaN before it): a candidate right alone but wrong when
its calls run back to back is skipped too.

The rows go to :mod:`.autotune_store` (persistent, keyed by GPU, layer, versions); the provider's plans use
them from then on. A token count already stored complete for the running versions is not measured again.
Tuning inside CUDA-graph capture raises.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Iterable, Optional

from . import autotune_store as store
from .autotune_store import Choice, Row

__all__ = ["GRID", "Budget", "token_grid", "select_rows", "candidates", "autotune_layer", "tuning_budget", "WARMUP_RESERVE_S", "check_not_capturing",
           "DECODE_TUNE_MAX_ROUTES", "MAX_NRMSE", "SPLITS", "DECODE_SPLITS", "with_decode_split"]

#: token counts the autotuner measures (those up to ``max_tokens``)
GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
#: split-K choices timed for each grouped tile shape (None: the family's rule)
SPLITS = (None, 1, 2, 4, 8)
#: K splits timed for each decode knob set (both kernels; None: the decode split rule)
DECODE_SPLITS = (None, 1, 2, 4, 8)
#: the decode kernels are timed only up to this many routes (beyond it they re-read every expert many times)
DECODE_TUNE_MAX_ROUTES = 256
#: a candidate whose first call, or whose last call after the timing replays, is this far from the FP32
#: reference (or not finite) is skipped
MAX_NRMSE = 0.02
#: calls per CUDA graph and timed replays per candidate
GRAPH_CALLS, REPLAYS = 8, 3


class Budget:
    """A wall-clock budget of ``seconds`` read from ``clock`` (tests pass a fake one)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.perf_counter):
        if not (isinstance(seconds, (int, float)) and seconds > 0 and math.isfinite(seconds)):
            raise ValueError(f"autotune budget: expected a positive number of seconds, got {seconds!r}")
        self.clock = clock
        self.end = clock() + float(seconds)

    def left(self) -> float:
        return max(0.0, self.end - self.clock())

    def expired(self) -> bool:
        return self.clock() >= self.end

    def share(self, parts_left: int) -> float:
        """The deadline of the next of ``parts_left`` parts: an equal share of what is left."""
        now = self.clock()
        return now + max(0.0, self.end - now) / max(1, parts_left)


def token_grid(max_tokens: int) -> list:
    return [t for t in GRID if t <= max_tokens]


def select_rows(grid: Iterable[int], candidates_of: Callable, measure: Callable, budget: Budget,
                log: Callable = lambda msg: None) -> list:
    """The :class:`~.autotune_store.Row` s of ``grid``: ``candidates_of(T) -> (default, [choices])``,
    ``measure(T, choice) -> us or None`` (None: failed its check). The default of each token count is always
    measured (unless the whole budget is spent: tuning stops there, keeping the rows measured); the others
    while the count's share of the budget lasts."""
    grid = list(grid)
    rows = []
    for idx, t in enumerate(grid):
        if budget.expired():
            log(f"autotune: budget spent before T={t}; {len(grid) - idx} token counts left to the defaults")
            break
        deadline = budget.share(len(grid) - idx)
        default, cands = candidates_of(t)
        order = ([default] if default is not None else []) + [c for c in cands if c != default]
        times, complete = {}, True
        for n, c in enumerate(order):
            if n and budget.clock() >= deadline:
                complete = False
                break
            us = measure(t, c)
            if us is not None:
                times[c] = us
        if not times:
            continue
        best = min(times, key=times.get)
        grouped = [c for c in times if not c.decode]
        g = min(grouped, key=times.get) if grouped else None
        rows.append(Row(t, best, g, round(times[best], 2), None if g is None else round(times[g], 2), complete))
        log(f"autotune T={t}: {best.label()} {times[best]:.1f} us"
            + (f" (default {times[default]:.1f} us)" if default in times and default != best else "")
            + f", {len(times)}/{len(order)} timed" + ("" if complete else " (budget)"))
    return rows


# ------------------------------------------------------------------------------------------------------
# candidates of one call (host only)
# ------------------------------------------------------------------------------------------------------
def _default_choice(call, info) -> Optional[Choice]:
    """What selection picks for ``call`` without the autotune store, as a :class:`Choice`."""
    from . import choice_plan, provider
    from .sm90.tuned import candidate_name

    with store.bypass():
        p, _ = provider._make_plan(call, info)
    if p is None:
        return None
    if p.decode:
        return Choice("decode", _knob_text(dict(p.tiles).get("knobs", ())), None)
    name = candidate_name(dict(p.tiles))
    for sp in (None, max(p.splits)):  # the rule's split-K, else the explicit one that reproduces the plan
        q = choice_plan.plan_of_choice(call, info, Choice(p.family, name, sp))
        if q is not None and q.splits == p.splits:
            return Choice(p.family, name, sp)
    return Choice(p.family, name, None)


def _knob_text(knobs: tuple) -> str:
    """Decode knob items back to the ``"w8u8/w8u4"`` text (``""``: the defaults)."""
    from .decode.family import knob_text

    return knob_text(knobs)


def with_decode_split(text: str, split: Optional[int]) -> str:
    """Decode knob text ``text`` (``""``: the defaults) with both kernels' K split forced to ``split``
    (``s<N>``; None: ``text`` as it is, the split rule's)."""
    if split is None:
        return text
    from .decode.family import KNOBS, knob_items

    items = {m: dict(v) for m, v in dict(knob_items(text or None)).items()}
    for m in ("gate_up", "down"):
        items[m] = dict(items.get(m) or KNOBS[m], splits=split)
    return _knob_text(tuple((m, tuple(sorted(v.items()))) for m, v in sorted(items.items())))


def candidates(call, info, allow_jit: bool = False, status: Optional[Callable] = None,
               memo: Optional[dict] = None) -> list:
    """The choices worth timing for ``call`` on ``info`` whose kernels the loader has (``status(spec, arch)``,
    default :func:`w4a16_moe.loader.kernel_status`: prebuilt or JIT cache; ``"jit"`` too when ``allow_jit``),
    one per distinct plan, in the order they are timed. ``memo``: the loader's answers per (spec, arch),
    shared between the token counts of one tuning run (each answer checks a library's checksum)."""
    from ... import settings
    from . import choice_plan, layout_budget, provider
    from .sm90 import family as sm90
    from .warp import family as warp
    from .sm90.tuned import candidate_name

    if status is None:
        from ...loader import kernel_status as status
    base, _ = provider.family_for(info)
    if base is None:
        return []
    dt = provider._DTYPES[call.dtype]
    s = settings.get()
    out = []
    if (base.name == "sm90" and not s.batch_invariant and s.cute_decode != "0"
            and call.tokens * call.top_k <= DECODE_TUNE_MAX_ROUTES):
        from ...formats.schemes import get_scheme
        from .decode.family import default_knob_sets, takes_fp32_scales

        fp32 = takes_fp32_scales(get_scheme(call.scheme))
        sets = list(dict.fromkeys([*default_knob_sets(fp32), *sm90.tuned_decode_knob_sets(call.scheme, dt)]))
        out += [Choice("decode", with_decode_split(kn, sp)) for kn in sets for sp in DECODE_SPLITS]
    grouped = []
    if base.name == "sm90":
        rule = sm90.select_tiles(call.tokens * call.top_k, call.experts, call.top_k, call.global_experts)
        tiles = [rule] + [t for t in sm90.selectable_tiles(call.scheme) if t != rule]
        grouped += [("sm90", candidate_name(t)) for t in tiles]
    if base.name == "warp" or (base.name == "sm90" and s.cute_family == "auto"):
        gated = call.activation.gated
        grouped += [("warp", candidate_name(t)) for t in warp.model_tiles(call.scheme)
                    if sm90.k_tile_ok("warp", t, call.hidden, call.intermediate, gated, call.scheme)]
    out += [Choice(f, c, sp) for f, c in grouped for sp in SPLITS]
    seen, kept = set(), []
    ok = {} if memo is None else memo
    for c in out:
        p = choice_plan.plan_of_choice(call, info, c)
        if p is None or not layout_budget.allows(p, call, info):  # W4A16_MOE_LAYOUTS: the layer's kept pairs only
            continue
        ident = (p.family, p.configs, p.splits)
        if ident in seen:
            continue
        seen.add(ident)
        fam = provider.registry.get(p.family)
        avail = True
        for cfg in p.configs:
            spec = fam.spec_for(cfg)
            if (spec, p.arch) not in ok:
                src = status(spec, p.arch)[0]
                ok[(spec, p.arch)] = src in ("prebuilt", "jit-cache") or (allow_jit and src == "jit")
            avail = avail and ok[(spec, p.arch)]
        if avail:
            kept.append(c)
    return kept


# ------------------------------------------------------------------------------------------------------
# measuring on the GPU
# ------------------------------------------------------------------------------------------------------
def check_not_capturing(what: str = "w4a16_moe.warmup(autotune=True)") -> None:
    """Raise when the current CUDA stream is capturing a graph (tuning runs and times real calls)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"{what}: cannot autotune inside CUDA-graph capture; call it before capturing")


def _inputs(weights, tokens: int, top_k: int, dtype, seed: int, global_experts: Optional[int] = None):
    """Fresh synthetic inputs drawn like the benchmark's: normal activations, uniform routing (top-k of
    uniform scores over the local experts, or over ``global_experts`` with the local ones first: ids
    ``0 .. E - 1``, the others another rank's), softmax routing weights."""
    import torch

    dev = weights.device
    gen = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(tokens, weights.hidden_size, generator=gen, device=dev).to(dtype)
    experts = global_experts or weights.num_experts
    scores = torch.rand(tokens, experts, generator=gen, device=dev)
    ids = scores.topk(min(top_k, experts), dim=1).indices.to(torch.int32)
    if ids.shape[1] < top_k:  # more routes than experts: the rest route nowhere
        ids = torch.cat([ids, ids.new_full((tokens, top_k - ids.shape[1]), -1)], 1)
    tw = torch.softmax(torch.randn(tokens, top_k, generator=gen, device=dev), dim=1)
    return x, tw, ids


def _time_us(fn, poison: Optional[Callable] = None) -> float:
    """Median us per call of ``fn`` over CUDA-graph replays (plain replays where capture fails). With
    ``poison``: after the timing, ``poison()`` then one more replay, so that the caller can check the output of
    calls run back to back."""
    import torch

    graph = None
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(GRAPH_CALLS):
                fn()
        run = graph.replay
    except Exception:
        graph = None
        torch.cuda.synchronize()

        def run():
            for _ in range(GRAPH_CALLS):
                fn()
    run()
    times = []
    for _ in range(REPLAYS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / GRAPH_CALLS)
    if poison is not None:
        poison()
        run()
        torch.cuda.synchronize()
    del graph
    return sorted(times)[len(times) // 2]


def _nrmse(out, ref) -> float:
    """NRMSE of ``out`` against the FP32 reference ``ref``; infinite where ``out`` holds a non-finite value."""
    import torch

    if not bool(torch.isfinite(out).all()):
        return math.inf
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _layout_keys(weights) -> set:
    from ...formats.weights import layout_cache

    return set(layout_cache(weights.w13.codes))


#: seconds of a :func:`w4a16_moe.warmup` budget kept for what follows the tuning: loading and running the tuned
#: plans of every warmed-up token count (the tuner has packed the weights and loaded most kernels by then).
#: H200, deepseek-ep8 (``bench --preset deepseek-ep8 --autotune``): the tuner given the whole 60 s budget made
#: the warmup take 60.5 s
WARMUP_RESERVE_S = 5.0


def tuning_budget(budget_s: float, spent_s: float) -> float:
    """The tuner's seconds within a warmup budget of ``budget_s`` of which ``spent_s`` are spent: what is left
    less :data:`WARMUP_RESERVE_S`, and a quarter of the budget at least (a budget smaller than the reserve
    still tunes something)."""
    return max(0.25 * budget_s, budget_s - spent_s - WARMUP_RESERVE_S)


def autotune_layer(weights, dtype, activation: str, top_k: int, max_tokens: int,
                   finalizes=("deterministic", "fused"), budget_s: float = 60.0, allow_jit: bool = False,
                   log: Optional[Callable] = None, clock: Callable[[], float] = time.perf_counter,
                   global_experts: Optional[int] = None) -> dict:
    """Tune one layer (see the module docstring) within ``budget_s`` seconds for all of ``finalizes``;
    returns ``{finalize: path of its store entry}`` (finalize modes with nothing new to measure are skipped).
    ``global_experts``: the ``global_num_experts`` hint of the layer's calls (one expert-parallel rank): the
    calls tuned carry it, the synthetic routing is uniform over that many experts, and the rows go to the
    hint's own store entry. Weights with a ``w13_perm`` (act order over H) are tuned in their stored column order
    (the kernels never read the permutation; :func:`w4a16_moe.warmup` tunes the top-1 call the op runs)."""
    import torch

    from ... import settings
    from ...activations import get_activation
    from ...device import probe
    from ...log import logger
    from ...reference import reference_moe
    from ...validate import MoECall
    from . import choice_plan
    from .provider import _DTYPES, cute_fused_moe

    check_not_capturing()
    log = log or logger.info
    if getattr(weights, "w13_perm", None) is not None:
        weights = weights.without_w13_perm()  # the kernels' view, so that the reference below matches them
    info = probe(weights.device)
    act = get_activation(activation)
    e, h, i = weights.num_experts, weights.hidden_size, weights.intermediate_size
    if global_experts == e:
        global_experts = None  # every expert local: no hint (validate.check_global_experts)
    dt = _DTYPES[dtype]
    budget = Budget(budget_s, clock)
    packed_before = _layout_keys(weights)
    grid = token_grid(max_tokens)
    out, memo = {}, {}
    finalizes = list(finalizes)
    for n, fin in enumerate(finalizes):
        key = store.LayerKey(info.name, e, h, i, weights.scheme.name, dt, top_k, act.name, fin, global_experts,
                             settings.get().layouts)
        have = store.read_entry(key) or {"rows": {}}
        todo = [t for t in grid if not (t in have["rows"] and have["rows"][t].complete)]
        if not todo:
            log(f"autotune {key.text()}: every token count up to {max_tokens} already tuned")
            continue
        part = Budget(budget.left() / (len(finalizes) - n), clock) if budget.left() > 0 else None
        if part is None:
            break
        calls = {t: MoECall(t, top_k, h, i, e, dtype, weights.device, act, fin, 0, weights.scheme.name,
                            has_bias=weights.has_bias, global_experts=global_experts) for t in todo}
        data: dict = {}

        def case(t):
            if t not in data:
                data.clear()  # one token count's inputs at a time
                x, tw, ids = _inputs(weights, t, top_k, dtype, seed=1000 + t, global_experts=global_experts)
                data[t] = (x, tw, ids, reference_moe(x, weights, tw, ids, activation=act.name))
            return data[t]

        def candidates_of(t):
            return _default_choice(calls[t], info), candidates(calls[t], info, allow_jit, memo=memo)

        def measure(t, choice):
            call = calls[t]
            p = choice_plan.plan_of_choice(call, info, choice)
            if p is None:
                return None
            x, tw, ids, ref = case(t)
            o = torch.full_like(x, float("nan"))
            # before any launch: a candidate that faults the context (a sticky CUDA error) is named in the log
            logger.debug(f"autotune {fin} T={t}: {choice.label()}: {p.family} splits {p.splits}")
            try:
                cute_fused_moe(x, weights, tw, ids, call=call, out=o, plan=p)
                torch.cuda.synchronize()
            except Exception as ex:  # e.g. a kernel that cannot be had after all
                log(f"autotune T={t} {choice.label()}: failed ({type(ex).__name__}: {ex}), skipped")
                return None
            err = _nrmse(o, ref)
            if not err < MAX_NRMSE:
                log(f"autotune T={t} {choice.label()}: NRMSE {err:.3g}, skipped")
                return None
            us = _time_us(lambda: cute_fused_moe(x, weights, tw, ids, call=call, out=o, plan=p),
                          poison=lambda: o.fill_(float("nan")))
            err = _nrmse(o, ref)
            if not err < MAX_NRMSE:
                log(f"autotune T={t} {choice.label()}: NRMSE {err:.3g} after back-to-back calls, skipped")
                return None
            return us

        rows = select_rows(todo, candidates_of, measure, part, log)
        data.clear()
        if rows:
            out[fin] = store.update(key, rows, grid, device=info.name)
            log(f"autotune {key.text()}: {len(rows)} token counts stored in {out[fin]}")
    _drop_unused_layouts(weights, packed_before, info, dtype, activation, top_k, grid, finalizes, global_experts)
    return out


def _drop_unused_layouts(weights, before: set, info, dtype, activation: str, top_k: int, grid, finalizes,
                         global_experts: Optional[int] = None) -> None:
    """Free the packed weight layouts tuning created that no plan of the grid uses (each is a full copy)."""
    from ...activations import get_activation
    from ...formats.weights import layout_cache
    from ...validate import MoECall
    from . import provider

    act = get_activation(activation)
    keep = set(before)
    for fin in finalizes:
        for t in grid:
            for ro in (False, True):
                call = MoECall(t, top_k, weights.hidden_size, weights.intermediate_size, weights.num_experts, dtype,
                               weights.device, act, fin, 0, weights.scheme.name, ro, weights.has_bias,
                               global_experts=global_experts)
                p, _ = provider._plan_cached(call, info)
                if p is not None:
                    fam = provider.registry.get(p.family)
                    keep |= {fam.layout_key(w, c, dtype) for c, w in zip(p.configs, ("w13", "w2"))}
    cache = layout_cache(weights.w13.codes)
    for k in [k for k in cache if k not in keep]:
        del cache[k]
