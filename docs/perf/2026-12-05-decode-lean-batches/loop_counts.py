"""The batch loop of each decode kernel in a prebuilt directory (CPU, no GPU): the innermost loop that holds
``HMMA`` (a backward branch to a label before it), its instruction count, its ``HMMA`` count and its opcode mix.

    python docs/perf/2026-12-05-decode-lean-batches/loop_counts.py DIR [--match SUBSTRING]
"""
import argparse
import re
import sys
from pathlib import Path

from w4a16_moe.loader import sass


def batch_loop(text: str):
    """``(instructions, HMMAs, opcode counter)`` of the innermost loop holding HMMA, or None."""
    ins, labels, pending = [], {}, []
    for line in text.split("\n"):
        line = line.strip()
        m = re.match(r"^(\.L_x_\d+):", line)
        if m:
            pending.append(m.group(1))
            continue
        if re.match(r"/\*[0-9a-f]+\*/\s+\S", line):
            for p in pending:
                labels[p] = len(ins)
            pending = []
            ins.append(line)
    loops = []
    for i, s in enumerate(ins):
        m = re.search(r"BRA\s+`\((\.L_x_\d+)\)", s)
        if m and labels.get(m.group(1), i + 1) <= i:
            body = ins[labels[m.group(1)]:i + 1]
            h = sum("HMMA" in b for b in body)
            if h:
                loops.append((len(body), h, sass.opcode_counts("\n".join(body))))
    return min(loops, key=lambda x: x[0] / x[1]) if loops else None


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--match", default="w4a16_decode_gemv")
    a = ap.parse_args(argv)
    kernels, _ = sass._by_family(Path(a.dir))  # the SASS check's reader: manifest, libraries, cubins by fingerprint
    for k, cubins in (kc for group in kernels.values() for kc in group):
        if a.match not in k["name"]:
            continue
        p = k["params"]
        loop = batch_loop(sass.disassemble(cubins[0].data))
        if loop is None:
            continue
        n, h, ops = loop
        knobs = (f"{p['mode']:7s} {p['dtype']} g{p['group']:<3d} w{p['warps']}u{p['unroll']}"
                 f"{'x' if p.get('fp32_scale') else ' '}{'z' if p.get('zero_point') else ' '} X{p['m64_per_block']}")
        top = " ".join(f"{o} {c}" for o, c in ops.most_common(8))
        print(f"{knobs}  loop {n:4d}  HMMA {h:3d}  per HMMA {n / h:5.1f}  | {top}")


if __name__ == "__main__":
    sys.exit(main())
