"""Build the Cython extensions in nsqshm/_core.

NSQSHM_DEBUG=1 builds with assertions on, no optimisation and Cython's
bounds checks, for gdb and valgrind.
"""

import os

from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("NSQSHM_DEBUG") == "1"
CFLAGS = ["-O0", "-g", "-UNDEBUG"] if DEBUG else ["-O3", "-DNDEBUG"]
CORE = "nsqshm/_core"
MODULES = ["ring", "codec", "arena", "inflight", "wire", "diskqueue", "snappy", "localbatch", "commitlog", "logcursor", "keyhash",
           "commands", "ext", "tracelog"]

extensions = [
    Extension(
        f"nsqshm._core.{name}",
        [f"{CORE}/{name}.pyx"],
        include_dirs=[f"{CORE}/includes"],
        extra_compile_args=CFLAGS + ["-std=gnu11", "-pthread"],
        extra_link_args=["-pthread"],
    )
    for name in MODULES
]

setup(
    ext_modules=cythonize(
        extensions,
        language_level=3,
        compiler_directives={
            "boundscheck": DEBUG,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": DEBUG,
        },
        gdb_debug=DEBUG,
    )
)
