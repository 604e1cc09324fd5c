# Round 39, call 4 (~4 min with the start): where `auto`'s split starts to pay, with the
# plan knob (CUPY_DASH_SPLIT_COLUMNS=0: uncut tables, =1: every table cut in thirds). Ours deterministic alone,
# burst_bench.py, three alternating rounds: head dim 64 at full 1280 (B 12) / 1536 (B 10), below call 3's
# lengths. $OUT: ab4.tgz (<leg>_<hdim>_<n>.json), log.txt.
. benchmarks/device_env.sh
T=/tmp/ab4; mkdir -p $T
leg() {  # leg <name> <knob> <hdim> <n> <shapes...>
  local name=$1 knob=$2 hd=$3 n=$4; shift 4
  CUPY_DASH_SPLIT_COLUMNS=$knob timeout 100 python3 benchmarks/burst_bench.py --hdim $hd --impls dash_det \
    --rounds 4 --shapes "$@" --json $T/${name}_${hd}_$n.json 2>&1 | tail -2 | sed "s/^/$name d$hd $n /" \
    | tee -a $O/log.txt
  (cd $T && tar czf $O/ab4.tgz *.json)
}
for n in 1 2 3; do
  [ $SECONDS -gt 430 ] && break
  leg whole 0 64 $n full:1280 full:1536
  leg split 1 64 $n full:1280 full:1536
done
echo "call4: $SECONDS s" | tee -a $O/log.txt
