"""Merge ``python -m w4a16_moe tune --json`` results into the tuned table (``kernels/cute/sm90/tuned.json``).

    python scripts/merge_tuned.py RESULT.json [RESULT.json ...] [--table PATH]

Per result: its grouped-GEMM rows (each naming its candidate and carrying the run's device, versions,
revision and date) replace the table's rows at the same token counts of its key (rows that name the
warp-MMA family are kept: the tuner does not time that family), and its ``decode`` summary (bound, knob
sets and the run's provenance, when it timed the decode kernels) replaces the key's decode entry. The merged
table is checked the way the package reads it (an unknown candidate name is an error naming the row).
Prints what changed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TABLE = os.path.join(ROOT, "python", "w4a16_moe", "kernels", "cute", "sm90", "tuned.json")
PROVENANCE = ("device", "versions", "revision", "date")


def _short(row: dict) -> str:
    return f"{row.get('family')}:{row.get('candidate')} splits {row.get('splits')}"


def merge(table: dict, result: dict, log=print) -> dict:
    key = result["key"]
    rows = {r["tokens"]: r for r in table.setdefault("entries", {}).get(key, [])}
    meta = result.get("meta") or {}
    for r in result.get("rows", []):
        if not isinstance(r, dict):
            raise ValueError(f"{key}: result row {r!r} is not a named row (a result of a tuner older than format 2)")
        r = {**{k: meta[k] for k in PROVENANCE if k in meta}, **r}
        missing = [k for k in ("tokens", "family", "candidate", "splits") + PROVENANCE if k not in r]
        if missing:
            raise ValueError(f"{key}: result row {r!r} lacks {', '.join(missing)}")
        old = rows.get(r["tokens"])
        if old is not None and old.get("family", "sm90") != "sm90":
            log(f"{key} T={r['tokens']}: kept {_short(old)} (another family; the tuner timed only sm90 tiles)")
            continue
        if old is None or _short(old) != _short(r):
            log(f"{key} T={r['tokens']}: {_short(old) if old else None} -> {_short(r)}")
        rows[r["tokens"]] = r
    table["entries"][key] = [rows[t] for t in sorted(rows)]
    if result.get("decode") is not None:
        dec = {**{k: meta[k] for k in PROVENANCE if k in meta}, **result["decode"]}
        old = table.setdefault("decode", {}).get(key)
        if old != dec:
            log(f"{key} decode: {old} -> {dec}")
        table["decode"][key] = dec
    if meta.get("command"):
        table.setdefault("commands", {})[key] = meta["command"]
    return table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--table", default=TABLE)
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from w4a16_moe.kernels.cute.sm90 import family as fam
    from w4a16_moe.kernels.cute.sm90.tuned import FORMAT, dumps

    with open(a.table) as f:
        table = json.load(f)
    if table.get("format") != FORMAT:
        print(f"merge_tuned: {a.table} is format {table.get('format')}, expected {FORMAT}", file=sys.stderr)
        return 2
    for path in a.results:
        with open(path) as f:
            merge(table, json.load(f))
    text = dumps(table)
    tmp = a.table + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    try:
        fam._table(tmp)  # the checks the package applies when it reads the table
    except ValueError as e:
        os.unlink(tmp)
        print(f"merge_tuned: {e}", file=sys.stderr)
        return 1
    os.replace(tmp, a.table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
