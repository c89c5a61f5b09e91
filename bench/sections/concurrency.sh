# bench/sections/concurrency.sh - the suite's `concurrency` section (issue 24). Sourced by bench/suite.sh;
# it uses the suite's settings and helpers (the CONC_* settings, B, ENG, TRACE, RR_*, THREADS, TMP,
# ARMS, LOG and say, drop, run_arm, prepare, pack, model_bytes, measure_iobw); not a script of its own.
#
# Per repetition, per model and cache fraction, the arms own-pN / replay-pN for N in
# CONC_PAR (order reversed on even repetitions), cold. The replay model is the replay
# section's (made here when that section did not run). Then `deltafin batch`.
CD=${DEMO_MODEL:-models/demo-moe}
CDP=$B/bench-models/$(basename "$CD")-pack
CM=()
if [ -f "$CD/config.json" ]; then
    [ -f "$CDP/manifest.json" ] || { say "packing $CD"; "$ENG" pack --model "$CD" --out "$CDP" >>"$LOG"; }
    CM+=("own|$CD|$CDP")
else
    say "note: $CD absent: concurrency on the demo model skipped"
fi
if [ -n "$TRACE" ] && [ -f "$TRACE" ]; then
    CR=$B/bench-models/replay-$(basename "$TRACE" .trace)-h$RR_HIDDEN-i$RR_MOE_I
    if prepare "$CR" --match-trace "$TRACE" --hidden "$RR_HIDDEN" --intermediate $((RR_HIDDEN * 3)) \
        --moe-intermediate "$RR_MOE_I"; then
        pack "$CR"
        CM+=("replay|$CR|$CR-pack")
    fi
else
    say "note: no trace at \$TRACE: concurrency on the replay model skipped"
fi
say ""
say "## concurrency: sequences ($CONC_PAR) decoded together, streamed at ($CONC_FRACS) %; prompt $CONC_PROMPT, decode $CONC_NEW each, teacher forced"
for rep in $(seq "$CONC_REPS"); do
    PAR=$CONC_PAR
    [ $((rep % 2)) = 0 ] && PAR=$(printf '%s\n' $CONC_PAR | tac | tr '\n' ' ')
    for cm in "${CM[@]}"; do
        IFS='|' read -r kind mdl pk <<<"$cm"
        read -r EB DB < <(model_bytes "$mdl")
        IOBW=$(measure_iobw "$mdl" "$pk")
        echo "{\"section\":\"concurrency\",\"event\":\"iobw\",\"model\":\"$mdl\",\"rep\":$rep,\"gbs\":$IOBW}" >>"$ARMS"
        fl=(); [ "$kind" = replay ] && fl=(--replay-routing "$TRACE")
        for frac in $CONC_FRACS; do
            for p in $PAR; do
                run_arm concurrency "$kind-p$p" "$mdl" "$frac" "$EB" "$DB" "$IOBW" "$rep" "$CONC_PROMPT" "$CONC_NEW" \
                    --experts "$pk" --policy deltafin --prefetch off --parallel "$p" "${fl[@]}"
            done
        done
    done
done
# deltafin batch (a product command: the model's own routing) on CONC_JOBS jobs
if [ -f "$CD/config.json" ]; then
    read -r EB DB < <(model_bytes "$CD")
    frac=${CONC_FRACS%% *}
    JOBS=$TMP/conc-jobs.jsonl
    /usr/bin/python3 - "$CONC_JOBS" "$CONC_PROMPT" "$CONC_JOB_TOKENS" "$CD/config.json" >"$JOBS" <<'PYEOF'
import json, random, sys
n, plen, mt = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
c = json.load(open(sys.argv[4])); c = c.get("text_config", c)
rng = random.Random(24)
for i in range(n):  # seeded random prompts; greedy, so a run is repeatable
    body = {"model": "m", "prompt": [rng.randrange(c["vocab_size"]) for _ in range(plen)], "max_tokens": mt,
            "temperature": 0}
    print(json.dumps({"custom_id": "job-%d" % i, "method": "POST", "url": "/v1/completions", "body": body}))
PYEOF
    for rep in $(seq "$CONC_REPS"); do
        for p in $CONC_BATCH_PAR; do
            rm -f "$TMP/conc-out.jsonl"
            drop
            t_arm=$SECONDS
            if "$ENG" batch --model "$CD" --experts "$CDP" --expert-cache $((EB * frac / 100)) --policy deltafin \
                --prefetch off --threads "$THREADS" --parallel "$p" --input "$JOBS" --output "$TMP/conc-out.jsonl" \
                2>"$TMP/conc-batch.err" >/dev/null; then
                /usr/bin/python3 - "$TMP/conc-batch.err" "$TMP/conc-out.jsonl" "$p" "$frac" "$rep" "$CD" >>"$ARMS" <<'PYEOF'
import json, re, sys
txt = open(sys.argv[1]).read()
m = re.search(r"(\d+) tokens generated in ([0-9.]+) s: ([0-9.]+) tok/s", txt)
x = re.search(r"([0-9.]+) MB per generated token", txt)
lines = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
ok = sum(1 for l in lines if l.get("response") and l["response"].get("status_code") == 200)
p = int(sys.argv[3])
print(json.dumps({"section": "concurrency", "event": "batch", "arm": "batch-p%d" % p, "parallel": p,
                  "budget_pct": int(sys.argv[4]), "rep": int(sys.argv[5]), "model": sys.argv[6], "jobs": len(lines),
                  "jobs_ok": ok, "tokens": int(m.group(1)) if m else 0, "seconds": float(m.group(2)) if m else 0,
                  "tokens_per_s": float(m.group(3)) if m else 0,
                  "tokens_per_s_per_seq": (float(m.group(3)) / p) if m else 0,
                  "expert_bytes_per_token": float(x.group(1)) * 1e6 if x else 0}))
PYEOF
                say "concurrency batch --parallel $p ${frac}% rep $rep: $(tail -1 "$ARMS" | /usr/bin/python3 -c "import json,sys; d=json.load(sys.stdin); print('%d jobs (%d answered), %d tokens, %.3f tok/s (%.3f per sequence), %.3f MB expert reads per token' % (d['jobs'], d['jobs_ok'], d['tokens'], d['tokens_per_s'], d['tokens_per_s_per_seq'], d['expert_bytes_per_token'] / 1e6))") [$((SECONDS - t_arm)) s]"
            else
                say "concurrency batch --parallel $p rep $rep FAILED: $(tail -1 "$TMP/conc-batch.err")"
            fi
        done
    done
fi
