#!/usr/bin/python3
"""train_demo - trains and exports the demo models shipped under models/.

Owns: turning the corpus (tools/demo_data.py) into token streams, the training
loop (CPU, float32, seeded), export of the BF16 Hugging Face checkpoint and the
held-out perplexity of the exported (BF16) weights. The model code is
tools/demo_model.py. `make demo-models` runs the whole pipeline; the exact
commands are in tools/README.md.

    train_demo.py tokens --corpus build/demo/corpus --tok build/demo/tok/tokenizer.json --out build/demo/tokens
    train_demo.py train --preset moe --tokens build/demo/tokens --tok-dir build/demo/tok \
        --out models/demo-moe --steps 3000 --time-cap 2700 --seed 1
    train_demo.py eval --model models/demo-moe --tokens build/demo/tokens

Training data: random windows of ctx+1 tokens from three streams, drawn with
fixed weights (Moby-Dick 0.40, State of the Union 0.55, chat-formatted samples
0.05; documents end in <|endoftext|>). The chat samples wrap a training
paragraph as an assistant answer to a fixed user request, so --chat gets a
reply in the corpus's style rather than noise. Learning rate: linear warm-up then
cosine to 10% over --steps; the --time-cap (seconds of training wall time) stops
early and still exports, and training.json records the steps actually run.
"""

import argparse
import json
import math
import os
import shutil
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import demo_data  # noqa: E402
import demo_model  # noqa: E402

PRESETS = {
    # Sized to what 45 minutes on a shared 2-core VM can train (~200-400 tokens/s):
    # routed experts 4 x 32 x 3 x 256 x 128 x 2 B = 25.2 MB of ~31 MB BF16.
    "moe": dict(arch="qwen3_moe", hidden=256, layers=4, heads=4, kv_heads=2, head_dim=64,
                experts=32, top_k=4, moe_inter=128, ctx=256, batch=8, lr=3e-3,
                warmup=30, aux_coef=0.01),
    # The draft gets 12 minutes: short windows and small batches buy it more updates.
    "draft": dict(arch="qwen3", hidden=192, layers=3, heads=4, kv_heads=2, head_dim=48,
                  inter=512, ctx=128, batch=4, lr=3e-3, warmup=30),
    # Seconds-long runs for the smoke test of the pipeline itself.
    "tiny-moe": dict(arch="qwen3_moe", hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16,
                     experts=8, top_k=2, moe_inter=32, ctx=64, batch=4, lr=3e-3, warmup=5,
                     aux_coef=0.01),
    "tiny-draft": dict(arch="qwen3", hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16,
                       inter=128, ctx=64, batch=4, lr=3e-3, warmup=5),
}
STREAM_WEIGHTS = {"moby-dick": 0.40, "sotu": 0.55, "chat": 0.05}
CHAT_REQUESTS = {
    "moby-dick": ["Tell me about whales.", "Tell me a story of the sea.",
                  "Write a passage in the style of Moby-Dick."],
    "sotu": ["What is the state of the Union?", "Address the Congress.",
             "Write a passage from a State of the Union address."],
}
N_CHAT = 4000


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- token streams

def cmd_tokens(a):
    tok = demo_data.Tokenizer(a.tok)
    eot = tok.special["<|endoftext|>"]
    os.makedirs(a.out, exist_ok=True)
    for part in ("train", "heldout"):
        for name, docs in demo_data.load_split(a.corpus, part).items():
            ids = []
            for d in docs:
                ids.extend(tok.encode_ordinary(d))
                ids.append(eot)
            np.save(os.path.join(a.out, f"{name}.{part}.npy"), np.array(ids, dtype=np.uint16))
            log(f"{name}.{part}: {len(ids)} tokens")
    # Chat samples: a random training paragraph as the assistant's answer.
    rng = np.random.default_rng(1234)
    tr = demo_data.load_split(a.corpus, "train")
    paras = {n: [p.strip() for d in docs for p in d.split("\n\n") if len(p.strip()) > 200]
             for n, docs in tr.items()}
    ids = []
    names = sorted(paras)
    for i in range(N_CHAT):
        n = names[i % len(names)]
        req = CHAT_REQUESTS[n][rng.integers(len(CHAT_REQUESTS[n]))]
        p = paras[n][rng.integers(len(paras[n]))]
        if len(p) > 1200:   # the addresses have no paragraph breaks: a run of sentences
            sents = p.split(". ")
            j = int(rng.integers(len(sents)))
            k = j
            while k < len(sents) and len(". ".join(sents[j:k + 1])) < 800:
                k += 1
            p = ". ".join(sents[j:k + 1]).strip()
            if not p.endswith("."):
                p += "."
        text = (f"<|im_start|>user\n{req}<|im_end|>\n<|im_start|>assistant\n{p}<|im_end|>\n"
                "<|endoftext|>")
        ids.extend(tok.encode(text))
    np.save(os.path.join(a.out, "chat.train.npy"), np.array(ids, dtype=np.uint16))
    log(f"chat.train: {len(ids)} tokens")


def load_streams(d, part):
    names = list(STREAM_WEIGHTS) if part == "train" else ["moby-dick", "sotu"]
    return {n: torch.from_numpy(np.load(os.path.join(d, f"{n}.{part}.npy")).astype(np.int64))
            for n in names}


def sample_batch(streams, B, T, g):
    names = list(STREAM_WEIGHTS)
    w = torch.tensor([STREAM_WEIGHTS[n] for n in names])
    pick = torch.multinomial(w, B, replacement=True, generator=g)
    rows = []
    for i in pick.tolist():
        s = streams[names[i]]
        o = int(torch.randint(0, len(s) - T - 1, (1,), generator=g))
        rows.append(s[o:o + T + 1])
    x = torch.stack(rows)
    return x[:, :-1], x[:, 1:]


# ---------------------------------------------------------------- export

def export(model, out, tok_dir, info):
    os.makedirs(out, exist_ok=True)
    tmp = os.path.join(out, "model.safetensors.tmp")
    demo_model.save_safetensors(tmp, demo_model.hf_tensors(model))
    os.replace(tmp, os.path.join(out, "model.safetensors"))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(model.cfg, f, indent=2)
    eos = model.cfg["eos_token_id"]
    gen = {"bos_token_id": model.cfg["bos_token_id"], "do_sample": True, "eos_token_id": eos,
           "pad_token_id": model.cfg["bos_token_id"], "temperature": 0.8, "top_k": 40,
           "top_p": 0.95, "transformers_version": "4.51.0"}
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    shutil.copyfile(os.path.join(tok_dir, "tokenizer.json"), os.path.join(out, "tokenizer.json"))
    tj = json.load(open(os.path.join(tok_dir, "tokenizer.json")))
    qc = os.path.join(REPO, "assets", "tokenizers", "qwen3", "tokenizer_config.json")
    tmpl = json.load(open(qc))["chat_template"]   # Qwen3's own template, verbatim
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(demo_data.tokenizer_config(tj, tmpl), f, indent=2, ensure_ascii=False)
    with open(os.path.join(out, "training.json"), "w") as f:
        json.dump(info, f, indent=2)


# ---------------------------------------------------------------- train

def cmd_train(a):
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    P = dict(PRESETS[a.preset])
    for k in ("ctx", "batch", "lr"):
        if getattr(a, k) is not None:
            P[k] = getattr(a, k)
    tok = json.load(open(os.path.join(a.tok_dir, "tokenizer.json")))
    sp = {t["content"]: t["id"] for t in tok["added_tokens"]}
    vocab = len(tok["model"]["vocab"]) + len(tok["added_tokens"])
    cfg = demo_model.make_config(
        P["arch"], vocab, P["hidden"], P["layers"], P["heads"], P["kv_heads"], P["head_dim"],
        inter=P.get("inter", 0), experts=P.get("experts", 0), top_k=P.get("top_k", 0),
        moe_inter=P.get("moe_inter", 0), max_pos=4 * P["ctx"], bos=sp["<|endoftext|>"],
        eos=(sp["<|im_end|>"], sp["<|endoftext|>"]), aux_coef=P.get("aux_coef", 0.0))
    model = demo_model.Model(cfg)
    model.init_weights(a.seed)
    nparam = sum(p.numel() for p in model.parameters())
    log(f"{a.preset}: {nparam / 1e6:.2f} M parameters, ctx {P['ctx']}, batch {P['batch']}, "
        f"{a.steps} steps, time cap {a.time_cap} s")
    streams = load_streams(a.tokens, "train")
    g = torch.Generator().manual_seed(a.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    keep = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": keep, "weight_decay": 0.0}],
                            lr=P["lr"], betas=(0.9, 0.95), eps=1e-8)
    aux_coef = P.get("aux_coef", 0.0)
    t0 = time.time()
    last_export = t0
    step = 0
    info = {"preset": a.preset, "params": P, "seed": a.seed, "steps_planned": a.steps,
            "time_cap_s": a.time_cap, "threads": a.threads, "command": " ".join(sys.argv)}
    ema = None
    stop = "steps"
    lrs = []
    replay = json.load(open(a.replay))["lr_schedule"] if a.replay else None
    while step < a.steps:
        if a.time_cap and time.time() - t0 >= a.time_cap:
            stop = "time cap"
            break
        if replay is not None:
            if step >= len(replay):
                break
            lr = replay[step]
        else:
            # Progress is the larger of the step and the time fraction, so the
            # decay completes whether the steps or the time cap end the run; the
            # rates used are recorded in training.json for an exact replay.
            prog = step / max(1, a.steps)
            if a.time_cap:
                prog = max(prog, (time.time() - t0) / a.time_cap)
            lr = P["lr"] * min(1.0, (step + 1) / P["warmup"])
            lr *= 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, prog)))
        lrs.append(lr)
        for gr in opt.param_groups:
            gr["lr"] = lr
        x, y = sample_batch(streams, P["batch"], P["ctx"], g)
        logits, aux = model(x)
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss = ce + aux_coef * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        ema = ce.item() if ema is None else 0.98 * ema + 0.02 * ce.item()
        if step % a.log_every == 0 or step == 1:
            el = time.time() - t0
            log(f"step {step} ce {ce.item():.3f} (ema {ema:.3f}) aux {aux.item():.3f} lr {lr:.2e} "
                f"{step * P['batch'] * P['ctx'] / el:.0f} tok/s elapsed {el:.0f} s")
        if a.export_every and time.time() - last_export > a.export_every:
            info.update(steps_done=step, train_seconds=round(time.time() - t0, 1),
                        stopped_by="in progress")
            export_rounded(model, a, info)
            last_export = time.time()
    info.update(steps_done=step, train_seconds=round(time.time() - t0, 1), stopped_by=stop,
                final_train_ce_ema=round(ema, 4) if ema is not None else None,
                lr_schedule=lrs)
    log(f"stopped by {stop} after {step} steps, {info['train_seconds']} s")
    export_rounded(model, a, info)
    if not a.no_eval:
        info["heldout"] = evaluate(a.out, a.tokens, P["ctx"], a.eval_tokens)
        with open(os.path.join(a.out, "training.json"), "w") as f:
            json.dump(info, f, indent=2)


def export_rounded(model, a, info):
    """Exports the BF16 rounding of the current weights without disturbing training."""
    export(model, a.out, a.tok_dir, info)
    log(f"exported {a.out}")


# ---------------------------------------------------------------- eval

@torch.no_grad()
def evaluate(model_dir, tokens_dir, ctx, limit=65536, batch=8):
    """Held-out perplexity of the exported BF16 weights: non-overlapping windows of
    ctx tokens (each predicting its ctx-1 next tokens), per corpus, over the first
    `limit` held-out tokens of each."""
    m = demo_model.load_model(model_dir)
    out = {}
    for name, s in load_streams(tokens_dir, "heldout").items():
        s = s[:limit]
        n = (len(s) // ctx) * ctx
        w = s[:n].view(-1, ctx)
        nll, cnt = 0.0, 0
        for i in range(0, len(w), batch):
            x = w[i:i + batch]
            logits, _ = m(x[:, :-1])
            nll += torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum").item()
            cnt += x[:, 1:].numel()
        out[name] = {"tokens": cnt, "nll": round(nll / cnt, 4), "ppl": round(math.exp(nll / cnt), 2)}
        log(f"{model_dir}: held-out {name}: {cnt} tokens, ppl {out[name]['ppl']}")
    return out


def cmd_eval(a):
    torch.set_num_threads(a.threads)
    ctx = a.ctx or json.load(open(os.path.join(a.model, "training.json")))["params"]["ctx"]
    print(json.dumps(evaluate(a.model, a.tokens, ctx, a.eval_tokens)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("tokens")
    p.add_argument("--corpus", required=True)
    p.add_argument("--tok", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("train")
    p.add_argument("--preset", choices=sorted(PRESETS), required=True)
    p.add_argument("--tokens", required=True)
    p.add_argument("--tok-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--time-cap", type=float, default=0, help="seconds of training; 0: none")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx", type=int)
    p.add_argument("--batch", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--export-every", type=float, default=600, help="seconds; 0: only at the end")
    p.add_argument("--no-eval", action="store_true")
    p.add_argument("--replay", help="training.json whose lr_schedule to replay step by step "
                   "(reproduces a run that the time cap ended)")
    p.add_argument("--eval-tokens", type=int, default=65536,
                   help="held-out tokens evaluated per corpus (from the start)")
    p = sub.add_parser("eval")
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", required=True)
    p.add_argument("--ctx", type=int)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--eval-tokens", type=int, default=65536)
    a = ap.parse_args(argv)
    {"tokens": cmd_tokens, "train": cmd_train, "eval": cmd_eval}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
