"""benchmarks/ncu_legs.sh's legs per visit: SM-active and elapsed cycles, tensor-pipe active cycles and instructions
per visit, from the Nsight Compute raw pages in an extracted ncu_cuts.tgz (names <impl>[_<leg>]_<shape tag>.raw.csv),
and the SM-active Mcycles per SM of the call (shapes full 3840, B 4, and causal 8192, B 2). Visits are counted on
ours' 80 x 128 tile; FA3's causal kernel takes 64 x 128 tiles, so compare its causal row by the call's Mcycles, not
per visit.

    python benchmarks/read_cuts.py <folder>
"""
import glob
import os
import sys

from ncu_summary import _number, read_raw


def visits(tag: str) -> int:
    """Tile visits of the bench shape: full 3840 (B 4) or causal 8192 (B 2), 16 heads, 80 x 128 tiles."""
    if tag.startswith("causal"):
        m_blocks = -(-8192 // 80)
        return 2 * 16 * sum(m_blocks - (128 * n) // 80 for n in range(8192 // 128))
    return 4 * 16 * (3840 // 128) * (3840 // 80)


def value(raw: dict, name: str):
    return _number(raw[name][1]) if name in raw else None


def main():
    rows = []
    for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.raw.csv"))):
        name = os.path.basename(path)[:-len(".raw.csv")]
        tag = name.rsplit("_", 1)[1]
        raw, per_sm = read_raw(path), visits(tag) / 132
        pct, elapsed_avg = (value(raw, m) for m in ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
                                                    "sm__cycles_elapsed.avg"))
        # tensor-pipe cycles as the share of the elapsed cycles: the raw sm__pipe_tensor_cycles_active counter sums
        # the SM's four tensor sub-pipes (4x the SM's cycles)
        tensor = pct / 100 * elapsed_avg if pct is not None and elapsed_avg is not None else None
        cells = [value(raw, "sm__cycles_active.avg"), value(raw, "sm__cycles_elapsed.max"), tensor]
        inst = value(raw, "smsp__inst_executed.sum")
        rows.append((tag, name, *(c / per_sm if c else float("nan") for c in cells),
                     inst / visits(tag) if inst else float("nan"), (cells[0] or float("nan")) / 1e6))
    print(f"{'leg':44s} {'active':>7s} {'elapsed':>8s} {'tensor':>7s} {'inst':>7s}   (per visit)  active Mcycles")
    for _, name, active, elapsed, tensor, inst, mcycles in sorted(rows):
        print(f"{name:44s} {active:7.0f} {elapsed:8.0f} {tensor:7.0f} {inst:7.0f}   {mcycles:17.3f}")


if __name__ == "__main__":
    main()
