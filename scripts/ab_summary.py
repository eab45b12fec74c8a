"""Summarize scripts/ab_bench.sh: per workload and token count, each revision's median over its runs and
new / old. Reads both bench JSON formats (a record list, or the older ``{"meta", "records"}``).

    python3 scripts/ab_summary.py OUT_DIR
"""

from __future__ import annotations

import glob
import json
import os
import statistics
import sys


def _records(path: str) -> list:
    with open(path) as f:
        data = json.load(f)
    recs = data["records"] if isinstance(data, dict) else data
    out = []
    for r in recs:
        layer = r.get("layer") or r.get("workload")
        impl = r.get("impl") or r.get("provider")
        if impl in ("cute", "w4a16_moe") and r.get("median_us") is not None:
            out.append((layer, int(r["tokens"]), float(r["median_us"])))
    return out


def main(out_dir: str) -> int:
    runs: dict = {}
    for path in sorted(glob.glob(os.path.join(out_dir, "ab_*_*.json"))):
        rev = os.path.basename(path).split("_")[1]
        for layer, t, us in _records(path):
            runs.setdefault((layer, t), {}).setdefault(rev, []).append(us)
    print("| layer | tokens | old us (runs) | new us (runs) | new / old |")
    print("|---|---:|---|---|---:|")
    worst = 0.0
    for (layer, t), by in sorted(runs.items()):
        o, n = by.get("old", []), by.get("new", [])
        if not o or not n:
            continue
        mo, mn = statistics.median(o), statistics.median(n)
        worst = max(worst, abs(mn / mo - 1))
        print(f"| {layer} | {t} | {mo:.1f} ({', '.join(f'{v:.1f}' for v in o)}) | "
              f"{mn:.1f} ({', '.join(f'{v:.1f}' for v in n)}) | {mn / mo:.3f} |")
    print(f"\nlargest |new / old - 1|: {100 * worst:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else "out"))
