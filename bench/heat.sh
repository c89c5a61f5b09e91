# bench/heat.sh - sourced by bench/prefetch.sh and bench/spec.sh: keeps the expert
# packs' heat files (the cache policy's persisted prior, which every run rewrites)
# as they were when the script started, so that every run starts from the same prior
# and the packs are left as they were found. Without it the demo model's numbers
# moved from batch to batch (docs/benchmarks.md).
#   heat_keep DIR PACK...   copy each pack's experts.heat into DIR (a scratch directory)
#   heat_reset              put them back (a pack that had none is left with none)
HEAT_DIR=
HEAT_PACKS=()
heat_keep() {
    HEAT_DIR=$1
    shift
    HEAT_PACKS=("$@")
    local i
    for i in "${!HEAT_PACKS[@]}"; do
        if [ -f "${HEAT_PACKS[$i]}/experts.heat" ]; then
            cp "${HEAT_PACKS[$i]}/experts.heat" "$HEAT_DIR/heat-$i"
        fi
    done
}
heat_reset() {
    local i
    for i in "${!HEAT_PACKS[@]}"; do
        if [ -f "$HEAT_DIR/heat-$i" ]; then
            cp "$HEAT_DIR/heat-$i" "${HEAT_PACKS[$i]}/experts.heat"
        else
            rm -f "${HEAT_PACKS[$i]}/experts.heat"
        fi
    done
}
