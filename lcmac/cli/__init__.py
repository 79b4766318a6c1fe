"""The ``lcmac`` command: ``main`` parses and calls the library (one module per command group)."""
from lcmac.cli.main import main

__all__ = ["main"]
