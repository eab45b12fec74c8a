"""``python -m w4a16_moe.bench.standing [DIR] [--device H200] [--peers humming,vllm_marlin] [--floor] [--json]``: where
the project stands against its peers, or (``--floor``) against the hardware floor, from the committed benchmark runs
(``DIR``, default ``docs/benchmarks``).

Every ``DIR/<run>/<layer>.json`` is a list of :mod:`.records`. For each row (layer, dtype, token count) on the
device, the **latest run that measured it** (run folders sort by name: ``2026-12-05f`` after ``2026-12-05``)
gives the ratio ``ours / fastest peer``, both from that run (same process, same inputs). A row counts as
ahead when the ratio is below 1. The output is one line per layer (and dtype): rows, rows ahead, the rows
that are not, and the runs the figures come from. A row whose figures are older than the project's current
code says so only through its run: read the run's revision in ``DIR/README.md``.

``--floor``: each row's ``ours / floor_eff`` (the project's deterministic-finalize time over the record's floor,
from the latest run that measured the project) against the targets of issue 17: at most
:data:`FLOOR_TARGETS` ``["mem"]`` (1.5) on memory-bound rows and ``["flop"]`` (1.35) on compute-bound ones (the
record's ``bound``; a record without one counts as memory-bound). One line per layer (and dtype): rows, rows within
the target, the median and worst ratios, and the rows furthest past it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from typing import Iterable, Optional

from . import merge
from .records import PEER_IMPLS

__all__ = ["latest_rows", "summarize", "floor_rows", "summarize_floor", "FLOOR_TARGETS", "main"]

#: issue 17's floor targets: time / floor_eff at most this, by the record's ``bound``
FLOOR_TARGETS = {"mem": 1.5, "flop": 1.35}


def _device_tag(device: Optional[str]) -> str:
    d = (device or "").upper()
    for tag in ("H200", "H100", "B200", "GB200", "A100", "L40S"):
        if tag in d:
            return tag
    return device or "?"


def _row_files(root: str, device: str):
    """``(run, {row key: {impl: record}})`` per record file of every run folder, in run order (folder names sort:
    ``2026-12-05f`` after ``2026-12-05``): the records measured on ``device`` (a time recorded), keyed by ``(layer,
    dtype, tokens)``. Every ``.json`` of a run folder must be a record list (:func:`.merge.load` checks it)."""
    for run in sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))):
        folder = os.path.join(root, run)
        for name in sorted(os.listdir(folder)):
            if not name.endswith(".json"):
                continue
            by_row = defaultdict(dict)
            for r in merge.load(os.path.join(folder, name))[0]:
                if _device_tag(r.get("device")) == device and r.get("median_us") is not None:
                    key = (str(r.get("layer")), str(r.get("dtype") or "bf16"), int(r.get("tokens")))
                    by_row[key][r["impl"]] = r
            yield run, by_row


def latest_rows(root: str, device: str = "H200", peers: Iterable[str] = PEER_IMPLS) -> list:
    """One row ``{"layer", "dtype", "tokens", "run", "ours_us", "peer", "peer_us", "ratio", "revision"}`` per
    (layer, dtype, tokens) measured on ``device`` with the project and at least one of ``peers``: the figures of
    the latest run (folder name order) that measured both, in the same file."""
    peers = tuple(peers)
    latest = {}
    for run, by_row in _row_files(root, device):
        for key, impls in by_row.items():
            ours = impls.get("w4a16_moe")
            measured = [(impls[p]["median_us"], p) for p in peers if p in impls]
            if ours is None or not measured:
                continue
            peer_us, peer = min(measured)
            latest[key] = dict(layer=key[0], dtype=key[1], tokens=key[2], run=run, ours_us=ours["median_us"],
                               peer=peer, peer_us=peer_us, ratio=ours["median_us"] / peer_us,
                               revision=ours.get("revision"))
    return [latest[k] for k in sorted(latest)]


def floor_rows(root: str, device: str = "H200") -> list:
    """One row ``{"layer", "dtype", "tokens", "run", "ours_us", "floor_eff_us", "bound", "target", "ratio",
    "revision"}`` per (layer, dtype, tokens) the project was measured at on ``device``: the latest run's figures
    (folder name order), ``ratio = ours_us / floor_eff_us`` and the target of the record's bound."""
    latest = {}
    for run, by_row in _row_files(root, device):
        for key, impls in by_row.items():
            r = impls.get("w4a16_moe")
            if r is None:
                continue
            bound = r.get("bound") if r.get("bound") in FLOOR_TARGETS else "mem"
            latest[key] = dict(layer=key[0], dtype=key[1], tokens=key[2], run=run, ours_us=r["median_us"],
                               floor_eff_us=r["floor_eff_us"], bound=bound, target=FLOOR_TARGETS[bound],
                               ratio=r["median_us"] / r["floor_eff_us"], revision=r.get("revision"))
    return [latest[k] for k in sorted(latest)]


def _by_layer(rows: list) -> list:
    """``((layer, dtype), rows)`` groups of per-row figures, sorted."""
    groups = defaultdict(list)
    for r in rows:
        groups[(r["layer"], r["dtype"])].append(r)
    return sorted(groups.items())


def summarize_floor(rows: list, worst: int = 3) -> list:
    """Per (layer, dtype): ``{"layer", "dtype", "rows", "met", "median", "worst", "misses": [row, ...], "runs"}``;
    ``misses`` are the ``worst`` rows furthest past their target (by ``ratio / target``), largest first."""
    out = []
    for (layer, dtype), rs in _by_layer(rows):
        ratios = sorted(r["ratio"] for r in rs)
        over = sorted((r for r in rs if r["ratio"] > r["target"]), key=lambda r: -r["ratio"] / r["target"])
        out.append(dict(layer=layer, dtype=dtype, rows=len(rs), met=len(rs) - len(over),
                        median=ratios[len(ratios) // 2], worst=ratios[-1], misses=over[:worst],
                        runs=sorted({r["run"] for r in rs})))
    return out


def _floor_markdown(summary: list, device: str) -> str:
    t = FLOOR_TARGETS
    lines = [f"| layer | dtype | rows | within target | ours / floor_eff: median, worst | furthest past the target "
             f"(mem <= {t['mem']}, flop <= {t['flop']}) | runs ({device}) |", "|---|---|---:|---:|---|---|---|"]
    for s in summary:
        misses = ", ".join(f"{r['tokens']} tokens {r['ratio']:.2f} ({r['bound']})" for r in s["misses"])
        lines.append(f"| {s['layer']} | {s['dtype']} | {s['rows']} | {s['met']} | {s['median']:.2f}, {s['worst']:.2f} "
                     f"| {misses} | {', '.join(s['runs'])} |")
    total = sum(s["rows"] for s in summary)
    met = sum(s["met"] for s in summary)
    lines.append("")
    lines.append(f"{met} of {total} rows within the floor target.")
    return "\n".join(lines)


def summarize(rows: list) -> list:
    """Per (layer, dtype): ``{"layer", "dtype", "rows", "ahead", "behind": [row, ...], "worst", "best", "runs"}``."""
    out = []
    for (layer, dtype), rs in _by_layer(rows):
        ratios = [r["ratio"] for r in rs]
        out.append(dict(layer=layer, dtype=dtype, rows=len(rs), ahead=sum(x < 1.0 for x in ratios),
                        behind=[r for r in rs if r["ratio"] >= 1.0], best=min(ratios), worst=max(ratios),
                        runs=sorted({r["run"] for r in rs})))
    return out


def _markdown(summary: list, device: str) -> str:
    lines = [f"| layer | dtype | rows | ahead | ours / fastest peer | not ahead | runs ({device}) |",
             "|---|---|---:|---:|---|---|---|"]
    for s in summary:
        behind = ", ".join(f"{r['tokens']} tokens {r['ratio']:.3f} ({r['run']})" for r in s["behind"])
        lines.append(f"| {s['layer']} | {s['dtype']} | {s['rows']} | {s['ahead']} | {s['best']:.2f}-{s['worst']:.3f} "
                     f"| {behind} | {', '.join(s['runs'])} |")
    total = sum(s["rows"] for s in summary)
    ahead = sum(s["ahead"] for s in summary)
    lines.append("")
    lines.append(f"{ahead} of {total} rows ahead of the fastest peer measured beside the project.")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m w4a16_moe.bench.standing", description=__doc__.split("\n\n")[0])
    p.add_argument("root", nargs="?", default="docs/benchmarks", help="the benchmark runs (default docs/benchmarks)")
    p.add_argument("--device", default="H200", help="device tag of the records to use (H200, H100, ...)")
    p.add_argument("--peers", default=",".join(PEER_IMPLS), help="impls that count as peers (comma list)")
    p.add_argument("--floor", action="store_true", help="against the hardware floor (issue 17's targets) instead of "
                   "the peers")
    p.add_argument("--json", action="store_true", help="print the per-row figures as JSON")
    a = p.parse_args(argv)
    if not os.path.isdir(a.root):
        p.error(f"root: {a.root!r} is not a directory of benchmark runs")
    if a.floor:
        rows = floor_rows(a.root, a.device)
        print(json.dumps(rows, indent=1) if a.json else _floor_markdown(summarize_floor(rows), a.device))
        return 0
    rows = latest_rows(a.root, a.device, [x for x in a.peers.split(",") if x])
    if a.json:
        print(json.dumps(rows, indent=1))
    else:
        print(_markdown(summarize(rows), a.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
