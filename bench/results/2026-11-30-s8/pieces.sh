#!/bin/bash
cd /work/main
P16=$(cat /tmp/p16)
run() { # name env prefetch depth extra
  cp /tmp/demo.heat build/demo-pack/experts.heat; sync; echo 3 > /proc/sys/vm/drop_caches
  r=$(env $2 /tmp/wt/build/deltafin run --model models/demo-moe --experts build/demo-pack --expert-cache 6M --sim-disk 0.6 --prompt-tokens $P16 --max-new ${NEW:-400} --temp 0 --print-ids --teacher-force 7 --prefetch $3 --prefetch-depth $4 $5 --stats 2>&1 >/dev/null)
  echo "$1 $3 depth $4 $(echo "$r" | grep -o '([0-9.]* tok/s)' | tail -1) $(echo "$r" | grep -o 'achieved [0-9.]*') $(echo "$r" | grep -o '[0-9.]* MB wasted' | head -1) $(echo "$r" | grep -o 'gate [a-z]* [0-9.]*x' | head -1)"
}
for i in $(seq ${REPS:-3}); do
  run base "X=1" off 1
  for cfg in ${CFGS:-"256:2" "32:1" "16:2" "8:2"}; do
    ck=${cfg%:*}; inf=${cfg#*:}
    for arm in ${ARMS:-"router:1" "router:2" "on:1" "on:2"}; do
      run "c${ck}k-i$inf" "PF_CHUNK_K=$ck PF_INFLIGHT=$inf" ${arm%:*} ${arm#*:}
    done
  done
done
cp /tmp/demo.heat build/demo-pack/experts.heat
