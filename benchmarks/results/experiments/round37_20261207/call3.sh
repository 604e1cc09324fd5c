# Round 37, call 3 (prepared for the next session; carry .whl; ~3 min with the start): the causal last wave,
# timing only. The tree's tables and benchmarks/with_split_tail.py trim (each CTA's list cut at the mean load, the
# cut remainders to the least-loaded CTAs; its dK / dV are wrong), one process each, alternating, burst_bench.py of
# ours deterministic beside FA3's non-deterministic backward at causal 8k / 16k. $OUT: tree_<n>.json,
# trim_<n>.json, log.txt.
export CUPY_DASH_CACHE_DIR=/tmp/dash_cache PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
O=${OUT:-/root/out}
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader | tee $O/log.txt
args="--shapes causal:8192 causal:16384 --impls dash_det fa3_nondet --rounds 4 --tolerance 1e9"
for n in 1 2; do
  timeout 60 python3 benchmarks/burst_bench.py $args --json $O/tree_$n.json 2>&1 | tail -2 | sed "s/^/tree$n /" \
    | tee -a $O/log.txt
  timeout 60 python3 benchmarks/with_split_tail.py trim benchmarks/burst_bench.py $args --json $O/trim_$n.json 2>&1 \
    | tail -4 | sed "s/^/trim$n /" | tee -a $O/log.txt
done
