"""The GPU side: kernel variants, NVRTC and its disk cache, parameter structs, tensor maps, launch plans and their
executor, schedule tables on the device, deferred error records (docs/architecture.md, "The layers as they are" and
"Inside the cuda layer"). Imports the schedules and the configuration, never the core or an adapter; nothing here
is imported by ``import cupy_dash``.
"""
