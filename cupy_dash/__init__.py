"""cupy_dash: deterministic FlashAttention-style attention for NVIDIA Hopper (sm_90a). The API: docs/api.md;
``cupy_dash.schedule`` builds, validates and simulates the dQ-reduction schedules without a GPU.

Every name here and every submodule is imported on first access: ``import cupy_dash`` imports neither CuPy,
ml_dtypes, torch nor JAX (so ``python -m cupy_dash --help`` answers at once); an adapter whose framework is not
installed raises ModuleNotFoundError when it is accessed.
"""
from ._version import __version__

# public name -> the submodule that defines it
_EXPORTS = {"attention": "differentiable", "attention_backward": "core.api", "attention_forward": "core.api",
            "check_errors": "core.api", "attention_backward_varlen": "core.varlen",
            "attention_forward_varlen": "core.varlen", "prepare_varlen_backward": "core.varlen"}

__all__ = ["__version__", "attention", "attention_backward", "attention_backward_varlen", "attention_forward",
           "attention_forward_varlen", "check_errors", "prepare_varlen_backward", "reference", "schedule"]


def __getattr__(name):
    """The names of ``__all__`` and the submodules, imported on first access (and then kept as attributes)."""
    import importlib
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    if not name.startswith("__"):
        try:
            return importlib.import_module(f"{__name__}.{name}")    # binds the attribute itself
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":                    # the submodule exists, a dependency does not
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
