# Round 36, call 6 (prepared for the next session, not run; ~9 min with the start; carry .whl): the standing with the
# dQ store split on whichever card comes (head dim 128: ours deterministic and atomic, FA3's two backwards; head dim
# 64; the forward; one process each, as round 30's call 2), then Nsight Compute's full set of the tree and FA3 at
# full 3840 (B 4) for the source view of the two hand-offs (stall samples at the dQ store, the bulk issue and the
# waits around them; read with benchmarks/sass_ops.py and the .sass.csv.gz pages). $OUT: call6.tgz, ncu.tgz.
export CUPY_DASH_COMMIT=${CUPY_DASH_COMMIT:-unset} CUPY_DASH_CACHE_DIR=/tmp/dash_cache PYTHONUNBUFFERED=1
TOP=/tmp/call6; mkdir -p $TOP
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,memory.total --format=csv | tee $TOP/device_info.txt
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
S6="full:1280 full:3840 full:15360 causal:2048 causal:8192 causal:16384"
PYTHONPATH=/tmp/site timeout 200 python3 benchmarks/steady_bench.py --impls dash_det fa3_nondet fa3_det dash_atomic \
  --rounds 3 --loop-s 0.4 --shapes $S6 --json $TOP/steady_d128.json 2>&1 | tail -8
PYTHONPATH=/tmp/site timeout 100 python3 benchmarks/steady_bench.py --hdim 64 --impls dash_det fa3_nondet \
  --rounds 3 --loop-s 0.3 --shapes $S6 --json $TOP/steady_d64.json 2>&1 | tail -7
PYTHONPATH=/tmp/site timeout 110 python3 benchmarks/steady_bench.py --forward --rounds 3 --loop-s 0.3 --shapes \
  causal:1024 causal:2048 causal:4096 causal:8192 causal:16384 full:1280 full:3840 full:15360 \
  --json $TOP/steady_fwd.json 2>&1 | tail -9
(cd $TOP && tar czf ${OUT:-/root/out}/call6.tgz *)
NCU_PROFILE_BWD=0 FA3_WHL=1 NCU_SHAPES="--seqlen 3840 --batch 4" timeout 200 bash benchmarks/device_run.sh ncu 2>&1 \
  | grep -E "elapsed|FA3 against|rror" | tail -6
