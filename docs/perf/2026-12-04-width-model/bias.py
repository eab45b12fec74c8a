import json, sys, os, math, collections
code, mp = sys.argv[1], sys.argv[2]
sys.meta_path = [f for f in sys.meta_path if "ScikitBuild" not in type(f).__name__]
sys.path.insert(0, os.path.join(code, "python"))
from w4a16_moe.kernels.cute import cost_model as cm, tiles as T
from w4a16_moe.kernels.cute.sm90.tuned import candidate_name
m = json.load(open(mp)); cm.model = lambda path=None: m
for fn in sys.argv[3:]:
    d = json.load(open(fn))
    acc = collections.defaultdict(list)
    for r in d["rows"]:
        if "results" not in r: continue
        e, h, i, k, t, g = r["E"], r["H"], r["I"], r["top_k"], r["tokens"], r.get("E_global", r["E"])
        if t < 1024: continue
        for x in r["results"]:
            if "us" not in x or list(x.get("splits", [1,1])) != [1, 1]: continue
            name = f"{x['family']} {candidate_name(x['tiles'])}"
            if name not in m["entries"]: continue
            p = cm.predict_us(name, t * k, e, h, i, True, k, g if g > e else None)
            acc[name].append(x["us"] / p)
    print(fn.split("perf/")[1], "(rows >= 1024 tokens) measured / predicted, geo mean [n]:")
    for n, v in sorted(acc.items()):
        if n.startswith("sm90 t") and int(n[6:].split("_")[0]) >= 48:
            print(f"   {n[5:45]:40s} {math.exp(sum(map(math.log, v))/len(v)):.3f} [{len(v)}]")
