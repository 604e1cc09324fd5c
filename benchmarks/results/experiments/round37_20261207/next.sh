# The next session's first GPU call (carry .whl; one start instead of three, since refused starts cost device time;
# ~8-9.5 min of command, kept under the 10-minute limit): call 2b (full masks in thirds), call 3 (causal trimmed),
# the timeline build's SM idle share with the thirds' tables (clock_check.py), then, in the time left, the
# head-dim-128 standing (benchmarks/standing.sh's first part). The first process compiles the kernels (a fresh
# machine). $OUT: full.tgz, causal.tgz, clock_split.json, device_info.txt, steady_d128.json, log.txt.
R=benchmarks/results/experiments/round37_20261207
bash $R/call2b.sh
bash $R/call3.sh
. benchmarks/device_env.sh
CUPY_DASH_BWD_FULL_BLOCK_M=80 timeout 40 python3 benchmarks/with_split_tail.py 3 benchmarks/clock_check.py \
  --rounds 1 --shapes 128:full:3840 --json $O/clock_split.json 2>&1 | tail -2 | tee -a $O/log.txt
left=$((570 - SECONDS))
[ $left -gt 90 ] && TOP=$O PARTS=d128 D128_S=$left bash benchmarks/standing.sh 2>&1 | tee -a $O/log.txt
echo "next.sh: $SECONDS s" | tee -a $O/log.txt
