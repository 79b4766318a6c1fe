"""The CUDA schedule templates (TileLang) and their config.

    config          knobs (CudaConfig), feasibility rules and static plans; imports no
                    compiler (the cost model, the tuner and the runtime read it)
    batched_tiles   the template and tile of a batched product (lcmac.bmm); no compiler
    common          pieces the templates share
    gemm            the GEMM stage: plain and batched GEMM (grid, cluster, persistent)
    combines        Combine A / B / H
    fused           the fused GEMM + Combine-H kernels (grid, persistent split-group,
                    TMA-engine epilogue) and the split-group fixup
    low_precision   scaled fp16 / fp16x2 and fp8 operands

Every module but ``config`` and ``batched_tiles`` imports TileLang and runs only inside the TileLang worker
(``lcmac.targets.tilelang_worker``); docs/cuda-templates.md describes the templates."""
