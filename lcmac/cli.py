"""The ``lcmac`` command. Thin: it parses arguments and calls the library."""
from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    from . import __version__
    p = argparse.ArgumentParser(prog="lcmac", description=__doc__)
    p.add_argument("--version", action="version", version=f"lcmac {__version__}")
    p.parse_args(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
