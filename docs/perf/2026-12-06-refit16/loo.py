"""Leave one layer out: refit the model without each layer of the sweeps in turn and replay the refit's picks on that
layer's rows (the time of the pick over the fastest timed choice, unsplit, runs averaged; a row of a sweep timed with
the split-K rule counts the choices the rule left unsplit).

    PYTHONPATH=python python docs/perf/2026-12-06-refit16/loo.py call|kernels|call-all [SWEEP.json ...]

Modes: ``call`` the shipped model's method (the SM90 entries on the call time on the H200's clock, the warp entries
of base_model.json), ``kernels`` the same on each kernel's time, ``call-all`` every family on the call time on the
sweeps' own clock (no base). Sweeps: the four fit sweeps unless given.
"""
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

D = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("replay", os.path.join(D, "replay.py"))
rp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rp)
FILES = [os.path.join(D, f) for f in ("fitA.json", "fitB.json", "fitA2.json", "fitB2.json")]
BASE = ["--families", "sm90", "--base", os.path.join(D, "base_model.json")]
ARGS = {"call": ["--target", "call", "--time-scale", "0.96", *BASE], "kernels": BASE, "call-all": ["--target", "call"]}


def main():
    mode, files = sys.argv[1], sys.argv[2:] or FILES
    data = [json.load(open(f)) for f in files]
    rows = rp.rows(files)
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    tmp = tempfile.mkdtemp()
    layers = sorted({r["layer"] for d in data for r in d["rows"]})

    def refit(n_layer):
        n, layer = n_layer
        paths = []
        for j, d in enumerate(data):
            p = os.path.join(tmp, f"l{n}_s{j}.json")
            json.dump(dict(d, rows=[r for r in d["rows"] if r["layer"] != layer]), open(p, "w"))
            paths.append(p)
        out = os.path.join(tmp, f"l{n}_model.json")
        subprocess.run([sys.executable, "scripts/fit_cost_model.py", *paths, *ARGS[mode], "--out", out], check=True,
                       capture_output=True)
        return layer, out

    with ThreadPoolExecutor(2) as ex:
        models = dict(ex.map(refit, enumerate(layers)))
    logs, worst = [], []
    for key, r in rows.items():
        if not r["t"]:
            continue
        p = rp.pick(models[key[0]], r)
        if p in r["t"]:
            x = mean(r["t"][p]) / min(mean(v) for v in r["t"].values())
            logs.append(math.log(x))
            worst.append((round(x, 3), key))
    print(f"{mode}: {len(layers)} layers, {len(logs)} rows, geo {math.exp(mean(logs)):.4f}, worst {max(worst)}, "
          f"> 1.05: {sum(w[0] > 1.05 for w in worst)}")


if __name__ == "__main__":
    main()
