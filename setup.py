from Cython.Build import cythonize
from setuptools import Extension, setup

setup(ext_modules=cythonize([Extension("cupy_dash._schedule", ["cupy_dash/_schedule.pyx"]),
                             Extension("cupy_dash._launch", ["cupy_dash/_launch.pyx"], libraries=["dl"])],
                            language_level=3))
