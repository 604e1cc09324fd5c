# Round 43, call 4 (carry .whl; ~6 min with the start): where causal 16k's cycles go on the merged tree, beside FA3.
# 1. clock_check.py with the 80-query plan (the idle share of the steady loop's last wave; symmetric_shift tables:
#    auto's at causal, uncut at full) at causal 16k / 8k and full 3840; 2. burst_bench.py, ours deterministic /
#    atomic and FA3's non-deterministic backward below the power limit (bursts) and at it (steady loops); 3. every
#    kernel of one backward (ours deterministic / atomic, FA3) under Nsight Compute at full 3840 and causal 16k:
#    time, elapsed and mean active SM cycles, DRAM bytes.
#    $OUT: clock_check.json, burst.json, kernels.tgz, log.txt.
. benchmarks/device_env.sh
CUPY_DASH_BWD_FULL_BLOCK_M=80 CUPY_DASH_BWD_CAUSAL_BLOCK_M=80 timeout 100 python3 benchmarks/clock_check.py \
  --shapes 128:causal:16384 128:causal:8192 128:full:3840 --json $O/clock_check.json 2>&1 | tail -4 | tee -a $O/log.txt
timeout 200 python3 benchmarks/burst_bench.py --json $O/burst.json 2>&1 | tail -6 | tee -a $O/log.txt
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | tail -1); mkdir -p /tmp/k
m=gpu__time_duration.sum,sm__cycles_elapsed.max,sm__cycles_active.avg,sm__cycles_active.max,launch__grid_size
m=$m,dram__bytes.sum
for shape in "--seqlen 3840 --batch 4" "--causal --seqlen 16384 --batch 1"; do
  tag=$(echo "$shape" | tr -d ' -' | tr -s 'a-z' | cut -c1-24)
  for impl in ours:auto ours:atomic fa3:auto; do
    n=${impl%%:*}_${impl#*:}_$tag
    timeout 100 "$ncu" --profile-from-start off --clock-control none --kernel-name-base demangled --metrics $m -f \
      -o /tmp/k/$n python3 benchmarks/ncu_bwd.py --impl ${impl%%:*} --schedule ${impl#*:} $shape > /tmp/k/$n.log 2>&1
    "$ncu" -i /tmp/k/$n.ncu-rep --page raw --csv > /tmp/k/$n.raw.csv 2>&1
    python3 benchmarks/ncu_summary.py /tmp/k/$n.raw.csv --metrics ${m//,/ } | sed "s/^/$n /" | tee -a $O/log.txt
  done
done
(cd /tmp/k && tar czf $O/kernels.tgz *.raw.csv *.log)
echo "call4: $SECONDS s" | tee -a $O/log.txt
