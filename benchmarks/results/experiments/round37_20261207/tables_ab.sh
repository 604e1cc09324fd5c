# The timing-only A/B of a table prototype (benchmarks/with_split_tail.py LEG) against the tree's tables: one
# process each, alternating, twice; each burst_bench.py of ours deterministic beside FA3's non-deterministic
# backward on SHAPES. The reports go to $OUT/TAG.tgz (tree_<n>.json, leg_<n>.json), rewritten after every process,
# so a call cut short keeps the processes that finished; the lines they print to $OUT/log.txt.
#
#   TAG=full LEG=3 SHAPES="full:3840 full:15360" bash benchmarks/results/experiments/round37_20261207/tables_ab.sh
. benchmarks/device_env.sh
T=/tmp/tables_${TAG:?set TAG}; mkdir -p $T
args="--shapes ${SHAPES:?set SHAPES} --impls dash_det fa3_nondet --rounds 4 --tolerance 1e9"
for n in 1 2; do
  timeout 120 python3 benchmarks/burst_bench.py $args --json $T/tree_$n.json 2>&1 | tail -2 \
    | sed "s/^/$TAG tree$n /" | tee -a $O/log.txt
  (cd $T && tar czf $O/$TAG.tgz *.json)
  timeout 120 python3 benchmarks/with_split_tail.py ${LEG:?set LEG} benchmarks/burst_bench.py $args \
    --json $T/leg_$n.json 2>&1 | tail -4 | sed "s/^/$TAG leg$n /" | tee -a $O/log.txt
  (cd $T && tar czf $O/$TAG.tgz *.json)
done
