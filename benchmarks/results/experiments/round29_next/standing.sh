# The full standing of today's tree on whichever card comes (~6 min with the start; carry .whl): head dim 128
# (ours deterministic and atomic, FA3 both), head dim 64 and the forward, one process each, as
# benchmarks/results/steady_20261205/ (the README's table) measured them. Every file lands under $OUT.
export CUPY_DASH_COMMIT=${CUPY_DASH_COMMIT:-unset} CUPY_DASH_CACHE_DIR=/tmp/dash_cache PYTHONUNBUFFERED=1
TOP=${OUT:-/root/out}; mkdir -p $TOP
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,memory.total --format=csv > $TOP/device_info.txt
cat $TOP/device_info.txt
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
python3 -m cupy_dash compile --all -j 16 2>&1 | tail -1
S6="full:1280 full:3840 full:15360 causal:2048 causal:8192 causal:16384"
PYTHONPATH=/tmp/site timeout 240 python3 benchmarks/steady_bench.py --impls dash_det fa3_nondet fa3_det dash_atomic \
  --rounds 4 --loop-s 0.5 --shapes $S6 --json $TOP/steady_d128.json 2>&1 | tail -8
PYTHONPATH=/tmp/site timeout 120 python3 benchmarks/steady_bench.py --hdim 64 --impls dash_det fa3_nondet \
  --rounds 3 --loop-s 0.4 --shapes $S6 --json $TOP/steady_d64.json 2>&1 | tail -7
PYTHONPATH=/tmp/site timeout 150 python3 benchmarks/steady_bench.py --forward --rounds 3 --loop-s 0.4 --shapes \
  causal:1024 causal:2048 causal:4096 causal:8192 causal:16384 full:1280 full:3840 full:15360 \
  --json $TOP/steady_fwd.json 2>&1 | tail -9
