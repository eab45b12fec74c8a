"""``python -m w4a16_moe.bench.merge OUT_DIR FILE... [--date YYYY-MM-DD] [--flat]``: combine benchmark
results into ``OUT_DIR/<date>/<layer>.json`` (a list of :mod:`.records`), ``.md`` (table) and ``.png``
(plot, when matplotlib is installed), one set per layer and dtype (``<layer>-fp16`` for FP16).

Each FILE is one of:

* the project's records (``bench --json``: a JSON list);
* an older ``bench --json`` (``{"meta", "records"}`` with ``workload`` / ``provider`` fields);
* the peers tool's output (``peer_bench.py --json``: ``{"tool": "peer_bench", "layer", "env", "rows", ...}``).
  Its fields map as: ``layer.name`` -> layer, ``layer.dtype`` -> dtype, ``int4_g<layer.g>`` -> scheme, per row
  ``tokens`` and ``floor_eff_us``, per impl ``median_us``, ``nrmse``, ``samples_us``, ``provider`` and the
  marks (``impls.<name>.marks``; ``^`` where the project's provider was not ``cute``, ``~`` for partial
  samples); ``env.gpu`` -> device; ``env.w4a16_moe_revision`` or ``env.staged.revision`` (``+dirty`` when
  the staged checkout had changed files) -> revision. The tool writes no date: ``--date`` or the file's
  modification time (UTC) is used. Skipped impls, warnings and rows left unmeasured become notes.

A (layer, dtype, tokens, impl) given by several files is taken from the last one. ``<date>`` is ``--date``
or the latest record date; ``--flat`` writes into OUT_DIR itself.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import sys
from typing import Optional

from . import records as rec

__all__ = ["load", "peer_records", "legacy_records", "merge", "write_outputs", "main"]


def _float(v):
    if isinstance(v, str):
        try:
            return float(v)  # "nan" / "inf" as the peers tool writes them
        except ValueError:
            return None
    return v


def _file_date(path: str) -> str:
    return _dt.datetime.fromtimestamp(os.path.getmtime(path), _dt.timezone.utc).isoformat(timespec="seconds")


def _peer_revision(env: dict) -> Optional[str]:
    if env.get("w4a16_moe_revision"):
        return str(env["w4a16_moe_revision"])
    st = env.get("staged")
    if isinstance(st, dict) and st.get("revision"):
        dirty = st.get("dirty_files")
        return str(st["revision"]) + ("+dirty" if dirty not in (None, 0, "0", [], False) else "")
    return None


def peer_records(res: dict, date: Optional[str] = None, source_file: Optional[str] = None) -> tuple:
    """``(records, notes)`` of one peers-tool result (see the module docstring for the field mapping); notes
    are ``(layer, text)``."""
    L, env = res["layer"], res.get("env") or {}
    impl_info = res.get("impls") or {}
    device = env.get("gpu") or "cpu"
    revision = _peer_revision(env)
    scheme = f"int4_g{L['g']}"
    versions = {k: env.get(k) for k in ("torch", "triton", "cuda", "python") if env.get(k)}
    versions["peer_bench"] = env.get("tool")
    if isinstance(impl_info.get("w4a16_moe"), dict):
        versions["w4a16_moe"] = impl_info["w4a16_moe"].get("version")
    if isinstance(impl_info.get("humming"), dict) and impl_info["humming"].get("humming"):
        versions["humming"] = impl_info["humming"]["humming"]
    out = []
    for row in res.get("rows") or []:
        for name, r in (row.get("impls") or {}).items():
            if name not in rec.IMPLS + rec.EXTRA_IMPLS:
                continue
            marks = (impl_info.get(name) or {}).get("marks") or ""
            if name in rec.PROJECT_IMPLS and r.get("provider") not in (None, "cute"):
                marks += "^"
            if r.get("partial"):
                marks += "~"
            med = _float(r.get("median_us"))
            d = {"layer": L["name"], "tokens": int(row["tokens"]), "impl": name, "median_us": med,
                 "floor_eff_us": float(row["floor_eff_us"]), "nrmse": _float(r.get("nrmse")), "device": device,
                 "revision": revision, "dtype": L.get("dtype", "bfloat16").replace("bfloat16", "bf16")
                 .replace("float16", "fp16"), "scheme": scheme, "activation": "swiglu", "date": date,
                 "source": "peer_bench" + (f" ({os.path.basename(source_file)})" if source_file else ""),
                 "marks": marks, "samples_us": r.get("samples_us", []), "floor_us": row.get("floor_us"),
                 "experts_present": row.get("n_hit"), "local_routes": row.get("n_local_routes"),
                 "bound": row.get("bound"),
                 "layer_shape": {"E": L["E_local"], "H": L["H"], "I": L["I"], "topk": L["topk"],
                                 "E_global": L["E_global"]},
                 "versions": versions}
            if r.get("provider") is not None:
                d["provider"] = r["provider"]
            if r.get("error"):
                d["error"] = r["error"]
            if d["nrmse"] is not None and not math.isfinite(d["nrmse"]):
                d.setdefault("error", f"non-finite output or reference (NRMSE {d['nrmse']})")
                d["nrmse"] = None  # JSON has no nan / inf
            out.append(d)
    texts = []
    for n, why in (res.get("skipped") or {}).items():
        texts.append(f"skipped `{n}`: {why}")
    texts += [f"WARNING: {w}" for w in res.get("warnings") or []]
    if res.get("not_measured"):
        texts.append(f"not measured {', '.join(map(str, res['not_measured']))} ({res.get('stopped')}); "
                     f"finish with `{res.get('resume_hint')}`")
    argv = (res.get("args") or {}).get("argv")
    if argv:
        texts.append(f"command `{' '.join(argv)}`")
    src = os.path.basename(source_file) if source_file else "peer_bench"
    return out, [(L["name"], f"{src}: {t}") for t in texts]


def legacy_records(res: dict) -> list:
    """Records of an older ``bench --json`` (``{"meta", "records"}`` keyed by workload / provider)."""
    m = res.get("meta") or {}
    out = []
    for r in res["records"]:
        d = dict(r)
        d.setdefault("layer", r.get("workload") or m.get("workload"))
        d.setdefault("impl", rec.PROVIDER_IMPL.get(r.get("provider"), r.get("provider")))
        d.setdefault("device", m.get("device"))
        d.setdefault("revision", m.get("revision"))
        d.setdefault("date", m.get("date"))
        d.setdefault("dtype", m.get("dtype", "bf16"))
        d.setdefault("source", "w4a16_moe bench")
        out.append(d)
    return out


def load(path: str, date: Optional[str] = None) -> tuple:
    """``(records, notes)`` of one FILE of any of the three kinds (notes: ``(layer, text)``)."""
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, list):
        return rec.check_records(data), []
    if isinstance(data, dict) and data.get("tool") == "peer_bench":
        return peer_records(data, date or _file_date(path), path)
    if isinstance(data, dict) and isinstance(data.get("records"), list):
        return rec.check_records(legacy_records(data)), []
    raise ValueError(f"{path}: neither a list of records, a bench result nor a peer_bench result")


def merge(lists) -> list:
    """Concatenate record lists; a later record replaces an earlier one of the same (layer, dtype, tokens, impl)."""
    out: dict = {}
    for recs in lists:
        for r in recs:
            key = (r["layer"], r.get("dtype") or "bf16", r["tokens"], r["impl"])
            out.pop(key, None)
            out[key] = r
    return list(out.values())


def write_outputs(records: list, out_dir: str, notes=(), date: Optional[str] = None, flat: bool = False,
                  log=print) -> list:
    """Write ``<layer>.json/.md/.png`` per (layer, dtype) under ``out_dir/<date>`` (or ``out_dir`` when
    ``flat``), each markdown with the ``(layer, text)`` notes of its layer. Returns the paths written."""
    rec.check_records(records)
    if not flat:
        if date is None:
            dates = sorted(str(r["date"])[:10] for r in records if r.get("date"))
            date = dates[-1] if dates else _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
        out_dir = os.path.join(out_dir, date)
    os.makedirs(out_dir, exist_ok=True)
    written = []
    notes = list(notes)
    order = rec.IMPLS + rec.EXTRA_IMPLS
    for (layer, dtype), recs in rec.group_records(records).items():
        recs = sorted(recs, key=lambda r: (r["tokens"], order.index(r["impl"])))
        stem = os.path.join(out_dir, rec.group_file_stem(layer, dtype))
        rec.write_json(recs, stem + ".json")
        rec.write_markdown(recs, stem + ".md", notes=[t for lay, t in notes if lay in (layer, None)])
        written += [stem + ".json", stem + ".md"]
        if rec.write_plot(recs, stem + ".png", log=log):
            written.append(stem + ".png")
    return written


def main(argv: Optional[list] = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m w4a16_moe.bench.merge", description="combine benchmark records and peers-tool results into "
                                 "OUT_DIR/<date>/<layer>.{json,md,png}",
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("out_dir", metavar="OUT_DIR", help="e.g. docs/benchmarks")
    ap.add_argument("files", metavar="FILE", nargs="+", help="records, bench or peer_bench JSON files")
    ap.add_argument("--date", default=None, help="YYYY-MM-DD: the folder under OUT_DIR, and the date of "
                                                 "peer_bench records (default: their file's time)")
    ap.add_argument("--flat", action="store_true", help="write into OUT_DIR itself, no <date> folder")
    a = ap.parse_args(argv)
    if a.date is not None:
        try:
            _dt.date.fromisoformat(a.date)
        except ValueError:
            ap.error(f"--date: expected YYYY-MM-DD, got {a.date!r}")
    lists, notes = [], []
    for p in a.files:
        if not os.path.isfile(p):
            ap.error(f"FILE: {p} does not exist")
        try:
            recs, n = load(p, a.date)
        except (ValueError, KeyError, json.JSONDecodeError) as e:
            print(f"merge: {p}: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        lists.append(recs)
        notes += n
    records = merge(lists)
    if not records:
        print("merge: no records in the given files", file=sys.stderr)
        return 1
    for p in write_outputs(records, a.out_dir, notes, a.date, a.flat):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
