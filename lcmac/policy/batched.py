"""Which batched GEMM ``lcmac.bmm(algo="auto")`` runs: lcmac's batched kernel, or the vendor's.

The model of batched small products (``lcmac.costmodel.small.predict_batched``) prices the GPU
alone; below ~100 µs of GPU work the call's host cost decides, so the rule is the measured
wins (``BATCHED_WINS``), not the model's word.
"""
from __future__ import annotations

from lcmac.core.dtypes import ITEMSIZE

__all__ = ["BATCHED_WINS", "choose_batched"]

#: Where lcmac's batched kernel beat torch.bmm, its Python call included (docs/batched.md).
#: Each row: dtypes, max(M, N) range, K range, the least batch, the config, the measurement.
#: Only what was measured to win is here; a shape between two rows is left to the vendor.
BATCHED_WINS = (
    (("bfloat16", "float16"), (8, 24), (8, 24), 10_000, {},
     "H200: 8³ auto 2.04×, 16³ 1.25× at 100 000; H100, lighter call: lcmac.bmm 'gemm' 8³ "
     "1.08–1.10×, 16³ 1.04–1.08×, 24³ 1.13–1.14× at 10 000, 1.07–2.03× at 100 000; 0.54–0.69× "
     "at 1 000"),
    (("float32",), (16, 16), (256, 256), 10_000, {"policy": "splitk"},
     "16×16×256: auto 1.48× at 10 000, 1.76× at 100 000; 0.76× at 1 000"),
    (("float32",), (16, 16), (64, 256), 100_000, {"policy": "splitk"},
     "16×16×64: auto 1.11× at 100 000; 0.89× at 10 000"),
    (("float32",), (32, 32), (512, 512), 10_000, {"policy": "splitk"},
     "32×32×512: auto 1.13× at 10 000 and 100 000; 0.74× at 1 000"),
    # wider than 128: the production GEMM template (schedules.cuda.gemm.batched_products), TF32
    # on both sides, measured at one batch per size: 256³ won, the larger sizes lost
    (("float32",), (256, 256), (256, 256), 20_000, {},
     "256³: 1.11× sustained at 20 000 (auto 1.11×; burst 1.06–1.15×, auto 1.02×)"),
)


def choose_batched(device: str, dtype: str, M: int, N: int, K: int, batch: int,
                   tf32: bool = False) -> dict | None:
    """``lcmac.bmm(algo="auto")``'s rule: None for the vendor's batched GEMM, else the config
    of lcmac's batched kernel (``{}``: the default tile; ``{"policy": "splitk"}``: the 3D
    partition).  ``tf32``: the caller lets float32 products run as TF32 (torch's
    ``allow_tf32``), as lcmac's kernel does.

    - Only CUDA: on the CPU lcmac's batched path is the float64 reference.
    - float32 only with ``tf32``: lcmac multiplies float32 as TF32 where cuBLAS keeps these
      small products in float32.
    - Rows of 16 bytes (N and K a multiple of 16 / itemsize): the TMA path; unaligned rows
      take element-wise copies, which lost to torch.bmm.
    - max(M, N) from 33 to 128 (no row): the model puts these products at the memory bound
      from batch 10 000, where torch.bmm already runs and no partition of the same bytes
      wins; below that both are launch-bound and lcmac.bmm's call costs more than torch.bmm's.
    - Wider than 128, the production GEMM template: only the sizes it was measured to win at.
    - Otherwise the ranges of the measured wins (``BATCHED_WINS``; a shape inside a range but
      between its measured points is interpolated, not measured).  The least batch of each is
      a measured threshold, not the model's, because the call's host cost decides there: the
      thresholds hold for hosts like the ones measured (a slower CPU moves them up)."""
    if device != "cuda" or dtype not in ("bfloat16", "float16", "float32") or batch <= 0:
        return None
    if dtype == "float32" and not tf32:
        return None
    vec = 16 // ITEMSIZE[dtype]
    if N % vec or K % vec:
        return None
    for dtypes, (side_lo, side_hi), (k_lo, k_hi), least, config, _measured in BATCHED_WINS:
        if (dtype in dtypes and side_lo <= max(M, N) <= side_hi and k_lo <= K <= k_hi
                and batch >= least):
            return dict(config)
    return None
