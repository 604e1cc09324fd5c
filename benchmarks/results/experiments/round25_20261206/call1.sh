export CUPY_DASH_COMMIT=93a0db9 OUT=${OUT:-/root/out}
python3 -m pip install --no-build-isolation --no-deps -q -e . >/tmp/i.log 2>&1
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader > $OUT/device_info.txt
for p in no_ds_barrier no_ds_barrier_offset; do mkdir -p .ab_$p && cp -r kernels_src docs .ab_$p/ && (cd .ab_$p && patch -s -p1 <../benchmarks/patches/$p.patch); done
for leg in tree no_ds_barrier no_ds_barrier_offset; do
  run=(python3); [ $leg = tree ] || run=(python3 benchmarks/with_kernels.py .ab_$leg/kernels_src)
  CUPY_DASH_BWD_FULL_BLOCK_M=80 CUPY_DASH_BWD_CAUSAL_BLOCK_M=80 timeout 150 "${run[@]}" benchmarks/timeline.py --shapes 128:full:3840 128:causal:8192 --policies symmetric_shift > $OUT/timeline_$leg.txt 2>&1
  echo "$leg timeline rc $?"
done
AB_PATCHES="no_ds_barrier no_ds_barrier_offset" NO_INSTALL=1 LEGS=2 FA3_WHL=1 STEADY_ARGS="--shapes full:3840 full:15360 causal:8192 causal:16384 --rounds 4 --loop-s 0.4" timeout 330 bash benchmarks/device_run.sh steady_ab > $OUT/ab.log 2>&1
echo "ab rc $?"; tail -30 $OUT/ab.log
