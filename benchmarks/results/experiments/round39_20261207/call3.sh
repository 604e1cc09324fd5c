# Round 39, call 3 (carry .whl not needed; ~7 min with the start): where `auto`'s split starts to pay, with the
# plan knob (CUPY_DASH_SPLIT_COLUMNS=0: uncut tables, =1: every table cut in thirds). Ours deterministic alone,
# burst_bench.py, three alternating rounds: head dim 128 at full 2560 (B 6) / 3072 (B 5), head dim 64 at full
# 1920 (B 8) / 2560 (B 6). $OUT: ab3.tgz (<leg>_<hdim>_<n>.json), log.txt.
. benchmarks/device_env.sh
T=/tmp/ab3; mkdir -p $T
leg() {  # leg <name> <knob> <hdim> <n> <shapes...>
  local name=$1 knob=$2 hd=$3 n=$4; shift 4
  CUPY_DASH_SPLIT_COLUMNS=$knob timeout 100 python3 benchmarks/burst_bench.py --hdim $hd --impls dash_det \
    --rounds 4 --shapes "$@" --json $T/${name}_${hd}_$n.json 2>&1 | tail -2 | sed "s/^/$name d$hd $n /" \
    | tee -a $O/log.txt
  (cd $T && tar czf $O/ab3.tgz *.json)
}
for n in 1 2 3; do
  [ $SECONDS -gt 430 ] && break
  leg whole 0 128 $n full:2560 full:3072
  leg split 1 128 $n full:2560 full:3072
  leg whole 0 64 $n full:1920 full:2560
  leg split 1 64 $n full:1920 full:2560
done
echo "call3: $SECONDS s" | tee -a $O/log.txt
