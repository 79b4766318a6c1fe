"""The dtypes the CUDA backend takes, the accumulators of each, and what float64 is built for."""
from __future__ import annotations

SUPPORTED_DTYPES = ("bfloat16", "float16", "float32")
#: dtypes on the fp64 tensor cores (DMMA: mma.sync m8n8k4 with float64 accumulators; wgmma
#: has no fp64): the batched small template, the plain GEMM and Algorithm 1 (combines,
#: batched GEMM, Combine H) with native operands, their copies by cp.async (``tma_copies``).
#: The fused, persistent, clustered, block-sparse and run-time-M forms have none (``fp64_why``).
FP64_DTYPES = ("float64",)
#: what a batched product (``CudaConfig.batched``) takes
BATCHED_DTYPES = SUPPORTED_DTYPES + FP64_DTYPES
#: the tile float64 builds other than batched products fill in where the config is silent:
#: 128² over 8 warps splitting rows and columns (64 float64 accumulators a thread; 128×256
#: would need 256 registers for them alone), C stored from registers
FP64_TILE_DEFAULTS = {"block_m": 128, "block_n": 128, "policy": "square", "stages": 4,
                      "store_via_smem": False}


def accum_dtype(dtype: str) -> str:
    """The accumulators of a GEMM stage on ``dtype`` operands: float64 for float64 (the fp64
    tensor cores accumulate in float64), float32 for every other dtype."""
    return "float64" if dtype == "float64" else "float32"


def tma_copies(dtype: str) -> bool:
    """Whether a GEMM stage's operand copies may go by TMA.  Not for float64: TileLang 0.1.15
    lays the fp64 mma's shared operands out in a swizzle a TensorMap cannot encode ("byte-address
    swizzle Sw<2,3,4> is not representable by a TensorMap descriptor"), so they are cp.async
    copies (bounds-checked and zero-filled all the same)."""
    return dtype not in FP64_DTYPES


def fp64_why(dtype: str, config: dict | None) -> str | None:
    """Why a build of ``dtype`` with ``config`` (a dict of CudaConfig fields) is refused
    because ``dtype`` runs on the fp64 tensor cores and the form asked for has no such kernel
    (None: it has one, or ``dtype`` is not float64).  The knobs with a ``*_why`` of their
    own (persistent, cluster, direct_views, operands, dynamic_rows) are refused there."""
    if dtype not in FP64_DTYPES:
        return None
    cfg = config or {}
    if cfg.get("batched"):
        if cfg.get("batched_template") == "gemm":
            return (f"the production GEMM template (batched_template='gemm') has no {dtype}: its "
                    f"tensor-core path is wgmma, which has no fp64; {dtype} runs on the small "
                    f"template (batched_template 'small' or 'auto')")
        return None
    form = "the fused kernel (fused=True)" if cfg.get("fused") else \
        "the block-sparse product (bsr)" if cfg.get("bsr") else None
    if form:
        return (f"{form} has no {dtype} (its accumulators and partial sums are float32); {dtype} "
                f"runs on the fp64 tensor cores in the plain GEMM, Algorithm 1 (fused=False) and "
                f"batched products")
    return None


#: the names the build (``lcmac.artifact.build``) and the TileLang worker import
BATCHED_ONLY_DTYPES = FP64_DTYPES
batched_only_why = fp64_why
