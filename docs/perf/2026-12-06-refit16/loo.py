"""Leave one layer out: refit the SM90 entries without each fit layer in turn and replay the refit's picks on that
layer's rows (the time of the pick over the fastest timed choice, unsplit, runs averaged).

    PYTHONPATH=python python docs/perf/2026-12-06-refit16/loo.py call|kernels
"""
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile

D = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("replay", os.path.join(D, "replay.py"))
rp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rp)
FILES = [os.path.join(D, f) for f in ("fitA.json", "fitB.json", "fitA2.json", "fitB2.json")]
ARGS = {"call": ["--target", "call", "--time-scale", "0.96"], "kernels": []}


def main():
    mode = sys.argv[1]
    data = [json.load(open(f)) for f in FILES]
    rows = rp.rows(FILES)
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    logs, worst, tmp = [], [], tempfile.mkdtemp()
    for layer in sorted({r["layer"] for d in data for r in d["rows"]}):
        paths = []
        for j, d in enumerate(data):
            p = os.path.join(tmp, f"s{j}.json")
            json.dump(dict(d, rows=[r for r in d["rows"] if r["layer"] != layer]), open(p, "w"))
            paths.append(p)
        out = os.path.join(tmp, "model.json")
        subprocess.run([sys.executable, "scripts/fit_cost_model.py", *paths, *ARGS[mode], "--families", "sm90",
                        "--base", os.path.join(D, "base_model.json"), "--out", out], check=True, capture_output=True)
        for key, r in rows.items():
            if key[0] != layer or not r["t"]:
                continue
            p = rp.pick(out, r)
            if p in r["t"]:
                x = mean(r["t"][p]) / min(mean(v) for v in r["t"].values())
                logs.append(math.log(x))
                worst.append((round(x, 3), key))
    print(f"{mode}: {len(logs)} rows, geo {math.exp(mean(logs)):.4f}, worst {max(worst)}, "
          f"> 1.05: {sum(w[0] > 1.05 for w in worst)}")


if __name__ == "__main__":
    main()
