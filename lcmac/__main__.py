"""``python -m lcmac`` is the ``lcmac`` command."""
import sys

from lcmac.cli.main import main

sys.exit(main())
