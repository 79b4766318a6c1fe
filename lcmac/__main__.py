"""``python -m lcmac`` is the ``lcmac`` command."""
import sys

from .cli import main

sys.exit(main())
