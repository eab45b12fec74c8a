"""Merge ``python -m w4a16_moe tune --json`` results into the tuned table (``kernels/cute/sm90/tuned.json``).

    python scripts/merge_tuned.py RESULT.json [RESULT.json ...] [--table PATH]

Per result: its grouped-GEMM rows replace the table's rows at the same token counts of its key (rows that
name the warp-MMA family are kept: the tuner does not time that family), and its ``decode`` summary (bound
and knob sets, when it timed the decode kernels) replaces the key's decode entry. Prints what changed.
"""

from __future__ import annotations

import argparse
import json
import os

TABLE = os.path.join(os.path.dirname(__file__), "..", "python", "w4a16_moe", "kernels", "cute", "sm90", "tuned.json")


def merge(table: dict, result: dict, log=print) -> dict:
    key = result["key"]
    rows = {r[0]: r for r in table.setdefault("entries", {}).get(key, [])}
    for r in result.get("rows", []):
        old = rows.get(r[0])
        if old is not None and len(old) > 3 and old[3] != "sm90":
            log(f"{key} T={r[0]}: kept {old} (another family; the tuner timed only sm90 tiles)")
            continue
        if old != r:
            log(f"{key} T={r[0]}: {old} -> {r}")
        rows[r[0]] = r
    table["entries"][key] = [rows[t] for t in sorted(rows)]
    if result.get("decode") is not None:
        old = table.setdefault("decode", {}).get(key)
        if old != result["decode"]:
            log(f"{key} decode: {old} -> {result['decode']}")
        table["decode"][key] = result["decode"]
    return table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--table", default=TABLE)
    a = ap.parse_args()
    with open(a.table) as f:
        table = json.load(f)
    for path in a.results:
        with open(path) as f:
            merge(table, json.load(f))
    with open(a.table, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
