# Round 37, call 2 (~4.5 min with the start; carry .whl): the last wave balanced, timing only. Two processes per leg,
# alternating: the tree's tables, then benchmarks/with_split_tail.py 3 (the last partial round of full-mask columns
# cut into thirds of their Q range; its dK / dV are wrong, its time is the balance's), each burst_bench.py of ours
# deterministic beside FA3's non-deterministic backward at full 3840 / 15360. Then clock_check.py's SM idle share of
# the timeline build with the split tables. $OUT: ab.tgz, log.txt, clock_split.json. (The standing was left out:
# the session's device time ran short after four refused starts; call 1's bursts give the ratios on this card.)
export CUPY_DASH_CACHE_DIR=/tmp/dash_cache PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
O=${OUT:-/root/out}; mkdir -p /tmp/ab
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader | tee $O/log.txt
args="--shapes full:3840 full:15360 --impls dash_det fa3_nondet --rounds 4 --tolerance 1e9"
for n in 1 2; do
  timeout 100 python3 benchmarks/burst_bench.py $args --json /tmp/ab/tree_$n.json 2>&1 | tail -2 \
    | sed "s/^/tree$n /" | tee -a $O/log.txt
  timeout 100 python3 benchmarks/with_split_tail.py 3 benchmarks/burst_bench.py $args --json /tmp/ab/split_$n.json \
    2>&1 | tail -4 | sed "s/^/split$n /" | tee -a $O/log.txt
done
(cd /tmp/ab && tar czf $O/ab.tgz *)
CUPY_DASH_BWD_FULL_BLOCK_M=80 timeout 60 python3 benchmarks/with_split_tail.py 3 benchmarks/clock_check.py \
  --shapes 128:full:3840 --json $O/clock_split.json 2>&1 | tail -3 | tee -a $O/log.txt
