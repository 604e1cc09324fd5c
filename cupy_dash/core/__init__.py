"""The functional API (``cupy_dash``'s top-level names) and what serves it on the host; its modules:
docs/architecture.md, layer "core". Imports :mod:`cupy_dash.cuda` and :mod:`cupy_dash.schedule`, never an adapter
or the command line.
"""
