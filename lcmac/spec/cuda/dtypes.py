"""The dtypes the CUDA backend takes, and the accumulators of each."""
from __future__ import annotations

SUPPORTED_DTYPES = ("bfloat16", "float16", "float32")
#: dtypes only the batched small template builds (``schedules.cuda.small``; a config with
#: ``batched``): float64 on the fp64 tensor cores (mma.sync m8n8k4, float64 accumulators;
#: wgmma has no fp64, so the production GEMM template and the LCMA kernels have none)
BATCHED_ONLY_DTYPES = ("float64",)
#: what a batched product (``CudaConfig.batched``) takes
BATCHED_DTYPES = SUPPORTED_DTYPES + BATCHED_ONLY_DTYPES


def accum_dtype(dtype: str) -> str:
    """The accumulators of a GEMM stage on ``dtype`` operands: float64 for float64 (the fp64
    tensor cores accumulate in float64), float32 for every other dtype."""
    return "float64" if dtype == "float64" else "float32"


def batched_only_why(dtype: str, config: dict | None) -> str | None:
    """Why a build of ``dtype`` with ``config`` (a dict of CudaConfig fields) is refused
    because the dtype is one only the batched small template builds (None: it is not)."""
    if dtype not in BATCHED_ONLY_DTYPES:
        return None
    cfg = config or {}
    if not cfg.get("batched"):
        return (f"{dtype} is built for batched products only (lcmac.bmm(A, B, algo='gemm'), a "
                f"config with batched=True); the CUDA backend's other kernels take "
                f"{', '.join(SUPPORTED_DTYPES)}")
    if cfg.get("batched_template") == "gemm":
        return (f"the production GEMM template (batched_template='gemm') has no {dtype}: its "
                f"tensor-core path is wgmma, which has no fp64; {dtype} runs on the small "
                f"template (batched_template 'small' or 'auto')")
    return None
