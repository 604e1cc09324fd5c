from Cython.Build import cythonize
from setuptools import Extension, setup

# _schedule builds the tables, _schedule_check validates and simulates them (both include _heap.pxi); _compact
# builds and checks compact (per-column) tables, _compact_view expands them and computes what the kernel will
# compute per visit, _varlen_sched builds and checks those of packed varlen batches (_units.pxi is shared by
# _schedule, _compact and _varlen_sched, _compact_rule.pxi by the five compact modules, _cta_lists.pxi by the
# two builders), _varlen_view expands them, _varlen_pack packs them in the byte layout uploaded (with
# _scratch.pxi: the new-packing pipeline's malloc'd scratch); _launch is
# every kernel launch (one cuLaunchKernel); _xla_ffi is cupy_dash.jax's XLA FFI handler (xla_ffi.c).
setup(ext_modules=cythonize([Extension("cupy_dash._schedule", ["cupy_dash/_schedule.pyx"]),
                             Extension("cupy_dash._schedule_check", ["cupy_dash/_schedule_check.pyx"]),
                             Extension("cupy_dash._compact", ["cupy_dash/_compact.pyx"]),
                             Extension("cupy_dash._compact_view", ["cupy_dash/_compact_view.pyx"]),
                             Extension("cupy_dash._varlen_sched", ["cupy_dash/_varlen_sched.pyx"]),
                             Extension("cupy_dash._varlen_view", ["cupy_dash/_varlen_view.pyx"]),
                             Extension("cupy_dash._varlen_pack", ["cupy_dash/_varlen_pack.pyx"]),
                             Extension("cupy_dash._launch", ["cupy_dash/_launch.pyx"], libraries=["dl"]),
                             Extension("cupy_dash._xla_ffi", ["cupy_dash/_xla_ffi.pyx", "cupy_dash/xla_ffi.c"],
                                       depends=["cupy_dash/xla_ffi.h"], include_dirs=["cupy_dash"], libraries=["dl"],
                                       extra_compile_args=["-std=gnu11"])],
                            language_level=3))
