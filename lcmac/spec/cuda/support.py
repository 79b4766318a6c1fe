"""What the CUDA templates can build: for each knob that applies only somewhere, why a
config, arch, dtype or shape cannot have it (``*_why``: None where it can), and the checks
that refuse it by name."""
from __future__ import annotations

from lcmac.core.dtypes import ITEMSIZE
from lcmac.core.errors import LcmacError, ShapeError
from lcmac.spec.cuda.dtypes import FP64_DTYPES, tma_copies


class NotSupportedYet(LcmacError, NotImplementedError):
    """A feature of the CUDA backend that is not implemented yet (named in the message)."""


def cluster_kernels(cfg: "CudaConfig", dtype: str, arch: str) -> tuple[str, ...]:
    """Kernels built as 2-CTA clusters sharing B slabs by multicast (none when cluster is 1);
    a config asking for clusters where the template has none is refused by name."""
    if cfg.cluster == 1:
        return ()
    why = _cluster_why(cfg, dtype, arch)
    if why:
        raise NotSupportedYet(f"cluster=2 applies to the native 2-byte GEMM stage on sm_90a "
                              f"only: {why} (use cluster=1)")
    return ("gemm", "batched_gemm")


def persistent_gemm(cfg: "CudaConfig", dtype: str, arch: str) -> bool:
    """Whether the unfused GEMM stage (plain GEMM, Algorithm 1's batched GEMM) runs as a
    persistent kernel; a config asking for it where that template has none is refused by
    name."""
    if not cfg.persistent or cfg.fused:
        return False
    why = persistent_why(cfg, dtype, arch)
    if why:
        raise NotSupportedYet(f"persistent=True for the unfused GEMM stage applies to native "
                              f"2-byte operands on sm_90a only: {why} (use persistent=False)")
    return True


def _cluster_why(cfg: "CudaConfig", dtype: str, arch: str) -> str | None:
    """Why the GEMM stage cannot be built as 2-CTA clusters with ``cfg`` (None: it can)."""
    return ("sm_80 has no thread-block clusters" if arch != "sm_90a" else
            "float32's GEMM stage is TF32 mma.sync" if dtype == "float32" else
            f"{dtype}'s copies are cp.async, and multicast is TMA's" if not tma_copies(dtype) else
            f"operands={cfg.operands!r} has its own GEMM template" if cfg.operands != "native" else
            "the fused kernel is not clustered" if cfg.fused else
            "the clustered batched GEMM runs the cache-aware order only (cache_aware=False)"
            if not cfg.cache_aware else None)


def arch_why(cfg: "CudaConfig", dtype: str, arch: str) -> str | None:
    """Why no shape can be built with ``cfg`` for ``arch`` and ``dtype`` (None: some can);
    the build refuses each of these by name, the tuner prunes them from its space."""
    if cfg.cluster != 1 and (why := _cluster_why(cfg, dtype, arch)):
        return f"cluster=2: {why}"
    if cfg.persistent and not cfg.fused and (why := persistent_why(cfg, dtype, arch)):
        return f"persistent=True: {why}"
    if cfg.fused and cfg.tma_reduce and (why := _no_tma(arch)):
        return f"tma_reduce=True: {why}"
    if cfg.direct_views not in ("none", "auto") and (why := _views_why(cfg, dtype, arch)):
        return f"direct_views={cfg.direct_views!r}: {why}"
    if why := dmma_why(cfg, dtype, arch):
        return f"dmma={cfg.dmma!r}: {why}"
    if cfg.fused and (cfg.split_group or cfg.persistent) and cfg.overlap_epilogue and arch == "sm_80":
        return ("split_group/persistent with overlap_epilogue: sm_80's cp.async pipeline needs a "
                "constant trip count (use overlap_epilogue=False there)")
    return None


def dmma_why(cfg: "CudaConfig", dtype: str, arch: str) -> str | None:
    """Why the fp64 tensor-core products cannot be issued in the shape ``cfg.dmma`` (None:
    they can; "m8n8k4", TileLang's own, always can)."""
    if cfg.dmma == "m8n8k4":
        return None
    if dtype not in FP64_DTYPES:
        return f"it shapes the fp64 tensor-core products, which {dtype} does not run on"
    if arch != "sm_90a":
        return f"{cfg.dmma} fp64 mma is sm_90's; {arch} has m8n8k4 only"
    if cfg.batched:
        return ("batched products keep m8n8k4 (it pairs the plain GEMM's and Algorithm 1's "
                "row tiles)")
    return None


def persistent_why(cfg: "CudaConfig", dtype: str, arch: str) -> str | None:
    """Why the unfused GEMM stage cannot be persistent with ``cfg`` (None: it can)."""
    return ("the fused kernel has its own persistent grid" if cfg.fused else
            "sm_80's cp.async pipeline needs a constant trip count (TileLang 0.1.15)"
            if arch != "sm_90a" else
            "float32's GEMM stage is TF32" if dtype == "float32" else
            f"{dtype}'s copies are cp.async, whose pipeline TileLang 0.1.15 builds over a constant "
            f"trip count only" if not tma_copies(dtype) else
            f"operands={cfg.operands!r} has its own GEMM template" if cfg.operands != "native" else
            "the clustered GEMM is not persistent (cluster=2)" if cfg.cluster != 1 else None)


def _no_tma(arch: str) -> str | None:
    """Why ``arch`` cannot run a template built on TMA descriptors (None: it can)."""
    return None if arch == "sm_90a" else f"{arch} has no TMA"


def _whole_tiles(cfg: "CudaConfig", blk: "Blocking", dtype: str, with_k: bool) -> bool:
    """Whether the tiles split the blocks of C (``with_k``: of A and B too) exactly, with no
    padding: a TMA box is clipped to the whole matrix, not to its block, so a tile must not
    reach across a block boundary into the next block."""
    whole = (blk.M == blk.m * blk.Mb and blk.N == blk.n * blk.Nb
             and blk.Mb % cfg.block_m == 0 and blk.Nb % cfg.block_n == 0)
    return whole and (not with_k or (blk.K == blk.k * blk.Kb and blk.Kb % cfg.bk(dtype) == 0))


def tma_reduce_why(cfg: "CudaConfig", blk: "Blocking", dtype: str, arch: str) -> str | None:
    """Why the fused kernel cannot run its epilogue on the TMA engine (None: it can)."""
    if why := _no_tma(arch):
        return why
    if dtype not in ("bfloat16", "float16") or cfg.operands != "native":
        return f"it stores native 2-byte outputs, not {dtype} with operands={cfg.operands!r}"
    if (cfg.split_group or cfg.cluster != 1 or not cfg.store_via_smem or cfg.r_order != "natural"
            or not cfg.cache_aware):
        return ("it has its own persistent grid and product order, always cache-aware "
                "(split_group=False, cluster=1, store_via_smem=True, r_order='natural', "
                "cache_aware=True)")
    if not _whole_tiles(cfg, blk, dtype, with_k=False):
        return (f"the C blocks ({blk.Mb}x{blk.Nb} of {blk.M}x{blk.N}) must be whole multiples of "
                f"the {cfg.block_m}x{cfg.block_n} tile")
    return None


def _views_why(cfg: "CudaConfig", dtype: str, arch: str) -> str | None:
    """The shape-independent part of ``direct_views_why``."""
    if why := _no_tma(arch):
        return why
    if dtype not in ("bfloat16", "float16") or cfg.operands != "native":
        return f"the GEMM stage reads native 2-byte operands, not {dtype} with operands={cfg.operands!r}"
    if cfg.fused or cfg.cluster != 1 or cfg.tf32_wgmma:
        return "Algorithm 1's batched GEMM only (fused=False, cluster=1)"
    return None


def direct_views_why(cfg: "CudaConfig", blk: "Blocking", dtype: str, arch: str) -> str | None:
    """Why the batched GEMM cannot read single-block operands in place (None: it can)."""
    if why := _views_why(cfg, dtype, arch):
        return why
    if not _whole_tiles(cfg, blk, dtype, with_k=True):
        return (f"the blocks ({blk.Mb}x{blk.Kb} of A, {blk.Kb}x{blk.Nb} of B) must split "
                f"{blk.M}x{blk.K} and {blk.K}x{blk.N} exactly into whole "
                f"{cfg.block_m}x{cfg.bk(dtype)} / {cfg.bk(dtype)}x{cfg.block_n} tiles")
    return None


def check_batched_shape(M: int, N: int, K: int) -> None:
    """A batched small product takes any positive sizes (its copies check bounds)."""
    if min(M, N, K) <= 0:
        raise ShapeError(f"shape must be positive, got M={M} N={N} K={K}")


def check_shape(M: int, N: int, K: int, dtype: str) -> None:
    if min(M, N, K) <= 0:
        raise ShapeError(f"shape must be positive, got M={M} N={N} K={K}")
    vec = 16 // ITEMSIZE[dtype]
    if K % vec or N % vec:
        raise ShapeError(f"the CUDA backend needs K and N to be multiples of {vec} for {dtype} "
                         f"(16-byte rows for the TMA copies); got K={K}, N={N} (M may be any size)")
