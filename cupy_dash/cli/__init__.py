"""The subcommands of ``python -m cupy_dash`` (docs/architecture.md, layer "command line"). The top layer: nothing
in the package imports it but ``__main__``.
"""
