# aggregate.py DIR ARM... - medians (and every repetition) of bench/pcache.sh events files:
# DIR/ARM*/{cold,restart,turn0,disk}-R.jsonl; bound = the restart's prefill_eval_s + state bytes / disk GB/s.
import json, glob, statistics as st, sys, os
def ev(f, kind):
    for l in open(f):
        e = json.loads(l)
        if e.get("event") == kind: return e
def rep(d, r):
    c, w, t0 = ev(f"{d}/cold-{r}.jsonl", "summary"), ev(f"{d}/restart-{r}.jsonl", "summary"), ev(f"{d}/turn0-{r}.jsonl", "summary")
    pw, pc, bw = ev(f"{d}/restart-{r}.jsonl", "prompt_cache"), ev(f"{d}/cold-{r}.jsonl", "prompt_cache"), ev(f"{d}/disk-{r}.jsonl", "disk")["gbs"]
    x = dict(cold=c["ttft_s"], restart=w["ttft_s"], new_rows=w["prefill_eval_s"], restore=pw["restore_s"], mb=pw["bytes_read"]/1e6,
             bw=bw, turn0=t0["ttft_s"], store_cold=pc["store_s"], store_restart=pw["store_s"], written_mb=pc["bytes_written"]/1e6)
    x["read"] = x["mb"]/1e3/bw; x["bound"] = x["new_rows"] + x["read"]; x["ratio"] = x["restart"]/x["bound"]
    return x
for arm in sys.argv[2:]:
    rows = []
    for d in sorted(glob.glob(f"{sys.argv[1]}/{arm}*")):
        for f in sorted(glob.glob(f"{d}/cold-*.jsonl")):
            rows.append(rep(d, f.split("-")[-1].split(".")[0]))
    keys = rows[0].keys()
    print(f"{arm}: n={len(rows)}")
    for k in keys:
        v = [x[k] for x in rows]
        print(f"  {k:14s} median {st.median(v):.4f}  [{', '.join(f'{a:.4f}' for a in v)}]")
