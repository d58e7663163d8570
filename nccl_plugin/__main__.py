"""`python -m nccl_plugin path`: print the plugin's path (for NCCL_PROFILER_PLUGIN=)."""

from __future__ import annotations

import sys

from nccl_plugin import library_path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["path"]:
        print("usage: python -m nccl_plugin path    (prints the profiler plugin's file for NCCL_PROFILER_PLUGIN=)",
              file=sys.stderr)
        return 2
    try:
        print(library_path())
    except FileNotFoundError as e:
        print(f"nccl_plugin: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
