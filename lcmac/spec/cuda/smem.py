"""Shared memory: what one CTA may use per architecture, and what a config's pipeline
stages and output tile take of it."""
from __future__ import annotations

from lcmac.core.dtypes import ITEMSIZE
from lcmac.core.errors import LcmacError

#: dynamic shared memory one CTA may use, per architecture (bytes)
SMEM_PER_CTA = {"sm_90a": 227 * 1024, "sm_80": 163 * 1024}


def stage_bytes(cfg: "CudaConfig", dtype: str) -> int:
    """Shared memory of one stage of the GEMM stage's K loop: the A and B slabs, in the
    operand storage type (two halves each for fp16x2)."""
    if cfg.operands == "native":
        return (cfg.block_m + cfg.block_n) * cfg.bk(dtype) * ITEMSIZE[dtype]
    if cfg.operands == "fp8":
        return (cfg.block_m + cfg.block_n) * cfg.bk("float8_e4m3") + 4 * (cfg.block_m + cfg.block_n)
    halves = 2 if cfg.operands == "fp16x2" else 1
    return (cfg.block_m + cfg.block_n) * cfg.bk("float16") * 2 * halves


def persistent_tile_bytes(cfg: "CudaConfig", dtype: str) -> int:
    """Shared memory the persistent unfused GEMM keeps for its output tile beside the
    pipeline (a one-tile CTA's tile aliases the drained pipeline buffers instead)."""
    if not cfg.store_via_smem or not (cfg.persistent and not cfg.fused or cfg.fused and cfg.tma_reduce):
        return 0
    return cfg.block_m * cfg.block_n * ITEMSIZE.get(dtype, 4)


def check_smem(kernels: list[dict], arch: str) -> None:
    """Every kernel's dynamic shared memory (as lowered) within what one CTA may use on the
    arch: a kernel over it compiles but fails at launch, so the build refuses it here."""
    limit = SMEM_PER_CTA[arch]
    over = [k for k in kernels if k.get("smem_bytes", 0) > limit]
    if over:
        k = over[0]
        raise LcmacError(f"kernel {k['name']!r} needs {k['smem_bytes'] // 1024} KB of shared memory "
                         f"per CTA, more than {arch}'s {limit // 1024} KB: use fewer stages or a "
                         f"smaller block_m/block_n/block_k in the config")
