#!/usr/bin/python3
"""dist_estimate.py - expected speed of expert parallelism over several machines
(`mpirun -n N deltafin ... --experts-by-rank`, docs/distributed.md) for the real
Kimi K3 and DeepSeek-V3, from their shapes (shared/notes/ARCHITECTURES.md)
and a few stated machine assumptions; optionally corrected by measured message
sizes from `deltafin ... --stats` (--measured-json). Python 3 standard library only.

Owns the arithmetic of docs/distributed.md: the ownership rule (weighted shares,
w_r = C_r + t*bw_r), the per-MoE-layer message sizes for decode (1 row) and a
prefill chunk, network time, each machine's disk and RAM time per token, and the
per-layer latency the design tolerates. Prints Markdown; --update-doc FILE rewrites
the part of FILE between the markers <!-- dist_estimate:begin --> and
<!-- dist_estimate:end --> with the output (and the command that made it).

    tools/dist_estimate.py                      # the tables, from shapes only
    tools/dist_estimate.py --measured-json m.json --update-doc docs/distributed.md

--measured-json FILE: one JSON object or a list of them, each
    {"bytes_sent_per_token": B, "bytes_recv_per_token": B, "moe_layers": M, "rows": R}
(required; per decoded token, R rows per pass: 1 for decode) and optionally
"messages_per_token", "wait_s_per_token", "step_s_per_token", "source" (free text),
"model" ("kimi-k3" or "deepseek-v3": the measurement was taken on that model and its
per-layer sizes replace the computed ones for "ranks" machines), or the shape it was
taken on: "width" (f32 values per row vector), "top_k", "experts" (per MoE layer),
"ranks", "rank0_experts" (true/false): then the measured sizes are set against this
script's prediction for that shape, and the ratio scales the real models' message bytes.
"""
import argparse
import json
import math
import sys

GB = 1e9
# Shapes as shipped (ARCHITECTURES.md sections 2, 4 and 6). width: the f32 values
# per row vector sent to an owner and per slot returned (K3's latent MoE: the
# experts read u = routed_expert_down_proj . x (3584) and return w2's 3584 values;
# the up projection and norm run on rank 0 after the combination).
MODELS = {
    "kimi-k3": dict(name="Kimi K3 (MXFP4 experts)", layers=93, moe_layers=92, hidden=7168, width=3584,
                    top_k=16, experts=896, expert_bytes=17_547_264, always_active=113.5 * GB,
                    embed_bytes=163840 * 7168 * 2),
    "deepseek-v3": dict(name="DeepSeek-V3 (FP8 experts)", layers=61, moe_layers=58, hidden=7168, width=7168,
                        top_k=8, experts=256, expert_bytes=44_050_944, always_active=19.1 * GB,
                        embed_bytes=129280 * 7168 * 2),
}


def hit_of(frac, curve):
    """Hit rate of a cache holding the hottest `frac` of a rank's owned experts:
    uniform routing (worst case) -> frac; else piecewise linear through curve."""
    frac = max(0.0, min(1.0, frac))
    if not curve:
        return frac
    pts = [(0.0, 0.0)] + sorted(curve) + [(1.0, 1.0)]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= frac <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (frac - x0) / (x1 - x0)
    return frac


def p_none(n_owned, experts, k):
    """P(a row's k distinct experts, uniform, miss all n_owned of a layer's experts)."""
    p = 1.0
    for i in range(k):
        p *= max(0.0, (experts - n_owned - i) / (experts - i))
    return p


def plan(m, n, a):
    """Per rank: cache C, drive GB/s bw, share p of the experts (weighted rendezvous
    hash in expectation: w_r = C_r + t*bw_r, t = max(0, (E - sum C)/sum bw))."""
    E = m["moe_layers"] * m["experts"] * m["expert_bytes"]
    ranks = []
    for r in range(n):
        c = a.cache_gb * GB - (m["always_active"] if r == 0 else 0)
        owns = not (r == 0 and n > 1 and a.rank0_experts == "no")
        ranks.append(dict(rank=r, cache=max(0.0, c) if owns else 0.0, bw=a.drive_gbs * a.drives * GB if owns else 0.0,
                          owns=owns))
    sc, sb = sum(x["cache"] for x in ranks), sum(x["bw"] for x in ranks)
    t = max(0.0, (E - sc) / sb)
    w = [x["cache"] + t * x["bw"] for x in ranks]
    for x, wr in zip(ranks, w):
        x["p"] = wr / sum(w)
        owned = x["p"] * E
        x["cache"] = min(x["cache"], owned)
        x["hit"] = hit_of(x["cache"] / owned, a.hit_curve) if owned else 0.0
    return ranks, E


def expected_max(k, p, tau):
    """E[max_r c_r * tau_r], (c_r) ~ multinomial(k, p): k slots over the ranks."""
    total = 0.0

    def walk(r, left, prob, worst):
        nonlocal total
        if r == len(p) - 1:
            total += prob * p[r] ** left * max(worst, left * tau[r]) if p[r] > 0 or left == 0 else 0.0
            return
        for c in range(left + 1):
            walk(r + 1, left - c, prob * math.comb(left, c) * p[r] ** c, max(worst, c * tau[r]))
    walk(0, k, 1.0, 0.0)
    return total


def layer_msgs(m, ranks, rows, a, scale=(1.0, 1.0)):
    """Bytes rank 0 sends and receives per MoE layer for a pass of `rows` rows, and
    messages (both ways), expected over uniform routing."""
    vec, k, e = 4 * m["width"], m["top_k"], m["experts"]
    sent = recv = msgs = 0.0
    for x in ranks[1:]:
        if not x["owns"]:
            continue
        hit_row = 1 - p_none(x["p"] * e, e, k)      # a row has >= 1 expert on this rank
        busy = 1 - (1 - hit_row) ** rows            # the rank gets a message this layer
        slots = rows * k * x["p"]
        sent += busy * a.header_bytes + rows * hit_row * vec + slots * a.entry_bytes
        recv += busy * a.header_bytes + slots * vec
        msgs += 2 * busy
    return sent * scale[0], recv * scale[1], msgs


def decode_row(m, n, a, link, scale, direct):
    ranks, E = plan(m, n, a)
    X = m["top_k"] * m["moe_layers"] * m["expert_bytes"]          # expert bytes a token uses
    # a layer waits for its slowest owner: the expected maximum over the ranks of
    # (experts the row routes to the rank) x (seconds per expert there)
    tau = [m["expert_bytes"] * ((1 - x["hit"]) / x["bw"] + x["hit"] / (a.mem_gbs * GB)) if x["owns"] else 0.0
           for x in ranks]
    t_exp = m["moe_layers"] * expected_max(m["top_k"], [x["p"] for x in ranks], tau)
    t_dense = (m["always_active"] - m["embed_bytes"]) / (a.mem_gbs * GB)
    sent, recv, msgs = direct or layer_msgs(m, ranks, 1, a, scale)
    B = link * GB / 8 * a.link_efficiency
    busy = sent + recv > 0
    t_bytes = m["moe_layers"] * (sent + recv) / B if busy else 0.0
    t_lat = m["moe_layers"] * 2 * a.latency_us * 1e-6 if busy else 0.0
    step0 = t_dense + t_exp + t_bytes
    step = step0 + t_lat
    return dict(ranks=ranks, t_exp=t_exp, t_dense=t_dense, sent=sent, recv=recv, msgs=msgs, t_net=t_bytes + t_lat,
                step=step, tol_us=a.net_share * step0 / (2 * m["moe_layers"]) * 1e6 if busy else None,
                miss=sum(X * x["p"] * (1 - x["hit"]) for x in ranks))


def fmt_b(b):
    return f"{b / 1e6:.3f} MB" if b >= 1e6 else f"{b / 1e3:.1f} kB"


def tables(a, scales, directs):
    out = []
    links = [float(x) for x in a.links.split()]
    drives_list = [int(x) for x in a.drives_list.split()]
    for key in a.models.split():
        m = MODELS[key]
        E = m["moe_layers"] * m["experts"] * m["expert_bytes"]
        X = m["top_k"] * m["moe_layers"] * m["expert_bytes"]
        out += [f"### {m['name']}", "",
                f"{m['layers']} layers, {m['moe_layers']} MoE; {m['experts']} experts top-{m['top_k']} of "
                f"{m['expert_bytes']:,} B; experts {E / GB:.1f} GB; {X / GB:.1f} GB of expert reads per token with "
                f"nothing cached; always-active {m['always_active'] / GB:.1f} GB (rank 0); row vector {m['width']} "
                f"f32 = {4 * m['width']:,} B each way" + (" (the latent width)" if m["width"] != m["hidden"] else "") + ".",
                ""]
        sc = scales.get("all", (1.0, 1.0))
        tag = "shapes" if sc == (1.0, 1.0) else f"shapes x measured ratio (sent {sc[0]:.3f}, recv {sc[1]:.3f})"
        out += [f"Messages per MoE layer (rank 0's side; {tag}):", "",
                "| machines | rows per pass | sent by rank 0 | received by rank 0 | messages | per token (sent + received) |",
                "|---|---|---|---|---|---|"]
        for n in [int(x) for x in a.ranks.split()]:
            for rows in (1, a.prefill_rows):
                ranks, _ = plan(m, n, argparse.Namespace(**{**vars(a), "drives": drives_list[0]}))
                d = directs.get((key, n)) if rows == 1 else None
                s, r, msgs = d or layer_msgs(m, ranks, rows, a, sc)
                src = " (measured)" if d else ""
                out.append(f"| {n} | {rows} | {fmt_b(s)}{src} | {fmt_b(r)}{src} | "
                           + ("-" if msgs is None else f"{msgs:.2f}") + " | "
                           f"{fmt_b((s + r) * m['moe_layers'] / rows)} |")
        out.append("")
        for drives in drives_list:
            aa = argparse.Namespace(**{**vars(a), "drives": drives})
            out += [f"Decode, {drives} NVMe per machine at {a.drive_gbs:g} GB/s each ({tag}):", "",
                    "| machines | link Gb/s | expert shares (rank 0 first) | hit rates | read from drives per token "
                    "| disk+RAM s/token (slowest owner per layer) | rank 0 always-active s/token | network s/token "
                    "| tok/s | network share | tolerated latency per layer |", "|---|---|---|---|---|---|---|---|---|---|---|"]
            base = decode_row(m, 1, aa, links[0], sc, None)
            out.append(f"| 1 | - | 1.00 | {base['ranks'][0]['hit']:.3f} | {base['miss'] / GB:.1f} GB | "
                       f"{base['t_exp']:.3f} | {base['t_dense']:.3f} | 0 | {1 / base['step']:.3f} | - | - |")
            for n in [int(x) for x in a.ranks.split()]:
                for link in links:
                    d = decode_row(m, n, aa, link, sc, directs.get((key, n)))
                    shares = "/".join(f"{x['p']:.2f}" for x in d["ranks"])
                    hits = "/".join(f"{x['hit']:.2f}" if x["owns"] else "-" for x in d["ranks"])
                    out.append(f"| {n} | {link:g} | {shares} | {hits} | {d['miss'] / GB:.1f} GB | {d['t_exp']:.3f} | "
                               f"{d['t_dense']:.3f} | {d['t_net']:.4f} | {1 / d['step']:.3f} | "
                               f"{d['t_net'] / d['step']:.1%} | {d['tol_us'] / 1e3:.2f} ms |")
            out.append("")
        out += prefill_table(m, a, links, drives_list, sc)
    return out


def prefill_table(m, a, links, drives_list, sc):
    R, e, k = a.prefill_rows, m["experts"], m["top_k"]
    touched = 1 - (1 - k / e) ** R          # share of a layer's experts a chunk's rows use
    out = [f"Prefill, one chunk of {R} rows (experts touched per layer: {touched:.1%}; compute not modelled):", "",
           "| machines | NVMe per machine | link Gb/s | network s/chunk | disk+RAM s/chunk (slowest machine) "
           "| network / disk+RAM |", "|---|---|---|---|---|---|"]
    for drives in drives_list:
        aa = argparse.Namespace(**{**vars(a), "drives": drives})
        for n in [1] + [int(x) for x in a.ranks.split()]:
            ranks, E = plan(m, n, aa)
            io = max(E * x["p"] * touched * ((1 - x["hit"]) / x["bw"] + x["hit"] / (a.mem_gbs * GB))
                     for x in ranks if x["owns"])
            s, r, msgs = layer_msgs(m, ranks, R, aa, sc)
            for link in (links if n > 1 else [0]):
                net = m["moe_layers"] * ((s + r) / (link * GB / 8 * a.link_efficiency) + 2 * a.latency_us * 1e-6) \
                    if n > 1 else 0.0
                out.append(f"| {n} | {drives} | {link:g} | {net:.2f} | {io:.2f} | {net / io:.2f} |" if n > 1 else
                           f"| 1 | {drives} | - | 0 | {io:.2f} | - |")
    return out + [""]


def measured(a):
    """Reads --measured-json; returns (lines, scales, directs)."""
    if not a.measured_json:
        return ["No measurements given: every figure below is computed from shapes and the assumptions above.", ""], {}, {}
    try:
        data = json.load(open(a.measured_json))
    except (OSError, ValueError) as ex:
        sys.exit(f"dist_estimate: {a.measured_json}: {ex}")
    data = data if isinstance(data, list) else [data]
    lines = ["Measured (from " + a.measured_json + "):", "",
             "| source | rows | MoE layers | sent per layer per pass | received per layer per pass | messages per token "
             "| waiting on ranks / step | predicted sent / received | measured / predicted |", "|---|---|---|---|---|---|---|---|---|"]
    scales, directs, ratios = {}, {}, []
    for i, d in enumerate(data):
        for f in ("bytes_sent_per_token", "bytes_recv_per_token", "moe_layers", "rows"):
            if not isinstance(d.get(f), (int, float)) or d[f] < 0 or (f in ("moe_layers", "rows") and d[f] < 1):
                sys.exit(f"dist_estimate: {a.measured_json}: entry {i}: field '{f}' missing or not a valid number")
        s = d["bytes_sent_per_token"] * d["rows"] / d["moe_layers"]
        r = d["bytes_recv_per_token"] * d["rows"] / d["moe_layers"]
        wait = (f"{d['wait_s_per_token'] / d['step_s_per_token']:.1%}"
                if d.get("wait_s_per_token") is not None and d.get("step_s_per_token") else "-")
        pred, ratio = "-", "-"
        if d.get("model") in MODELS and d.get("ranks"):
            directs[(d["model"], int(d["ranks"]))] = (s, r, d["messages_per_token"] * d["rows"] / d["moe_layers"]
                                                  if d.get("messages_per_token") else None)
            ratio = "replaces the computed sizes"
        elif all(d.get(f) for f in ("width", "top_k", "experts", "ranks")):
            shape = dict(width=d["width"], top_k=d["top_k"], experts=d["experts"], moe_layers=d["moe_layers"],
                         expert_bytes=1, always_active=0, embed_bytes=0)
            aa = argparse.Namespace(**{**vars(a), "rank0_experts": "yes" if d.get("rank0_experts", True) else "no",
                                       "cache_gb": 1.0, "drives": 1})
            ranks = [dict(rank=i, owns=not (i == 0 and aa.rank0_experts == "no"), p=0.0)
                     for i in range(int(d["ranks"]))]
            owners = [x for x in ranks if x["owns"]]
            for x in owners:
                x["p"] = 1 / len(owners)
            ps, pr, _ = layer_msgs(shape, ranks, d["rows"], aa)
            pred = f"{fmt_b(ps)} / {fmt_b(pr)}"
            ratio = f"{s / ps:.3f} / {r / pr:.3f}" if ps and pr else "-"
            if ps and pr and d["rows"] == 1:
                ratios.append((s / ps, r / pr))
        lines.append(f"| {d.get('source', 'entry %d' % i)} | {d['rows']} | {d['moe_layers']} | {fmt_b(s)} | {fmt_b(r)} | "
                     f"{d.get('messages_per_token', '-')} | {wait} | {pred} | {ratio} |")
    if ratios and a.apply_measured:
        scales["all"] = (sum(x for x, _ in ratios) / len(ratios), sum(y for _, y in ratios) / len(ratios))
    return lines + [""], scales, directs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="kimi-k3 deepseek-v3")
    ap.add_argument("--ranks", default="2 4", help="machines (one rank each), besides the 1-machine baseline")
    ap.add_argument("--links", default="10 25 100", help="link speeds, Gb/s")
    ap.add_argument("--link-efficiency", type=float, default=0.9, help="usable share of the link (MPI over TCP)")
    ap.add_argument("--latency-us", type=float, default=25.0, help="one-way latency per message, microseconds")
    ap.add_argument("--drives-list", default="1 4", help="NVMe drives per machine")
    ap.add_argument("--drive-gbs", type=float, default=6.5, help="GB/s per drive")
    ap.add_argument("--cache-gb", type=float, default=100.0,
                    help="RAM per machine for experts and always-active weights (rank 0's cache: this minus them)")
    ap.add_argument("--mem-gbs", type=float, default=60.0, help="memory read bandwidth per machine, GB/s")
    ap.add_argument("--rank0-experts", choices=("yes", "no"), default="yes")
    ap.add_argument("--hit-curve", default="", help="FRAC:HIT,... hit rate of a cache holding the hottest FRAC "
                    "of a rank's experts (default: uniform routing, HIT = FRAC)")
    ap.add_argument("--prefill-rows", type=int, default=512)
    ap.add_argument("--header-bytes", type=float, default=32, help="per message (assumed framing)")
    ap.add_argument("--entry-bytes", type=float, default=12, help="per (row, slot, expert) entry (assumed framing)")
    ap.add_argument("--net-share", type=float, default=0.10,
                    help="the share of a step latency may take, for the tolerated latency column")
    ap.add_argument("--measured-json", help="measured message sizes (see the top of this file)")
    ap.add_argument("--apply-measured", action="store_true",
                    help="scale the real models' message bytes by the measured/predicted ratio of decode entries")
    ap.add_argument("--update-doc", help="rewrite FILE between <!-- dist_estimate:begin --> and <!-- dist_estimate:end -->")
    a = ap.parse_args()
    for k in a.models.split():
        if k not in MODELS:
            sys.exit(f"dist_estimate: --models: unknown model '{k}' (known: {', '.join(MODELS)})")
    try:
        a.hit_curve = [tuple(float(v) for v in p.split(":")) for p in a.hit_curve.split(",") if p]
    except ValueError:
        sys.exit("dist_estimate: --hit-curve: expected FRAC:HIT,FRAC:HIT")
    a.drives = int(a.drives_list.split()[0])
    cmd = "tools/dist_estimate.py " + " ".join(x for x in sys.argv[1:] if not x.startswith("--update-doc")
                                               and x != a.update_doc)
    head = [f"Generated by `{cmd.strip()}`.", "",
            f"Assumptions: per machine {a.cache_gb:g} GB of RAM for weights (rank 0: always-active weights first, "
            f"experts in the rest), drives at {a.drive_gbs:g} GB/s each, memory read {a.mem_gbs:g} GB/s, "
            f"links used at {a.link_efficiency:.0%}, {a.latency_us:g} us one-way latency per message, "
            f"{a.header_bytes:g} B per message + {a.entry_bytes:g} B per (row, slot, expert) entry, "
            f"rank 0 owns experts: {a.rank0_experts}; hit rate: "
            + ("uniform routing (a cache holding a share f of a rank's experts hits f)" if not a.hit_curve else
               "piecewise linear through " + ", ".join(f"{x:g}:{y:g}" for x, y in a.hit_curve)) + ".", ""]
    mlines, scales, directs = measured(a)
    text = "\n".join(head + mlines + tables(a, scales, directs))
    if a.update_doc:
        doc = open(a.update_doc).read()
        b, e = "<!-- dist_estimate:begin -->", "<!-- dist_estimate:end -->"
        if b not in doc or e not in doc:
            sys.exit(f"dist_estimate: {a.update_doc}: markers {b} / {e} not found")
        doc = doc[:doc.index(b) + len(b)] + "\n" + text + "\n" + doc[doc.index(e):]
        open(a.update_doc, "w").write(doc)
    else:
        print(text)


if __name__ == "__main__":
    main()
