"""The LCMA intermediate representation: algorithms, verification, composition, programs."""
from lcmac.ir.algorithm import Algorithm
from lcmac.ir.alternative_basis import AlternativeBasisAlgorithm
from lcmac.ir.basis_search import search_basis
from lcmac.ir.catalogue import get
from lcmac.ir.executor import reference_matmul, run_fused, run_unfused
from lcmac.ir.gf2 import GF2Algorithm, reduce_mod2
from lcmac.ir.transforms import compose, orbit, power, rotate, transpose
from lcmac.ir.verify import brent_failures, is_exact, verify

__all__ = ["Algorithm", "get", "verify", "is_exact", "brent_failures", "compose", "power",
           "rotate", "transpose", "orbit", "run_unfused", "run_fused", "reference_matmul",
           "AlternativeBasisAlgorithm", "search_basis", "GF2Algorithm", "reduce_mod2"]
