"""The 16-bit staging tile against the FP32 one, per row of the twin runs (``explore_tiles.py time --twin``).

    python docs/perf/2026-12-06-stage16/compare.py twin_h100_a.json [twin_h100_b.json]

Each file holds rows whose first two results are the default plan and its twin (one with ``down_stage16``, one
without, in either order). Prints, per row and file, the stage16 / FP32 ratio of the call and of each GEMM kernel,
and with two files (the two timing orders) their geometric mean."""

import json
import math
import sys


def ratios(path: str) -> dict:
    d = json.load(open(path))
    out = {}
    for row in d["rows"]:
        rs = [r for r in row["results"] if "us" in r]
        if len(rs) < 2:
            continue
        s16 = [r for r in rs if r["tiles"].get("down_stage16", "default") in (True, "default")]
        f32 = [r for r in rs if r["tiles"].get("down_stage16") is False]
        # file a: default (no key) was FP32 staging and the twin has down_stage16=True
        if not f32:
            f32 = [r for r in rs if "down_stage16" not in r["tiles"]]
            s16 = [r for r in rs if r["tiles"].get("down_stage16") is True]
        a, b = f32[0], s16[0]
        ka = [k[1] for k in a["kernels"] if "cutlass" in k[0]]
        kb = [k[1] for k in b["kernels"] if "cutlass" in k[0]]
        t = a["tiles"]
        kind = "pp" if t.get("down_pingpong") else ("wg4" if t.get("consumer_wgs") == 4 else "rb1")
        out[(row["layer"], row["tokens"])] = dict(kind=kind, call=b["us"] / a["us"], up=kb[0] / ka[0],
                                                  down=kb[1] / ka[1], f32_down=ka[1], s16_down=kb[1],
                                                  f32_call=a["us"], s16_call=b["us"])
    return d["device"], out


def main(paths) -> None:
    runs = [ratios(p) for p in paths]
    print("device:", ", ".join(sorted({r[0] for r in runs})))
    keys = [k for k in runs[0][1] if all(k in r[1] for r in runs)]
    gm = lambda v: math.exp(sum(map(math.log, v)) / len(v))  # noqa: E731
    print("| layer | tokens | down GEMM | call s16/f32 | gate/up s16/f32 | down s16/f32 | down us f32 -> s16 |")
    print("|---|---:|---|---:|---:|---:|---:|")
    by_kind = {}
    for k in keys:
        rs = [r[1][k] for r in runs]
        call, up, down = (gm([r[f] for r in rs]) for f in ("call", "up", "down"))
        by_kind.setdefault(rs[0]["kind"], []).append((call, down))
        f32d, s16d = gm([r["f32_down"] for r in rs]), gm([r["s16_down"] for r in rs])
        print(f"| `{k[0]}` | {k[1]} | {rs[0]['kind']} | {call:.3f} | {up:.3f} | {down:.3f} | {f32d:.1f} -> {s16d:.1f} |")
    for kind, v in sorted(by_kind.items()):
        print(f"{kind}: {len(v)} rows, call {gm([c for c, _ in v]):.3f} (geo mean; {min(c for c, _ in v):.3f}-"
              f"{max(c for c, _ in v):.3f}), down kernel {gm([d for _, d in v]):.3f} "
              f"({min(d for _, d in v):.3f}-{max(d for _, d in v):.3f})")


if __name__ == "__main__":
    main(sys.argv[1:])
