"""The cost model's choice between the TN 80 (four widths) and TN 96 grouped tiles on every sweep row of docs/perf
that timed both unsplit (INT4 g128, BF16, >= 40 routes per expert): measured and predicted t96 / t80v4, and the
regret (time of the model's pick / the faster of the two). Run from the checkout root:
python docs/perf/2026-12-04-tile-edge/regret.py"""
import json,gzip,glob,math,collections
from w4a16_moe.kernels.cute import cost_model as cm, tiles as tr
N80="sm90 t80_x4_k64_s4_w2_v4_pdl_f2"; N96="sm90 t96_x4_k64_s4_w2"
seen=set(); rows=[]
for f in sorted(glob.glob("docs/perf/*/*.json*")):
    op=gzip.open if f.endswith(".gz") else open
    try: d=json.load(op(f))
    except Exception: continue
    rs=d.get("rows") if isinstance(d,dict) else None
    if not isinstance(rs,list): continue
    for r in rs:
        if not isinstance(r,dict) or "results" not in r or r.get("scheme","int4_g128")!="int4_g128" or r.get("dtype","bf16")!="bf16": continue
        t={}
        for x in r["results"]:
            c=x.get("choice","")
            if x.get("us") is None or "split-K 2" in c or "split-K 4" in c or "split-K 8" in c: continue
            for n in (N80,N96):
                if c==n+" split-K rule" or c==n: t[n]=x["us"]
        if len(t)<2: continue
        E,H,I,k,T=r["E"],r["H"],r["I"],r["top_k"],r["tokens"]; Eg=r.get("E_global") or E
        key=(f.split("/")[2],E,H,I,k,Eg,T)
        R=T*k; g=Eg if Eg>E else None
        p80=cm.predict_us(N80,R,E,H,I,True,k,g); p96=cm.predict_us(N96,R,E,H,I,True,k,g)
        rows.append((key, T*k/Eg, t[N80], t[N96], p80, p96))
n=0; reg=[]
for key,rpe,m80,m96,p80,p96 in sorted(rows,key=lambda r:r[1]):
    if rpe<40: continue
    pick = m80 if p80<=p96 else m96
    best=min(m80,m96); reg.append(pick/best)
    print(f"{str(key):60s} rpe {rpe:6.1f} meas96/80 {m96/m80:5.3f} pred96/80 {p96/p80:5.3f} regret {pick/best:5.3f}")
print("rows",len(reg),"geo regret",math.exp(sum(map(math.log,reg))/len(reg)),"max",max(reg))
