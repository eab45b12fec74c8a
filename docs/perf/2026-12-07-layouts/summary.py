"""Each call's time under W4A16_MOE_LAYOUTS=2 / 1 over its time with every layout (``layout_budget_time.py`` rows).

    python docs/perf/2026-12-07-layouts/summary.py docs/perf/2026-12-07-layouts/h100_*.json
"""

import json
import math
import sys


def main(paths):
    rows = [r for p in paths for r in json.load(open(p))["rows"]]
    print("| layer | scheme | " + " | ".join(f"T={t}" for t in sorted({r["tokens"] for r in rows})) + " |")
    print("|---|---|" + "---:|" * len({r["tokens"] for r in rows}))
    ratios = {"2": [], "1": []}
    by_layer = {}
    for r in rows:
        us = {x["choice"].split(":")[0][len("layouts="):]: x["us"] for x in r["results"]}
        by_layer.setdefault((r["layer"], r["scheme"]), []).append(
            f"{us['all']:.0f} / {us['2'] / us['all']:.2f} / {us['1'] / us['all']:.2f}")
        for b in ratios:
            ratios[b].append((us[b] / us["all"], r["tokens"]))
    for (layer, scheme), cells in by_layer.items():
        print(f"| `{layer}` | {scheme} | " + " | ".join(cells) + " |")
    for b, v in ratios.items():
        gm = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))  # noqa: E731
        print(f"\nW4A16_MOE_LAYOUTS={b}: {len(v)} calls, geometric mean {gm([x for x, _ in v]):.3f}; 1-4 tokens "
              f"{gm([x for x, t in v if t <= 4]):.3f}, 16-256 {gm([x for x, t in v if 16 <= t <= 256]):.3f}, "
              f">= 1024 {gm([x for x, t in v if t >= 1024]):.3f}; range {min(x for x, _ in v):.2f}-{max(x for x, _ in v):.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
