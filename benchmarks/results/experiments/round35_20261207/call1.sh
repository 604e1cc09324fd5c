# Round 35, call 1 (~4 min with the start): the per-visit timeline (kernels_src/bwd/timeline.cuh's stamps) at full
# 3840 with the 80-query tile, symmetric_shift, of the tree and three patched copies: cut_exp2 (no ex2, timing only;
# round 31), cut_exp2_wg0 (MMA warpgroup 0 takes no ex2, timing only) and exp2_early_both (every ex2 held ahead of
# the dP^T wait; both round 34). Which phase each one moves, and how the GEMM completion order changes: why holding
# the ex2 early is slower when removing them reaches FA3's cycles. Everything lands in $OUT/timelines.tgz.
export CUPY_DASH_CACHE_DIR=/tmp/dash_cache PYTHONUNBUFFERED=1
TOP=/tmp/tl; mkdir -p $TOP
R=benchmarks/results/experiments
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $TOP/device_info.txt
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
declare -A P=([cut_exp2]=$R/round31_20261206/patches [cut_exp2_wg0]=$R/round34_20261207/patches
              [exp2_early_both]=$R/round34_20261207/patches)
run() {  # leg kernels_src
  (cd benchmarks && CUPY_DASH_BWD_FULL_BLOCK_M=80 timeout 70 python3 with_kernels.py $2 timeline.py \
    --shapes 128:full:3840 --policies symmetric_shift > $TOP/timeline_$1.txt 2>&1)
  grep -E "^d128|P\^T, dP|dS\^T|dQ|done|orders|CTA cycles" $TOP/timeline_$1.txt | head -12
  (cd $TOP && tar czf ${OUT:-/root/out}/timelines.tgz *)
}
run tree $PWD/kernels_src
for leg in exp2_early_both cut_exp2 cut_exp2_wg0; do
  mkdir -p /tmp/legs/$leg && cp -r kernels_src /tmp/legs/$leg/ &&
    patch -s -d /tmp/legs/$leg -p1 < ${P[$leg]}/$leg.patch
  run $leg /tmp/legs/$leg/kernels_src
done
