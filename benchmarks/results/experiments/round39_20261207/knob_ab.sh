# Run by call3.sh and call4.sh: the A/B of the split's plan knob, CUPY_DASH_SPLIT_COLUMNS=0 (uncut tables, leg
# "whole") against =1 (every table cut in thirds, leg "split"), three alternating rounds of burst_bench.py (ours
# deterministic alone, four rounds each).
#   bash knob_ab.sh <folder under /tmp> <tgz> "<hdim> <shapes...>" ["<hdim> <shapes...>" ...]
# $OUT: <tgz> (<leg>_<hdim>_<round>.json), log.txt.
. benchmarks/device_env.sh
T=/tmp/$1 TGZ=$2; shift 2; mkdir -p $T
groups=("$@")
leg() {  # leg <name> <knob> <hdim> <round> <shapes...>
  local name=$1 knob=$2 hd=$3 n=$4; shift 4
  CUPY_DASH_SPLIT_COLUMNS=$knob timeout 100 python3 benchmarks/burst_bench.py --hdim $hd --impls dash_det \
    --rounds 4 --shapes "$@" --json $T/${name}_${hd}_$n.json 2>&1 | tail -2 | sed "s/^/$name d$hd $n /" \
    | tee -a $O/log.txt
  (cd $T && tar czf $O/$TGZ *.json)
}
for n in 1 2 3; do
  [ $SECONDS -gt 430 ] && break
  for group in "${groups[@]}"; do
    read -r hd shapes <<< "$group"
    leg whole 0 $hd $n $shapes
    leg split 1 $hd $n $shapes
  done
done
