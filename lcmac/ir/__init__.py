"""The LCMA intermediate representation: algorithms, verification, composition, programs."""
from .algorithm import Algorithm
from .alternative_basis import AlternativeBasisAlgorithm
from .basis_search import search_basis
from .catalogue import get
from .executor import reference_matmul, run_fused, run_unfused
from .gf2 import GF2Algorithm, reduce_mod2
from .transforms import compose, orbit, power, rotate, transpose
from .verify import brent_failures, is_exact, verify

__all__ = ["Algorithm", "get", "verify", "is_exact", "brent_failures", "compose", "power",
           "rotate", "transpose", "orbit", "run_unfused", "run_fused", "reference_matmul",
           "AlternativeBasisAlgorithm", "search_basis", "GF2Algorithm", "reduce_mod2"]
