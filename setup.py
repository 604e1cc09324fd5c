from Cython.Build import cythonize
from setuptools import Extension, setup

# _schedule builds the tables, _schedule_check validates and simulates them (both include _heap.pxi); _launch is
# the host fast path's kernel launch.
setup(ext_modules=cythonize([Extension("cupy_dash._schedule", ["cupy_dash/_schedule.pyx"]),
                             Extension("cupy_dash._schedule_check", ["cupy_dash/_schedule_check.pyx"]),
                             Extension("cupy_dash._launch", ["cupy_dash/_launch.pyx"], libraries=["dl"])],
                            language_level=3))
