"""Evaluate a cost model (code at CODE, JSON at MODEL) on the sweep files, the way tests/test_cost_model.py does.
usage: python eval_cm.py CODE_ROOT MODEL_JSON OUT_JSON"""
import json, math, os, sys
code, model_path, out_path = sys.argv[1:4]
sys.meta_path = [f for f in sys.meta_path if "ScikitBuild" not in type(f).__name__]
sys.path.insert(0, os.path.join(code, "python"))
sys.path.insert(0, os.path.join(code, "tests"))
os.chdir(code)  # the sweeps are read relative to the checkout
from w4a16_moe.kernels.cute import cost_model
from w4a16_moe.kernels.cute.sm90 import family as fam
from w4a16_moe.kernels.cute.sm90.tuned import candidate_name
import test_cost_model as T
assert cost_model.__file__.startswith(code), cost_model.__file__
m = json.load(open(model_path))
cost_model.model = lambda path=None: m
P = os.path.join("docs", "perf")
files = {os.path.relpath(p, os.path.join(T.ROOT, P)): p for p in T.HELD}
files.update({os.path.relpath(p, P) + " (fit)": p for p in T.FIT})
files.update({os.path.relpath(p, P) + " (extend)": p for p in T.EXTEND})
res = {}
for label, path in files.items():
    ratios, rows, picks = [], 0, []
    for e, h, i, k, t, g, times in T._rows(path):
        rows += 1
        f, tl, _ = fam.rule_choice(t * k, e, k, g if g > e else None, "int4_g128", h, i, True, 132)
        got = T._choice_time(times, f, tl)
        picks.append([f"{e},{h},{i},{k}" + (f",{g}" if g > e else ""), t, f"{f} {candidate_name(tl)}", got, min(times.values())])
        if got is None:
            continue
        ratios.append(got / min(times.values()))
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    res[label] = dict(rows=rows, timed=len(ratios), geo=geo, max=max(ratios), picks=picks)
    print(f"{label:55s} rows {rows:3d} timed {len(ratios):3d} geo {geo:.4f} max {max(ratios):.3f}")
layers = [tuple(int(v) for v in s.split(",")) for s in (
    "384,7168,256,8", "32,7168,2048,8,256", "256,7168,256,8", "128,4096,384,8", "16,4096,1536,8,128",
    "20,5120,1536,8,160", "16,5120,8192,1", "128,5120,1024,1", "8,4096,14336,2", "128,2048,768,8",
    "64,4096,512,8", "128,4096,768,8", "60,2048,640,4", "16,4096,1536,8", "64,2048,1408,6", "8,6144,16384,2",
    "128,2048,768,8,128", "160,5120,384,8", "64,4096,256,8", "128,7168,256,8", "40,5120,1536,8,160")]
grid = []
for e, h, i, k, *rest in layers:
    for t in (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192):
        c = fam.model_choice(t * k, e, h, i, True, k, rest[0] if rest else None)
        grid.append([",".join(map(str, (e, h, i, k, *rest))), t, None if c is None else f"{c[0]} {candidate_name(c[1])}"])
json.dump(dict(files=res, grid=grid), open(out_path, "w"), indent=0)
