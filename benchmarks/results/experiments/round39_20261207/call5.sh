# Round 39, call 5 (~4 min with the start): sixths against thirds at head dim 64's long full masks, with the plan
# knob CUPY_DASH_SPLIT_PIECES (unset: thirds, `auto`'s; 6: sixths). Ours deterministic alone, burst_bench.py, three
# alternating rounds at full 3840 (B 4) / 15360 (B 1). $OUT: ab5.tgz (<leg>_64_<n>.json), log.txt.
. benchmarks/device_env.sh
T=/tmp/ab5; mkdir -p $T
leg() {  # leg <name> <pieces or -> <n>
  local name=$1 pieces=$2 n=$3
  if [ "$pieces" = - ]; then unset CUPY_DASH_SPLIT_PIECES; else export CUPY_DASH_SPLIT_PIECES=$pieces; fi
  timeout 100 python3 benchmarks/burst_bench.py --hdim 64 --impls dash_det --rounds 4 --shapes full:3840 \
    full:15360 --json $T/${name}_64_$n.json 2>&1 | tail -2 | sed "s/^/$name d64 $n /" | tee -a $O/log.txt
  (cd $T && tar czf $O/ab5.tgz *.json)
}
for n in 1 2 3; do
  [ $SECONDS -gt 300 ] && break
  leg thirds - $n
  leg sixths 6 $n
done
echo "call5: $SECONDS s" | tee -a $O/log.txt
