"""The ``lcmac`` command's exit status: 0 done, 1 the command ran and failed, 2 the command
line is wrong (argparse's own status for its errors).  Scripts can tell "fix the command"
from "the work failed" (docs/cli.md, "Exit status")."""
from __future__ import annotations

from lcmac.core.errors import CatalogueError, DTypeError, LcmacError, ShapeError, TargetError

OK = 0
FAILURE = 1
USAGE = 2

EPILOG = """exit status:
  0  done (verify: every Brent equation holds)
  1  the command ran and failed: a Brent equation fails, a file cannot be read or holds no
     valid algorithm, an output directory cannot be written, a compile or a tuning run fails
  2  usage error: an unknown option, a malformed or missing value (a shape, a target, an
     algorithm or dtype name), options that do not go together"""


class UsageError(LcmacError):
    """Options that do not go together, or a value the command cannot take."""


# what lcmac raises for a value named on the command line (an algorithm, a target, a dtype, a
# shape): the fix is to the command, as with argparse's errors
_USAGE_ERRORS = (UsageError, CatalogueError, DTypeError, ShapeError, TargetError)


def exit_code(error: LcmacError) -> int:
    """The exit status for ``error``: ``USAGE`` for a bad value on the command line, else
    ``FAILURE``."""
    return USAGE if isinstance(error, _USAGE_ERRORS) else FAILURE
