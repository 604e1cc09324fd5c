# Call 2: auto against every schedule at the six bench shapes (one process), then varlen with the tree's dK / dV
# epilogue against the old one (.ab_old: git archive 4e53eda kernels_src + benchmarks/patches/dkv_from_registers.patch).
export CUPY_DASH_COMMIT=${CUPY_DASH_COMMIT:-71500f7} OUT=${OUT:-/root/out}
python3 -m pip install --no-build-isolation --no-deps -q -e . >/tmp/i.log 2>&1
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader > $OUT/device_info.txt
timeout 240 python3 benchmarks/steady_bench.py --impls dash_det --schedules fa3 descending shift symmetric_shift \
  --rounds 5 --loop-s 0.3 --shapes full:1280 full:3840 full:15360 causal:2048 causal:8192 causal:16384 \
  --json $OUT/schedules.json --md $OUT/schedules.md > $OUT/schedules.log 2>&1; echo "schedules rc $?"
for n in 1 2; do
  for leg in tree old; do
    run=(python3); [ $leg = tree ] || run=(python3 benchmarks/with_kernels.py .ab_old/kernels_src)
    timeout 120 "${run[@]}" benchmarks/varlen_bwd.py --seqs 4 16 64 --schedules auto --repeats 20 \
      --json $OUT/varlen_${leg}_$n.json > $OUT/varlen_${leg}_$n.txt 2>&1; echo "varlen $leg $n rc $?"
  done
done
cd $OUT && tar czf varlen_ab.tgz varlen_* && rm varlen_*_?.json varlen_*_?.txt
