"""`nms-agent`: the host agent entry point."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="nms-agent",
        description="fabric-nms host probe agent: probes peers NIC-to-NIC with kernel timestamps and reports "
                    "one-way delays, loss, path events and clock estimates to the service. "
                    "The probe mesh is not implemented yet: this build only prints this help.")
    parser.add_argument("--config", help="agent configuration file (YAML)")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    args = parser.parse_args(argv)
    if args.version:
        from nms import __version__

        print(f"nms-agent {__version__}")
        return 0
    if args.config is not None:
        print("nms-agent: the probe agent is not part of this build yet (see docs/ARCHITECTURE.md)", file=sys.stderr)
        return 2
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
