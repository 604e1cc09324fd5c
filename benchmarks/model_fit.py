"""Fits the engine model's reduction cost r (in units of a visit's compute c) and its number of dQ writers to a
benchmark report that measured several schedules: for every configuration and schedule the model's makespan
ratio to the best schedule's against the measured time ratio, and the rms of their log over all of them, per
(writers, r). ``auto`` picks by this model (cupy_dash/schedule/per_visit.py, AUTO_COSTS = (c, r)); re-fit it after a
kernel change that moves the reduction's cost (docs/schedules.md, "Calibration"). No GPU needed.

    python benchmarks/model_fit.py benchmarks/results/<report>.json [more.json] [--r 0.4 0.8 1.2] [--writers 1 2]
"""
from __future__ import annotations

import argparse
import json
import math
import sys

POLICIES = ("fa3", "descending", "shift", "symmetric_shift")


def measured_times(report: dict) -> list:
    """[(config, {policy: relative time})] for every configuration with at least two measured schedules."""
    out = []
    for cfg in report["configs"]:
        times = {p: 1.0 / cfg["results"][f"dash_bwd_{p}"]["tflops"] for p in POLICIES
                 if "tflops" in cfg["results"].get(f"dash_bwd_{p}", {})}
        if len(times) >= 2:
            out.append((cfg, times))
    return out


def model_times(cfg: dict, sms: int, r: float, writers: int) -> dict:
    """{policy: makespan} of the engine model for one configuration (c = 1)."""
    from cupy_dash import schedule
    from cupy_dash.cuda import kernels
    tile = kernels.bwd_tile(cfg["hdim"], cfg["causal"])
    group = cfg["heads"] // cfg.get("heads_kv", cfg["heads"])
    out = {}
    for policy in POLICIES:
        plan = schedule.build(policy, seqlen_q=cfg["seqlen"], seqlen_k=cfg["seqlen"], block_m=tile.block_m,
                              block_n=tile.block_n, num_heads=cfg["batch"] * cfg["heads"], causal=cfg["causal"],
                              num_sms=sms, group_size=group)
        out[policy] = schedule.simulate(plan, c=1.0, r=r, model="engine", writers=writers)
    return out


def fit(measured: list, sms: int, rs, writers_choices) -> list:
    """[(rms log error, writers, r, worst (config id, policy, predicted ratio, measured ratio))], best first."""
    rows = []
    for writers in writers_choices:
        for r in rs:
            errors, worst = [], None
            for cfg, times in measured:
                model = model_times(cfg, sms, r, writers)
                best_t, best_m = min(times.values()), min(model[p] for p in times)
                for policy, t in times.items():
                    pred, meas = model[policy] / best_m, t / best_t
                    e = math.log(pred / meas)
                    errors.append(e * e)
                    tag = f"d{cfg['hdim']}-{'causal' if cfg['causal'] else 'full'}-{cfg['seqlen']}"
                    if worst is None or abs(e) > abs(math.log(worst[2] / worst[3])):
                        worst = (tag, policy, pred, meas)
            rows.append((math.sqrt(sum(errors) / len(errors)), writers, r, worst))
    return sorted(rows, key=lambda row: row[0])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", help="bench.py JSON reports that measured several schedules")
    ap.add_argument("--r", nargs="+", type=float, default=[0.25, 0.5, 0.8, 1.0, 1.25, 1.5, 2.0],
                    help="reduction costs to try, in units of c (default 0.25 .. 2)")
    ap.add_argument("--writers", nargs="+", type=int, default=[1, 2], choices=(1, 2))
    args = ap.parse_args(argv)
    measured, sms = [], None
    for path in args.reports:
        with open(path) as f:
            report = json.load(f)
        sms = sms or int(report["meta"].get("sms") or 132)
        measured += measured_times(report)
    if not measured:
        print("no configuration with two or more measured schedules", file=sys.stderr)
        return 1
    print(f"{len(measured)} configurations, {sum(len(t) for _, t in measured)} schedule times, {sms} CTAs")
    print("rms log error  writers  r     worst (config, schedule: predicted / measured ratio to the best)")
    for rms, writers, r, (tag, policy, pred, meas) in fit(measured, sms, args.r, args.writers):
        print(f"{rms:12.3f}  {writers:7d}  {r:4.2f}  {tag} {policy}: {pred:.2f} / {meas:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
