# The checks before lse_early6 stays merged (~6 min with the start; carry .whl): the backward's GPU files and the
# timeline's, the sanitizers, then the standing at every bench shape, one process. Every file lands under $OUT.
export CUPY_DASH_COMMIT=${CUPY_DASH_COMMIT:-unset} PYTHONUNBUFFERED=1 CUPY_DASH_CACHE_DIR=/tmp/dash_cache
TOP=${OUT:-/root/out}; mkdir -p $TOP
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,memory.total --format=csv | tee $TOP/device_info.txt
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
timeout 200 python3 -m pytest tests/gpu/test_gpu_{attention,gqa,compact,varlen_bwd,fold,window,portable,softcap,timeline}.py \
  -q -n 15 -p no:cacheprovider 2>&1 | tail -4 | tee $TOP/engine_tests.log
mkdir -p /tmp/san && OUT=/tmp/san NO_INSTALL=1 bash benchmarks/device_run.sh sanitize 2>&1 \
  | grep -E 'ERROR SUMMARY|hazard' | head -12
(cd /tmp && tar czf $TOP/sanitize.tgz san)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/site timeout 90 python3 benchmarks/steady_bench.py --impls dash_det fa3_nondet --rounds 3 \
  --loop-s 0.3 --shapes full:1280 full:3840 full:15360 causal:2048 causal:8192 causal:16384 \
  --json $TOP/steady_d128_1.json 2>&1 | tail -6
