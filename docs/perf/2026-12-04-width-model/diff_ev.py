import json, sys
a = json.load(open(sys.argv[1])); b = json.load(open(sys.argv[2]))
def short(n): return n.replace("sm90 ", "").replace("_x4_k64_s4_w2", "").replace("_pdl_f2", "")[:40]
for f in a["files"]:
    for pa, pb in zip(a["files"][f]["picks"], b["files"][f]["picks"]):
        if pa[2] != pb[2]:
            ra = None if pa[3] is None else pa[3] / pa[4]; rb = None if pb[3] is None else pb[3] / pb[4]
            print(f"{f[:40]:40s} {pa[0]:22s} @{pa[1]:5d}: {short(pa[2]):40s} {ra and round(ra,3)} -> {short(pb[2]):40s} {rb and round(rb,3)}")
ch = [(x, y) for x, y in zip(a["grid"], b["grid"]) if x[2] != y[2]]
print("grid changes:", len(ch), "of", len(a["grid"]))
for x, y in ch:
    print(f"  {x[0]:22s} @{x[1]:5d}: {short(x[2])} -> {short(y[2])}")
