"""Replay two checkouts' selection on timed rows (CPU): each row's default choice under OLD and NEW, looked up in the
row's measured choices (``explore_tiles.py time`` JSON), and their ratios.

    python docs/perf/2026-12-07-k64/replay.py OLD_CHECKOUT NEW_CHECKOUT ROWS.json...

Each checkout's ``python/`` is imported in its own process (an editable install's finder is removed first), the
plans made for the JSON's device name with every kernel assumed available.
"""

import json
import math
import subprocess
import sys

_PICKS = r'''
import json, sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, sys.argv[1] + "/python"); sys.path.insert(0, sys.argv[1] + "/scripts")
import torch
from sweep_tiles import parse_layer
from w4a16_moe.activations import get_activation
from w4a16_moe.device import DeviceInfo
from w4a16_moe.kernels.cute import autotune as at, provider
from w4a16_moe.validate import MoECall
provider._kernels_available = lambda arch: None
out = {}
for f in sys.argv[2:]:
    d = json.load(open(f))
    info = DeviceInfo("cuda", d["device"], (9, 0), 132)
    for r in d["rows"]:
        e, h, i, k, g = parse_layer(r["layer"])
        call = MoECall(r["tokens"], k, h, i, e, torch.bfloat16, torch.device("cuda"), get_activation("swiglu"),
                       r.get("finalize", "deterministic"), 0, r["scheme"], global_experts=g)
        out[f"{f}|{r['layer']}|{r['tokens']}"] = at._default_choice(call, info).label()
print(json.dumps(out))
'''


def picks(tree: str, files: list) -> dict:
    run = subprocess.run([sys.executable, "-c", _PICKS, tree, *files], capture_output=True, text=True, check=True)
    return json.loads(run.stdout)


def main(argv: list) -> int:
    old_tree, new_tree, files = argv[0], argv[1], argv[2:]
    old, new = picks(old_tree, files), picks(new_tree, files)
    ratio_new, ratio_old, ratio_best = [], [], []
    for f in files:
        for r in json.load(open(f))["rows"]:
            key = f"{f}|{r['layer']}|{r['tokens']}"
            res = {x["choice"]: x["us"] for x in r["results"] if "us" in x}
            o, n, best = res.get(old[key]), res.get(new[key]), min(res.values())
            if o is None or n is None:
                print(f"{key}: not timed: {old[key] if o is None else ''} {new[key] if n is None else ''}")
                continue
            ratio_new.append(n / o), ratio_old.append(o / best), ratio_best.append(n / best)
            mark = "" if old[key] == new[key] else " *"
            print(f"{f.split('/')[-1]:16s} {r['layer']:16s} {r['tokens']:5d} {r['scheme']:11s} old {old[key][:36]:36s} "
                  f"{o:7.1f}  new {new[key][:36]:36s} {n:7.1f}  {n / o:.3f}{mark}")

    def gm(v):
        return math.exp(sum(map(math.log, v)) / len(v))

    print(f"{len(ratio_new)} rows: new / old {gm(ratio_new):.3f} (worst {max(ratio_new):.3f}); old / fastest "
          f"{gm(ratio_old):.3f} (worst {max(ratio_old):.3f}); new / fastest {gm(ratio_best):.3f} (worst {max(ratio_best):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
