"""The CUDA schedule: the TileLang kernel templates and how one artifact is composed of them.

    batched_tiles   the template and tile of a batched product (lcmac.bmm); no compiler
    common          pieces the templates share
    gemm            the GEMM stage: plain and batched GEMM (grid, cluster, persistent)
    combines        Combine A / B / H
    fused           the fused GEMM + Combine-H kernels (grid, persistent split-group,
                    TMA-engine epilogue) and the split-group fixup
    low_precision   scaled fp16 / fp16x2 and fp8 operands
    small, bsr      batches of small products; a block-sparse A times a dense B
    compose         which kernels an artifact needs, their buffers and workspace
    rows            artifacts whose row count M is a run-time value (one per N×K); no compiler
    host_source     the rewrites of TileLang's generated CUDA before linking; no compiler
    entry_point     the C entry point chaining the kernels; no compiler

The knobs (``CudaConfig``) and feasibility rules are ``lcmac.spec.cuda``.  The templates
import TileLang and run only inside the TileLang worker (``lcmac.targets.tilelang_worker``);
``compose`` imports each inside the function that builds its kernels, so it imports without
TileLang itself.  docs/cuda-templates.md describes the templates."""
