#!/usr/bin/env bash
# bench/suite.sh [--quick] [--warm] - `make bench`: the headline numbers from one
# command. Every arm is one `deltafin bench` (run's options, a seeded random
# prompt, teacher-forced decode, one JSON summary); this script prepares the
# models, runs the arms interleaved (rep 1: A B C ..., rep 2: A B C ...) from a
# cold page cache, and bench/report.py turns the JSON lines into
# results.json, results.md and gnuplot PNGs under bench/results/<date>[-quick]/.
#
# Sections:
#  core    in-RAM decode of the engine core's benchmark model (hidden 2048, 128
#          experts, top-8, 8 layers; 9 GiB of experts) as a fraction of the
#          measured memory bandwidth, and prefill vs decode per token.
#  deepseek in-RAM decode of a DeepSeek-V3-shaped model scaled to this machine
#          (issue 21: hidden 2048, 8 layers of which 1 dense, 64 routed experts
#          top-6 + 1 shared, q-LoRA 768, kv-LoRA 512, 16 heads, nope 128 + rope
#          64, v 128; 7.2 GiB of experts): decode at a short context (16) and at
#          DS_CTX (4096) and prefill of a DS_PROMPT (512)-token prompt, each set
#          against the memory bandwidth measured just before it; the share of
#          MLA attention in a decode step at DS_CTX (the step's growth from
#          context 16 to DS_CTX, and bench_mla's timer of the MLA block alone);
#          latent vs expanded K/V cache bytes per token.
#  formats weights as shipped (issue 22), in RAM, warm, 2 threads: the deepseek
#          section's model with every Linear in FP8 (128x128 block scales, as
#          DeepSeek-V3/R1 ship) and a Kimi K2-shaped one (hidden 2048, 8 layers,
#          64 experts top-8 of width 2048) with INT4 routed experts (as K2-Thinking
#          ships): decode at context 16, shipped bytes per token x tokens/s over
#          the memory bandwidth measured just before; the expert bytes per token
#          as shipped next to what the same experts in BF16 would read.
#  sweep   synthetic Qwen3-MoE (random routers) at 5/10/25/50/100% of the expert
#          bytes as expert cache: pack + deltafin policy, pack + LRU, page-cache
#          path (safetensors, buffered reads, page cache held to the same budget
#          by build/memhog), plus prefetch/drafter arms when `deltafin run --help`
#          has those options (not at 100%, where nothing is read).
#  replay  real routing (issue 9): a synthetic model shaped like the routing
#          trace (26 MoE layers, 64 experts, top-6), routing replayed from the
#          trace, 10% and 25%: deltafin vs LRU vs page cache, next to what
#          `deltafin cache-sim` predicts for the same trace tokens and cache size.
#  bound   the fraction of the I/O bound (issues 3 and 4) on a disk whose speed
#          is known: the pack arms of the sweep and replay models and the demo
#          model streamed, with `--sim-disk SIM_GBS` (reads handed over no
#          earlier than a disk of that bandwidth, serving them in order with no
#          credit for idle time, would; src/experts/store.c). This VM's own
#          disk moves 1.0-2.8 GB/s between repetitions, which makes a fraction
#          measured against it noise. Decode BOUND_NEW tokens from a
#          BOUND_PROMPT-token prompt, teacher forced, cold; prefetch off vs on.
#          The real disk's bandwidth is measured too: it must be faster. When
#          the core section's model is there (full runs), it is streamed too at
#          BOUND_CORE_FRACS (10 %: 9 GiB of experts, 10x the cache): issue 3's
#          benchmark, a synthetic Qwen3-MoE whose experts are >= 3x the budget.
#  k3      a Kimi K3-shaped model (issue 23; bench/sections/k3.sh: KDA + gated NoPE MLA, latent MoE,
#          attention residuals, MXFP4 experts; 27 layers shaped like the routing trace,
#          K3_BENCH_GIB (3.5) GiB of experts) streamed from a pack at K3_FRAC (10) % cache,
#          cold: decode tokens/s against the I/O bound with the model's own routing and
#          the trace's, prefetch off and on; a K3_PREFILL (512)-token prefill's time to
#          first token against one read of the experts it touched + the same prefill in
#          RAM (goal <= 1.3x); the KDA state per sequence; the per-token split of the time
#          (KDA, MLA, MoE spine, experts, waiting on reads, other). Scaled down for a
#          try-out: K3_BENCH_GIB=0.3 K3_HIDDEN=1024 K3_VOCAB=32768 (see docs/benchmarks.md).
#  concurrency  N sequences decoded together (issue 24; bench/sections/concurrency.sh:
#          `deltafin bench --parallel N`, one
#          df_eval_multi per step over one row of each sequence, each its own random
#          prompt and teacher-forced tokens) at CONC_PAR (1 2 4 8), experts streamed from
#          a pack at CONC_FRACS (10 25) % cache, cold: aggregate and per-sequence
#          tokens/s and expert bytes read per decoded token, on the demo model
#          (its own routing) and on the replay section's model (each sequence
#          replaying its own stretch of the trace). Then `deltafin batch` on
#          CONC_JOBS (64) completion jobs of CONC_JOB_TOKENS (32) tokens each at
#          --parallel CONC_BATCH_PAR (1 8) on the demo model at the first of
#          CONC_FRACS: jobs, aggregate tokens/s and expert bytes per token from its
#          summary. Scaled down for a try-out: CONC_NEW=8 CONC_JOBS=8 and a small
#          replay model (RR_HIDDEN=256 RR_MOE_I=64; see docs/benchmarks.md).
#  dist    experts over several ranks with Open MPI (issue 26; bench/sections/dist.sh):
#          on the replay model with real routing, DIST_RANKS (2) ranks each holding
#          1/DIST_RANKS of the experts in RAM (`mpirun ... --experts-by-rank`) against
#          1 process streaming them at a DIST_FRAC (10) % cache and 1 process with one
#          rank's cache: tok/s, MB read per token, bytes sent/received per token, the
#          time waiting on ranks over the decode. Skipped without mpirun or the runtime.
#
# Settings (environment): REPS, PROMPT_LEN, NEW, FRACS, REPLAY_FRACS, THREADS,
# COLD (1: drop caches before every arm), HOLD (1: in sweep and replay, every
# arm runs on a machine shrunk by memhog to the budget + the always-active
# weights + HOLD_SLACK_MIB (160) for the engine's buffers, so the page-cache
# arm's page cache is held to the budget and the pack arms get no more; memhog
# itself leaves HOLD_RESERVE_MIB (64) for the rest of the system. It locks most
# of the machine's memory, so it is off in --quick, which is meant for a shared
# machine; HOLD_MAX caps what it locks, for trying it out), RESULTS_DIR, SECTIONS
# ("core deepseek formats sweep replay bound k3 concurrency dist demo"), DIST_* (bench/sections/dist.sh), CONC_PAR, CONC_FRACS, CONC_REPS (REPS),
# CONC_PROMPT (16), CONC_NEW (128), CONC_JOBS, CONC_JOB_TOKENS, CONC_BATCH_PAR, CORE_REPS, DS_REPS (CORE_REPS), DS_NEW (32),
# DS_CTX (4096), DS_PROMPT (512), SIM_GBS (0.6), BOUND_NEW (128),
# BOUND_PROMPT (16), BOUND_FRACS ("5 10 25"), BOUND_CORE_FRACS ("10"), K3_BENCH_GIB (3.5),
# K3_HIDDEN (2048), K3_VOCAB (163840), K3_KDA_HEADS (16, also MLA's), K3_MOE_I (from
# K3_BENCH_GIB), K3_FRAC (10), K3_REPS (REPS), K3_PROMPT (16), K3_NEW (128), K3_PREFILL
# (512), K3_TRACE (TRACE), DEMO_MODEL, TRACE, SYN_* and RR_* model shapes (see below), PREFETCH_FLAGS,
# DRAFT_ARMS ("name=flags;name=flags"). Models go to $B/bench-models/.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
ENG=$B/deltafin
QUICK=0
for a in "$@"; do
    case $a in
    --quick) QUICK=1 ;;
    --warm) COLD=0 ;;
    *) echo "usage: bench/suite.sh [--quick] [--warm]" >&2; exit 2 ;;
    esac
done
q() { [ "$QUICK" = 1 ] && echo "$1" || echo "$2"; } # quick-value full-value
REPS=${REPS:-$(q 1 2)}
PROMPT_LEN=${PROMPT_LEN:-$(q 64 512)}
NEW=${NEW:-$(q 16 512)}
FRACS=${FRACS:-$(q "10 25" "5 10 25 50 100")}
REPLAY_FRACS=${REPLAY_FRACS:-"10 25"}
REPLAY_PROMPT=${REPLAY_PROMPT:-16}
REPLAY_NEW=${REPLAY_NEW:-$(q 48 256)}
THREADS=${THREADS:-$(nproc)}
COLD=${COLD:-1}
HOLD=${HOLD:-$(q 0 1)}
HOLD_SLACK_MIB=${HOLD_SLACK_MIB:-160}
HOLD_RESERVE_MIB=${HOLD_RESERVE_MIB:-64}
SECTIONS=${SECTIONS:-$(q "sweep replay bound concurrency dist demo" "core deepseek formats sweep replay bound k3 concurrency dist demo")} # core, deepseek, formats, k3: 5-10 GB models
SIM_GBS=${SIM_GBS:-0.6}
BOUND_NEW=${BOUND_NEW:-$(q 32 128)}
BOUND_PROMPT=${BOUND_PROMPT:-16}
BOUND_FRACS=${BOUND_FRACS:-$(q "10" "5 10 25")}
CORE_REPS=${CORE_REPS:-$(q 1 5)}
DS_REPS=${DS_REPS:-$CORE_REPS}
DS_NEW=${DS_NEW:-32}
DS_CTX=${DS_CTX:-4096}
DS_PROMPT=${DS_PROMPT:-512}
K3_BENCH_GIB=${K3_BENCH_GIB:-3.5}
K3_HIDDEN=${K3_HIDDEN:-2048}
K3_VOCAB=${K3_VOCAB:-163840}
K3_KDA_HEADS=${K3_KDA_HEADS:-16}
K3_FRAC=${K3_FRAC:-10}
K3_REPS=${K3_REPS:-$REPS}
K3_PROMPT=${K3_PROMPT:-16}
K3_NEW=${K3_NEW:-$(q 32 128)}
K3_PREFILL=${K3_PREFILL:-512}
CONC_PAR=${CONC_PAR:-"1 2 4 8"}
CONC_FRACS=${CONC_FRACS:-"10 25"}
CONC_REPS=${CONC_REPS:-$REPS}
CONC_PROMPT=${CONC_PROMPT:-16}
CONC_NEW=${CONC_NEW:-$(q 32 128)}
CONC_JOBS=${CONC_JOBS:-64}
CONC_JOB_TOKENS=${CONC_JOB_TOKENS:-32}
CONC_BATCH_PAR=${CONC_BATCH_PAR:-"1 8"}
# ../shared beside the checkout (a worktree's is one level further up)
TRACE=${TRACE:-$(ls ../shared/traces/esft-deepseek-v2-lite/law.trace ../../shared/traces/esft-deepseek-v2-lite/law.trace 2>/dev/null | head -1 || true)}
# Model shapes, the same in both modes (the models are made once): sweep experts
# 0.75 GiB (4 layers x 64 experts x 3 MiB, top-4), replay experts 1.2 GiB (the
# trace's 26 x 64, top-6, of 0.75 MiB each). Sized so that the default run,
# whose cost is bytes missed per token x 512 tokens x arms over the disk's
# bandwidth, stays near 30 minutes on a 2-core VM with a ~1 GB/s disk; raise them
# on a bigger machine for a bigger disk-to-RAM ratio, e.g. SYN_HIDDEN=2048
# SYN_MOE_I=768 SYN_LAYERS=8 SYN_EXPERTS=128 SYN_TOPK=8 (9 GiB, the bench/run.sh
# model) or RR_HIDDEN=2048 RR_MOE_I=1408 (DeepSeek-V2-Lite's experts, 27 GiB).
SYN_HIDDEN=${SYN_HIDDEN:-1024}
SYN_LAYERS=${SYN_LAYERS:-4}
SYN_EXPERTS=${SYN_EXPERTS:-64}
SYN_TOPK=${SYN_TOPK:-4}
SYN_MOE_I=${SYN_MOE_I:-512}
RR_HIDDEN=${RR_HIDDEN:-512}
RR_MOE_I=${RR_MOE_I:-256}

DATE=$(date +%Y-%m-%d)
OUT=${RESULTS_DIR:-bench/results/$DATE$([ "$QUICK" = 1 ] && echo -quick || true)}
mkdir -p "$OUT"
ARMS=$OUT/arms.jsonl
: >"$ARMS"
LOG=$OUT/suite.log
: >"$LOG"
say() { echo "$*" | tee -a "$LOG"; }
T0=$(date +%s)
T_START=$SECONDS
TMP=$(mktemp -d)
HOG="" # a running memhog: never left behind holding the machine's memory
trap '[ -z "$HOG" ] || kill "$HOG" 2>/dev/null; rm -rf "$TMP"' EXIT
trap 'exit 130' INT TERM

# ---- the held machine (HOLD=1) ------------------------------------------------------
# One memhog holds memory for a whole section; hog_set moves the line it leaves
# free (through a FIFO on its stdin) and waits for its report. Locking 20 GB
# from scratch takes a minute on a VM; moving the line between arms, a second.
hog_set() { # LEAVE_BYTES
    if [ -z "$HOG" ]; then
        rm -f "$TMP/hog.ctl"; mkfifo "$TMP/hog.ctl"
        "$B/memhog" --leave "$1" --reserve $((HOLD_RESERVE_MIB << 20)) --control \
            --ready "$TMP/memhog.ready" ${HOLD_MAX:+--max "$HOLD_MAX"} <"$TMP/hog.ctl" >/dev/null &
        HOG=$!
        exec 7>"$TMP/hog.ctl"
    fi
    rm -f "$TMP/memhog.ready"
    echo "$1" >&7
    for _ in $(seq 3000); do
        [ -f "$TMP/memhog.ready" ] && return 0
        kill -0 "$HOG" 2>/dev/null || { say "note: memhog failed: memory not held"; hog_stop; return 0; }
        sleep 0.1
    done
    say "note: memhog did not answer in 300 s"
}
hog_stop() {
    [ -n "$HOG" ] || return 0
    exec 7>&-
    kill "$HOG" 2>/dev/null || true
    wait "$HOG" 2>/dev/null || true
    HOG=""
}

# ---- machine facts --------------------------------------------------------------
DEV=$(findmnt -no SOURCE --target "$B" 2>/dev/null | sed 's|^/dev/||; s|\[.*||')
say "# deltafin benchmark suite ($([ "$QUICK" = 1 ] && echo quick || echo full)), $(date -u +%FT%TZ)"
say "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; memory $(free -g | awk '/Mem:/{print $2}') GiB; disk $DEV"
MEMBW=$("$B/bench_kernels" --mem-mib 1024 2>/dev/null | awk '/^membw_gbs/{print $2}' | tail -1 || true)
say "memory read bandwidth: ${MEMBW:-?} GB/s (bench_kernels)"
say "settings: REPS=$REPS PROMPT_LEN=$PROMPT_LEN NEW=$NEW FRACS='$FRACS' REPLAY_FRACS='$REPLAY_FRACS' THREADS=$THREADS COLD=$COLD HOLD=$HOLD"

drop() { [ "$COLD" = 1 ] || return 0; sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || say "(cannot drop caches: not root)"; }
# Before an in-RAM section's warm-up, whatever COLD says: the resident weights are
# read back in 2 MiB folios only when the kernel finds free 2 MiB blocks, and a page
# cache left full and fragmented by earlier sections held the deepseek model at 28-32%
# PMD-mapped (FilePmdMapped in smaps) and 2.9 tok/s, against 8.0 tok/s after a drop
# (engine/residency.c; the same machine, 2026-12-02).
drop_for_ram() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || say "(cannot drop caches: not root)"; }
has_run_flag() { "$ENG" run --help | grep -q -- "$1"; }

# model_bytes MODEL -> "experts dense"
model_bytes() {
    "$ENG" inspect --model "$1" | sed -n 's/.*always-active .*(\([0-9]*\)), routed experts .*(\([0-9]*\)).*/\2 \1/p'
}

# prepare OUT_DIR GEN_ARGS... : generates a checkpoint when missing, after checking
# that the disk has room for it (plus its pack) with 2 GiB to spare.
prepare() {
    local dir=$1; shift
    [ -f "$dir/config.json" ] && return 0
    local need
    need=$(/usr/bin/python3 - "$@" <<'PYEOF'
import sys
a = sys.argv[1:]; g = lambda k, d: int(a[a.index(k) + 1]) if k in a else d
h, L, E, I, V = g("--hidden", 0), g("--layers", 0), g("--experts", 0), g("--moe-intermediate", 0), g("--vocab", 151936)
if "--match-trace" in a: L, E = 27, 64
print(2 * (L * E * 3 * h * I * 2) + V * h * 2 + L * h * h * 8)
PYEOF
)
    room_for "$dir" "$need" "checkpoint + pack" || return 1
    say "generating $dir (about $((need / 2 >> 20)) MiB)"
    nice /usr/bin/python3 tools/gen_checkpoint.py --out "$dir" --arch qwen3_moe --seed 5 --dtype bf16 \
        --vocab 151936 --heads 16 --kv-heads 4 --head-dim 128 --norm-topk-prob 1 --tie-embeddings 1 \
        --max-pos 4096 --max-shard-size 4000000000 --fast-init "$@" >>"$LOG"
}
# room_for DIR BYTES WHAT: the disk under DIR has BYTES + 2 GiB free (else says SKIP)
room_for() {
    local avail
    mkdir -p "$(dirname "$1")"
    avail=$(df --output=avail -B1 "$(dirname "$1")" | tail -1)
    if [ "$avail" -lt $(($2 + (2 << 30))) ]; then
        say "SKIP $1: needs about $(($2 >> 20)) MiB ($3) + 2 GiB, disk has $((avail >> 20)) MiB free"
        return 1
    fi
}
pack() { # MODEL -> MODEL-pack
    [ -f "$1-pack/manifest.json" ] || { say "packing $1"; "$ENG" pack --model "$1" --out "$1-pack" >>"$LOG"; }
}

# run_arm SECTION ARM MODEL FRAC EXPERT_BYTES DENSE_BYTES IOBW REP PROMPT NEW FLAGS...
run_arm() {
    local sec=$1 arm=$2 m=$3 frac=$4 eb=$5 db=$6 iobw=$7 rep=$8 plen=$9 new=${10}; shift 10
    local cache=$((eb * frac / 100)) locked=0 short=0 err=$TMP/arm.err t_arm=$SECONDS
    local flags=("$@")
    if [ "$arm" = resident ] || [[ "$arm" == resident-* ]]; then
        : # everything in RAM, mapped: no cache to size
    elif [ "$arm" = pagecache ]; then
        # the store keeps nothing (one slot); the page cache is the expert cache
        local slot=$((eb / $(model_shape "$m" | awk '{print $1 * $2}')))
        flags+=(--expert-cache "$slot")
    else
        flags+=(--expert-cache "$cache")
    fi
    if [ "$HOLD" = 1 ] && { [ "$sec" = sweep ] || [ "$sec" = replay ]; }; then
        # every arm gets the same machine: the budget + the always-active weights
        # (mapped; page cache) + HOLD_SLACK for the engine's own buffers and KV
        # cache. For the pack arms the budget is their cache arena, for the
        # page-cache arm it is page cache.
        hog_set $((cache + db + (HOLD_SLACK_MIB << 20)))
        read -r locked short <"$TMP/memhog.ready" 2>/dev/null || { locked=0; short=0; }
        [ "$short" -lt $((256 << 20)) ] || say "note: memhog is $((short >> 20)) MiB short of holding memory to the budget"
    fi
    case $sec:$arm in core:* | deepseek:* | formats:* | k3:*resident*) ;; *) drop ;; esac # in-RAM arms run warm
    local json
    if json=$("$ENG" bench --model "$m" --random-prompt "$plen" --max-new $((new + 1)) --threads "$THREADS" \
        --io-bw "$iobw" "${flags[@]}" 2>"$err"); then
        /usr/bin/python3 - "$json" "$sec" "$arm" "$frac" "$rep" "$locked" "$cache" "$m" "$short" "${ARM_MEMBW:-0}" >>"$ARMS" <<'PYEOF'
import json, sys
d = json.loads(sys.argv[1])
d.update(section=sys.argv[2], arm=sys.argv[3], budget_pct=int(sys.argv[4]), rep=int(sys.argv[5]),
         memhog_locked=int(sys.argv[6]), budget_bytes=int(sys.argv[7]), model=sys.argv[8],
         memhog_short=int(sys.argv[9]))
if float(sys.argv[10]) > 0:
    d["membw_gbs"] = float(sys.argv[10])  # measured just before this run
print(json.dumps(d))
PYEOF
        say "$sec $arm ${frac}% rep $rep: $(tail -1 "$ARMS" | /usr/bin/python3 -c "import json,sys; d=json.load(sys.stdin); n=max(1,d['decode_tokens']); print('%.3f tok/s, ttft %.2f s, %.2f MB/token read from storage, hits %d misses %d, peak RSS %.0f MiB' % (d['tokens_per_s'], d['ttft_s'], d['storage_bytes_read']/n/1e6, d['expert_hits'], d['expert_misses'], d['peak_rss_bytes']/2**20))") [$((SECONDS - t_arm)) s; at $((SECONDS - T_START)) s]"
    else
        say "$sec $arm ${frac}% rep $rep FAILED: $(tail -1 "$err")"
    fi
}
# model_shape MODEL -> "MoE_layers experts top_k" (Qwen3-MoE: mlp_only_layers; the
# DeepSeek and Kimi-Linear families: first_k_dense_replace, moe_layer_freq; a
# wrapper's text_config)
model_shape() {
    /usr/bin/python3 - "$1/config.json" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
c = c.get("text_config", c)
k0, f, mlp = c.get("first_k_dense_replace", 0), c.get("moe_layer_freq", 1), c.get("mlp_only_layers", [])
n = sum(1 for i in range(c["num_hidden_layers"]) if i not in mlp and i >= k0 and i % f == 0)
E = c.get("num_experts", c.get("n_routed_experts"))
K = c.get("num_experts_per_tok", c.get("num_experts_per_token"))
print(n, E, K)
PYEOF
}

# measure_iobw MODEL [PACK] -> GB/s of O_DIRECT reads of one record at depth 8
measure_iobw() {
    local m=$1 pk=${2:-$1-pack} shape rec
    shape=$(model_shape "$m")
    rec=$(($(model_bytes "$m" | awk '{print $1}') / $(echo "$shape" | awk '{print $1 * $2}')))
    rec=$(((rec + 4095) / 4096 * 4096))
    drop
    "$B/bench_io" -s "$rec" -d 8 -t "$(q 2 4)" "$pk/experts.bin" | awk '{print $2}'
}

arms_for_sweep() { # name|flags, one a line
    # prefetch is on by default: the baseline arms turn it off, and it gets its own arm
    echo "deltafin|--experts PACK --policy deltafin --prefetch off"
    echo "lru|--experts PACK --policy lru --prefetch off"
    echo "pagecache|--prefetch off"
    if has_run_flag --prefetch; then
        echo "deltafin-prefetch|--experts PACK --policy deltafin ${PREFETCH_FLAGS:---prefetch on}"
    else
        say "note: no --prefetch in 'deltafin run --help': prefetch arms skipped" >&2
    fi
    if has_run_flag --draft; then
        local spec
        # A drafter decodes the model's own tokens (teacher forcing would make every
        # draft wrong), which route and cache differently from forced random ones:
        # its baseline is plain decoding of the same own tokens.
        echo "deltafin-own|--experts PACK --policy deltafin --prefetch off --teacher-force 0"
        # the demo draft shares only the demo model's tokenizer: the demo section runs it
        IFS=';' read -ra spec <<<"${SWEEP_DRAFT_ARMS:-draft-lookup=--draft lookup}"
        for s in "${spec[@]}"; do
            case $s in *models/demo-draft*) [ -f models/demo-draft/config.json ] || {
                say "note: models/demo-draft absent: arm ${s%%=*} skipped" >&2; continue; } ;; esac
            echo "${s%%=*}|--experts PACK --policy deltafin ${s#*=}"
        done
    else
        say "note: no --draft in 'deltafin run --help': drafter arms skipped" >&2
    fi
}

# ---- core: in-RAM decode against memory bandwidth (issue 2) ------------------------
# The engine core's goal: active-weight bytes per token x tokens/s over the
# measured memory read bandwidth, 2 threads, on the shape the issue names; and
# prefill (64 rows) vs decode per token. Warm: the model is read into the page
# cache once (by the engine's own faults, which bring large folios) and not dropped.
if [[ " $SECTIONS " == *" core "* ]]; then
    CM=$B/bench-models/moe-h2048-e128
    if prepare "$CM" --hidden 2048 --intermediate 6144 --layers 8 --heads 32 --kv-heads 4 \
        --experts 128 --top-k 8 --moe-intermediate 768; then
        read -r EB DB < <(model_bytes "$CM")
        say ""
        say "## core: $CM in RAM (resident, warm), prompt 64, decode 32, 2 threads"
        drop
        "$ENG" run --model "$CM" --prompt-tokens 1 --max-new 1 --temp 0 --print-ids >/dev/null
        # the bandwidth drifts (35-57 GB/s within a session on the development VM):
        # each run is set against a measurement taken just before it
        for rep in $(seq "$CORE_REPS"); do
            ARM_MEMBW=$("$B/bench_kernels" --membw-only | awk '/^membw_gbs/{print $2}')
            run_arm core resident "$CM" 100 "$EB" "$DB" 0 "$rep" 64 32 --threads 2
            say "  memory read bandwidth just before: $ARM_MEMBW GB/s"
        done
        ARM_MEMBW=
    fi
fi

# ---- deepseek: a DeepSeek-V3-shaped model in RAM (issue 21) ---------------------------
# Three arms per repetition, interleaved (reversed on even repetitions), warm:
#   ctx16    16-token prompt, DS_NEW decoded: decode at a short context; its
#            active bytes x tokens/s over the bandwidth measured just before it
#   prefill  DS_PROMPT-token prompt: prefill tokens/s (vs ctx16's decode)
#   ctx4096  a DS_CTX - DS_NEW token prompt, DS_NEW decoded: decode near DS_CTX
# The MLA share at DS_CTX is what a step grew by from ctx16 to ctx4096 over the
# ctx4096 step (all the growth is attention over the longer latent cache), and
# independently bench_mla's time of the MLA block alone at DS_CTX x layers over
# the ctx4096 step. Each repetition's arms are paired (report.py).
if [[ " $SECTIONS " == *" deepseek "* ]]; then
    DSM=$B/bench-models/dsv3-h2048-l8-e64
    DS_GEN=(--arch deepseek_v3 --seed 5 --dtype bf16 --vocab 129280 --hidden 2048 --intermediate 10944
        --layers 8 --first-k-dense 1 --heads 16 --q-lora-rank 768 --kv-lora-rank 512 --qk-nope-dim 128
        --qk-rope-dim 64 --v-head-dim 128 --experts 64 --top-k 6 --n-shared-experts 1
        --moe-intermediate 1408 --n-group 8 --topk-group 4 --routed-scaling-factor 2.5 --norm-topk-prob 1
        --max-pos 8192 --max-shard-size 4000000000 --fast-init)
    if [ -f "$DSM/config.json" ] || { room_for "$DSM" 9300000000 "checkpoint" &&
        say "generating $DSM (about 8800 MiB)" &&
        nice /usr/bin/python3 tools/gen_checkpoint.py --out "$DSM" "${DS_GEN[@]}" >>"$LOG"; }; then
        read -r EB DB < <(model_bytes "$DSM")
        "$ENG" inspect --model "$DSM" | grep -E '^(attention|latent cache|experts|MoE layers)' | tee -a "$LOG"
        # cache bytes per token, all layers: the engine's F32 latent rows vs the
        # expanded per-head keys (nope + rope) and values a plain K/V cache holds
        /usr/bin/python3 - "$DSM/config.json" >>"$ARMS" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
L, nh = c["num_hidden_layers"], c["num_attention_heads"]
lat = c["kv_lora_rank"] + c["qk_rope_head_dim"]
exp = nh * (c["qk_nope_head_dim"] + c["qk_rope_head_dim"] + c["v_head_dim"])
print(json.dumps({"section": "deepseek", "event": "cache", "layers": L, "latent_values": lat,
                  "expanded_values": exp, "latent_bytes_per_token": 4 * L * lat,
                  "expanded_f32_bytes_per_token": 4 * L * exp, "expanded_bf16_bytes_per_token": 2 * L * exp}))
PYEOF
        say ""
        say "## deepseek: $DSM in RAM (resident, warm), 2 threads; decode $DS_NEW at context 16 and $DS_CTX, prefill $DS_PROMPT"
        drop_for_ram
        "$ENG" run --model "$DSM" --prompt-tokens 1 --max-new 1 --temp 0 --print-ids >/dev/null
        DS_ARMS=("ctx16 16" "prefill $DS_PROMPT" "ctx$DS_CTX $((DS_CTX - DS_NEW))")
        for rep in $(seq "$DS_REPS"); do
            ORDER=("${DS_ARMS[@]}")
            [ $((rep % 2)) = 0 ] && ORDER=("${DS_ARMS[2]}" "${DS_ARMS[1]}" "${DS_ARMS[0]}")
            for a in "${ORDER[@]}"; do
                read -r name plen <<<"$a"
                new=$DS_NEW
                [ "$name" = prefill ] && new=4 # the prompt is the measure
                ARM_MEMBW=$("$B/bench_kernels" --membw-only | awk '/^membw_gbs/{print $2}')
                run_arm deepseek "resident-$name" "$DSM" 100 "$EB" "$DB" 0 "$rep" "$plen" "$new" --threads 2
                say "  memory read bandwidth just before: $ARM_MEMBW GB/s"
            done
            # the MLA block alone at DS_CTX (one layer, the model's shape)
            MLA=$("$B/bench_mla" --ctx "$DS_CTX" --rows 256 --threads 2 --reps 21)
            echo "$MLA" | awk -v rep="$rep" '/^mla_decode_ms/{d=$2} /^mla_prefill_ms_per_row/{p=$2}
                END{printf "{\"section\":\"deepseek\",\"event\":\"mla\",\"rep\":%d,\"mla_decode_ms\":%s,\"mla_prefill_ms_per_row\":%s}\n", rep, d, p}' >>"$ARMS"
            say "rep $rep: bench_mla at ctx $DS_CTX: $(echo "$MLA" | grep -E '^mla_' | tr '\n' ' ')"
        done
        ARM_MEMBW=
    fi
fi

# ---- formats: weights as shipped, in RAM (issue 22) ---------------------------------
# Two models, their arms interleaved per repetition (reversed on even ones), warm.
if [[ " $SECTIONS " == *" formats "* ]]; then
    FP8M=$B/bench-models/dsv3-fp8n-h2048-l8-e64 # fp8n: the normal-weight codes of gen_quant (2026-12-06)
    K2M=$B/bench-models/k2-int4-h2048-l8-e64
    FMT_DS=(--arch deepseek_v3 --seed 5 --dtype bf16 --vocab 129280 --hidden 2048 --intermediate 10944
        --layers 8 --first-k-dense 1 --heads 16 --q-lora-rank 768 --kv-lora-rank 512 --qk-nope-dim 128
        --qk-rope-dim 64 --v-head-dim 128 --experts 64 --top-k 6 --n-shared-experts 1
        --moe-intermediate 1408 --n-group 8 --topk-group 4 --routed-scaling-factor 2.5 --norm-topk-prob 1
        --max-pos 8192 --max-shard-size 4000000000 --fast-init --quant fp8)
    FMT_K2=(--arch kimi_k2 --seed 6 --dtype bf16 --vocab 163840 --hidden 2048 --intermediate 8192
        --layers 8 --first-k-dense 1 --heads 16 --q-lora-rank 768 --kv-lora-rank 512 --qk-nope-dim 128
        --qk-rope-dim 64 --v-head-dim 128 --experts 64 --top-k 8 --n-shared-experts 1
        --moe-intermediate 2048 --routed-scaling-factor 2.827 --norm-topk-prob 1
        --max-pos 8192 --max-shard-size 4000000000 --fast-init --quant int4)
    FMT_OK=()
    for pair in "$FP8M:FMT_DS:4800000000" "$K2M:FMT_K2:5000000000"; do
        IFS=: read -r dir var need <<<"$pair"
        declare -n gen_args=$var
        if [ -f "$dir/config.json" ] || { room_for "$dir" "$need" "checkpoint" &&
            say "generating $dir" && nice /usr/bin/python3 tools/gen_checkpoint.py --out "$dir" "${gen_args[@]}" >>"$LOG"; }; then
            FMT_OK+=("$dir")
            # expert bytes per token as shipped, and in BF16: top-k x MoE layers x one expert
            /usr/bin/python3 - "$dir" >>"$ARMS" <<'PYEOF'
import json, os, struct, sys
d = sys.argv[1]
c = json.load(open(os.path.join(d, "config.json")))
k0 = c.get("first_k_dense_replace", 0)
pre = f"model.layers.{k0}.mlp.experts.0."
shipped = 0
for fn in sorted(os.listdir(d)):
    if fn.endswith(".safetensors"):
        with open(os.path.join(d, fn), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            h = json.loads(f.read(n))
        for name, t in h.items():
            if name.startswith(pre) and not name.endswith("weight_shape"):
                shipped += t["data_offsets"][1] - t["data_offsets"][0]
moe = c["num_hidden_layers"] - k0
per_tok = c["num_experts_per_tok"] * moe
bf16 = 3 * 2 * c["hidden_size"] * c["moe_intermediate_size"]
print(json.dumps({"section": "formats", "event": "bytes", "model": d, "expert_bytes_shipped": shipped,
                  "expert_bytes_bf16": bf16, "expert_bytes_per_token_shipped": shipped * per_tok,
                  "expert_bytes_per_token_bf16": bf16 * per_tok}))
PYEOF
        fi
        unset -n gen_args
    done
    if [ ${#FMT_OK[@]} -gt 0 ]; then
        say ""
        say "## formats: ${FMT_OK[*]} in RAM (resident, warm), 2 threads; decode $DS_NEW at context 16"
        drop_for_ram
        for dir in "${FMT_OK[@]}"; do
            "$ENG" inspect --model "$dir" | grep -E '^(weights|expert formats|always-active dtypes)' | tee -a "$LOG"
            "$ENG" run --model "$dir" --prompt-tokens 1 --max-new 1 --temp 0 --print-ids >/dev/null
        done
        for rep in $(seq "$DS_REPS"); do
            ORDER=("${FMT_OK[@]}")
            [ $((rep % 2)) = 0 ] && [ ${#ORDER[@]} = 2 ] && ORDER=("${FMT_OK[1]}" "${FMT_OK[0]}")
            for dir in "${ORDER[@]}"; do
                read -r EB DB < <(model_bytes "$dir")
                name=resident-fp8-dsv3
                [ "$dir" = "$K2M" ] && name=resident-int4-k2
                ARM_MEMBW=$("$B/bench_kernels" --membw-only | awk '/^membw_gbs/{print $2}')
                run_arm formats "$name" "$dir" 100 "$EB" "$DB" 0 "$rep" 16 "$DS_NEW" --threads 2
                say "  memory read bandwidth just before: $ARM_MEMBW GB/s"
            done
        done
        ARM_MEMBW=
    fi
fi

# ---- sweep ----------------------------------------------------------------------
if [[ " $SECTIONS " == *" sweep "* ]]; then
    M=$B/bench-models/moe-h$SYN_HIDDEN-l$SYN_LAYERS-e$SYN_EXPERTS-k$SYN_TOPK-i$SYN_MOE_I
    if prepare "$M" --hidden "$SYN_HIDDEN" --intermediate $((SYN_HIDDEN * 3)) --layers "$SYN_LAYERS" \
        --experts "$SYN_EXPERTS" --top-k "$SYN_TOPK" --moe-intermediate "$SYN_MOE_I"; then
        pack "$M"
        read -r EB DB < <(model_bytes "$M")
        say ""
        say "## sweep: $M, experts $((EB >> 20)) MiB, always-active $((DB >> 20)) MiB; prompt $PROMPT_LEN, decode $NEW"
        mapfile -t SWEEP < <(arms_for_sweep)
        for rep in $(seq "$REPS"); do
            IOBW=$(measure_iobw "$M"); say "rep $rep: O_DIRECT read bandwidth $IOBW GB/s"
            echo "{\"section\":\"sweep\",\"event\":\"iobw\",\"rep\":$rep,\"gbs\":$IOBW}" >>"$ARMS"
            # even repetitions run the arms in reverse: an arm that follows another
            # reads records that one just read, which a virtual disk's host may cache
            ORDER=("${SWEEP[@]}")
            if [ $((rep % 2)) = 0 ]; then mapfile -t ORDER < <(printf '%s\n' "${SWEEP[@]}" | tac); fi
            for frac in $FRACS; do
                for a in "${ORDER[@]}"; do
                    name=${a%%|*}; fl=${a#*|}; fl=${fl//PACK/$M-pack}
                    # with every expert cached nothing is read: only the baselines run
                    case $frac:$name in 100:deltafin | 100:lru | 100:pagecache | [0-9]:* | [1-9][0-9]:*) ;; *) continue ;; esac
                    # shellcheck disable=SC2086
                    run_arm sweep "$name" "$M" "$frac" "$EB" "$DB" "$IOBW" "$rep" "$PROMPT_LEN" "$NEW" $fl
                done
            done
        done
    fi
fi

# ---- replay (real routing) ------------------------------------------------------
if [[ " $SECTIONS " == *" replay "* ]]; then
    if [ -z "$TRACE" ] || [ ! -f "$TRACE" ]; then
        say "SKIP replay section: no trace at $TRACE (set TRACE=)"
    else
        RM=$B/bench-models/replay-$(basename "$TRACE" .trace)-h$RR_HIDDEN-i$RR_MOE_I
        [ -f "$RM/config.json" ] || hog_stop # generating it needs the memory
        if prepare "$RM" --match-trace "$TRACE" --hidden "$RR_HIDDEN" --intermediate $((RR_HIDDEN * 3)) \
            --moe-intermediate "$RR_MOE_I"; then
            pack "$RM"
            read -r EB DB < <(model_bytes "$RM")
            read -r NL NE NK < <(model_shape "$RM")
            say ""
            say "## replay: $RM routed by $TRACE; experts $((EB >> 20)) MiB, always-active $((DB >> 20)) MiB; prompt $REPLAY_PROMPT, decode $REPLAY_NEW"
            # the trace tokens the runs use (prompt rows, then decoded rows), for cache-sim
            SUB=$TMP/replay-used.trace
            /usr/bin/python3 - "$TRACE" $((REPLAY_PROMPT + REPLAY_NEW)) "$SUB" <<'PYEOF'
import sys
src, n, dst = sys.argv[1], int(sys.argv[2]), sys.argv[3]
head, toks = [], []
for line in open(src):
    if line.startswith("#"):
        if not toks: head.append(line)
    elif line.strip():
        toks.append(line)
toks = (toks * (n // len(toks) + 1))[:n]   # the engine wraps around too
open(dst, "w").writelines(head + toks)
PYEOF
            for frac in $REPLAY_FRACS; do
                slots=$((EB * frac / 100 / (EB / (NL * NE))))
                tr=$((slots / 8 < NK ? slots / 8 : NK)) # the store's transient slots
                "$ENG" cache-sim --trace "$SUB" --slots $((slots - tr)) --policy deltafin,lru \
                    --warmup "$REPLAY_PROMPT" >"$OUT/cachesim-$frac.txt" 2>&1 || true
                /usr/bin/python3 - "$OUT/cachesim-$frac.txt" "$frac" "$((EB / (NL * NE)))" "$NL" "$NK" >>"$ARMS" <<'PYEOF'
import json, re, sys
txt, frac, eb, nl, nk = open(sys.argv[1]).read(), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
for pol in ("deltafin", "lru"):
    m = re.search(r"^\s*%s\b.*?hit rate\s*([0-9.]+)" % pol, txt, re.M) or re.search(r"^\s*%s\b\D*([0-9.]+)" % pol, txt, re.M)
    if m:
        hr = float(m.group(1)); hr = hr / 100 if hr > 1 else hr
        print(json.dumps({"section": "replay", "event": "cachesim", "arm": pol, "budget_pct": frac,
                          "hit_rate": hr, "bytes_per_token": (1 - hr) * nl * nk * eb}))
PYEOF
                say "cache-sim at ${frac}%: $(tr '\n' ' ' <"$OUT/cachesim-$frac.txt")"
            done
            for rep in $(seq "$REPS"); do
                IOBW=$(measure_iobw "$RM"); say "rep $rep: O_DIRECT read bandwidth $IOBW GB/s"
                echo "{\"section\":\"replay\",\"event\":\"iobw\",\"rep\":$rep,\"gbs\":$IOBW}" >>"$ARMS"
                for frac in $REPLAY_FRACS; do
                    RARMS="deltafin lru pagecache deltafin-prefetch"
                    [ $((rep % 2)) = 0 ] && RARMS="deltafin-prefetch pagecache lru deltafin" # see the sweep
                    for arm in $RARMS; do
                        # --chunk 1: the cache sees the trace's tokens one by one, as cache-sim does;
                        # prefetch off except in its own arm (it changes the transient slots)
                        fl=(--replay-routing "$TRACE" --chunk 1 --prefetch off)
                        case $arm in
                        deltafin | lru) fl+=(--experts "$RM-pack" --policy "$arm") ;;
                        deltafin-prefetch) fl=(--replay-routing "$TRACE" --chunk 1 --experts "$RM-pack" --policy deltafin --prefetch on) ;;
                        esac
                        run_arm replay "$arm" "$RM" "$frac" "$EB" "$DB" "$IOBW" "$rep" "$REPLAY_PROMPT" "$REPLAY_NEW" "${fl[@]}"
                    done
                done
            done
        fi
    fi
fi

# ---- bound: the fraction of the I/O bound on a disk of known speed ------------------
hog_stop
if [[ " $SECTIONS " == *" bound "* ]]; then
    BM=$B/bench-models/moe-h$SYN_HIDDEN-l$SYN_LAYERS-e$SYN_EXPERTS-k$SYN_TOPK-i$SYN_MOE_I
    BR=$B/bench-models/replay-$(basename "${TRACE:-none}" .trace)-h$RR_HIDDEN-i$RR_MOE_I
    BD=${DEMO_MODEL:-models/demo-moe}
    BC=$B/bench-models/moe-h2048-e128
    say ""
    say "## bound: experts through a simulated ${SIM_GBS} GB/s disk; prompt $BOUND_PROMPT, decode $BOUND_NEW, teacher forced"
    if [ -f "$BC/config.json" ]; then pack "$BC"; else BC=; fi # the core section makes it (full runs)
    BDP=$B/bench-models/$(basename "$BD")-pack
    if [ -f "$BD/config.json" ] && [ ! -f "$BDP/manifest.json" ]; then
        say "packing $BD"; "$ENG" pack --model "$BD" --out "$BDP" >>"$LOG"
    fi
    for rep in $(seq "$REPS"); do
        for mdl in "$BM" "$BR" ${BC:+"$BC"} "$BD"; do
            pk=$mdl-pack
            [ "$mdl" = "$BD" ] && pk=$BDP
            [ -f "$mdl/config.json" ] && [ -f "$pk/manifest.json" ] || { [ "$rep" = 1 ] &&
                say "note: $mdl or its pack absent (the sweep/replay sections make them): skipped"; continue; }
            read -r EB DB < <(model_bytes "$mdl")
            case $mdl in
            "$BM") sec=bound; fracs=$BOUND_FRACS; fl=() ;;
            "$BR") sec=bound-replay; fracs=$REPLAY_FRACS; fl=(--replay-routing "$TRACE" --chunk 1) ;;
            "$BC") sec=bound-core; fracs=${BOUND_CORE_FRACS:-10}; fl=() ;;
            *) sec=bound-demo; fracs=25; fl=() ;;
            esac
            REAL=$(measure_iobw "$mdl" "$pk")
            echo "{\"section\":\"$sec\",\"event\":\"realbw\",\"rep\":$rep,\"gbs\":$REAL}" >>"$ARMS"
            say "rep $rep $sec: the real disk reads $REAL GB/s (O_DIRECT, record-sized); simulated $SIM_GBS"
            /usr/bin/python3 -c "import sys; sys.exit(float(sys.argv[1]) < 1.2 * float(sys.argv[2]))" "$REAL" "$SIM_GBS" ||
                say "note: the real disk is not clearly faster than the simulated one: fractions are low"
            ORDER="off on lru"
            [ $((rep % 2)) = 0 ] && ORDER="lru on off"
            for frac in $fracs; do
                for a in $ORDER; do
                    case $a in
                    off) arm=deltafin; af=(--policy deltafin --prefetch off) ;;
                    on) arm=deltafin-prefetch; af=(--policy deltafin --prefetch on) ;;
                    lru) arm=lru; af=(--policy lru --prefetch off) ;;
                    esac
                    run_arm "$sec" "$arm" "$mdl" "$frac" "$EB" "$DB" 0 "$rep" "$BOUND_PROMPT" "$BOUND_NEW" \
                        --experts "$pk" --sim-disk "$SIM_GBS" --teacher-force 7 "${af[@]}" "${fl[@]}"
                done
            done
        done
    done
fi

# ---- k3: a Kimi K3-shaped model streamed from a pack (issue 23) ------------------------
if [[ " $SECTIONS " == *" k3 "* ]]; then
    # shellcheck source=bench/sections/k3.sh
    . bench/sections/k3.sh
fi

# ---- concurrency: N sequences decoded together (issue 24) -----------------------------
if [[ " $SECTIONS " == *" concurrency "* ]]; then
    # shellcheck source=bench/sections/concurrency.sh
    . bench/sections/concurrency.sh
fi

# ---- dist: experts over several ranks with Open MPI (issue 26) ------------------------
if [[ " $SECTIONS " == *" dist "* ]]; then
    # shellcheck source=bench/sections/dist.sh
    . bench/sections/dist.sh
fi

# ---- demo (the trained demo models, when present) -----------------------------------
if [[ " $SECTIONS " == *" demo "* ]]; then
    DM=${DEMO_MODEL:-models/demo-moe}
    if [ ! -f "$DM/config.json" ]; then
        say ""
        say "note: $DM absent (the trained demo model is another issue's): demo section skipped"
    else
        read -r EB DB < <(model_bytes "$DM")
        say ""
        say "## demo: $DM in RAM; prompt $PROMPT_LEN, decode $NEW"
        DEMO=("resident|")
        if has_run_flag --draft; then
            DEMO+=("resident-own|--teacher-force 0") # the drafters' baseline (see arms_for_sweep)
            IFS=';' read -ra spec <<<"${DRAFT_ARMS:-draft-lookup=--draft lookup;draft-model=--draft models/demo-draft}"
            for sp in "${spec[@]}"; do
                case $sp in *models/demo-draft*) [ -f models/demo-draft/config.json ] || {
                    say "note: models/demo-draft absent: arm ${sp%%=*} skipped"; continue; } ;; esac
                DEMO+=("resident-${sp%%=*}|${sp#*=}")
            done
        else
            say "note: no --draft in 'deltafin run --help': drafter arms skipped"
        fi
        for rep in $(seq "$REPS"); do
            for a in "${DEMO[@]}"; do
                # shellcheck disable=SC2086
                run_arm demo "${a%%|*}" "$DM" 100 "$EB" "$DB" 0 "$rep" "$PROMPT_LEN" "$NEW" ${a#*|}
            done
        done
    fi
fi

/usr/bin/python3 bench/report.py "$OUT" "${MEMBW:-0}" "$([ "$QUICK" = 1 ] && echo quick || echo full)" | tee -a "$LOG"
say "suite took $(($(date +%s) - T0)) s; results in $OUT"
