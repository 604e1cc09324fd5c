"""Loss-curve plot shared by the training examples (matplotlib only)."""
from __future__ import annotations


def plot(results, path, title):
    """PNG: the loss curves of every run, and the per-step |run 1 - run 2| of each attention.
    ``results``: {attention name: [run 1, run 2]}, each run a dict with a ``losses`` list."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError(f"--plot needs matplotlib: pip install matplotlib ({exc})") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    for name, runs in results.items():
        for i, r in enumerate(runs):
            a.plot(r["losses"], lw=1.2, ls="-" if i == 0 else "--", label=f"{name}, run {i + 1}")
        diff = [abs(x - y) for x, y in zip(runs[0]["losses"], runs[1]["losses"])]
        b.plot(diff, lw=1.2, label=f"{name}: |run 1 - run 2|")
    a.set_xlabel("step"), a.set_ylabel("training loss"), a.legend(fontsize=8), a.grid(alpha=0.3)
    b.set_xlabel("step"), b.set_ylabel("loss difference between the two runs"), b.legend(fontsize=8)
    b.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
