"""NCCL profiler plugin (C, nccl_plugin/src/) and the Python side of its wire format (decode.py).

The plugin is built by the package install into this directory; `library_path()` (or
`python -m nccl_plugin path`) gives the file for `NCCL_PROFILER_PLUGIN=`. See docs/nccl_plugin.md.
"""

from __future__ import annotations

import importlib.machinery
from pathlib import Path

LIBRARY_STEM = "_nms_profiler"


def library_path() -> Path:
    """The built plugin; FileNotFoundError (saying how to build it) when the install did not build it."""
    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = here / f"{LIBRARY_STEM}{suffix}"
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"the NCCL profiler plugin is not built in {here}: run `pip install -e .` "
                            "(needs a C compiler) in the source tree")
