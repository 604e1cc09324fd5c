# The standing beside FA3 on the GPU machine (carry .whl): head dim 128 with ours deterministic and atomic and FA3's
# two backwards, head dim 64 with ours deterministic and FA3's non-deterministic one, then the forward; one process
# each, three rounds, the bench's six shapes (bf16, 16k tokens, H * D = 2048). Reports go to $TOP (default
# /tmp/standing): device_info.txt, steady_d128.json, steady_d64.json, steady_fwd.json.
#
#   CUPY_DASH_COMMIT=<local commit> [TOP=<folder>] [PARTS="d128 d64 fwd"] [D128_S=200] bash benchmarks/standing.sh
#
# PARTS: which of the three to run; D128_S: the head-dim-128 part's time limit in seconds.
export CUPY_DASH_COMMIT=${CUPY_DASH_COMMIT:-unset}
. benchmarks/device_env.sh
TOP=${TOP:-/tmp/standing}; mkdir -p $TOP
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,memory.total --format=csv > $TOP/device_info.txt
PARTS=" ${PARTS:-d128 d64 fwd} "
S6="full:1280 full:3840 full:15360 causal:2048 causal:8192 causal:16384"
[[ $PARTS == *" d128 "* ]] && timeout ${D128_S:-200} python3 benchmarks/steady_bench.py --impls dash_det fa3_nondet \
  fa3_det dash_atomic --rounds 3 --loop-s 0.4 --shapes $S6 --json $TOP/steady_d128.json 2>&1 | tail -8
[[ $PARTS == *" d64 "* ]] && timeout 100 python3 benchmarks/steady_bench.py --hdim 64 --impls dash_det fa3_nondet \
  --rounds 3 --loop-s 0.3 --shapes $S6 --json $TOP/steady_d64.json 2>&1 | tail -7
[[ $PARTS == *" fwd "* ]] && timeout 110 python3 benchmarks/steady_bench.py --forward --rounds 3 --loop-s 0.3 \
  --shapes causal:1024 causal:2048 causal:4096 causal:8192 causal:16384 full:1280 full:3840 full:15360 \
  --json $TOP/steady_fwd.json 2>&1 | tail -9
exit 0
