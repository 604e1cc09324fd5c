"""``python -m cupy_dash [demo|compile|schedule] ...``; no subcommand runs the default job.

The top level only dispatches: ``-h`` / ``--help`` and ``--version`` are answered here, a subcommand's own
arguments (``--help`` included) go to that subcommand, and anything else (an unknown flag or subcommand) is an
argparse error (exit status 2).
"""
import argparse
import importlib.util
import os
import sys


def _unshadow():
    """Make ``cupy_dash`` this package when a folder shadows it. Run from a folder that holds a directory named
    cupy_dash without an ``__init__.py`` (a clone of this repository under git's default name), Python takes that
    directory for a namespace package ``cupy_dash``; an editable install, whose finder Python asks only after
    that, then supplies the submodules (this one included) but the package's ``__init__`` never runs. Put the
    package this file belongs to in its place, before anything else is imported from it."""
    package = sys.modules.get(__package__)
    if package is None or getattr(package, "__file__", None) is not None:
        return                                  # the regular package (or not run as part of one)
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(__package__, os.path.join(here, "__init__.py"),
                                                  submodule_search_locations=[here])
    module = importlib.util.module_from_spec(spec)
    sys.modules[__package__] = module
    spec.loader.exec_module(module)


_unshadow()

from ._version import __version__  # noqa: E402  (after _unshadow: from this file's package)

COMMANDS = {
    "demo": "forward + backward with every schedule on one shape (needs a Hopper GPU)",
    "compile": "compile kernel variants for sm_90a with NVRTC and check for spills (no GPU needed)",
    "schedule": "compare the schedules of one problem in a simulation (no GPU needed)",
}
# Commands that left the package, and where they went (an argparse error that names the new command).
MOVED = {
    "bench": "the benchmark against torch SDPA and FlashAttention-3 is a script of the source repository: "
             "`python benchmarks/bench.py` (the same options)",
}


def _parser() -> argparse.ArgumentParser:
    commands = "\n".join(f"  {name:<10} {what}" for name, what in COMMANDS.items())
    p = argparse.ArgumentParser(
        prog="python -m cupy_dash", usage="%(prog)s [-h] [--version] [COMMAND [ARGS ...]]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Deterministic FlashAttention-style attention for Hopper GPUs.\n\nWith no command: the demo "
                    "on a Hopper GPU, else the schedule analysis of a default training shape.",
        epilog=f"commands:\n{commands}\n\n`python -m cupy_dash COMMAND --help` describes a command's options.")
    p.add_argument("--version", action="version", version=f"cupy_dash {__version__}")
    # No argparse choices: with them, `--flag VALUE` would be reported as an invalid command VALUE instead of
    # an unrecognized --flag. main() checks the name.
    p.add_argument("command", nargs="?", metavar="COMMAND", help=f"one of {', '.join(COMMANDS)} (listed below)")
    return p


def main(argv=None):
    """Run one command; returns its exit status (argparse exits by itself for --help, --version and errors)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    if argv and not argv[0].startswith("-"):
        command, rest = argv[0], argv[1:]            # the rest, --help included, is the command's
    else:
        command, rest = parser.parse_args(argv).command, []     # -h, --version, or exit 2 naming an unknown flag
    if command in MOVED:
        parser.error(f"no command {command!r} in the package: {MOVED[command]}")
    if command is not None and command not in COMMANDS:
        parser.error(f"unknown command {command!r} (choose from {', '.join(COMMANDS)})")
    if command == "schedule":
        from .cli.schedule import main as run
    elif command == "compile":
        from .cli.compile import main as run
    elif command == "demo":
        from .cli.gpu import demo_main as run
    else:
        from .cli.gpu import default_main as run
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
