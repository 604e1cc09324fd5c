"""Summarise a steady_ab run (``bash benchmarks/device_run.sh steady_ab``): per shape and leg, the medians over every
round of every process of ms per call, Mcycles per call and SM clock for each implementation, and the median over
rounds of FA3's time over ours deterministic (speed relative to FA3's non-deterministic backward, same round).

    python benchmarks/steady_ab_summary.py <folder of <leg>_<n>.json reports, or steady_ab.tgz>
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import tarfile
import tempfile

IMPLS = ("dash_det", "dash_atomic", "fa3_nondet", "fa3_det")


def load(folder: pathlib.Path) -> dict:
    """{(leg, shape name, impl): [loop records]} from every <leg>_<n>.json in folder."""
    loops = {}
    for path in sorted(folder.glob("*.json")):
        leg = path.stem.rsplit("_", 1)[0]
        for shape in json.loads(path.read_text())["shapes"]:
            for impl, records in shape["loops"].items():
                loops.setdefault((leg, shape["shape"]["name"], impl), []).extend(records)
    return loops


def summary(loops: dict) -> list:
    """One line per (shape, leg), shapes in the order first seen."""
    shapes = list(dict.fromkeys(k[1] for k in loops))
    legs = sorted({k[0] for k in loops})
    lines = ["median ms (Mcycles, MHz) over every round of every process; vs FA3: FA3 ms / ours deterministic ms "
             "per round, median"]
    for name in shapes:
        for leg in legs:
            cells = []
            for impl in IMPLS:
                records = loops.get((leg, name, impl))
                if records:
                    med = {k: statistics.median(r[k] for r in records) for k in ("ms", "mcycles", "sm_mhz")}
                    cells.append(f"{impl} {med['ms']:.4f} ({med['mcycles']:.3f}, {med['sm_mhz']:.0f})")
            det, fa3 = loops.get((leg, name, "dash_det")), loops.get((leg, name, "fa3_nondet"))
            if det and fa3:
                cells.append(f"vs FA3 {statistics.median(f['ms'] / d['ms'] for d, f in zip(det, fa3)):.3f}")
            if cells:
                lines.append(f"{name:13s} {leg:16s} " + " | ".join(cells))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("source", help="a folder of steady_bench reports or the steady_ab.tgz holding them")
    src = pathlib.Path(ap.parse_args().source)
    if src.is_dir():
        print("\n".join(summary(load(src))))
        return
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(src) as tar:
        tar.extractall(tmp, filter="data")
        print("\n".join(summary(load(pathlib.Path(tmp)))))


if __name__ == "__main__":
    main()
