# Call 5: exp2_early_m80 (the 80-query plan keeps two k-slices of P^T's exp2 ahead of the dP^T wait) against the
# tree, two processes per leg beside FA3, and the bits of both builds.
export CUPY_DASH_COMMIT=${CUPY_DASH_COMMIT:-unset} OUT=${OUT:-/root/out}
AB_PATCHES=exp2_early_m80 LEGS=2 FA3_WHL=1 STEADY_ARGS="--shapes full:1280 full:3840 full:15360 causal:8192 \
causal:16384 --rounds 4 --loop-s 0.4" timeout 420 bash benchmarks/device_run.sh steady_ab > $OUT/exp2_ab.log 2>&1
echo "ab rc $?"; grep -E "^(tree|exp2)" $OUT/steady_ab.log | tail -20
timeout 60 python3 benchmarks/bits_digest.py --out /tmp/new.json > /dev/null 2>&1
timeout 60 python3 benchmarks/with_kernels.py .ab_exp2_early_m80/kernels_src benchmarks/bits_digest.py --out /tmp/old.json \
  > /dev/null 2>&1
python3 benchmarks/bits_digest.py --compare /tmp/new.json /tmp/old.json 2>&1 | tee $OUT/exp2_bits.txt
