"""What spread_shift.py and half_waves.py share: swapping ``compact._build_compact`` for a wrapper of it (every
table built afterwards in the process, per-visit tables included, comes from the wrapper's records), and running a
script or module with the swap in place."""
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[3]


def swap(flag: str, wrapper) -> None:
    """Replace ``compact._build_compact`` by ``wrapper(it)`` once per process (``flag`` marks it) and clear the
    caches of the tables built before."""
    from cupy_dash.schedule import auto, compact
    if not getattr(compact._build_compact, flag, False):
        compact._build_compact = wrapper(compact._build_compact)
        setattr(compact._build_compact, flag, True)
        auto._build.cache_clear()
        auto._auto_choice.cache_clear()


def plugin(flag: str, wrapper) -> tuple:
    """``(apply, pytest_configure)`` of a plugin module: ``apply()`` swaps in ``wrapper`` (:func:`swap`), and the
    hook applies it in every pytest process (``-p MODULE``; xdist's workers load the plugin too)."""
    def apply() -> None:
        swap(flag, wrapper)

    def pytest_configure(config) -> None:
        apply()
    return apply, pytest_configure


def main(doc: str, apply) -> None:
    """``python PLUGIN.py SCRIPT|MODULE ARGS...``: ``apply()``, then run the target as with_kernels.py does."""
    if len(sys.argv) < 2:
        sys.exit(doc)
    sys.path.insert(0, str(BENCHMARKS))
    from with_kernels import run_target
    apply()
    run_target(sys.argv[1], sys.argv[2:])
