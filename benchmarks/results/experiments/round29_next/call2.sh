# Next round's second call (~4 min with the start; carry .whl): NOTES items 1 and 5.
# 1) what a timeline stamp costs: level 13 at full 3840 plain, stamped, and stamped with the stores predicated off
#    (stamp_cost_no_store) or without clock reads (stamp_cost_no_clock);
# 2) ncu source pages of today's tree and of exp2_early_m80 on it, full 3840, for the segments of
#    docs/decisions/bwd-engine.md, "Where the softmax waits";
# 3) the standing of today's tree at every bench shape, one process (the second beside steady_20261206d's).
export CUPY_DASH_COMMIT=${CUPY_DASH_COMMIT:-unset} CUPY_DASH_CACHE_DIR=/tmp/dash_cache PYTHONUNBUFFERED=1
TOP=${OUT:-/root/out}; mkdir -p $TOP/stamps
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
for m in no_store no_clock e2; do
  patch=stamp_cost_$m; [ $m = e2 ] && patch=exp2_early_m80
  rm -rf .ab_$m && mkdir -p .ab_$m && cp -r kernels_src .ab_$m/
  (cd .ab_$m && patch -s -p1 < ../benchmarks/patches/$patch.patch)
done
(cd benchmarks
 timeout 60 python3 gemm_chain.py --levels 13 --real full:3840 2>&1 | tee $TOP/stamps/plain.txt | grep "cycles per"
 timeout 60 python3 gemm_chain.py --levels 13 --real full:3840 --stamps 2>&1 | tee $TOP/stamps/stamps.txt \
   | grep "cycles per"
 for m in no_store no_clock; do
   timeout 60 python3 with_kernels.py ../.ab_$m/kernels_src gemm_chain.py --levels 13 --real full:3840 --stamps 2>&1 \
     | tee $TOP/stamps/$m.txt | grep "cycles per"
 done)
(cd $TOP && tar czf stamps.tgz stamps && rm -r stamps)
OUT=$TOP/ncu NO_INSTALL=1 NCU_PROFILE_BWD=0 NCU_SHAPES="--seqlen 3840 --batch 4" NCU_IMPLS=ours_auto \
  bash benchmarks/device_run.sh ncu 2>&1 | grep -E "cycles_elapsed|inst_executed"
OUT=$TOP/ncu_e2 NO_INSTALL=1 NCU_PROFILE_BWD=0 NCU_SHAPES="--seqlen 3840 --batch 4" NCU_IMPLS=ours_auto \
  NCU_KSRC=.ab_e2/kernels_src NCU_TAG=_e2 bash benchmarks/device_run.sh ncu 2>&1 \
  | grep -E "cycles_elapsed|inst_executed"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/site timeout 150 python3 benchmarks/steady_bench.py --impls dash_det fa3_nondet --rounds 4 \
  --loop-s 0.4 --shapes full:1280 full:3840 full:15360 causal:2048 causal:8192 causal:16384 \
  --json $TOP/steady_d128_2.json 2>&1 | tail -6
rm -rf .ab_*
