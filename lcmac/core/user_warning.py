"""Warnings that name the user's line: ``warn_user`` gives ``warnings.warn`` the stack level
of the first frame outside lcmac, whatever depth inside lcmac the warning is raised at.  A
fixed ``stacklevel`` names the right frame on one call path only (``lcmac.matmul`` reaches the
kernel cache through a different number of frames for numpy arrays, torch tensors and the
torch op), and a warning filter keyed on the user's module then misses it.

torch's own frames are skipped too: a ``torch.ops.lcmac`` call runs lcmac's implementation
under torch's dispatch, so the frame above lcmac's there is torch's, not the user's.
"""
from __future__ import annotations

import os
import sys
import warnings

#: lcmac's package directory, with a separator so that a sibling "lcmac_x" does not match
_LCMAC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _internal_dirs() -> tuple[str, ...]:
    torch = sys.modules.get("torch")
    torch_file = getattr(torch, "__file__", None)
    if torch_file is None:
        return (_LCMAC_DIR,)
    return _LCMAC_DIR, os.path.dirname(os.path.abspath(torch_file)) + os.sep


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the first frame outside lcmac and
    torch (the outermost frame where there is none, as under ``python -m lcmac``)."""
    inside = _internal_dirs()
    frame, level = sys._getframe(1), 2          # level 2: warn_user's caller
    while frame.f_back is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
