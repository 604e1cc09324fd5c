# Next round's first call (~5 min with the start; carry .whl): NOTES item 2's candidates beside FA3.
# 1) lse_early6 and dpsum_early4 against the tree at the 80-query tile's shapes; 2) lse_early_m64 at the 64-query
# tile's (causal below 8192 queries). Two processes per leg, ours deterministic beside FA3's non-deterministic
# backward. Each stage's files go to their own folder under $OUT. Predictions: benchmarks/NOTES.md, item 2.
export CUPY_DASH_COMMIT=${CUPY_DASH_COMMIT:-unset} FA3_WHL=1 LEGS=2
TOP=${OUT:-/root/out}
OUT=$TOP/m80 AB_PATCHES="lse_early6 dpsum_early4" \
  STEADY_ARGS="--shapes full:3840 full:15360 causal:8192 --rounds 4 --loop-s 0.4" \
  bash benchmarks/device_run.sh steady_ab 2>&1 | tail -20
OUT=$TOP/m64 NO_INSTALL=1 AB_PATCHES="lse_early_m64" \
  STEADY_ARGS="--shapes causal:2048 causal:4096 --rounds 4 --loop-s 0.4" \
  bash benchmarks/device_run.sh steady_ab 2>&1 | tail -10
rm -rf .ab_*
