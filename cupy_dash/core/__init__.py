"""The functional API and what serves it on the host: the fixed-length entry points (``api``), packed
variable-length batches (``varlen``, over ``varlen_launch``: the checks of the lengths and the launch of one
packing's backward), the torch host fast paths that re-launch a stored plan (``fastpath``,
``fastpath_varlen``), host copies of device cu_seqlens (``varlen_host_cu``), the caller's arrays, streams and
result types (``interop``), and the framework-free rules of the transformers adapter (``transformers_rules``,
importable without torch). ``cupy_dash``'s top-level names (``attention_forward``, ...) are defined here; it
imports :mod:`cupy_dash.cuda` and :mod:`cupy_dash.schedule`, never an adapter or the command line.
"""
