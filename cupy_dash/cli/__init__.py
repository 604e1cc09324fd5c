"""The command line's subcommands (``python -m cupy_dash``, whose ``__main__`` dispatches here): ``schedule`` and
``compact`` (the schedule analysis, no GPU), ``compile`` (every kernel variant through NVRTC, no GPU) and ``gpu``
(the demo and the default job), with ``measure`` (FLOP counts, seeded inputs, CUDA-event timing) that the demo and
``benchmarks/`` measure with. The top layer: nothing in the package imports it but ``__main__``.
"""
