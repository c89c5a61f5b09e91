#!/usr/bin/python3
"""report.py OUT MEMBW MODE - turns bench/suite.sh's arms.jsonl into results.json,
results.md and gnuplot PNGs (tokens/s vs budget per arm; time per token split into
read wait, compute and other) in OUT.

Per (section, budget, arm): median, min and max over the repetitions. The I/O
bound of an arm is the measured O_DIRECT bandwidth of its repetition divided by
the expert bytes it missed per token; `fraction_of_bound` is tokens/s over it.
Bytes per token are what the process made the kernel fetch from storage while
decoding (/proc/self/io read_bytes), so the page-cache path (buffered reads, whose
misses the engine cannot see) and the pack (O_DIRECT) are counted the same way;
the bound sections and k3 use the engine's own count of missed bytes instead. k3
also sets each streamed prefill's time to first token against one read of the
experts it touched + the in-RAM prefill (k3_summary).
"""
import json
import os
import shutil
import statistics
import subprocess
import sys

out, membw, mode = sys.argv[1], float(sys.argv[2] or 0), sys.argv[3]
rows = [json.loads(l) for l in open(os.path.join(out, "arms.jsonl")) if l.strip()]
iobw = {(r["section"], r["rep"]): r["gbs"] for r in rows if r.get("event") == "iobw"}
sims = {(r["budget_pct"], r["arm"]): r for r in rows if r.get("event") == "cachesim"}
runs = [r for r in rows if r.get("event") == "summary"]


def per_token_bytes(r):
    # what the process made the kernel fetch from storage while decoding
    # (/proc/self/io): O_DIRECT pack reads and page-cache misses alike
    return r["storage_bytes_read"] / max(1, r["decode_tokens"])


def derive(r):
    n = max(1, r["decode_tokens"])
    bw = iobw.get((r["section"], r["rep"]), r.get("io_bw_gbs", 0))
    bpt = per_token_bytes(r)
    mbw = r.get("membw_gbs", membw)
    bound = bw * 1e9 / bpt if bpt > 0 else 0.0
    if r["section"] == "k3":
        # the brief's bound: the engine's own count of missed bytes (a wrong
        # prediction's read is waste, not need) at the measured bandwidth
        bpt = r["bytes_missed_per_token"]
        bound = bw * 1e9 / bpt if bpt > 0 else 0.0
    if r["section"].startswith("bound"):
        # a simulated disk (deltafin bench run --sim-disk): its bandwidth is the
        # bound's, and the engine's own count of missed bytes (what the tokens
        # needed; a wrong prediction's read is waste, not need) its bytes
        bw, bpt = r.get("sim_disk_gbs", r.get("io_bw_gbs", 0)), r["bytes_missed_per_token"]
        bound = r["io_bound_tokens_per_s"]
    hits, miss = r["expert_hits"], r["expert_misses"]
    if r["arm"] == "pagecache":
        # the engine keeps nothing: its every read goes to the page cache, whose
        # hit rate is the share of those bytes that did not come from storage
        asked = r["expert_bytes_read"]
        hit_rate = max(0.0, 1 - r["storage_bytes_read"] / asked) if asked else None
    else:
        hit_rate = hits / (hits + miss) if hits + miss else None
    wait = r["read_wait_s"] / n
    compute = max(0.0, (r["eval_s"] - r["read_wait_s"]) / n)
    other = max(0.0, r["decode_s"] / n - wait - compute)
    return {
        "tokens_per_s": r["tokens_per_s"],
        "ttft_s": r["ttft_s"],
        "bytes_per_token": bpt,
        "hit_rate": hit_rate,
        # achieved: storage bytes over the decode's wall time (the engine's own
        # read_bandwidth_gbs counts page-cache hits as reads on that path)
        "read_bandwidth_gbs": r["storage_bytes_read"] / r["decode_s"] / 1e9 if r["decode_s"] > 0 else 0.0,
        "io_bw_gbs": bw,
        "io_bound_tokens_per_s": bound,
        "fraction_of_bound": r["tokens_per_s"] / bound if bound else None,
        "peak_rss_mib": r["peak_rss_bytes"] / 2**20,
        "budget_mib": r["budget_bytes"] / 2**20,
        "read_wait_ms": wait * 1e3,
        "compute_ms": compute * 1e3,
        "other_ms": other * 1e3,
        "prefetch_recall": r.get("prefetch_recall"),
        # the engine core's measure: weights streamed from RAM per second over the
        # machine's measured read bandwidth, and prompt rows per second
        # (over the bandwidth measured just before the run when the suite took one)
        "membw_gbs": mbw or None,
        "membw_fraction": (r["tokens_per_s"] * r["active_bytes_per_token"] / 1e9 / mbw
                           if mbw and r.get("active_bytes_per_token") else None),
        "prefill_tokens_per_s": r["prompt_tokens"] / r["prefill_s"] if r.get("prefill_s") else None,
        "draft_acceptance": r.get("draft_acceptance"),
        # the concurrency section (deltafin bench --parallel N): tokens_per_s is the
        # aggregate of N sequences; expert bytes read per decoded token
        "tokens_per_s_per_seq": r.get("tokens_per_s_per_seq"),
        "expert_bytes_per_token": r.get("expert_bytes_per_token"),
        # where a decoded token's time went (df_stats' blocks); other: the rest of
        # the token's wall time (the remainder of the evaluation, sampling)
        **({"kda_ms": r["kda_s"] / n * 1e3, "attn_ms": r["attn_s"] / n * 1e3, "ffn_ms": r["ffn_s"] / n * 1e3,
            "experts_ms": r["experts_s"] / n * 1e3,
            "rest_ms": max(0.0, r["decode_s"] - r["kda_s"] - r["attn_s"] - r["ffn_s"] - r["experts_s"]
                           - r["read_wait_s"]) / n * 1e3} if "kda_s" in r else {}),
    }


groups = {}
for r in runs:
    groups.setdefault((r["section"], r["budget_pct"], r["arm"]), []).append(r)


def stats(vals):
    vals = [v for v in vals if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


results = []
for (sec, pct, arm), rs in sorted(groups.items()):
    d = [derive(r) for r in rs]
    entry = {"section": sec, "budget_pct": pct, "arm": arm, "reps": len(rs),
             "model": rs[0]["model"], "routing": rs[0].get("routing"),
             "prompt_tokens": rs[0]["prompt_tokens"], "decode_tokens": rs[0]["decode_tokens"],
             "active_mb_per_token": rs[0].get("active_bytes_per_token", 0) / 1e6}
    if arm == "pagecache":
        # held: memhog locked everything but the budget (within 256 MiB)
        entry["page_cache_held"] = all(r.get("memhog_locked", 0) > 0 and r.get("memhog_short", 1 << 62) < 256 << 20
                                       for r in rs)
    for k in d[0]:
        entry[k] = stats([x[k] for x in d])
    if (pct, arm) in sims and sec == "replay":
        entry["cachesim_hit_rate"] = sims[(pct, arm)]["hit_rate"]
        entry["cachesim_bytes_per_token"] = sims[(pct, arm)]["bytes_per_token"]
    results.append(entry)



def deepseek_summary():
    """Issue 21's figures from the deepseek section: per repetition, the arms of
    that repetition paired (they ran back to back): the MLA share of a decode
    step at the long context, by the step's growth over the short context, by
    the growth of the engine's own attention timer over the long step, and by
    bench_mla's timer of the block alone; prefill per token over decode."""
    ds = [r for r in runs if r["section"] == "deepseek"]
    if not ds:
        return None
    kind = lambda a: "short" if a == "resident-ctx16" else "prefill" if a == "resident-prefill" else "long"
    reps = {}
    for r in ds:
        reps.setdefault(r["rep"], {})[kind(r["arm"])] = r
    mla = {r["rep"]: r for r in rows if r.get("event") == "mla" and r.get("section") == "deepseek"}
    cache = next((r for r in rows if r.get("event") == "cache" and r.get("section") == "deepseek"), None)
    layers = cache["layers"] if cache else None
    growth, attn, timer, ratio, long_ctx = [], [], [], [], None
    step = lambda r, k: r[k] / r["decode_tokens"]  # seconds per decode step
    for rep, a in sorted(reps.items()):
        if "long" in a:
            long_ctx = a["long"]["prompt_tokens"] + a["long"]["decode_tokens"]
        if "short" in a and "long" in a:
            growth.append(1 - a["long"]["tokens_per_s"] / a["short"]["tokens_per_s"])
            if "attn_s" in a["long"] and "attn_s" in a["short"]:
                attn.append((step(a["long"], "attn_s") - step(a["short"], "attn_s")) / step(a["long"], "decode_s"))
        if "long" in a and rep in mla and layers:
            timer.append(mla[rep]["mla_decode_ms"] * layers / 1e3 * a["long"]["tokens_per_s"])
        if "short" in a and "prefill" in a and a["prefill"].get("prefill_s"):
            ratio.append(a["prefill"]["prompt_tokens"] / a["prefill"]["prefill_s"] / a["short"]["tokens_per_s"])
    return {"mla_share_growth": stats(growth), "mla_share_attn": stats(attn), "mla_share_timer": stats(timer), "prefill_over_decode": stats(ratio),
            "mla_decode_ms": stats([r["mla_decode_ms"] for r in mla.values()]),
            "mla_prefill_ms_per_row": stats([r["mla_prefill_ms_per_row"] for r in mla.values()]),
            "long_context": long_ctx, "layers": layers, "cache": cache}


def k3_summary():
    """Issue 23's figures from the k3 section: the KDA state, and per repetition
    each streamed prefill's time to first token against its bound, one read of
    the experts it touched (its (layer, expert) uses x one expert's bytes) at the
    repetition's measured bandwidth + the in-RAM prefill of the same routing in
    the same repetition."""
    ks = [r for r in runs if r["section"] == "k3"]
    if not ks:
        return None
    state = next((r for r in rows if r.get("event") == "state" and r.get("section") == "k3"), None)
    by = {(r["rep"], r["arm"]): r for r in ks}
    per_arm = {}
    for (rep, arm), r in sorted(by.items()):
        if not arm.startswith("prefill-"):
            continue
        ram = by.get((rep, "resident-prefill-" + ("replay" if "-replay" in arm else "own")))
        bw = iobw.get(("k3", rep))
        if not (ram and bw and state and "prefill_expert_requests" in r):
            continue
        touched = r["prefill_expert_requests"] * state["expert_bytes"]
        read_s = touched / (bw * 1e9)
        bound = read_s + ram["ttft_s"]
        per_arm.setdefault(arm, []).append({"ttft_s": r["ttft_s"], "touched_bytes": touched, "read_s": read_s,
                                            "in_ram_s": ram["ttft_s"], "bound_s": bound,
                                            "over_bound": r["ttft_s"] / bound,
                                            "read_wait_s": r.get("prefill_read_wait_s")})
    prefill = {arm: {k: stats([d[k] for d in ds]) for k in ds[0]} for arm, ds in per_arm.items()}
    return {"state": state, "prefill": prefill, "prompt_tokens": next(
        (r["prompt_tokens"] for r in ks if r["arm"].startswith("prefill-")), None)}


ds_summary = deepseek_summary()
k3 = k3_summary()
machine = {}
log = os.path.join(out, "suite.log")
for line in open(log):
    if line.startswith("cpu:") or line.startswith("memory read bandwidth") or line.startswith("settings:"):
        k, v = line.split(":", 1)
        machine[k] = v.strip()
machine["membw_gbs"] = membw
json.dump({"mode": mode, "machine": machine, "results": results, "deepseek": ds_summary, "k3": k3, "raw": rows},
          open(os.path.join(out, "results.json"), "w"), indent=1)


def m(e, k, fmt="{:.3f}", scale=1.0):
    s = e.get(k)
    if not s:
        return "-"
    return (fmt.format(s["median"] * scale) + " (" + fmt.format(s["min"] * scale) + "-" +
            fmt.format(s["max"] * scale) + ")") if s["n"] > 1 else fmt.format(s["median"] * scale)


md = [f"# deltafin benchmark ({mode})", ""]
md += [f"- {k}: {v}" for k, v in machine.items()]
md += ["", "Median (min-max) over repetitions. Budget: expert cache as % of the expert bytes",
       "Held (HOLD=1, sweep and replay): memhog shrank the machine for every arm to the budget + the",
       "always-active weights + a slack for the engine's buffers, so the page-cache arm's cache is held to the budget.",
       "Hit rate of page-cache arms: the share of the engine's expert reads not served from storage.",
       "MB/token: bytes the engine made the kernel read from storage per decoded token (/proc/self/io).",
       ""]
core = [e for e in results if e["section"] == "core"]
if core:
    md += ["## core (in-RAM decode vs memory bandwidth, 2 threads)", "",
           "| model | arm | decode tok/s | active MB/token | memory read GB/s | fraction of memory bandwidth | prefill tok/s | prefill/decode per token |",
           "|---|---|---|---|---|---|---|---|"]
    for e in core:
        pf, dc = e["prefill_tokens_per_s"], e["tokens_per_s"]
        md.append(f"| {e['model']} | {e['arm']} | {m(e, 'tokens_per_s', '{:.2f}')} | {e['active_mb_per_token']:.1f} | "
                  f"{m(e, 'membw_gbs', '{:.1f}')} | {m(e, 'membw_fraction', '{:.2f}')} | "
                  f"{m(e, 'prefill_tokens_per_s', '{:.2f}')} | " +
                  (f"{pf['median'] / dc['median']:.2f}x |" if pf and dc else "- |"))
    md.append("")
if ds_summary:
    d = ds_summary
    md += ["## deepseek (a DeepSeek-V3-shaped model in RAM, 2 threads; issue 21)", "",
           "| arm | decode tok/s | active MB/token | memory read GB/s | fraction of memory bandwidth | prefill tok/s |",
           "|---|---|---|---|---|---|"]
    for e in (e for e in results if e["section"] == "deepseek"):
        md.append(f"| {e['arm']} | {m(e, 'tokens_per_s', '{:.2f}')} | {e['active_mb_per_token']:.1f} | "
                  f"{m(e, 'membw_gbs', '{:.1f}')} | {m(e, 'membw_fraction', '{:.2f}')} | "
                  f"{m(e, 'prefill_tokens_per_s', '{:.2f}')} |")
    md.append("")
    fmt = lambda k, f="{:.3f}": m(d, k, f)
    md += [f"- MLA share of a decode step at context {d['long_context']}: {fmt('mla_share_growth')} "
           "(the step's growth from context 16, per repetition); "
           f"{fmt('mla_share_attn')} (the engine's attention time per step, its growth from context 16 "
           "over the step); "
           f"{fmt('mla_share_timer')} (bench_mla's block time x {d['layers']} layers over the step)",
           f"- bench_mla at that context, one layer, 2 threads: decode {fmt('mla_decode_ms')} ms, "
           f"prefill {fmt('mla_prefill_ms_per_row', '{:.4f}')} ms per row",
           f"- prefill per token over decode per token (context 16): {fmt('prefill_over_decode', '{:.2f}')}x"]
    c = d["cache"]
    if c:
        md.append(f"- cache per token ({c['layers']} layers): latent {c['latent_bytes_per_token']} B "
                  f"({c['latent_values']} F32 values per layer); an expanded K/V cache "
                  f"{c['expanded_f32_bytes_per_token']} B in F32, {c['expanded_bf16_bytes_per_token']} B in BF16 "
                  f"({c['expanded_values']} values per layer; {c['expanded_values'] / c['latent_values']:.1f}x)")
    md.append("")
fmt_rows = [e for e in results if e["section"] == "formats"]
if fmt_rows:
    fb = {r["model"]: r for r in rows if r.get("event") == "bytes" and r.get("section") == "formats"}
    md += ["## formats (weights as shipped, in RAM, 2 threads, context 16; issue 22)", "",
           "| arm | decode tok/s | shipped MB/token | memory read GB/s | fraction of memory bandwidth | "
           "expert MB/token as shipped | the same experts in BF16 |",
           "|---|---|---|---|---|---|---|"]
    for e in fmt_rows:
        b = fb.get(e["model"], {})
        sh, bf = b.get("expert_bytes_per_token_shipped"), b.get("expert_bytes_per_token_bf16")
        md.append(f"| {e['arm']} | {m(e, 'tokens_per_s', '{:.2f}')} | {e['active_mb_per_token']:.1f} | "
                  f"{m(e, 'membw_gbs', '{:.1f}')} | {m(e, 'membw_fraction', '{:.2f}')} | "
                  + (f"{sh / 1e6:.1f} | {bf / 1e6:.1f} ({bf / sh:.2f}x) |" if sh and bf else "- | - |"))
    md.append("")
if k3:
    st = k3["state"] or {}
    es = [e for e in results if e["section"] == "k3"]
    md += ["## k3 (a Kimi K3-shaped model streamed from a pack, cold; issue 23)", ""]
    if es:
        md.append(f"- model {es[0]['model']}; routing: own (the model's routers) or replayed from the trace")
    if st:
        md.append(f"- KDA state per sequence: {st['kda_state_bytes']} B ({st['kda_state_bytes'] / 2**20:.2f} MiB: "
                  f"{st['kda_layers']} KDA layers x {st['kda_state_bytes_per_layer']} B, whatever the context); "
                  f"latent cache {st['latent_bytes_per_token']} B per token ({st['mla_layers']} MLA layers); "
                  f"one routed expert {st['expert_bytes'] / 2**20:.2f} MiB (MXFP4)")
    md += ["", "Decode (I/O bound = measured O_DIRECT bandwidth / expert MB missed per token; "
           "per token: KDA / MLA / MoE spine / experts / waiting on reads / other, ms)", "",
           "| budget | arm | tok/s | MB missed/token | hit rate | GB/s measured | I/O bound tok/s | "
           "fraction of bound | per token ms |", "|---|---|---|---|---|---|---|---|---|"]
    for e in (e for e in es if e["arm"].startswith("decode-")):
        split = " / ".join(f"{e[k]['median']:.1f}" if e.get(k) else "-"
                           for k in ("kda_ms", "attn_ms", "ffn_ms", "experts_ms", "read_wait_ms", "rest_ms"))
        md.append(f"| {e['budget_pct']}% | {e['arm']} | {m(e, 'tokens_per_s')} | "
                  f"{m(e, 'bytes_per_token', '{:.1f}', 1e-6)} | {m(e, 'hit_rate', '{:.3f}')} | "
                  f"{m(e, 'io_bw_gbs', '{:.2f}')} | {m(e, 'io_bound_tokens_per_s', '{:.2f}')} | "
                  f"{m(e, 'fraction_of_bound', '{:.2f}')} | {split} |")
    pf = k3["prefill"]
    md += ["", f"Prefill of {k3['prompt_tokens']} tokens: time to first token against the bound "
           "(one read of the experts it touched at the measured bandwidth + the same prefill in RAM); goal <= 1.3x", "",
           "| arm | TTFT s | touched MB | one read s | in RAM s | bound s | TTFT / bound | waiting on reads s |",
           "|---|---|---|---|---|---|---|---|"]
    for arm, d in sorted(pf.items()):
        md.append(f"| {arm} | {m(d, 'ttft_s', '{:.2f}')} | {m(d, 'touched_bytes', '{:.0f}', 1e-6)} | "
                  f"{m(d, 'read_s', '{:.2f}')} | {m(d, 'in_ram_s', '{:.2f}')} | {m(d, 'bound_s', '{:.2f}')} | "
                  f"{m(d, 'over_bound', '{:.2f}')} | {m(d, 'read_wait_s', '{:.2f}')} |")
    md.append("")
def concurrency_md():
    """Issue 24's table: per routing (own: the demo model's routers; replay: the
    replay model, each sequence its own stretch of the trace) and cache budget,
    aggregate and per-sequence tok/s and expert MB read per decoded token at N
    sequences, the aggregate over one sequence's (medians); the target (replay
    at 10 %: 4 sequences >= 2x one); then deltafin batch's runs."""
    es = [e for e in results if e["section"] == "concurrency"]
    bt = [r for r in rows if r.get("section") == "concurrency" and r.get("event") == "batch"]
    if not es and not bt:
        return []
    out = ["## concurrency (N sequences decoded together, experts streamed from a pack, cold; issue 24)", "",
           "own: the demo model's routing; replay: the replay model, each sequence replaying its own stretch "
           "of the trace. Aggregate tok/s: all sequences' decoded tokens over the decode's wall time.", "",
           "| routing | budget | sequences | aggregate tok/s | per sequence tok/s | expert MB/token | hit rate "
           "| aggregate / 1 sequence |", "|---|---|---|---|---|---|---|---|"]
    def key(e):
        kind, _, p = e["arm"].rpartition("-p")
        return (kind, e["budget_pct"], int(p))
    base = {}
    for e in sorted(es, key=key):
        kind, pct, p = key(e)
        tps = e["tokens_per_s"]["median"] if e.get("tokens_per_s") else None
        if p == 1:
            base[(kind, pct)] = tps
        b = base.get((kind, pct))
        e["speedup"] = tps / b if tps and b else None
        out.append(f"| {kind} | {pct}% | {p} | {m(e, 'tokens_per_s')} | {m(e, 'tokens_per_s_per_seq')} | "
                   f"{m(e, 'expert_bytes_per_token', '{:.3f}', 1e-6)} | {m(e, 'hit_rate', '{:.3f}')} | "
                   + (f"{e['speedup']:.2f}x |" if e["speedup"] else "- |"))
    t = [e for e in es if key(e)[:3] == ("replay", 10, 4) and e.get("speedup")]
    if t:
        s = t[0]["speedup"]
        out += ["", f"- target (replay model at 10 %: 4 sequences' aggregate >= 2x one sequence's): "
                f"{s:.2f}x, {'met' if s >= 2 else 'NOT met'}"]
    if bt:
        out += ["", "deltafin batch (the model's own routing; tokens generated, greedy, a job may stop early):", "",
                "| model | budget | jobs (answered) | --parallel | tokens | aggregate tok/s | per sequence tok/s "
                "| expert MB/token |", "|---|---|---|---|---|---|---|---|"]
        for r in sorted(bt, key=lambda r: (r["parallel"], r["rep"])):
            out.append(f"| {r['model']} | {r['budget_pct']}% | {r['jobs']} ({r['jobs_ok']}) | {r['parallel']} | "
                       f"{r['tokens']} | {r['tokens_per_s']:.3f} | {r['tokens_per_s_per_seq']:.3f} | "
                       f"{r['expert_bytes_per_token'] / 1e6:.3f} |")
    return out + [""]


md += concurrency_md()


def dist_md():
    """Issue 26's table (bench/sections/dist.sh): per arm, medians over repetitions of
    tok/s, MB read from storage per token (every rank's when the summary carries
    dist_storage_bytes_read, else rank 0's), bytes sent/received by rank 0 per token,
    messages per token and the time waiting on ranks over the decode time, and tok/s
    over the single-stream arm's. The dist_* names are assumed until the runtime lands."""
    ds = [r for r in runs if r["section"] == "dist"]
    if not ds:
        return []
    def med(rs, k, scale=1.0, f="{:.3f}"):
        v = [r[k] for r in rs if r.get(k) is not None]
        return f.format(statistics.median(v) * scale) if v else "-"
    by = {}
    for r in ds:
        by.setdefault(r["arm"], []).append(r)
    base = [r["tokens_per_s"] for r in by.get("single-stream", [])]
    out = ["## dist (experts over several ranks with Open MPI, replay model, real routing; issue 26)", "",
           "| arm | processes | cache per process MiB | tok/s | MB read/token | sent kB/token | received kB/token "
           "| messages/token | waiting on ranks / decode | tok/s over single-stream |", "|---|---|---|---|---|---|---|---|---|---|"]
    for arm, rs in sorted(by.items(), key=lambda kv: (kv[1][0]["ranks"], kv[0])):
        tps = statistics.median([r["tokens_per_s"] for r in rs])
        scope = rs[0].get("dist_read_scope", "")
        out.append(f"| {arm} | {rs[0]['ranks']} | {rs[0]['cache_per_rank'] / 2**20:.0f} | {tps:.3f} | "
                   f"{med(rs, 'dist_read_per_token', 1e-6, '{:.2f}')}" + (" (rank 0 only)" if scope == "rank 0 only" else "")
                   + f" | {med(rs, 'dist_sent_per_token', 1e-3, '{:.1f}')} | {med(rs, 'dist_recv_per_token', 1e-3, '{:.1f}')} | "
                   f"{med(rs, 'dist_messages_per_token', 1, '{:.1f}')} | {med(rs, 'dist_wait_fraction', 100, '{:.1f}%')} | "
                   + (f"{tps / statistics.median(base):.2f}x |" if base and statistics.median(base) > 0 else "- |"))
    if any(r.get("dist_fields_missing") for r in ds):
        out += ["", "- NOTE: the summaries carry no dist_* fields: align bench/sections/dist.sh with the runtime's names."]
    return out + [""]


md += dist_md()
BOUND_NOTE = {
    "bound": "the sweep model",
    "bound-replay": "the replay model, routing replayed from a real trace",
    "bound-demo": "the trained demo model",
    "bound-core": "the engine core's model, 9 GiB of experts",
}
for sec in ("sweep", "replay", "bound", "bound-replay", "bound-core", "bound-demo", "demo"):
    es = [e for e in results if e["section"] == sec]
    if not es:
        continue
    title = f"## {sec}" + (" (routing replayed from a real trace)" if sec == "replay" else "")
    if sec in BOUND_NOTE:
        title += (f" ({BOUND_NOTE[sec]}; experts through a simulated {es[0]['io_bw_gbs']['median']:.2f} GB/s disk: "
                  "reads served in order, no credit for idle time; I/O bound = that bandwidth / MB missed per token)")
    md += [title, ""]
    hdr = ("| budget | arm | tok/s | TTFT s | MB/token | hit rate | GB/s read | frac. of I/O bound "
           "| peak RSS MiB | budget MiB | wait/compute/other ms |")
    if sec == "replay":
        hdr += " cache-sim MB/token |"
    md += [hdr, "|" + "---|" * (hdr.count("|") - 1)]
    for e in es:
        split = "/".join(f"{e[k]['median']:.1f}" if e[k] else "-" for k in ("read_wait_ms", "compute_ms", "other_ms"))
        label = e["arm"] + ({True: " (held)", False: " (not held)"}[e["page_cache_held"]]
                            if "page_cache_held" in e else "")
        line = (f"| {e['budget_pct']}% | {label} | {m(e, 'tokens_per_s')} | {m(e, 'ttft_s', '{:.2f}')} | "
                f"{m(e, 'bytes_per_token', '{:.2f}', 1e-6)} | {m(e, 'hit_rate', '{:.3f}')} | "
                f"{m(e, 'read_bandwidth_gbs', '{:.3f}')} | {m(e, 'fraction_of_bound', '{:.2f}')} | "
                f"{m(e, 'peak_rss_mib', '{:.0f}')} | {m(e, 'budget_mib', '{:.0f}')} | {split} |")
        if sec == "replay":
            c = e.get("cachesim_bytes_per_token")
            line += f" {c / 1e6:.2f} |" if c is not None else " - |"
        md.append(line)
    md.append("")
open(os.path.join(out, "results.md"), "w").write("\n".join(md) + "\n")
print("\n".join(md))

# ---- plots -------------------------------------------------------------------------
if not shutil.which("gnuplot"):
    print("gnuplot not installed (scripts/setup.sh installs gnuplot-nox): no PNGs")
    sys.exit(0)
for sec in ("sweep", "replay", "bound", "bound-replay", "bound-core", "bound-demo", "demo"):
    es = [e for e in results if e["section"] == sec]
    if not es:
        continue
    arms = sorted({e["arm"] for e in es})
    dat = os.path.join(out, f"{sec}-tps.dat")
    with open(dat, "w") as f:
        for a in arms:
            f.write(f'"{a}"\n')
            for e in sorted((e for e in es if e["arm"] == a), key=lambda e: e["budget_pct"]):
                s = e["tokens_per_s"]
                f.write(f"{e['budget_pct']} {s['median']} {s['min']} {s['max']}\n")
            f.write("\n\n")
    split = os.path.join(out, f"{sec}-split.dat")
    with open(split, "w") as f:
        for e in es:
            f.write(f'"{e["arm"]}\\n{e["budget_pct"]}%" {e["read_wait_ms"]["median"]:.3f} '
                    f'{e["compute_ms"]["median"]:.3f} {e["other_ms"]["median"]:.3f}\n')
    gp = f"""
set terminal pngcairo size 900,540 noenhanced
set output '{out}/{sec}-tps-vs-budget.png'
set title 'deltafin {sec}: decode tokens/s vs expert cache budget (median, min-max)'
set xlabel 'expert cache budget (% of expert bytes)'
set ylabel 'tokens/s'
set key top left
set grid
plot for [i=0:{len(arms) - 1}] '{dat}' index i using 1:2:3:4 with yerrorlines title columnheader(1)
set output '{out}/{sec}-time-split.png'
set title 'deltafin {sec}: time per decoded token'
set ylabel 'ms per token'
unset xlabel
set key outside right top
set style data histograms
set style histogram rowstacked
set style fill solid 0.8 border -1
set boxwidth 0.7
set xtics rotate by -45 scale 0
plot '{split}' using 2:xtic(1) title 'read wait', '' using 3 title 'compute', '' using 4 title 'other'
"""
    r = subprocess.run(["gnuplot"], input=gp, text=True, capture_output=True)
    if r.returncode:
        print("gnuplot failed:", r.stderr.strip()[-500:])
    else:
        print(f"plots: {out}/{sec}-tps-vs-budget.png, {out}/{sec}-time-split.png")
