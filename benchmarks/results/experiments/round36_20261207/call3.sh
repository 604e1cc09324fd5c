# Round 36, call 3 (~12 min with the start; carry .whl): what the merged dQ store split gives in time, and its checks.
# 1. steady_ab: the tree against dq_store_burst (patches/: the reverse of the merge, i.e. eaf65ba's kernels), three
#    processes per leg alternating, ours deterministic and atomic beside FA3's non-deterministic backward in each,
#    head dim 128 at full 3840 / 15360 and causal 2k / 8k / 16k (the shapes where the target is missed).
# 2. head dim 64 beside FA3 (the split applies there too), one process.
# 3. compute-sanitizer over every kernel family (device_run.sh sanitize), then the backward's GPU tests.
# $OUT: steady_ab.tgz, steady_ab.log, steady_d64.json, sanitize_*.log (tarred), tests.log.
export CUPY_DASH_CACHE_DIR=/tmp/dash_cache PYTHONUNBUFFERED=1
R=benchmarks/results/experiments/round36_20261207
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv | tee $OUT/device_info.txt
AB_PATCH_DIR=$R/patches AB_PATCHES=dq_store_burst LEGS=3 FA3_WHL=1 STEADY_IMPLS="dash_det fa3_nondet dash_atomic" \
  STEADY_ARGS="--rounds 3 --loop-s 0.3 --shapes full:3840 full:15360 causal:2048 causal:8192 causal:16384" \
  bash benchmarks/device_run.sh steady_ab 2>&1 | grep -v "^tar" | tail -3
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/site timeout 100 python3 benchmarks/steady_bench.py --hdim 64 --impls dash_det fa3_nondet \
  --rounds 3 --loop-s 0.3 --shapes full:1280 full:3840 full:15360 causal:2048 causal:8192 causal:16384 \
  --json $OUT/steady_d64.json 2>&1 | tail -7
mkdir -p /tmp/san && OUT=/tmp/san bash benchmarks/device_run.sh sanitize 2>&1 | grep -E "ERROR SUMMARY|rror" \
  | head -12
(cd /tmp/san && tar czf $OUT/sanitize.tgz *.log)
timeout -s INT -k 20 240 python3 -m pytest tests/gpu/test_gpu_attention.py tests/gpu/test_gpu_gqa.py \
  tests/gpu/test_gpu_softcap.py tests/gpu/test_gpu_compact.py tests/gpu/test_gpu_window.py -q -ra --maxfail=5 \
  -p no:cacheprovider 2>&1 | tee $OUT/tests.log | tail -4
