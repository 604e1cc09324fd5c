# Round 37, call 1 (~7 min with the start; carry .whl): what sets ours' time against FA3's at the power limit.
# 1. clock_check.py with a cold probe (one call after 1.5 idle s: %clock64 should read clocks.max.sm if it counts
#    SM cycles) and the steady loop's SM idle share; 2. burst_bench.py: ours deterministic / atomic and FA3's
#    non-deterministic backward below the limit (bursts after idle) and at it (steady loops), four long shapes;
# 3. every kernel of one backward (ours deterministic / atomic, FA3) under Nsight Compute, time and cycles: the
#    pre- and postprocess beside the main kernels. $OUT: clock_check.json, burst.json, kernels.tgz, log.txt,
#    smi.csv (nvidia-smi every 100 ms through the call, with the active clock-event reasons' bit mask).
. benchmarks/device_env.sh
f=clocks_event_reasons.active; nvidia-smi --query-gpu=$f --format=csv > /dev/null 2>&1 || f=clocks_throttle_reasons.active
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,$f \
  --format=csv,noheader -lms 100 > $O/smi.csv 2>&1 &   # the throttle reasons beside the clock, the whole call
CUPY_DASH_BWD_FULL_BLOCK_M=80 CUPY_DASH_BWD_CAUSAL_BLOCK_M=80 timeout 100 python3 benchmarks/clock_check.py \
  --cold-s 1.5 --shapes 128:full:3840 128:causal:8192 --json $O/clock_check.json 2>&1 | tail -6 | tee -a $O/log.txt
timeout 240 python3 benchmarks/burst_bench.py --json $O/burst.json 2>&1 | tail -6 | tee -a $O/log.txt
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | tail -1); mkdir -p /tmp/k
m=gpu__time_duration.sum,sm__cycles_elapsed.max,sm__cycles_active.avg,launch__grid_size,dram__bytes.sum
for shape in "--seqlen 3840 --batch 4" "--causal --seqlen 8192 --batch 2"; do
  tag=$(echo "$shape" | tr -d ' -' | tr -s 'a-z' | cut -c1-24)
  for impl in ours:auto ours:atomic fa3:auto; do
    n=${impl%%:*}_${impl#*:}_$tag
    timeout 100 "$ncu" --profile-from-start off --clock-control none --metrics $m -f -o /tmp/k/$n \
      python3 benchmarks/ncu_bwd.py --impl ${impl%%:*} --schedule ${impl#*:} $shape > /tmp/k/$n.log 2>&1
    "$ncu" -i /tmp/k/$n.ncu-rep --page raw --csv > /tmp/k/$n.raw.csv 2>&1
    python3 - /tmp/k/$n.raw.csv <<'PY' | sed "s/^/$n /" | tee -a $O/log.txt
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
h = rows[0]
for r in rows[2:]:
    d = dict(zip(h, r))
    print(d.get("Kernel Name", "?")[:48], "us", d.get("gpu__time_duration.sum"), "cyc", d.get("sm__cycles_elapsed.max"),
          "grid", d.get("launch__grid_size"), "dramMB", d.get("dram__bytes.sum"))
PY
  done
done
(cd /tmp/k && tar czf $O/kernels.tgz *.raw.csv *.log)
kill %1
