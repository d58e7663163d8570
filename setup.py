"""Builds the NCCL profiler plugin (plain C, no CUDA, no Python API) into the nccl_plugin package.

It is a Python extension by name only: NCCL dlopens the shared object by path
(`NCCL_PROFILER_PLUGIN=$(python -m nccl_plugin path)`); nothing imports it. Everything else is in
pyproject.toml.
"""

from setuptools import Extension, setup

SOURCES = ["nccl_plugin/src/plugin.c", "nccl_plugin/src/ring.c", "nccl_plugin/src/shipper.c"]
HEADERS = ["nccl_plugin/src/nccl_abi.h", "nccl_plugin/src/ring.h", "nccl_plugin/src/runtime.h",
           "nccl_plugin/src/wire.h"]

setup(ext_modules=[Extension(
    "nccl_plugin._nms_profiler",
    sources=SOURCES,
    depends=HEADERS,
    extra_compile_args=["-O2", "-std=c11", "-fvisibility=hidden", "-pthread", "-Wall", "-Wextra"],
    extra_link_args=["-pthread"],
)])
