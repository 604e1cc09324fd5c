"""``python -m cupy_dash [demo|compile|bench|schedule] ...``; no subcommand runs the default job."""
import sys


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv.pop(0) if argv and not argv[0].startswith("-") else None
    if command == "schedule":
        from .cli_schedule import main as run
    elif command == "compile":
        from .cli_compile import main as run
    elif command in ("demo", "bench"):
        from . import cli_gpu
        run = getattr(cli_gpu, f"{command}_main")
    elif command is None:
        from .cli_gpu import default_main as run
    else:
        print(f"cupy_dash: unknown command {command!r}; expected one of demo, compile, bench, schedule",
              file=sys.stderr)
        return 2
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
