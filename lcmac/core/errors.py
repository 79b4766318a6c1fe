"""Exceptions lcmac raises. Every message names the problem and, where it can, the fix."""


class LcmacError(Exception):
    """Base of every error lcmac raises on purpose."""


class AlgorithmError(LcmacError, ValueError):
    """A malformed algorithm: wrong shapes, non-numeric or non-exact coefficients."""


class VerificationError(AlgorithmError):
    """Coefficients that do not compute the matrix product (a Brent equation fails)."""


class CatalogueError(LcmacError, KeyError):
    """An unknown algorithm name, or a catalogue file that cannot be read."""

    def __str__(self):  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class ShapeError(LcmacError, ValueError):
    """Operands whose shapes do not fit the product or the artifact."""


class DTypeError(LcmacError, TypeError):
    """An unsupported or mismatched element type."""


class TargetError(LcmacError, ValueError):
    """An unknown target, or one this machine cannot build or run for."""


class ArtifactError(LcmacError):
    """A missing, corrupt, tampered or foreign artifact."""


class ToolchainError(LcmacError, RuntimeError):
    """A compiler, linker or emulator that is missing; the message names the package."""
