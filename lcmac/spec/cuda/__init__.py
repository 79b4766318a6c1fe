"""Configs and shape bookkeeping for the CUDA (TileLang) templates.

Nothing here imports TileLang: the runtime, the tests, the cost model and the tuner read
these without a compiler.  The templates live in ``lcmac.schedules.cuda`` and are imported
only inside the TileLang worker process.  What the knobs do and why the defaults are what
they are: docs/cuda-templates.md.

    config      ``CudaConfig``: the knobs, their checks, the defaults a build fills in
    dtypes      the dtypes the backend takes, their accumulators, what float64 is built for
    operands    how the GEMM stage's operands are stored (native, fp16, fp16x2, fp8)
    blocking    ``Blocking``: block sizes of one LCMA on one shape, its buffers and indices
    smem        shared memory per CTA, per stage and for the output tile
    support     what can be built where: the ``*_why`` reasons and the checks that refuse
    views       direct views: operand sides read in place from A and B
    persistent  the persistent grid's static schedule and tile rasterisation
    order       the order of a CTA's products and the Combine-H epilogue's steps
    bsr         the fused block-sparse product's blocks, tiles and shapes

The names below are re-exported for callers that want the whole CUDA spec in one place.
"""
from lcmac.spec.cuda.blocking import (
    INDEX_INT32_MAX, Blocking, buffer_shapes, ceil_div, int64_buffers, needs_int64, round_up)
from lcmac.spec.cuda.bsr import BSR_BLOCKS, bsr_shape_why, bsr_tile_defaults
from lcmac.spec.cuda.config import (
    BATCHED_TEMPLATES, DIRECT_VIEWS, DMMA_SHAPES, SCHEDULE_VERSION, CudaConfig, default_config,
    is_lcma)
from lcmac.spec.cuda.dtypes import (
    BATCHED_DTYPES, BATCHED_ONLY_DTYPES, FP64_DTYPES, FP64_TILE_DEFAULTS, SUPPORTED_DTYPES,
    accum_dtype, batched_only_why, fp64_why, tma_copies)
from lcmac.spec.cuda.operands import (
    FP8_BLOCK, FP8_MAX, FP8_MAX_COMBINE, FP8_TILE_DEFAULTS, FP8_TINY, OPERAND_MODES, SCALED_TOP,
    SPLIT_SHIFT, SPLIT_TILE_DEFAULTS, SPLIT_TILE_DEFAULTS_SM80, bound_exponent, check_operands,
    fp8_combine_size, scale_exponent)
from lcmac.spec.cuda.order import combine_h_steps, first_in_piece, r_order, reduce_groups
from lcmac.spec.cuda.persistent import PersistentPlan, ctas_per_sm, persistent_plan, raster
from lcmac.spec.cuda.smem import SMEM_PER_CTA, check_smem, persistent_tile_bytes, stage_bytes
from lcmac.spec.cuda.support import (
    NotSupportedYet, arch_why, check_batched_shape, check_shape, cluster_kernels, direct_views_why,
    dmma_why, persistent_gemm, persistent_why, tma_reduce_why)
from lcmac.spec.cuda.views import operand_sources, side_read_in_place, view_sides
