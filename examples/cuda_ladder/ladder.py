"""The GEMM optimisation ladder: the plain GEMM C = A·B (row-major, fp32 accumulation) written
seven ways in TileLang, each one step up from the one before (README.md says what each step
changes and what it gains, by bytes per flop and occupancy).

    1 naive               one thread per C element, its K loop reading A and B from global memory
    2 shared_tiling       a CTA stages BM×BK and BK×BN slabs in shared memory, one element each
    3 register_tiling     each thread computes a TM×TN micro-tile held in registers
    4 vectorised          128-bit global loads, A transposed in shared memory, 128-bit shared reads
    5 double_buffered     step 4 as a 2-stage software pipeline: slab k+1's loads fly during slab k
    6 tensor_cores        T.gemm (mma.sync) on single-buffered shared tiles, no pipeline
    7 async_tensor_cores  lcmac's production template (``lcmac.schedules.cuda.gemm.plain_gemm``):
                          TMA, a 4-stage pipeline, wgmma on sm_90a

Steps 1–5 run on the CUDA cores (operands converted to fp32, FFMA); 6–7 on the tensor cores,
float32 operands as TF32.  Each step has its own tile (``ladder_tile``): ``block_m`` /
``block_n`` / ``block_k`` replace a step's default where given, and the threads follow from
the tile; step 7 reads them as lcmac's CUDA config (``CudaConfig``) of the production GEMM.
Steps 1–6 index by hand or copy without bounds checks: they take shapes that are whole
multiples of their tile; step 7 takes any shape the production GEMM takes.
"""
# (no `from __future__ import annotations`: TileLang evaluates the Tensor annotations)

from dataclasses import dataclass

import tilelang.language as T
from tilelang.cuda.language import pdl_sync

from lcmac.schedules.cuda import gemm
from lcmac.spec.cuda import CudaConfig, NotSupportedYet

#: the operand types every step takes, and their bytes
ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}
#: what the products accumulate in
ACCUM = "float32"
#: the most elements a buffer of steps 1–6 may have: they index in 32 bits
INDEX_INT32_MAX = 2 ** 31 - 1

#: outputs per thread of steps 3–5 (TM × TN, the register micro-tile)
MICRO_M = MICRO_N = 8
#: outputs per warp of step 6 along M and N (mma.sync from ldmatrix fragments)
WARP_TILE = 64
#: one vectorised load or store (steps 4–5): 128 bits
VECTOR_BYTES = 16
#: the most threads a CTA may have
MAX_THREADS = 1024

STEP_NAMES = {1: "naive", 2: "shared_tiling", 3: "register_tiling", 4: "vectorised",
              5: "double_buffered", 6: "tensor_cores", 7: "async_tensor_cores"}


@dataclass(frozen=True)
class LadderTile:
    """A step's CTA tile (block_m × block_n outputs, K slabs of block_k; 0: no slabs) and
    threads per CTA."""
    block_m: int
    block_n: int
    block_k: int
    threads: int


def step_config(dtype: str, block_m=None, block_n=None, block_k=None, arch: str = "sm_90a") -> CudaConfig:
    """Step 7's config: lcmac's production GEMM config with the tile knobs given, completed
    for ``dtype`` and ``arch`` as an lcmac build completes it (the pipeline as deep as fits)."""
    given = {k: v for k, v in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k))
             if v is not None}
    cfg = CudaConfig.from_dict(given, dtype=dtype, arch=arch, lcma=False)
    cfg.check()
    return cfg


def ladder_tile(step: int, dtype: str, block_m=None, block_n=None, block_k=None) -> LadderTile:
    """The tile step ``step`` runs for operands of ``dtype`` (``block_m``, ``block_n``,
    ``block_k``: the step's default where None):

    1–2  block_m × block_n threads, one C element each (default 32 × 32 = 1024 threads: a warp
         is one row of 32 neighbouring columns); step 2 stages block_k = 32 slabs.
    3–5  block_m × block_n outputs (default 128 × 128), MICRO_M × MICRO_N per thread (threads
         follow: 256 by default); block_k = 32 bytes of K (16 for 2-byte types, 8 for float32),
         so that each thread loads one 128-bit vector of A and one of B per slab (steps 4–5).
    6    block_m × block_n (default 128 × 64), one warp per WARP_TILE × WARP_TILE outputs (2
         warps by default); block_k as the config reads it (64 for 2-byte types, 32 for
         float32).  On sm_90a TileLang lowers T.gemm to wgmma whenever a CTA has a multiple of 4
         warps (and block_m ≥ 64): a 128 × 128 tile turns this step into single-stage wgmma.
    7    the production GEMM's (128 × 256 × 64, 256 consumer threads; ``step_config``).

    The threads follow from the tile.
    """
    if step in (1, 2):
        bm, bn = block_m or 32, block_n or 32
        return LadderTile(bm, bn, (block_k or 32) if step == 2 else 0, bm * bn)
    if step in (3, 4, 5):
        bm, bn = block_m or 128, block_n or 128
        bk = block_k or 2 * VECTOR_BYTES // ITEMSIZE[dtype]
        return LadderTile(bm, bn, bk, (bm // MICRO_M) * (bn // MICRO_N))
    if step == 6:
        bm, bn = block_m or 128, block_n or 64
        bk = block_k or 128 // ITEMSIZE[dtype]              # 128 bytes of a row
        return LadderTile(bm, bn, bk, 32 * max(1, bm // WARP_TILE) * max(1, bn // WARP_TILE))
    cfg = step_config(dtype, block_m, block_n, block_k)
    return LadderTile(cfg.block_m, cfg.block_n, cfg.bk(dtype), cfg.threads)


def _check(step: int, M: int, N: int, K: int, dtype: str, tile: LadderTile) -> None:
    """Refuse, by name, what step ``step`` cannot compute exactly."""
    what = f"ladder step {step} ({STEP_NAMES[step]})"
    if dtype not in ITEMSIZE:
        raise NotSupportedYet(f"{what} takes {', '.join(ITEMSIZE)} operands, not {dtype}")
    if step == 7:
        return
    if tile.threads > MAX_THREADS or tile.threads % 32:
        raise NotSupportedYet(f"{what}: a {tile.block_m}x{tile.block_n} tile needs {tile.threads} "
                              f"threads per CTA; a CTA takes whole warps, at most {MAX_THREADS}")
    bk = tile.block_k or 1
    if M % tile.block_m or N % tile.block_n or K % bk:
        raise NotSupportedYet(f"{what} has no bounds checks: M, N, K must be multiples of its "
                              f"{tile.block_m}x{tile.block_n}x{bk} tile, and {M}x{N}x{K} is not "
                              f"(step 7, the production GEMM, takes any shape)")
    if max(M * K, K * N, M * N) > INDEX_INT32_MAX:
        raise NotSupportedYet(f"{what} indexes in 32 bits: {M}x{N}x{K} has a buffer of more than "
                              f"2^31-1 elements (step 7 indexes those in 64 bits)")
    if step in (3, 4, 5):
        vec = VECTOR_BYTES // ITEMSIZE[dtype] if step > 3 else 1
        per_load = vec * tile.threads
        if tile.block_m % MICRO_M or tile.block_n % MICRO_N or bk % vec or \
                (tile.block_m * bk) % per_load or (bk * tile.block_n) % per_load:
            raise NotSupportedYet(f"{what}: a {tile.block_m}x{tile.block_n}x{bk} tile does not split "
                                  f"into {MICRO_M}x{MICRO_N} micro-tiles and whole "
                                  f"{vec}-element loads for each of its {tile.threads} threads")
    if step == 2 and ((tile.block_m * bk) % tile.threads or (bk * tile.block_n) % tile.threads):
        raise NotSupportedYet(f"{what}: the {tile.block_m}x{bk} and {bk}x{tile.block_n} slabs must "
                              f"split evenly over the tile's {tile.threads} threads")


# ---- the copies of steps 2–5: each thread moves its share of a slab ---------------------------
@T.macro
def stage_elements(src, dst, row0, col0, tid, threads: int, per_thread: int):
    """dst (shared, rows × cols) = src[row0:, col0:], one element per load, thread ``tid``
    taking elements tid, tid + threads, ... (neighbouring threads, neighbouring columns)."""
    cols = dst.shape[1]
    for l in T.unroll(per_thread):
        e = l * threads + tid
        dst[e // cols, e % cols] = src[row0 + e // cols, col0 + e % cols]


@T.macro
def load_vectors(src, regs, row0, col0, tid, threads: int, cols: int, vec: int):
    """regs[l, :] = the l-th vec-element vector of thread ``tid`` in the rows × ``cols`` region
    of src at (row0, col0): one 128-bit global load each."""
    for l in T.unroll(regs.shape[0]):
        e = l * threads + tid
        for v in T.vectorized(vec):
            regs[l, v] = src[row0 + e // (cols // vec), col0 + e % (cols // vec) * vec + v]


@T.macro
def store_vectors(regs, dst, tid, threads: int, vec: int, transpose: bool):
    """The vectors of ``load_vectors`` into the shared slab ``dst``: as they were (one 128-bit
    store each), or transposed (``dst`` is the slab's transpose, element by element)."""
    cols = dst.shape[0] if transpose else dst.shape[1]
    for l in T.unroll(regs.shape[0]):
        e = l * threads + tid
        r, c = e // (cols // vec), e % (cols // vec) * vec
        if transpose:
            for v in T.unroll(vec):
                dst[c + v, r] = regs[l, v]
        else:
            for v in T.vectorized(vec):
                dst[r, c + v] = regs[l, v]


@T.macro
def outer_products(At_shared, B_shared, A_reg, B_reg, C_local, ty, tx):
    """C_local (MICRO_M × MICRO_N fp32 registers) += the thread's column of A times its row of
    B at each k of the slab, both read from shared memory as vectors: At_shared is A's slab
    transposed (bk × bm), so a thread's MICRO_M rows of A are neighbours there."""
    for kk in T.unroll(At_shared.shape[0]):
        for i in T.vectorized(MICRO_M):
            A_reg[i] = At_shared[kk, ty * MICRO_M + i]
        for j in T.vectorized(MICRO_N):
            B_reg[j] = B_shared[kk, tx * MICRO_N + j]
        for i in T.unroll(MICRO_M):
            for j in T.unroll(MICRO_N):
                C_local[i, j] += T.cast(A_reg[i], ACCUM) * T.cast(B_reg[j], ACCUM)


@T.macro
def store_micro_tile(C_local, C, row0, col0, dtype):
    """The thread's MICRO_M × MICRO_N outputs to C at (row0, col0), a row at a time."""
    for i in T.unroll(MICRO_M):
        for j in T.vectorized(MICRO_N):
            C[row0 + i, col0 + j] = T.cast(C_local[i, j], dtype)


@T.macro
def clear_micro_tile(C_local):
    for i in T.unroll(MICRO_M):
        for j in T.unroll(MICRO_N):
            C_local[i, j] = T.float32(0)


# ---- the steps (every buffer within 32-bit indices: ``_check``) --------------------------------
def naive(M: int, N: int, K: int, dtype: str, tile: LadderTile, pdl: bool):
    """Step 1: thread (row, col) reads row `row` of A and column `col` of B from global memory,
    2K elements for 2K flops; a warp's 32 columns make B's loads coalesced, A's a broadcast."""
    bm, bn = tile.block_m, tile.block_n

    @T.prim_func
    def ladder_naive(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype),
                     C: T.Tensor((M, N), dtype)):
        with T.Kernel(N // bn, M // bm, threads=tile.threads) as (bx, by):
            if pdl:
                pdl_sync()
            tid = T.get_thread_binding()
            row, col = by * bm + tid // bn, bx * bn + tid % bn
            acc = T.alloc_var(ACCUM, 0)
            for k in T.serial(K):
                acc += T.cast(A[row, k], ACCUM) * T.cast(B[k, col], ACCUM)
            C[row, col] = T.cast(acc, dtype)
    return ladder_naive


def shared_tiling(M: int, N: int, K: int, dtype: str, tile: LadderTile, pdl: bool):
    """Step 2: the CTA's threads copy each K slab of A and B into shared memory once, then
    every thread reads its row and column there: global traffic falls by the tile size."""
    bm, bn, bk, threads = tile.block_m, tile.block_n, tile.block_k, tile.threads

    @T.prim_func
    def ladder_shared_tiling(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype),
                             C: T.Tensor((M, N), dtype)):
        with T.Kernel(N // bn, M // bm, threads=threads) as (bx, by):
            if pdl:
                pdl_sync()
            A_shared = T.alloc_shared((bm, bk), dtype)
            B_shared = T.alloc_shared((bk, bn), dtype)
            tid = T.get_thread_binding()
            ty, tx = tid // bn, tid % bn
            acc = T.alloc_var(ACCUM, 0)
            for ko in T.serial(K // bk):
                # (TileLang puts the barriers around the copies: shared-memory hazards)
                stage_elements(A, A_shared, by * bm, ko * bk, tid, threads, bm * bk // threads)
                stage_elements(B, B_shared, ko * bk, bx * bn, tid, threads, bk * bn // threads)
                for kk in T.serial(bk):
                    acc += T.cast(A_shared[ty, kk], ACCUM) * T.cast(B_shared[kk, tx], ACCUM)
            C[by * bm + ty, bx * bn + tx] = T.cast(acc, dtype)
    return ladder_shared_tiling


def register_tiling(M: int, N: int, K: int, dtype: str, tile: LadderTile, pdl: bool):
    """Step 3: each thread owns a MICRO_M × MICRO_N block of C in registers and, at each k,
    reads MICRO_M elements of A and MICRO_N of B from shared memory for MICRO_M·MICRO_N FMAs
    (element-wise copies and reads: steps 4–5 vectorise them; the output store is already
    a row of MICRO_N at a time, as there)."""
    bm, bn, bk, threads = tile.block_m, tile.block_n, tile.block_k, tile.threads

    @T.prim_func
    def ladder_register_tiling(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype),
                               C: T.Tensor((M, N), dtype)):
        with T.Kernel(N // bn, M // bm, threads=threads) as (bx, by):
            if pdl:
                pdl_sync()
            A_shared = T.alloc_shared((bm, bk), dtype)
            B_shared = T.alloc_shared((bk, bn), dtype)
            A_reg = T.alloc_local((MICRO_M,), dtype)
            B_reg = T.alloc_local((MICRO_N,), dtype)
            C_local = T.alloc_local((MICRO_M, MICRO_N), ACCUM)
            tid = T.get_thread_binding()
            ty, tx = tid // (bn // MICRO_N), tid % (bn // MICRO_N)
            clear_micro_tile(C_local)
            for ko in T.serial(K // bk):
                stage_elements(A, A_shared, by * bm, ko * bk, tid, threads, bm * bk // threads)
                stage_elements(B, B_shared, ko * bk, bx * bn, tid, threads, bk * bn // threads)
                for kk in T.unroll(bk):
                    for i in T.unroll(MICRO_M):
                        A_reg[i] = A_shared[ty * MICRO_M + i, kk]
                    for j in T.unroll(MICRO_N):
                        B_reg[j] = B_shared[kk, tx * MICRO_N + j]
                    for i in T.unroll(MICRO_M):
                        for j in T.unroll(MICRO_N):
                            C_local[i, j] += T.cast(A_reg[i], ACCUM) * T.cast(B_reg[j], ACCUM)
            store_micro_tile(C_local, C, by * bm + ty * MICRO_M, bx * bn + tx * MICRO_N, dtype)
    return ladder_register_tiling


def _vector_tiled(M: int, N: int, K: int, dtype: str, tile: LadderTile, pdl: bool, pipelined: bool):
    """Steps 4 and 5: step 3 with every global load, shared store and shared read 128 bits
    wide (A's slab stored transposed, so a thread's MICRO_M rows of A are neighbours too);
    ``pipelined``: the K loop as a 2-stage software pipeline."""
    bm, bn, bk, threads = tile.block_m, tile.block_n, tile.block_k, tile.threads
    vec = VECTOR_BYTES // ITEMSIZE[dtype]
    a_loads, b_loads = bm * bk // (vec * threads), bk * bn // (vec * threads)
    # step 5: the loads of slab k+1 into registers (stage 0) are issued first, slab k's
    # products (stage 1) run while they fly, and the registers go to shared memory last
    k_loop = (lambda n: T.Pipelined(n, stage=[0, 0, 0, 0, 1], order=[0, 3, 1, 4, 2])) if pipelined \
        else T.serial

    @T.prim_func
    def kernel(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype),
               C: T.Tensor((M, N), dtype)):
        with T.Kernel(N // bn, M // bm, threads=threads) as (bx, by):
            if pdl:
                pdl_sync()
            At_shared = T.alloc_shared((bk, bm), dtype)
            B_shared = T.alloc_shared((bk, bn), dtype)
            A_vec = T.alloc_local((a_loads, vec), dtype)
            B_vec = T.alloc_local((b_loads, vec), dtype)
            A_reg = T.alloc_local((MICRO_M,), dtype)
            B_reg = T.alloc_local((MICRO_N,), dtype)
            C_local = T.alloc_local((MICRO_M, MICRO_N), ACCUM)
            tid = T.get_thread_binding()
            ty, tx = tid // (bn // MICRO_N), tid % (bn // MICRO_N)
            clear_micro_tile(C_local)
            for ko in k_loop(K // bk):
                load_vectors(A, A_vec, by * bm, ko * bk, tid, threads, bk, vec)
                store_vectors(A_vec, At_shared, tid, threads, vec, True)
                load_vectors(B, B_vec, ko * bk, bx * bn, tid, threads, bn, vec)
                store_vectors(B_vec, B_shared, tid, threads, vec, False)
                outer_products(At_shared, B_shared, A_reg, B_reg, C_local, ty, tx)
            store_micro_tile(C_local, C, by * bm + ty * MICRO_M, bx * bn + tx * MICRO_N, dtype)
    return kernel.with_attr("global_symbol", "ladder_double_buffered" if pipelined else "ladder_vectorised")


def vectorised(M: int, N: int, K: int, dtype: str, tile: LadderTile, pdl: bool):
    """Step 4: 128-bit loads and stores (LDG.128, STS.128, LDS.128), A transposed in shared."""
    return _vector_tiled(M, N, K, dtype, tile, pdl, pipelined=False)


def double_buffered(M: int, N: int, K: int, dtype: str, tile: LadderTile, pdl: bool):
    """Step 5: step 4 with a 2-stage pipeline: slab k+1 is loaded (into registers, the second
    buffer) while slab k is multiplied from shared memory."""
    return _vector_tiled(M, N, K, dtype, tile, pdl, pipelined=True)


def tensor_cores(M: int, N: int, K: int, dtype: str, tile: LadderTile, pdl: bool):
    """Step 6: the slabs copied synchronously (128-bit loads into TileLang's swizzled shared
    layout), then T.gemm on the tensor cores into fp32 fragments; one buffer per operand, no
    overlap of loads and products."""
    bm, bn, bk = tile.block_m, tile.block_n, tile.block_k

    @T.prim_func
    def ladder_tensor_cores(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype),
                            C: T.Tensor((M, N), dtype)):
        with T.Kernel(N // bn, M // bm, threads=tile.threads) as (bx, by):
            if pdl:
                pdl_sync()
            A_shared = T.alloc_shared((bm, bk), dtype)
            B_shared = T.alloc_shared((bk, bn), dtype)
            C_local = T.alloc_fragment((bm, bn), ACCUM)
            T.clear(C_local)
            for ko in T.serial(K // bk):        # one stage: load, then multiply
                T.copy(A[by * bm, ko * bk], A_shared, prefer_instruction="sync")
                T.copy(B[ko * bk, bx * bn], B_shared, prefer_instruction="sync")
                # warps stacked along M: 64 x 64 each (Square gives 128 x 32, more ldmatrix)
                T.gemm(A_shared, B_shared, C_local, policy=T.GemmWarpPolicy.FullRow)
            T.copy(C_local, C[by * bm, bx * bn])
    return ladder_tensor_cores


STEPS = {1: naive, 2: shared_tiling, 3: register_tiling, 4: vectorised, 5: double_buffered,
         6: tensor_cores}


def ladder_gemm(step: int, M: int, N: int, K: int, dtype: str, block_m=None, block_n=None,
                block_k=None, arch: str = "sm_90a"):
    """The prim_func of ladder step ``step`` (1–7) for C[M, N] = A[M, K]·B[K, N] in ``dtype``;
    step 7 is lcmac's production template itself (``gemm.plain_gemm``, the grid kernel)."""
    if step not in STEP_NAMES:
        raise NotSupportedYet(f"the GEMM ladder has steps 1..{len(STEP_NAMES)}, not {step}")
    tile = ladder_tile(step, dtype, block_m, block_n, block_k)
    _check(step, M, N, K, dtype, tile)
    if step == 7:
        cfg = step_config(dtype, block_m, block_n, block_k, arch)
        return gemm.plain_gemm(M, N, K, dtype, cfg, arch)
    # TileLang launches with programmatic dependent launch allowed on sm_90a: a kernel there
    # must wait for the previous one in the stream before it reads A and B
    return STEPS[step](M, N, K, dtype, tile, arch == "sm_90a")
