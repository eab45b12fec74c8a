"""Put an H100 sweep of ``scripts/explore_tiles.py time`` on the H200's clock for ``scripts/fit_cost_model.py``
(whose model is fitted on the H200 and which refuses sweeps of two devices).

    python docs/perf/2026-12-05-wide-pp-down/to_h200.py H100.json --out H200EQ.json [--ref 'docs/perf/2026-12-0[45]*/*.json']

Per GEMM (gate/up, down), the factor is the median of H200 / H100 kernel time over every (layer, tokens, choice) the
H100 sweep shares with recorded H200 sweeps (``--ref``): the same kernels on the same calls. Every GEMM kernel time
of the sweep is multiplied by its GEMM's factor; routing and finalize (memory-bound: H200 / H100 ~ 0.72, the HBM
ratio) are left as measured, and so is ``us`` (the model reads kernel times only). The output names the H200 and
keeps the provenance: ``measured_on``, ``factors``, ``pairs``.
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import sys


def _gemms(c: dict) -> list:
    """Indices of the two GEMM kernels (gate/up, down) in a result's ``kernels`` list (as fit_cost_model reads
    them: the third and second from last)."""
    ks = c.get("kernels") or []
    return [len(ks) - 3, len(ks) - 2] if len(ks) >= 4 else []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep")
    ap.add_argument("--out", required=True)
    ap.add_argument("--ref", default="docs/perf/2026-12-0[45]*/*.json")
    args = ap.parse_args(argv)
    data = json.load(open(args.sweep))
    if "H200" in data["device"]:
        raise SystemExit(f"{args.sweep}: already an H200 sweep")
    ref = {}
    for path in sorted(glob.glob(args.ref)):
        try:
            d = json.load(open(path))
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if not isinstance(d, dict) or "H200" not in str(d.get("device")) or "rows" not in d or "measured_on" in d:
            continue  # H200 sweeps only, not one this script wrote
        for r in d["rows"]:
            for c in r.get("results", []):
                if _gemms(c) and "us" in c:
                    ref.setdefault((r["layer"], r["tokens"], c["choice"]), []).append(c)
    ratios = ([], [])
    for r in data["rows"]:
        for c in r["results"]:
            for c2 in ref.get((r["layer"], r["tokens"], c["choice"]), []):
                for g, (i, j) in enumerate(zip(_gemms(c), _gemms(c2))):
                    ratios[g].append(c2["kernels"][j][1] / c["kernels"][i][1])
    if min(len(x) for x in ratios) < 8:
        raise SystemExit(f"only {len(ratios[0])} kernel pairs shared with the H200 sweeps: too few for a factor")
    factors = [round(statistics.median(x), 4) for x in ratios]
    for r in data["rows"]:
        for c in r["results"]:
            for g, i in enumerate(_gemms(c)):
                c["kernels"][i] = [c["kernels"][i][0], round(c["kernels"][i][1] * factors[g], 2)]
    data.update(device="NVIDIA H200", measured_on=data["device"], factors=dict(up=factors[0], down=factors[1]),
                pairs=len(ratios[0]), calibrated_by="docs/perf/2026-12-05-wide-pp-down/to_h200.py")
    with open(args.out, "w") as f:
        json.dump(data, f, indent=1)
    print(f"{args.sweep} -> {args.out}: factors up {factors[0]} down {factors[1]} from {len(ratios[0])} kernel pairs "
          f"(up {min(ratios[0]):.3f}-{max(ratios[0]):.3f}, down {min(ratios[1]):.3f}-{max(ratios[1]):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
