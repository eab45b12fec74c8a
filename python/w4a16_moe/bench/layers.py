"""The layer a ``bench`` run measures, from its command line: ``--workload`` (W1/W2 of targets.md),
``--preset`` (the peers tool's layers) or ``--layer E,H,I,TOPK[,E_GLOBAL]``, with ``--group``, ``--scheme``,
``--dtype`` and ``--activation``. Every bad value raises :class:`LayerArgError` naming the argument and the
rule it breaks.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..activations import ACTIVATIONS
from ..formats.schemes import SCHEMES, get_scheme
from .presets import DEFAULT_TOKENS, PRESETS, layer_name
from .workloads import DTYPES, WORKLOADS, Workload

__all__ = ["LayerArgError", "INT4_GROUPS", "parse_layer", "parse_tokens", "resolve_scheme", "build_workload"]

INT4_GROUPS = (32, 64, 128)


class LayerArgError(ValueError):
    """A bench argument that breaks a rule; the message names the argument and the rule."""


def parse_layer(text: str) -> dict:
    """``"E,H,I,TOPK[,E_GLOBAL]"`` -> ``{"E", "H", "I", "TOPK", "E_GLOBAL"}`` (E_GLOBAL defaults to E)."""
    parts = [p.strip() for p in str(text).split(",")]
    if len(parts) not in (4, 5):
        raise LayerArgError(f"--layer: expected E,H,I,TOPK[,E_GLOBAL] (4 or 5 integers), got {text!r}")
    names = ("E", "H", "I", "TOPK", "E_GLOBAL")
    vals = {}
    for n, p in zip(names, parts):
        try:
            vals[n] = int(p)
        except ValueError:
            raise LayerArgError(f"--layer: {n} must be an integer, got {p!r} in {text!r}") from None
    vals.setdefault("E_GLOBAL", vals["E"])
    for n in names:
        if vals[n] < 1:
            raise LayerArgError(f"--layer: {n} must be positive, got {vals[n]}")
    if vals["E_GLOBAL"] < vals["E"]:
        raise LayerArgError(f"--layer: E_GLOBAL ({vals['E_GLOBAL']}) must be >= E ({vals['E']}): an EP rank owns "
                            "ids 0..E-1 of the E_GLOBAL experts")
    if vals["TOPK"] > vals["E_GLOBAL"]:
        raise LayerArgError(f"--layer: TOPK ({vals['TOPK']}) must be <= E_GLOBAL ({vals['E_GLOBAL']}): a token's "
                            "top-k experts are distinct")
    return vals


def parse_tokens(text: Optional[str]) -> Optional[list]:
    """``"1,8,64"`` -> ``[1, 8, 64]`` (positive, no repeats); None -> None (the layer's default rows)."""
    if text is None:
        return None
    out = []
    for p in str(text).split(","):
        p = p.strip()
        try:
            t = int(p)
        except ValueError:
            raise LayerArgError(f"--tokens: expected comma-separated integers, got {p!r} in {text!r}") from None
        if t < 1:
            raise LayerArgError(f"--tokens: token counts must be positive, got {t}")
        if t in out:
            raise LayerArgError(f"--tokens: {t} is given twice")
        out.append(t)
    if not out:
        raise LayerArgError("--tokens: no token count given")
    return out


def resolve_scheme(group: Optional[int], scheme: Optional[str], default_group: int) -> str:
    """The scheme name: ``--scheme`` as given (``--group``, when also given, must be its group size), else
    ``int4_g<--group or default_group>`` (the group must be one of the INT4 schemes' 32, 64, 128)."""
    if scheme is not None:
        if scheme not in SCHEMES:
            raise LayerArgError(f"--scheme: unknown scheme {scheme!r}; known: {', '.join(SCHEMES)}")
        g = get_scheme(scheme).group_size
        if group is not None and group != g:
            raise LayerArgError(f"--group: {group} is not the group size of --scheme {scheme} "
                                f"({'one scale per row' if g is None else g}); leave --group out")
        return scheme
    g = default_group if group is None else group
    if g not in INT4_GROUPS:
        raise LayerArgError(f"--group: {g} is not in the INT4 schemes' list {INT4_GROUPS} (other groupings: "
                            "--scheme, e.g. int4_channel, nvfp4, mxfp4)")
    return f"int4_g{g}"


def _check_multiples(hidden: int, intermediate: int, scheme: str, where: str) -> None:
    sch = get_scheme(scheme)
    m = sch.min_k_multiple()
    what = f"the group size of {scheme}" if sch.group_size is not None and sch.group_size >= 8 else \
        f"{m} for {scheme} (whole int32 words of codes)"
    for n, v in (("H", hidden), ("I", intermediate)):
        if v % m:
            raise LayerArgError(f"{where}: {n} ({v}) must be a multiple of {m} ({what})")


def build_workload(*, workload: Optional[str] = None, preset: Optional[str] = None, layer: Optional[str] = None,
                   group: Optional[int] = None, scheme: Optional[str] = None, dtype: str = "bf16",
                   activation: Optional[str] = None) -> tuple:
    """``(Workload, default token counts)`` for exactly one of ``workload``, ``preset`` or ``layer``.

    ``--workload kimi-tp8|deepseek-ep8`` is W1/W2 exactly (its data and rows); so is ``--preset`` of the same
    name with the workload's group and scheme: its default token counts are the peers tool's, and the rows
    of the workload's token counts are the workload's own (:func:`~.workloads.benchmark_rows`). A preset with
    its own scheme / activation / biases (``gpt-oss-120b``) takes them unless ``--group`` / ``--scheme`` /
    ``--activation`` say otherwise; ``activation`` None is the preset's, else ``swiglu``."""
    given = [n for n, v in (("--workload", workload), ("--preset", preset), ("--layer", layer)) if v is not None]
    if len(given) != 1:
        raise LayerArgError("give exactly one of --workload, --preset or --layer" +
                            (f" (got {' and '.join(given)})" if given else ""))
    if dtype not in DTYPES:
        raise LayerArgError(f"--dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    if activation is None:
        activation = PRESETS[preset].activation if preset in PRESETS else "swiglu"
    if activation not in ACTIVATIONS:
        raise LayerArgError(f"--activation: unknown activation {activation!r}; known: {', '.join(ACTIVATIONS)}")
    if workload is not None:
        if workload not in WORKLOADS:
            raise LayerArgError(f"--workload: unknown workload {workload!r}; known: {', '.join(sorted(WORKLOADS))}")
        wl = WORKLOADS[workload]
        sch = resolve_scheme(group, scheme, get_scheme(wl.scheme).group_size)
        _check_multiples(wl.hidden, wl.intermediate, sch, "--workload " + workload)
        name = layer_name(wl.name, wl.local_experts, wl.hidden, wl.intermediate, wl.top_k, wl.global_experts, sch,
                          activation)
        desc = wl.description if name == wl.name else f"{name}: {wl.description}, as {sch}, {activation}"
        wl = dataclasses.replace(wl, name=name, description=desc, scheme=sch, dtype=dtype, activation=activation)
        return wl, wl.tokens
    if preset is not None:
        if preset not in PRESETS:
            raise LayerArgError(f"--preset: unknown preset {preset!r}; presets: {', '.join(PRESETS)}")
        p = PRESETS[preset]
        if scheme is None and group is None and p.scheme is not None:
            scheme = p.scheme
        sch = resolve_scheme(group, scheme, p.group)
        _check_multiples(p.hidden, p.intermediate, sch, "--preset " + preset)
        name = layer_name(preset, p.local_experts, p.hidden, p.intermediate, p.top_k, p.global_experts, sch,
                          activation)
        base = WORKLOADS.get(preset)
        if base is not None and base.scheme == sch and (base.local_experts, base.hidden, base.intermediate,
                                                        base.top_k, base.global_experts) == \
                (p.local_experts, p.hidden, p.intermediate, p.top_k, p.global_experts):
            wl = dataclasses.replace(base, name=name, dtype=dtype, activation=activation)
        else:
            wl = Workload(name, f"{name}: {p.what}, {sch}", p.global_experts, p.local_experts, p.hidden,
                          p.intermediate, p.top_k, sch, p.tokens, dtype, activation, p.bias)
        return wl, p.tokens
    v = parse_layer(layer)
    sch = resolve_scheme(group, scheme, 128)
    _check_multiples(v["H"], v["I"], sch, "--layer")
    name = layer_name(None, v["E"], v["H"], v["I"], v["TOPK"], v["E_GLOBAL"], sch, activation)
    ep = f", one EP rank owning ids 0..{v['E'] - 1} of {v['E_GLOBAL']}" if v["E_GLOBAL"] > v["E"] else ""
    desc = f"{name}: E={v['E']}, H={v['H']}, I={v['I']}, top-{v['TOPK']}{ep}, {sch}, {activation}"
    wl = Workload(name, desc, v["E_GLOBAL"], v["E"], v["H"], v["I"], v["TOPK"], sch, DEFAULT_TOKENS, dtype,
                  activation)
    return wl, DEFAULT_TOKENS
