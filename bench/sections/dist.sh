# bench/sections/dist.sh - the suite's `dist` section (issue 26): experts spread over
# several ranks with Open MPI against one process that streams them. Sourced by
# bench/suite.sh (it uses the suite's settings and helpers: B, ENG, TRACE, RR_*, REPS,
# THREADS, ARMS, TMP, say, drop, prepare, pack, model_bytes, model_shape,
# measure_iobw, has_run_flag, q); not a script of its own.
#
# On the replay section's model (RR_HIDDEN/RR_MOE_I, made here when missing), routing
# replayed from TRACE, teacher-forced decode, the page cache dropped before each arm:
#   single-stream  1 process, expert cache DIST_FRAC (10) % of the expert bytes: it
#                  streams most experts from the pack
#   single-half    1 process with the cache of one rank of dist-half (the same RAM
#                  per process, for the per-rank comparison)
#   dist-half      `mpirun -n DIST_RANKS deltafin bench ... --experts-by-rank`, each
#                  rank's cache 1/DIST_RANKS of the expert bytes + room for the store's
#                  transient slots, so the ranks together hold every expert in RAM
#   dist-stream    (only when named in DIST_ARMS) DIST_RANKS ranks, each with a
#                  DIST_FRAC % cache: the ranks stream too
# DIST_PROMPT (256) prompt tokens in one chunk read nearly every expert once, so the
# caches are warm when the decode (DIST_NEW tokens) that the figures count starts.
# The ranks share this machine's cores: each rank gets THREADS / DIST_RANKS threads
# (at least 1), the one-process arms THREADS.
#
# Reported per arm (bench/report.py, "dist"): tok/s, MB read from storage per token,
# bytes sent to / received from the other ranks per token, messages per token, and
# the time rank 0 waited on ranks as a share of the decode time.
#
# The runtime's names (src/cli/report.c): `deltafin bench`'s JSON summary, printed by
# rank 0 only, carries dist_bytes_sent, dist_bytes_recv, dist_messages (totals over the
# decode, rank 0's side), dist_wait_s (seconds rank 0 waited on ranks while decoding) and
# dist_storage_bytes_read (every rank's storage reads while decoding); the options are
# --experts-by-rank and --rank-timeout SEC. Without mpirun or without --experts-by-rank
# in `deltafin run --help` the section is skipped with a note.
#
# Settings: DIST_RANKS (2), DIST_FRAC (10), DIST_ARMS ("single-stream single-half
# dist-half"), DIST_REPS (REPS), DIST_PROMPT (256), DIST_NEW (32 quick, 128 full),
# DIST_TIMEOUT (1800 s per arm), DIST_RANK_TIMEOUT (120 s), MPIRUN (mpirun),
# MPIRUN_ARGS ("--oversubscribe"; add e.g. "--mca btl self,tcp" to force TCP).

DIST_RANKS=${DIST_RANKS:-2}
DIST_FRAC=${DIST_FRAC:-10}
DIST_ARMS=${DIST_ARMS:-"single-stream single-half dist-half"}
DIST_REPS=${DIST_REPS:-$REPS}
DIST_PROMPT=${DIST_PROMPT:-256}
DIST_NEW=${DIST_NEW:-$(q 32 128)}
DIST_TIMEOUT=${DIST_TIMEOUT:-1800}
DIST_RANK_TIMEOUT=${DIST_RANK_TIMEOUT:-120}
MPIRUN=${MPIRUN:-mpirun}
MPIRUN_ARGS=${MPIRUN_ARGS:-"--oversubscribe"}

# dist_arm ARM NP CACHE_BYTES MODEL EXPERT_BYTES IOBW REP FLAGS...: one `deltafin bench`,
# under mpirun when NP > 1; its summary (rank 0's) goes to ARMS with the section's fields.
dist_arm() {
    local arm=$1 np=$2 cache=$3 m=$4 eb=$5 iobw=$6 rep=$7; shift 7
    local out=$TMP/dist.out err=$TMP/dist.err t_arm=$SECONDS thr=$THREADS
    local cmd=()
    if [ "$np" -gt 1 ]; then
        thr=$((THREADS / np > 0 ? THREADS / np : 1))
        # shellcheck disable=SC2206 # MPIRUN_ARGS is a list of words on purpose
        cmd=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$MPIRUN" -n "$np" $MPIRUN_ARGS)
    fi
    drop
    if timeout "$DIST_TIMEOUT" "${cmd[@]}" "$ENG" bench --model "$m" --random-prompt "$DIST_PROMPT" \
        --max-new $((DIST_NEW + 1)) --threads "$thr" --io-bw "$iobw" --expert-cache "$cache" "$@" \
        >"$out" 2>"$err"; then
        if /usr/bin/python3 - "$out" "$arm" "$np" "$cache" "$eb" "$rep" "$m" >>"$ARMS" <<'PYEOF'; then
import json, sys
src, arm, np, cache, eb, rep, model = sys.argv[1:]
# every rank's stdout comes through mpirun: rank 0's summary is the one with dist_*
# fields (or the only summary, for one process)
sums = []
for line in open(src):
    line = line.strip()
    if line.startswith("{") and '"summary"' in line:
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if d.get("event") == "summary":
            sums.append(d)
if not sums:
    sys.exit(1)
d = next((s for s in sums if "dist_bytes_sent" in s), sums[0])
n = max(1, d["decode_tokens"])
d.update(section="dist", arm=arm, ranks=int(np), cache_per_rank=int(cache), budget_bytes=int(cache),
         budget_pct=round(int(cache) * 100 / int(eb)),
         rep=int(rep), model=model)
every = "dist_storage_bytes_read" in d
d["dist_read_per_token"] = d["dist_storage_bytes_read" if every else "storage_bytes_read"] / n
d["dist_read_scope"] = "one process" if int(np) == 1 else "all ranks" if every else "rank 0 only"
if int(np) > 1:
    if "dist_bytes_sent" not in d:
        d["dist_fields_missing"] = True  # the runtime's names differ: see bench/sections/dist.sh
    d["dist_sent_per_token"] = d.get("dist_bytes_sent", 0) / n
    d["dist_recv_per_token"] = d.get("dist_bytes_recv", 0) / n
    d["dist_messages_per_token"] = d.get("dist_messages", 0) / n
    d["dist_wait_fraction"] = d.get("dist_wait_s", 0) / d["decode_s"] if d.get("decode_s") else None
print(json.dumps(d))
PYEOF
            say "dist $arm ($np process(es), cache $((cache >> 20)) MiB each) rep $rep: $(tail -1 "$ARMS" | /usr/bin/python3 -c "
import json, sys
d = json.load(sys.stdin)
s = '%.3f tok/s, %.2f MB/token read (%s)' % (d['tokens_per_s'], d['dist_read_per_token'] / 1e6, d['dist_read_scope'])
if d['ranks'] > 1:
    s += ', sent %.1f kB/token, received %.1f kB/token, %.1f messages/token, waiting on ranks %s of the decode' % (
        d['dist_sent_per_token'] / 1e3, d['dist_recv_per_token'] / 1e3, d['dist_messages_per_token'],
        '%.1f%%' % (100 * d['dist_wait_fraction']) if d['dist_wait_fraction'] is not None else '?')
    if d.get('dist_fields_missing'):
        s += ' (NO dist_* fields in the summary: align the names)'
print(s)") [$((SECONDS - t_arm)) s]"
        else
            say "dist $arm rep $rep FAILED: no JSON summary in its output ($(tail -1 "$err"))"
        fi
    else
        say "dist $arm rep $rep FAILED (exit $?): $(tail -1 "$err")"
    fi
}

if ! command -v "$MPIRUN" >/dev/null; then
    say "note: no $MPIRUN (Open MPI: apt-get install openmpi-bin): dist section skipped"
elif ! has_run_flag --experts-by-rank; then
    say "note: no --experts-by-rank in 'deltafin run --help' (the MPI runtime is not built): dist section skipped"
elif [ -z "$TRACE" ] || [ ! -f "$TRACE" ]; then
    say "note: no trace at \$TRACE: dist section skipped (it runs on the replay model)"
else
    DM=$B/bench-models/replay-$(basename "$TRACE" .trace)-h$RR_HIDDEN-i$RR_MOE_I
    if prepare "$DM" --match-trace "$TRACE" --hidden "$RR_HIDDEN" --intermediate $((RR_HIDDEN * 3)) \
        --moe-intermediate "$RR_MOE_I"; then
        pack "$DM"
        read -r EB DB < <(model_bytes "$DM")
        read -r NL NE NK < <(model_shape "$DM")
        XB=$((EB / (NL * NE)))                        # one expert's bytes
        HALF=$((EB / DIST_RANKS + 2 * NK * XB))       # a rank's share + the store's transient slots
        STREAM=$((EB * DIST_FRAC / 100))
        say ""
        say "## dist: $DM routed by $TRACE; experts $((EB >> 20)) MiB, always-active $((DB >> 20)) MiB;" \
            "$DIST_RANKS ranks ($MPIRUN $MPIRUN_ARGS), arms: $DIST_ARMS; prompt $DIST_PROMPT, decode $DIST_NEW"
        for rep in $(seq "$DIST_REPS"); do
            IOBW=$(measure_iobw "$DM")
            echo "{\"section\":\"dist\",\"event\":\"iobw\",\"rep\":$rep,\"gbs\":$IOBW}" >>"$ARMS"
            ORDER=$DIST_ARMS
            # shellcheck disable=SC2086 # a list of words on purpose
            [ $((rep % 2)) = 0 ] && ORDER=$(printf '%s\n' $DIST_ARMS | tac | tr '\n' ' ')
            for arm in $ORDER; do
                fl=(--replay-routing "$TRACE" --experts "$DM-pack" --policy deltafin --prefetch off)
                case $arm in
                single-stream) dist_arm "$arm" 1 "$STREAM" "$DM" "$EB" "$IOBW" "$rep" "${fl[@]}" ;;
                single-half) dist_arm "$arm" 1 "$HALF" "$DM" "$EB" "$IOBW" "$rep" "${fl[@]}" ;;
                dist-half | dist-stream)
                    c=$HALF; [ "$arm" = dist-stream ] && c=$STREAM
                    dist_arm "$arm" "$DIST_RANKS" "$c" "$DM" "$EB" "$IOBW" "$rep" "${fl[@]}" \
                        --experts-by-rank --rank-timeout "$DIST_RANK_TIMEOUT" ;;
                *) say "note: unknown dist arm '$arm' skipped (known: single-stream single-half dist-half dist-stream)" ;;
                esac
            done
        done
    fi
fi
