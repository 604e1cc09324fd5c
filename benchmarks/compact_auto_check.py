"""auto's column model against the per-visit engine simulation: for shapes above the simulation threshold (or
near it), every policy's makespan / lower bound simulated per visit and by the column model, the simulation's
pick and the column model's pick with its simulated makespan relative to the best (CPU, minutes)::

    python benchmarks/compact_auto_check.py
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from cupy_dash import schedule  # noqa: E402
from cupy_dash.schedule import auto, compact, per_visit  # noqa: E402

SHAPES = []    # (seqlen_q, seqlen_k, block_m, block_n, heads, causal, group_size, window, num_sms)
for S in (32768, 65536):
    SHAPES += [(S, S, 64, 128, H, True, 1, (-1, -1), 132) for H in (8, 16, 32)]
    SHAPES += [(S, S, 128, 128, H, True, 1, (-1, -1), 132) for H in (16, 32)]
SHAPES += [(65536, 65536, 64, 128, 32, True, 1, (-1, -1), 114),
           (16384, 16384, 64, 128, 16, False, 1, (-1, -1), 132), (32768, 32768, 64, 128, 8, False, 1, (-1, -1), 132),
           (32768, 32768, 128, 128, 16, False, 1, (-1, -1), 132), (65536, 65536, 64, 128, 32, True, 8, (-1, -1), 132),
           (65536, 65536, 64, 128, 32, True, 4, (-1, -1), 132), (65536, 65536, 64, 128, 16, True, 1, (8192, 0), 132),
           (65536, 65536, 128, 128, 32, False, 1, (4096, 4096), 132),
           (32768, 65536, 64, 128, 16, True, 1, (-1, -1), 132), (65536, 32768, 64, 128, 16, False, 1, (-1, -1), 132)]


def main():
    worst = 1.0
    for sq, sk, bm, bn, heads, causal, g, window, sms in SHAPES:
        args = per_visit._checked_args("auto", sq, sk, bm, bn, heads, causal, sms, g, window)
        sim, col = {}, {}
        for p in schedule.AUTO_CANDIDATES:
            plan = auto._build(p, *args)
            sim[p] = schedule.simulate(plan, *schedule.AUTO_COSTS, model="engine")
            bound = plan.lower_bound(*schedule.AUTO_COSTS, model="engine")
            auto._build.cache_clear()
            col[p] = compact._build_compact(p, *args).model_makespan(*schedule.AUTO_COSTS, model="engine")
        best = min(sim.values())
        sim_pick = next(p for p in schedule.AUTO_CANDIDATES if sim[p] <= best * (1 + schedule.AUTO_TOLERANCE))
        col_pick = compact.column_model_choice(*args)
        worst = max(worst, sim[col_pick] / best)
        order = ("fa3", "descending", "shift", "symmetric_shift")
        print(f"sq={sq} sk={sk} {bm}x{bn} H={heads} g={g} {'causal' if causal else 'full'} window={window} sms={sms} "
              f"visits={compact.num_visits(*args[:6], args[-1]) / 1e6:.1f}M | simulated "
              + " / ".join(f"{sim[p] / bound:.3f}" for p in order) + " | column model "
              + " / ".join(f"{col[p] / bound:.3f}" for p in order)
              + f" | simulation picks {sim_pick}, column model {col_pick} ({sim[col_pick] / best:.3f}x best)", flush=True)
    print(f"worst: the column model's pick at {worst:.3f}x the simulated best")


if __name__ == "__main__":
    main()
