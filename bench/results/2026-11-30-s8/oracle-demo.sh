#!/bin/bash
# Session 8: what perfect expert prediction would be worth on the trained demo model.
# Needs a temporary build with oracle-demo.patch applied (git apply; make build/deltafin)
# at $WT (default /tmp/wt), and a routing trace of the demo's own teacher-forced run:
#   DF_DUMP_ROUTE=/tmp/demo-tf.trace $WT/build/deltafin run --model models/demo-moe \
#     --experts build/demo-pack --expert-cache 6M --prompt-tokens $(cat /tmp/p16) \
#     --max-new 400 --temp 0 --print-ids --teacher-force 7 --prefetch off
# Replaying that trace (--replay-routing) gives the model's own routing (same ids, same
# output, checked with cmp), so an arm's reads are those of a plain run; ORACLE=1 makes
# the lookahead the replayed routing of the target layer (perfect prediction inside a
# token), ORACLE=2 also predicts the next token's first layer at the end of each step.
# /tmp/p16: the 16-token prompt of bench/prefetch.sh (ids from random.Random(4)).
cd "$(dirname "$0")/../../.."
WT=${WT:-/tmp/wt}
P16=$(cat /tmp/p16)
HEAT=/tmp/demo.heat   # a copy of build/demo-pack/experts.heat, restored before every run
run() { # name env prefetch depth
  cp $HEAT build/demo-pack/experts.heat; sync; echo 3 > /proc/sys/vm/drop_caches
  r=$(env $2 $WT/build/deltafin run --model models/demo-moe --experts build/demo-pack --expert-cache 6M --sim-disk 0.6 --prompt-tokens $P16 --max-new 400 --temp 0 --print-ids --teacher-force 7 --prefetch $3 --prefetch-depth $4 --replay-routing /tmp/demo-tf.trace --stats 2>&1 >/dev/null)
  echo "$1 depth $4 $(echo "$r" | grep -o '([0-9.]* tok/s)' | tail -1) $(echo "$r" | grep -o 'achieved [0-9.]*') $(echo "$r" | grep -o '[0-9.]* MB wasted' | head -1) $(echo "$r" | grep -o 'gate [a-z]* [0-9.]*x' | head -1)"
}
for i in $(seq ${REPS:-5}); do
  run off ORACLE=0 off 1
  run on ORACLE=0 on 1
  run on ORACLE=0 on 2
  run router ORACLE=0 router 1
  run oracle-within ORACLE=1 router 1
  run oracle-within ORACLE=1 router 2
  run oracle-within+next ORACLE=2 router 2
done
cp $HEAT build/demo-pack/experts.heat
