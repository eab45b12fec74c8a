"""Benchmark records (one per layer, token count and implementation) and their writers: JSON, a markdown
table and a plot. No torch here: the merge tool and the tests use it on any machine.

A record is a dict with at least :data:`REQUIRED` (``median_us`` None when the implementation did not pass
the NRMSE check or failed; ``nrmse`` None when it failed before an output or the output was not finite,
``error`` then says which): ::

    {"layer": "deepseek-ep8", "tokens": 8, "impl": "w4a16_moe", "median_us": 56.8, "floor_eff_us": 31.7,
     "nrmse": 0.0049, "device": "NVIDIA H200", "revision": "0266000...", ...}

Optional fields the writers read: ``dtype`` (default ``bf16``), ``scheme``, ``activation``, ``date``,
``source`` (which tool measured it), ``marks`` (``*``, ``+``, ``^``, ``~`` as the peers tool uses them),
``provider`` and ``error``.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Iterable, Optional

__all__ = ["REQUIRED", "IMPLS", "EXTRA_IMPLS", "PROJECT_IMPLS", "PEER_IMPLS", "PROVIDER_IMPL", "MARKS",
           "check_records", "write_json", "markdown", "write_markdown", "write_plot", "group_records",
           "group_file_stem"]

REQUIRED = ("layer", "tokens", "impl", "median_us", "floor_eff_us", "nrmse", "device", "revision")
IMPLS = ("w4a16_moe", "w4a16_moe_fused", "humming", "vllm_marlin", "dense_bf16")
EXTRA_IMPLS = ("w4a16_moe_triton",)
PROJECT_IMPLS = ("w4a16_moe", "w4a16_moe_fused")
PEER_IMPLS = ("humming", "vllm_marlin")
# the project benchmark's providers -> impl names
PROVIDER_IMPL = {"cute": "w4a16_moe", "auto": "w4a16_moe", "cute-fused": "w4a16_moe_fused",
                 "triton": "w4a16_moe_triton", "dense-bf16": "dense_bf16"}
NRMSE_LIMIT = 0.02
MARKS = {
    "*": "humming ran without vLLM's compiled _moe_C (torch fallbacks for its route preparation): slower than "
         "in vLLM, so a ratio carrying this mark flatters w4a16_moe",
    "+": "vllm_marlin ran without vLLM's _C (SiLU*up as torch ops): slightly slower than in vLLM",
    "^": "w4a16_moe was served by a provider other than its CuTe kernels (provider in the JSON)",
    "~": "fewer timing samples than asked (deadline)",
    "\u2020": "the ratio compares measurements from different sources (different processes and data draws)",
}


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_records(records) -> list:
    """``records`` if every one has the schema (:data:`REQUIRED`, valid types and impl name), else ValueError
    naming the record and the field."""
    if not isinstance(records, list):
        raise ValueError(f"records: expected a list of dicts, got {type(records).__name__}")
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            raise ValueError(f"records[{i}]: expected a dict, got {type(r).__name__}")
        missing = [k for k in REQUIRED if k not in r]
        if missing:
            raise ValueError(f"records[{i}]: missing field(s) {', '.join(missing)}")
        if not isinstance(r["layer"], str) or not r["layer"]:
            raise ValueError(f"records[{i}].layer: expected a non-empty str, got {r['layer']!r}")
        if not isinstance(r["tokens"], int) or isinstance(r["tokens"], bool) or r["tokens"] < 1:
            raise ValueError(f"records[{i}].tokens: expected a positive int, got {r['tokens']!r}")
        if r["impl"] not in IMPLS + EXTRA_IMPLS:
            raise ValueError(f"records[{i}].impl: {r['impl']!r} is not one of {', '.join(IMPLS + EXTRA_IMPLS)}")
        if r["median_us"] is not None and not (_num(r["median_us"]) and r["median_us"] > 0):
            raise ValueError(f"records[{i}].median_us: expected a positive number or null, got {r['median_us']!r}")
        if not (_num(r["floor_eff_us"]) and r["floor_eff_us"] > 0):
            raise ValueError(f"records[{i}].floor_eff_us: expected a positive number, got {r['floor_eff_us']!r}")
        if r["nrmse"] is not None and not _num(r["nrmse"]):
            raise ValueError(f"records[{i}].nrmse: expected a number or null, got {r['nrmse']!r}")
        for k in ("device", "revision"):
            if r[k] is not None and not isinstance(r[k], str):
                raise ValueError(f"records[{i}].{k}: expected a str or null, got {r[k]!r}")
    return records


def _jsonable(v):
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no nan / inf
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def write_json(records: list, path: str) -> None:
    """Check ``records`` and write them as a JSON list (non-finite floats as strings)."""
    check_records(records)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_jsonable(records), f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def _impl_order(impls: Iterable[str]) -> list:
    known = IMPLS + EXTRA_IMPLS
    return sorted(set(impls), key=lambda n: (known.index(n) if n in known else len(known), n))


def group_records(records: list) -> dict:
    """``{(layer, dtype): [records]}`` in first-seen order."""
    out: dict = {}
    for r in records:
        out.setdefault((r["layer"], r.get("dtype") or "bf16"), []).append(r)
    return out


def group_file_stem(layer: str, dtype: str) -> str:
    """The file name (no extension) of one layer's results: the layer, ``-fp16`` for FP16."""
    stem = layer if dtype == "bf16" else f"{layer}-{dtype}"
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in stem)


def _distinct(recs: list, key: str) -> str:
    vals = []
    for r in recs:
        v = r.get(key)
        if v is not None and str(v) not in vals:
            vals.append(str(v))
    return ", ".join(vals) if vals else "-"


def _cell(r: Optional[dict]) -> str:
    if r is None:
        return "-"
    marks = r.get("marks") or ""
    if r.get("median_us") is not None:
        return f"{r['median_us']:.1f}{marks} ({r['median_us'] / r['floor_eff_us']:.2f}x)"
    nr = r.get("nrmse")
    if (_num(nr) and not nr < NRMSE_LIMIT) or "NRMSE" in (r.get("error") or ""):
        return "FAIL"  # did not pass the NRMSE check: not timed
    return "ERR" if r.get("error") else "n/t"


def _table(recs: list) -> list:
    impls = _impl_order(r["impl"] for r in recs)
    by = {(r["tokens"], r["impl"]): r for r in recs}
    tokens = sorted({r["tokens"] for r in recs})
    peers = [n for n in PEER_IMPLS if n in impls]
    ours = [n for n in PROJECT_IMPLS if n in impls] if peers else []
    hdr = ["tokens", "floor_eff (us)"] + [f"{n} us (x floor_eff)" for n in impls] + [f"{n} / best peer" for n in ours]
    lines = ["| " + " | ".join(hdr) + " |", "|" + "---:|" * len(hdr)]
    used = set()
    for t in tokens:
        row = {n: by.get((t, n)) for n in impls}
        fe = next(r["floor_eff_us"] for r in row.values() if r is not None)
        cells = [str(t), f"{fe:.1f}"] + [_cell(row[n]) for n in impls]
        for r in row.values():
            if r is not None and r.get("median_us") is not None:
                used.update(r.get("marks") or "")
        timed_peers = [row[n] for n in peers if row[n] is not None and row[n].get("median_us") is not None]
        best = min(timed_peers, key=lambda r: r["median_us"]) if timed_peers else None
        for n in ours:
            r = row[n]
            if best is None or r is None or r.get("median_us") is None:
                cells.append("-")
                continue
            mixed = (r.get("source"), r.get("revision")) != (best.get("source"), best.get("revision"))
            if mixed:
                used.add("\u2020")
            cells.append(f"{r['median_us'] / best['median_us']:.2f}{best.get('marks') or ''}"
                         f"{chr(0x2020) if mixed else ''} {best['impl']}")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "NRMSE against the FP32 reference (gate < 0.02):", "",
              "| tokens | " + " | ".join(impls) + " |", "|" + "---:|" * (len(impls) + 1)]
    for t in tokens:
        cells = []
        for n in impls:
            nr = (by.get((t, n)) or {}).get("nrmse")
            cells.append(f"{nr:.4f}" if _num(nr) else "-")
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    legend = [f"- `{m}` {MARKS[m]}" for m in MARKS if m in used]
    return lines + ([""] + legend if legend else [])


def markdown(records: list, title: Optional[str] = None, notes: Iterable[str] = ()) -> str:
    """A markdown report: per (layer, dtype) a table with rows = token counts and columns = impls (median us
    and time / floor_eff), floor_eff, and ``ours / best peer`` (< 1 = ahead) when humming or vllm_marlin is
    present; then the NRMSE of every cell. ``notes`` are appended as a list."""
    check_records(records)
    groups = group_records(records)
    out = []
    if title:
        out += [f"# {title}", ""]
    for (layer, dtype), recs in groups.items():
        out += [f"{'##' if title else '#'} {layer} ({dtype})", "",
                f"- scheme: {_distinct(recs, 'scheme')}; activation: {_distinct(recs, 'activation')}",
                f"- device: {_distinct(recs, 'device')}; revision: {_distinct(recs, 'revision')}",
                f"- date: {_distinct(recs, 'date')}; source: {_distinct(recs, 'source')}",
                "- median us of warm CUDA-graph replay (x = time / floor_eff); ratio < 1: ahead of the best peer",
                ""]
        out += _table(recs) + [""]
    notes = list(notes)
    if notes:
        out += ["Notes:", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(out)


def write_markdown(records: list, path: str, title: Optional[str] = None, notes: Iterable[str] = ()) -> None:
    with open(path, "w") as f:
        f.write(markdown(records, title, notes))


def write_plot(records: list, path: str, log=None) -> bool:
    """Latency against tokens (log-log), one line per impl and the floor_eff dashed, one panel per
    (layer, dtype). Without matplotlib: says so (to ``log`` or stderr) and returns False."""
    check_records(records)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        msg = (f"--plot: matplotlib is not installed in this Python ({sys.executable}); {path} not written "
               "(pip install matplotlib, or plot the JSON elsewhere with python -m w4a16_moe.bench.merge)")
        (log or (lambda m: print(m, file=sys.stderr)))(msg)
        return False
    groups = group_records(records)
    fig, axes = plt.subplots(len(groups), 1, figsize=(7, 4.5 * len(groups)), squeeze=False)
    for ax, ((layer, dtype), recs) in zip(axes[:, 0], groups.items()):
        for n in _impl_order(r["impl"] for r in recs):
            pts = sorted((r["tokens"], r["median_us"]) for r in recs if r["impl"] == n and r["median_us"])
            if pts:
                ax.plot([a for a, _ in pts], [b for _, b in pts], marker="o", label=n)
        fl = sorted({(r["tokens"], r["floor_eff_us"]) for r in recs})
        ax.plot([a for a, _ in fl], [b for _, b in fl], "k--", label="floor_eff")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens")
        ax.set_ylabel("latency (us)")
        ax.set_title(f"{layer} ({dtype}), {_distinct(recs, 'device')}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
