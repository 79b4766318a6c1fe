"""What the library logs, shown by the ``lcmac`` command: the "lcmac" logger's INFO messages
and above (a compile's notes on its config, a wait for another process building the same
kernel) as bare lines on stderr, so that stdout holds only the result.  The library itself
never writes to stderr: its logger has only a NullHandler (``lcmac/__init__.py``)."""
from __future__ import annotations

import contextlib
import logging
import sys


@contextlib.contextmanager
def library_log_on_stderr():
    """Show lcmac's log on ``sys.stderr`` for the length of one command (then as it was, so
    that a caller of ``lcmac.cli.main.main`` keeps its own logging)."""
    logger = logging.getLogger("lcmac")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
