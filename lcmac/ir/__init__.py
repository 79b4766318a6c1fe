"""The LCMA intermediate representation: algorithms, verification, composition, programs."""
from .algorithm import Algorithm
from .catalogue import get
from .executor import reference_matmul, run_fused, run_unfused
from .transforms import compose, orbit, power, rotate, transpose
from .verify import brent_failures, is_exact, verify

__all__ = ["Algorithm", "get", "verify", "is_exact", "brent_failures", "compose", "power",
           "rotate", "transpose", "orbit", "run_unfused", "run_fused", "reference_matmul"]
