"""The tuned table (``tuned.json`` beside this module): rows by candidate name, each with its provenance.

Format 2 (written by ``scripts/merge_tuned.py`` from ``python -m w4a16_moe tune --json`` results)::

    {"format": 2, "description": ...,
     "entries": {KEY: [{"tokens": T, "family": "sm90" | "warp", "candidate": NAME, "splits": S | null,
                        "device": ..., "versions": {...}, "revision": ..., "date": ..., "note"?: ...}, ...]},
     "decode":  {KEY: {"max_routes": R, "knobs": [[T, "w8u8/w8u4"], ...], "device": ..., "versions": ...,
                       "revision": ..., "date": ...}},
     "commands": {KEY: "the tuner command lines of the key's sweeps"}}

``KEY`` is :func:`tuned_key` (GPU name, layer shape, scheme, dtype, top-k; ``e<E>of<E_global>`` for one
expert-parallel rank, what calls with the ``global_num_experts`` hint look up). A row names its tile shape by
:func:`candidate_name` (derived from the tile dict, so reordering a family's candidate list changes no row);
a call uses the row with the largest token count <= its own. The table is checked when it is read: a row
naming an unknown candidate (or family, or lacking a field) raises ``ValueError`` naming the key and the row,
and rows measured with other package versions than the running ones are logged (info). Selection reads a key's
rows (and a decode entry) only where they were timed on the running kernel sources (:func:`is_current`: the
``source:<family>`` hashes the tuner records in ``versions``); a key with a row timed on other sources, or on
sources it did not record, is ignored as a whole and its calls take the cost model and the rules.
This module imports neither torch nor the DSL.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from typing import Mapping, Optional

__all__ = ["TUNED_PATH", "FORMAT", "ROW_FIELDS", "TunedRow", "TunedTable", "candidate_name", "tuned_key", "load",
           "running_versions", "source_hashes", "is_current", "dumps"]

TUNED_PATH = os.path.join(os.path.dirname(__file__), "tuned.json")
FORMAT = 2
#: fields every grouped-GEMM row must have (``note`` is optional)
ROW_FIELDS = ("tokens", "family", "candidate", "splits", "device", "versions", "revision", "date")

# short keys of the tile-dict fields in candidate names (``down_`` fields come after ``__d_``)
_ABBREV = {"tokens_per_tile": "t", "m64_per_block": "x", "k_tile": "k", "stages": "s", "consumer_wgs": "w",
           "min_ctas_per_sm": "o", "schedule": "", "row_blocks_per_cta": "r", "pingpong": "pp", "b_slots": "b",
           "tn_variants": "v", "pdl": "pdl", "mma_kblocks": "f", "warps": "w", "m16_per_warp": "m",
           "evict_first": "ef", "setmaxnreg": "mr", "producer_regs": "pr", "consumer_regs": "cr"}
_ORDER = list(_ABBREV)


def _item(key: str, value) -> str:
    ab = _ABBREV.get(key, key.replace("_", ""))
    if isinstance(value, bool):
        return ab if value else ab + "0"
    return f"{ab}{value}"


def candidate_name(tiles: Mapping) -> str:
    """A stable name of a tile dict: its fields in a fixed order as ``<short key><value>`` joined by ``_``,
    the ``down_`` overrides after ``__d_`` (e.g. ``t56_x4_k128_s5_w2_v4_pdl_f4__d_x2_k128_s8_w2_overlap_r28_pp2_b2``).
    Two different dicts always get different names."""
    rank = {k: i for i, k in enumerate(_ORDER)}

    def part(keys, prefix):
        keys = sorted(keys, key=lambda k: (rank.get(k, len(rank)), k))
        return "_".join(_item(k, tiles[prefix + k]) for k in keys)

    name = part([k for k in tiles if not k.startswith("down_")], "")
    down = [k[5:] for k in tiles if k.startswith("down_")]
    return name + ("__d_" + part(down, "down_") if down else "")


def tuned_key(gpu: str, num_experts: int, hidden: int, intermediate: int, scheme: str, dtype: str, top_k: int,
              global_experts: Optional[int] = None) -> str:
    """``GPU|e<E>_h<H>_i<I>|scheme|dtype|k<K>``; an expert-parallel layer (the ``global_num_experts`` hint,
    ``global_experts`` > E) is ``e<E>of<E_global>_...``: rows measured with all routes local never serve
    calls that carry the hint, and rows measured for one EP rank serve only calls that say so."""
    ep = f"of{global_experts}" if global_experts is not None and global_experts != num_experts else ""
    return f"{gpu}|e{num_experts}{ep}_h{hidden}_i{intermediate}|{scheme}|{dtype}|k{top_k}"


@dataclass(frozen=True)
class TunedRow:
    """One grouped-GEMM row, resolved: ``tiles`` is the candidate's tile dict (as sorted items)."""

    tokens: int
    family: str
    candidate: str
    tiles: tuple
    splits: Optional[int]
    #: the ``source:<family>`` hashes of the row's ``versions`` (sorted items): the kernel sources it was timed on
    sources: tuple = ()


@dataclass(frozen=True)
class TunedTable:
    """The checked table: ``entries`` key -> rows sorted by tokens; ``decode`` key -> its decode entry."""

    entries: dict
    decode: dict
    raw: dict


@functools.lru_cache(maxsize=None)
def running_versions() -> dict:
    """The versions a tuned row is compared against (those the tuner records; None where absent)."""
    import importlib.metadata as md
    import platform

    def ver(name):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    from ...._version import __version__

    out = {"w4a16_moe": __version__, "triton": ver("triton"), "nvidia-cutlass-dsl": ver("nvidia-cutlass-dsl"),
           "python": platform.python_version()}
    try:
        import torch

        out.update(torch=torch.__version__, cuda=torch.version.cuda)
    except ImportError:  # pragma: no cover
        pass
    return out


def _check_row(key: str, i: int, row, candidates: Mapping) -> TunedRow:
    where = f"tuned table: {key} row {i} ({row!r})"
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected an object with {', '.join(ROW_FIELDS)} (format {FORMAT})")
    missing = [f for f in ROW_FIELDS if f not in row]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)}")
    fam = row["family"]
    if fam not in candidates:
        raise ValueError(f"{where}: unknown family {fam!r} (known: {', '.join(sorted(candidates))})")
    tiles = candidates[fam].get(row["candidate"])
    if tiles is None:
        raise ValueError(f"{where}: unknown candidate {row['candidate']!r} of family {fam!r}")
    sp = row["splits"]
    if not isinstance(row["tokens"], int) or row["tokens"] < 1 or not (sp is None or isinstance(sp, int) and sp >= 1):
        raise ValueError(f"{where}: tokens must be a positive int and splits null or a positive int")
    return TunedRow(row["tokens"], fam, row["candidate"], tuple(sorted(tiles.items())), sp,
                    source_hashes(row.get("versions")))


def source_hashes(versions) -> tuple:
    """The ``source:<family>`` items of a row's ``versions`` (sorted; empty when it records none)."""
    if not isinstance(versions, Mapping):
        return ()
    return tuple(sorted((k, v) for k, v in versions.items() if k.startswith("source:")))


def is_current(sources, family: str, running: Mapping) -> bool:
    """Whether a row (or decode entry) with ``sources`` (:func:`source_hashes`) was timed on the kernels that
    run now: it records the source hash of the ``family`` it names, and every source hash it records equals
    the running one (``running``: the autotune store's :func:`~..autotune_store.running_versions`)."""
    have = dict(sources)
    if f"source:{family}" not in have:
        return False
    return all(running.get(k) == v for k, v in have.items())


def _log_versions(table: dict, path: str) -> None:
    from ....log import logger

    run = running_versions()
    seen = set()
    recs = [(k, r) for k, rows in table.get("entries", {}).items() for r in rows]
    recs += [(k, r) for k, r in table.get("decode", {}).items()]
    for key, r in recs:
        diff = tuple(sorted((n, v, run.get(n)) for n, v in (r.get("versions") or {}).items()
                            if v is not None and run.get(n) is not None and v != run.get(n)))
        if diff and (key, diff) not in seen:
            seen.add((key, diff))
            logger.info("tuned table %s: %s measured with other versions than these: %s", path, key,
                        ", ".join(f"{n} {v} (running {now})" for n, v, now in diff))


def load(path: str, candidates: Mapping) -> TunedTable:
    """Read and check the table at ``path`` (empty when absent). ``candidates``: family name ->
    {candidate name: tile dict}. Raises ``ValueError`` naming the row on any malformed or unknown entry."""
    try:
        with open(path) as f:
            raw = json.load(f)
    except FileNotFoundError:
        return TunedTable({}, {}, {})
    except ValueError as e:
        raise ValueError(f"tuned table {path}: not valid JSON ({e})") from None
    if raw.get("format") != FORMAT:
        raise ValueError(f"tuned table {path}: format {raw.get('format')!r}, expected {FORMAT} "
                         "(rows by candidate name; see w4a16_moe.kernels.cute.sm90.tuned)")
    entries = {}
    for key, rows in raw.get("entries", {}).items():
        checked = [_check_row(key, i, r, candidates) for i, r in enumerate(rows)]
        entries[key] = tuple(sorted(checked, key=lambda r: r.tokens))
    decode = {}
    for key, ent in raw.get("decode", {}).items():
        if not isinstance(ent, dict) or not isinstance(ent.get("max_routes"), int):
            raise ValueError(f"tuned table: decode entry {key} ({ent!r}): expected max_routes (int) and knobs")
        decode[key] = ent
    _log_versions(raw, path)
    return TunedTable(entries, decode, raw)


def dumps(table: dict) -> str:
    """The table as JSON text with one row per line (what ``scripts/merge_tuned.py`` writes)."""
    lines = ["{"]
    head = [k for k in table if k not in ("entries", "decode", "commands")]
    for k in head:
        lines.append(f" {json.dumps(k)}: {json.dumps(table[k])},")
    for sect in ("entries", "decode", "commands"):
        body = table.get(sect, {})
        lines.append(f" {json.dumps(sect)}: {{")
        items = []
        for key, val in body.items():
            if sect == "entries":
                rows = ",\n".join("   " + json.dumps(r) for r in val)
                items.append(f"  {json.dumps(key)}: [\n{rows}\n  ]")
            else:
                items.append(f"  {json.dumps(key)}: {json.dumps(val)}")
        lines.append(",\n".join(items))
        lines.append(" }," if sect != "commands" else " }")
    lines.append("}")
    return "\n".join(line for line in lines if line) + "\n"
