"""The GPU side: kernel variants and their NVRTC compile and disk cache (``jit``, ``kernels``), the parameter structs
read from kernels_src (``params``), TMA tensor maps (``tensormap``), the launch plans every entry point shares
(``plans``, packed from ``launchers``' blocks) and their executor (``executor`` over ``launch_plan.c``), the schedule
tables on the device (``device_tables``, ``varlen_device``) and the deferred error records (``errors``). It imports
the schedules (:mod:`cupy_dash.schedule`) and the configuration, never the core or an adapter; nothing here is
imported by ``import cupy_dash``.
"""
