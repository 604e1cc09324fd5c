from Cython.Build import cythonize
from setuptools import Extension, setup

setup(ext_modules=cythonize([Extension("cupy_dash._schedule", ["cupy_dash/_schedule.pyx"])],
                            language_level=3))
