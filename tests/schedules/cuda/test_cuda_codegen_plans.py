"""CUDA back end, the parts that need neither TileLang nor a GPU: the static schedules and
plans (lcmac.spec.cuda, lcmac.schedules.cuda.compose.view_plan), the scaled-operand
arithmetic, and the host-side source rewrites of lcmac.schedules.cuda.host_source.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from lcmac.spec.cuda.blocking import Blocking
from lcmac.spec.cuda.config import CudaConfig

ROOT = str(Path(__file__).resolve().parents[3])     # the repository
TR = {"fused": True, "tma_reduce": True, "stages": 3}


# ---- split-group persistent schedule: a tile-level emulation (no TileLang, no GPU) ----------
def emulate_persistent(alg, M, N, K, cfg, units=132, seed=0):
    """Run the persistent fused kernel's schedule on the CPU, tile by tile, the way the
    generated kernel does (fused.fused_gemm_h with a plan, then split_fixup): the same
    step → (group, product) map, rasterisation, first-write / read-modify-write decisions,
    workspace slots and fixup order.  C and the slots start as NaN, so a read of a value
    nothing wrote shows.  Returns (C, A @ B, plan); integer inputs make both exact."""
    from lcmac.spec.cuda.order import combine_h_steps, first_in_piece, r_order
    from lcmac.spec.cuda.persistent import persistent_plan, raster
    rng = np.random.default_rng(seed)
    A = rng.integers(-3, 4, (M, K)).astype(np.float64)
    B = rng.integers(-3, 4, (K, N)).astype(np.float64)
    blk = Blocking(M, N, K, alg.m, alg.k, alg.n, alg.R)
    pl = persistent_plan(blk, cfg, "bfloat16", units)
    bm, bn, R, Mb, Nb = cfg.block_m, cfg.block_n, alg.R, blk.Mb, blk.Nb
    Ap = np.zeros((alg.m * Mb, alg.k * blk.Kb)); Ap[:M, :K] = A
    Bp = np.zeros((alg.k * blk.Kb, alg.n * Nb)); Bp[:K, :N] = B
    U, V = np.asarray(alg.U, dtype=float), np.asarray(alg.V, dtype=float)
    H = np.zeros((R, pl.gy * bm, pl.gx * bn))
    for r in range(R):
        At = sum(U[r, i, l] * Ap[i * Mb:(i + 1) * Mb, l * blk.Kb:(l + 1) * blk.Kb]
                 for i in range(alg.m) for l in range(alg.k))
        Bt = sum(V[r, l, j] * Bp[l * blk.Kb:(l + 1) * blk.Kb, j * Nb:(j + 1) * Nb]
                 for l in range(alg.k) for j in range(alg.n))
        H[r, :Mb, :Nb] = At @ Bt
    order = r_order(alg.W, cfg.r_order)
    steps, nxt = combine_h_steps(alg.W, order)
    C = np.full((M, N), np.nan)
    Ps = np.full((max(pl.slots, 1), alg.m * alg.n, bm, bn), np.nan)
    ca, Lt, F, n_main = cfg.cache_aware, pl.Lt, pl.rounds * pl.P, pl.rounds * R

    def c_view(i, j, by, bx):
        rows = np.arange(by * bm, (by + 1) * bm); cols = np.arange(bx * bn, (bx + 1) * bn)
        rows = rows[(rows < Mb) & (i * Mb + rows < M)]; cols = cols[(cols < Nb) & (j * Nb + cols < N)]
        return np.ix_(i * Mb + rows, j * Nb + cols), (slice(0, len(rows)), slice(0, len(cols)))

    for pid in range(pl.P):
        n = n_main + (max(min(pl.tail_steps - pid * Lt, Lt), 0) if pl.rem else 0)
        for q in range(n):
            # step_of and the epilogue's test, term by term (tq = -1 in the whole rounds)
            tq = pid * Lt + q - n_main
            if q < n_main:
                g, jw, tq = (q // R) * pl.P + pid, q % R, -1
            else:
                g, jw = F + tq // R, tq % R
            s = jw if ca else (jw + g) % R
            by, bx = raster(g, pl.gx, pl.gy, cfg.swizzle)
            h = H[order[s], by * bm:(by + 1) * bm, bx * bn:(bx + 1) * bn]
            rot = 0 if ca else g % R
            if pl.split and tq >= 0 and pid * Lt > (tq // R) * R:
                st = (pid * Lt - (tq // R) * R + rot) % R
                for (i, j, w, _, prev) in steps[s]:
                    old = 0.0 if first_in_piece(s, prev, st, R) else Ps[pid, i * alg.n + j]
                    Ps[pid, i * alg.n + j] = old + float(w) * h
            else:
                for (i, j, w, first0, prev) in steps[s]:
                    first = first0 if rot == 0 else first_in_piece(s, prev, rot, R)
                    dst, src = c_view(i, j, by, bx)
                    C[dst] = (0.0 if first else C[dst]) + float(w) * h[src]
    for gt in range(pl.rem if pl.split else 0):           # the fixup kernel
        g = F + gt
        by, bx = raster(g, pl.gx, pl.gy, cfg.swizzle)
        rot = 0 if ca else g % R
        u0 = gt * R // Lt
        e0 = min((u0 + 1) * Lt - gt * R, R)
        for i in range(alg.m):
            for j in range(alg.n):
                nx = nxt[(i, j)]
                dst, src = c_view(i, j, by, bx)
                acc = C[dst] if nx[rot % R] < e0 else 0.0
                for k in range(pl.max_pieces - 1):
                    u = u0 + 1 + k
                    c = u * Lt - gt * R
                    if c < R and nx[(c + rot) % R] < min(c + Lt, R) - c:
                        acc = acc + Ps[min(u, pl.slots - 1), i * alg.n + j][src]
                C[dst] = acc
    return C, A @ B, pl


@pytest.mark.parametrize("algo", ["strassen", "winograd"])
@pytest.mark.parametrize("P,ca,swizzle", [(5, True, 2), (11, True, 0), (20, False, 2), (132, True, 8),
                                          (7, False, 3)])
def test_split_group_schedule_emulated(algo, P, ca, swizzle):
    """Every C element written, exactly A·B, for plans with whole rounds, tails cut into
    1..R-1-step pieces (several CTAs per group), rotated walks (cache_aware=False), short
    last swizzle panels and shapes that do not divide the grid or the tile."""
    from lcmac import ir
    from lcmac.costmodel.waves import wave_analysis
    alg = ir.get(algo)
    M, N, K = 100, 88, 24                    # Mb = 56, Nb = 48: a 7 × 6 grid of 8 × 8 tiles
    for split in (True, False):
        cfg = CudaConfig(fused=True, split_group=split, persistent=not split, block_m=8,
                         block_n=8, persistent_ctas=P, cache_aware=ca, swizzle=swizzle)
        C, ref, pl = emulate_persistent(alg, M, N, K, cfg)
        assert np.isfinite(C).all() and np.array_equal(C, ref), (pl, np.nanmax(abs(C - ref)))
        # the schedule's busiest CTA matches the cost model's wave count
        wa = wave_analysis(M, N, units=P, tile=(8, 8), m=2, n=2, R=7)
        assert pl.waves == wa.waves("split-group" if split else "whole-group"), pl
    if P == 20:
        assert pl.max_pieces == 1 and persistent_plan_of(alg, M, N, K, P).max_pieces == 7


def persistent_plan_of(alg, M, N, K, P, **kw):
    from lcmac.spec.cuda.persistent import persistent_plan
    cfg = CudaConfig(fused=True, split_group=True, block_m=8, block_n=8, persistent_ctas=P, **kw)
    return persistent_plan(Blocking(M, N, K, alg.m, alg.k, alg.n, alg.R), cfg, "bfloat16", 132)


# ---- buffers of more than 2³¹ elements: 64-bit index arithmetic ----------------------------
def _int32_wrapped_offsets(alg, M, N, K, fused):
    """Buffers whose compile-time-constant index offset reaches 2³¹: r·(per-product stride) for
    an unrolled product r (Ã, B̃ written by the combines, H read by Combine-H), i·Mb·N + j·Nb
    for a C block (and the A, B blocks the combines read).  TVM folds these in the extents'
    type, so with int32 extents they wrapped (tile-ai/tilelang#2560)."""
    b = Blocking(M, N, K, alg.m, alg.k, alg.n, alg.R)
    off = {"At": (b.R - 1) * b.Mb * b.Kb, "Bt": (b.R - 1) * b.Kb * b.Nb,
           "A": (alg.m - 1) * b.Mb * K + (alg.k - 1) * b.Kb,
           "B": (alg.k - 1) * b.Kb * N + (alg.n - 1) * b.Nb,
           "C": (alg.m - 1) * b.Mb * N + (alg.n - 1) * b.Nb}
    if not fused:
        off["H"] = (b.R - 1) * b.Mb * b.Nb
    return sorted(k for k, v in off.items() if v >= 2**31)


def test_logged_large_n_failures_are_int32_wraps():
    """The H100 tuning logs' failures (Strassen² at M = 8192 and Strassen/Strassen² at
    M = 16384 on the vocabulary projections: illegal address in combine_h, or relative error
    ≈ 1) are exactly the artifacts with a wrapped int32 constant offset; every such buffer is
    now declared with int64 extents (config.int64_buffers)."""
    from lcmac import ir
    from lcmac.spec.cuda.blocking import int64_buffers
    algs = {a: ir.get(a) for a in ("strassen", "strassen^2")}
    seen = {"ok": 0, "error": 0}
    for log in ("cuda-sm90a-bfloat16.jsonl", "cuda-sm90a-float32.jsonl"):
        path = os.path.join(ROOT, "lcmac", "data", "tuning_logs", log)
        if not os.path.exists(path):
            continue
        for line in open(path):
            r = json.loads(line)
            # the first-generation records were all measured before the fix (int32 extents)
            if r["algorithm"] not in algs or r.get("schedule_version", 1) != 1:
                continue
            alg, fused = algs[r["algorithm"]], bool(r["config"].get("fused", False))
            wrapped = _int32_wrapped_offsets(alg, *r["shape"], fused)
            assert bool(wrapped) == (r["status"] != "ok"), (r["algorithm"], r["shape"], r["status"], wrapped)
            seen[r["status"] if r["status"] == "ok" else "error"] += 1
            blk = Blocking(*r["shape"], alg.m, alg.k, alg.n, alg.R)
            assert set(wrapped) <= set(int64_buffers(blk, fused)), (r["shape"], wrapped)
    if seen["error"] == 0:
        pytest.skip("no tuning logs with large-N failures present")


def test_default_stages_fit_the_arch_shared_memory():
    """The default 4-stage pipeline of a 128×256 tile needs 192 KB: fine on sm_90a (227 KB),
    over sm_80's 163 KB, where a kernel compiles and then fails at launch.  With the arch
    known, a config silent on ``stages`` gets the deepest pipeline that fits; an explicit
    value is kept (and checked after lowering: test_sm80_build_fits_shared_memory)."""
    from lcmac.spec.cuda.smem import SMEM_PER_CTA, persistent_tile_bytes, stage_bytes

    # sm_90a bf16: an LCMA's persistent GEMM stage (the default there) keeps its 64 KB output
    # tile beside the pipeline: 3 stages; asked for 4, it stays a grid kernel (which fits 4);
    # the plain GEMM (lcma=False) keeps the grid kernel
    cases = [({}, "bfloat16", "sm_90a", 3), ({"persistent": False}, "bfloat16", "sm_90a", 4),
             ({"stages": 4}, "bfloat16", "sm_90a", 4), ({}, "float32", "sm_90a", 4),
             ({}, "bfloat16", "sm_80", 3), ({}, "float32", "sm_80", 3),
             ({"operands": "fp16x2"}, "float32", "sm_90a", 3),
             ({"operands": "fp16x2"}, "float32", "sm_80", 2),         # 128x64 there
             ({"operands": "fp16x2", "block_n": 128}, "float32", "sm_80", 2),
             ({"stages": 4}, "bfloat16", "sm_80", 4), ({}, "bfloat16", None, 4)]
    plain = CudaConfig.from_dict({}, dtype="bfloat16", arch="sm_90a", lcma=False)
    assert (plain.persistent, plain.stages) == (False, 4)
    for d, dtype, arch, want in cases:
        cfg = CudaConfig.from_dict(d, dtype=dtype, arch=arch)
        assert cfg.stages == want, (d, dtype, arch, cfg.stages)
        assert cfg.persistent == ((d, dtype, arch) == ({}, "bfloat16", "sm_90a")), (d, dtype, arch)
        if arch and "stages" not in d:
            room = SMEM_PER_CTA[arch] - persistent_tile_bytes(cfg, dtype)
            assert cfg.stages * stage_bytes(cfg, dtype) <= room
            # the deepest that fits, up to the default depth (4; fp16x2 on sm_80: 2, for spills)
            cap = 2 if (arch, d.get("operands")) == ("sm_80", "fp16x2") else 4
            assert (cfg.stages + 1) * stage_bytes(cfg, dtype) > room or want == cap


# ---- the scaled-operand arithmetic of the CUDA backend (config; no TileLang) ----------
def test_operand_scale_keeps_every_combined_value_in_fp16_range():
    """scale_exponent: the worst combined value (every input at ±amax, the combine row with
    the largest |coefficient| sum) lands below 2**SCALED_TOP, so below fp16's 65504, for
    amax across float32's whole range; and 2**±e are normal floats."""
    import numpy as np

    from lcmac import ir
    from lcmac.spec.cuda.operands import SCALED_TOP, bound_exponent, scale_exponent
    for name in ("strassen", "winograd", "strassen^2", "laderman"):
        alg = ir.get(name)
        for coeffs in (alg.U, alg.V):
            l = bound_exponent(coeffs)
            worst = np.abs(np.asarray(coeffs, dtype=float).reshape(len(coeffs), -1)).sum(1).max()
            assert worst < 2.0 ** l <= 2 * worst + 2
            for amax in (0.0, 1e-40, 1e-30, 0.37, 1.0, 2.0, 3.0e5, 1e30, 3.4e38):
                amax = float(np.float32(amax))
                e = scale_exponent(amax, l)
                assert -126 <= e <= 126
                top = worst * amax * 2.0 ** e       # float64: no overflow in the check itself
                assert top < 2.0 ** SCALED_TOP, (name, amax, e, top)
                if amax >= 1e-30:      # not clamped: the scale uses fp16's range
                    assert top >= 2.0 ** (SCALED_TOP - l - 1) * worst / 2 ** l


def test_fp16x2_split_keeps_22_bits():
    """The fp16x2 split the combine kernels perform (hi = fp16(v), lo = fp16((v − hi)·2¹¹),
    v the scaled value) reconstructs v to 2⁻²² relative over 29 binades below the top,
    where one fp16 keeps 2⁻¹¹; the product form used by the GEMM stage (hi·hi + 2⁻¹¹(hi·lo +
    lo·hi)) matches the float64 product to about 2⁻²²."""
    import numpy as np

    from lcmac.spec.cuda.operands import SCALED_TOP, SPLIT_SHIFT
    rng = np.random.default_rng(0)
    # |v| from fp16's smallest normal (2⁻¹⁴) to the top: 29 binades
    sign = rng.choice([-1.0, 1.0], 200000)
    v = (sign * rng.uniform(1, 2, 200000) * 2.0 ** rng.integers(-14, SCALED_TOP, 200000)).astype(np.float32)
    hi = v.astype(np.float16)
    lo = ((v - hi.astype(np.float32)) * np.float32(2.0 ** SPLIT_SHIFT)).astype(np.float16)
    rec = hi.astype(np.float64) + lo.astype(np.float64) * 2.0 ** -SPLIT_SHIFT
    rel = np.abs(rec - v) / np.abs(v)
    assert rel.max() < 2.0 ** -21 and np.median(rel) < 2.0 ** -23
    assert (np.abs(hi.astype(np.float64) - v) / np.abs(v)).max() > 2.0 ** -13   # one half: ~11 bits
    w = (rng.standard_normal(200000) * 2.0 ** 10).astype(np.float32)
    wh = w.astype(np.float16)
    wl = ((w - wh.astype(np.float32)) * np.float32(2.0 ** SPLIT_SHIFT)).astype(np.float16)
    h64, l64, wh64, wl64 = (x.astype(np.float64) for x in (hi, lo, wh, wl))
    prod = h64 * wh64 + (h64 * wl64 + l64 * wh64) * 2.0 ** -SPLIT_SHIFT
    exact = v.astype(np.float64) * w.astype(np.float64)
    assert np.median(np.abs(prod - exact) / np.abs(exact)) < 2.0 ** -22


def test_prepared_b_plan_splits_off_the_kernels_that_read_only_b():
    from lcmac.schedules.cuda.entry_point import prepared_b_plan
    ws = [("At", 0), ("Bt", 1024), ("H", 3072), ("__end__", 4096)]
    alg1 = [{"name": "combine_a", "args": ["A", "At"]}, {"name": "combine_b", "args": ["B", "Bt"]},
            {"name": "batched_gemm", "args": ["At", "Bt", "H"]}, {"name": "combine_h", "args": ["H", "C"]}]
    assert prepared_b_plan(alg1, ws) == {"kernels": ["combine_b"], "buffers": [["Bt", 0, 2048]], "bytes": 2048}
    # fp8: B̃ and its block scales both go to the prepared buffer, packed
    ws8 = [("At", 0), ("Bt", 512), ("SA", 1536), ("SB", 1792), ("H", 2048), ("__end__", 4096)]
    fp8 = [{"name": "combine_a", "args": ["A", "At", "SA"]}, {"name": "combine_b", "args": ["B", "Bt", "SB"]},
           {"name": "batched_gemm", "args": ["At", "Bt", "SA", "SB", "H"]}, {"name": "combine_h", "args": ["H", "C"]}]
    assert prepared_b_plan(fp8, ws8)["buffers"] == [["Bt", 0, 1024], ["SB", 1024, 256]]
    # scaled fp16 operands: the amax slots of A and B share one buffer, zeroed per call
    wss = [("S", 0), ("At", 256), ("Bt", 512), ("H", 768), ("__end__", 1024)]
    scaled = [{"name": "amax_a", "args": ["A", "S"]}, {"name": "amax_b", "args": ["B", "S"]},
              {"name": "combine_a", "args": ["A", "S", "At"]}, {"name": "combine_b", "args": ["B", "S", "Bt"]},
              {"name": "batched_gemm", "args": ["At", "Bt", "S", "H"]}, {"name": "combine_h", "args": ["H", "C"]}]
    assert "S are shared with the A side" in prepared_b_plan(scaled, wss, zero=["S"])["unsupported"]
    assert "nothing to prepare" in prepared_b_plan([{"name": "gemm", "args": ["A", "B", "C"]}],
                                                   [("__end__", 0)])["unsupported"]


def test_cluster_pipeline_refuses_an_unknown_loop():
    from lcmac.core.errors import ToolchainError
    from lcmac.schedules.cuda.host_source import cluster_pipeline
    with pytest.raises(ToolchainError, match="cluster=1"):
        cluster_pipeline("__global__ void k() { __syncthreads(); }", 3, 256)


@pytest.mark.parametrize("algo", ["strassen", "winograd", "laderman", "strassen^2"])
def test_reduce_groups_add_up_to_combine_h(algo):
    # the epilogue's plan, replayed on random products: the first contribution stores, the
    # rest add, one group per coefficient -- C_ij = sum_r W[r,i,j] H_r exactly (float64)
    from lcmac import ir
    from lcmac.spec.cuda.order import reduce_groups
    alg = ir.get(algo)
    W = np.asarray(alg.W, dtype=float)
    H = np.random.default_rng(0).standard_normal((alg.R, 3, 5))
    C = {}
    for r, groups in enumerate(reduce_groups(alg.W, list(range(alg.R)))):
        assert [w for w, _ in groups][1:].count(1) == 0 and len({w for w, _ in groups}) == len(groups)
        for w, dests in groups:
            for i, j, first in dests:
                assert first == ((i, j) not in C)
                C[(i, j)] = float(w) * H[r] + (0 if first else C[(i, j)])
    for (i, j), c in C.items():
        np.testing.assert_allclose(c, np.einsum("r,rxy->xy", W[:, i, j], H), rtol=1e-12, atol=1e-12)
    assert len(C) == alg.m * alg.n


def test_tma_reduce_refusals_name_the_reason():
    from lcmac.spec.cuda.support import tma_reduce_why
    ok = CudaConfig.from_dict(TR)
    blk = Blocking(1024, 1024, 1024, 2, 2, 2, 7)
    assert tma_reduce_why(ok, blk, "bfloat16", "sm_90a") is None
    for cfg, b, dtype, arch, words in (
            (ok, blk, "bfloat16", "sm_80", "sm_80 has no TMA"),
            (ok, blk, "float32", "sm_90a", "float32"),
            (CudaConfig.from_dict({**TR, "operands": "fp16"}), blk, "bfloat16", "sm_90a", "operands"),
            (CudaConfig.from_dict({**TR, "split_group": True}), blk, "bfloat16", "sm_90a", "split_group"),
            (CudaConfig.from_dict({**TR, "r_order": "greedy"}), blk, "bfloat16", "sm_90a", "r_order"),
            (CudaConfig.from_dict({**TR, "cache_aware": False}), blk, "bfloat16", "sm_90a", "cache_aware=True"),
            (ok, Blocking(1000, 1064, 1032, 2, 2, 2, 7), "bfloat16", "sm_90a", "whole multiples"),
            (ok, Blocking(1024, 768, 1024, 2, 2, 2, 7), "bfloat16", "sm_90a", "384")):
        why = tma_reduce_why(cfg, b, dtype, arch)
        assert why and words in why, (words, why)


def test_restrict_pointers_rewrites_both_signatures_or_refuses():
    from lcmac.core.errors import ToolchainError
    from lcmac.schedules.cuda.host_source import restrict_pointers
    decl = 'extern "C" __global__ void k_combine_h_kernel(bfloat16_t* C, const bfloat16_t* H);\n'
    defn = ('extern "C" __global__ void __launch_bounds__(256, 1) k_combine_h_kernel(bfloat16_t* C, '
            'const bfloat16_t* __restrict__ H) {\n}\n')
    out = restrict_pointers(decl + defn, "k_combine_h")
    assert out.count("bfloat16_t* __restrict__ C") == 2
    assert out.count("const bfloat16_t* __restrict__ H") == 2 and "__restrict__ __restrict__" not in out
    with pytest.raises(ToolchainError, match="restrict_pointers"):
        restrict_pointers(defn, "k_combine_h")          # the declaration is missing


def test_async_reduce_stores_refuses_an_unknown_epilogue():
    from lcmac.core.errors import ToolchainError
    from lcmac.schedules.cuda.host_source import async_reduce_stores
    with pytest.raises(ToolchainError, match="tma_reduce=False"):
        async_reduce_stores("__global__ void k() { tl::tma_store_add(d, s, 0, 0); }")


# ---- direct_views: single-block operands read from A / B in place ---------------------------
@pytest.mark.parametrize("algo,counts", [("strassen", (2, 2)), ("winograd", (3, 3)),
                                         ("strassen^2", (4, 4)), ("laderman", (9, 9)),
                                         ("dps-4x4x4-r48", (0, 0)), ("at-4x4x4-r49", (8, 8))])
def test_direct_outputs_are_the_single_block_operands(algo, counts):
    # an output that is one input with coefficient ±1 is read in place; the program of the
    # rest computes exactly those rows of the combine matrix
    from lcmac import ir
    from lcmac.ir.cse import optimized_programs
    from lcmac.ir.program import combine_matrices, direct_outputs, keep_outputs
    from lcmac.spec.cuda.views import operand_sources
    alg = ir.get(algo)
    progs, mats = optimized_programs(alg), combine_matrices(alg)
    for side, n in zip("AB", counts):
        d = direct_outputs(progs[side])
        assert len(d) == n
        for r, slot in d.items():
            assert list(np.flatnonzero(mats[side][r])) == [slot] and abs(mats[side][r][slot]) == 1
        keep = [r for r in range(alg.R) if r not in d]
        assert (keep_outputs(progs[side], keep).matrix() == mats[side][keep]).all()
        src = operand_sources(alg.R, d)
        assert sorted(s for s in src if s >= 0) == list(range(len(keep)))
        assert {r: -1 - s for r, s in enumerate(src) if s < 0} == d


@pytest.mark.parametrize("algo,counts", [("strassen", (2, 2)), ("winograd", (3, 3)),
                                         ("fg-3x3x3-r23-b", (8, 9)), ("at-4x4x4-r49", (8, 8))])
def test_view_plan_computes_the_product(algo, counts):
    # the plan the worker lowers, run in exact integer arithmetic: the combines write only
    # the kept operands, the GEMM reads the ±1 single blocks un-negated, and Combine H's
    # program carries the sign of every product read from an odd number of −1 blocks
    from lcmac import ir
    from lcmac.ir.cse import optimized_programs
    from lcmac.schedules.cuda.compose import view_plan
    alg = ir.get(algo)
    m, k, n = alg.grid
    blk = Blocking(m * 4, n * 4, k * 4, m, k, n, alg.R)
    progs, views, negated = view_plan(optimized_programs(alg), blk, "ab")
    assert tuple(len(views.get(s, {})) for s in "AB") == counts
    rng = np.random.default_rng(1)
    Ab = rng.integers(-3, 4, (m * k, 4, 4)).astype(np.int64)       # blocks, row-major order
    Bb = rng.integers(-3, 4, (k * n, 4, 4)).astype(np.int64)

    def operands(side, blocks):
        d = views.get(side, {})
        written = progs[side].matrix().astype(np.int64) @ blocks.reshape(len(blocks), -1)
        keep = [r for r in range(alg.R) if r not in d]
        out = [None] * alg.R
        for i, r in enumerate(keep):
            out[r] = written[i].reshape(4, 4)
        for r, slot in d.items():
            out[r] = blocks[slot]                        # in place: the block itself
        return out
    At, Bt = operands("A", Ab), operands("B", Bb)
    H = np.stack([At[r] @ Bt[r] for r in range(alg.R)])
    C = (progs["H"].matrix().astype(np.int64) @ H.reshape(alg.R, -1)).reshape(m, n, 4, 4)
    A = Ab.reshape(m, k, 4, 4).transpose(0, 2, 1, 3).reshape(4 * m, 4 * k)
    B = Bb.reshape(k, n, 4, 4).transpose(0, 2, 1, 3).reshape(4 * k, 4 * n)
    assert (C.transpose(0, 2, 1, 3).reshape(4 * m, 4 * n) == A @ B).all()
    assert bool(negated) == (algo in ("fg-3x3x3-r23-b", "at-4x4x4-r49"))


def test_direct_views_refusals_and_auto():
    from lcmac.spec.cuda.support import arch_why, direct_views_why
    from lcmac.spec.cuda.views import view_sides
    ab = CudaConfig.from_dict({"direct_views": "ab"})
    blk = Blocking(2048, 2048, 2048, 2, 2, 2, 7)
    assert direct_views_why(ab, blk, "bfloat16", "sm_90a") is None
    assert view_sides(CudaConfig(), blk, "bfloat16", "sm_90a") == "ab"          # auto
    for cfg, b, dtype, arch, words in (
            (ab, blk, "bfloat16", "sm_80", "sm_80 has no TMA"),
            (ab, blk, "float32", "sm_90a", "float32"),
            (CudaConfig.from_dict({"direct_views": "a", "operands": "fp16"}), blk, "bfloat16", "sm_90a", "operands"),
            (CudaConfig.from_dict({"direct_views": "a", "fused": True}), blk, "bfloat16", "sm_90a", "fused=False"),
            (ab, Blocking(1000, 1064, 1032, 2, 2, 2, 7), "bfloat16", "sm_90a", "exactly"),
            (ab, Blocking(2048, 2048, 2000, 2, 2, 2, 7), "bfloat16", "sm_90a", "1000")):
        why = direct_views_why(cfg, b, dtype, arch)
        assert why and words in why, (words, why)
        assert view_sides(CudaConfig.from_dict({**cfg.to_dict(), "direct_views": "auto"}), b, dtype, arch) == ""
    assert "direct_views='ab'" in arch_why(ab, "bfloat16", "sm_80")
    assert arch_why(CudaConfig(), "bfloat16", "sm_80") is None          # auto: nothing to refuse
    with pytest.raises(Exception, match="direct_views must be one of"):
        CudaConfig(direct_views="c").check()


def test_view_counts_price_the_unwritten_operands():
    from lcmac.costmodel import config_estimates as est
    cfg = {"fused": False, "stages": 3}
    alg = est.algorithm_of("winograd")
    assert est.view_counts("cuda-sm90a", "bfloat16", (4096,) * 3, alg, cfg) == (3, 3)
    assert est.view_counts("cuda-sm90a", "bfloat16", (4000,) * 3, alg, cfg) == (0, 0)   # not whole tiles
    assert est.view_counts("cuda-sm80", "bfloat16", (4096,) * 3, alg, cfg) == (0, 0)
    assert est.view_counts("cuda-sm90a", "bfloat16", (4096,) * 3, alg, {**cfg, "direct_views": "b"}) == (0, 3)
    on = est.estimate("cuda-sm90a", "bfloat16", (4096,) * 3, "winograd", cfg)
    off = est.estimate("cuda-sm90a", "bfloat16", (4096,) * 3, "winograd", {**cfg, "direct_views": "none"})
    # 3 of 7 Ã and B̃ blocks (2048² bf16) not written
    p = est.target_profile("cuda-sm90a")
    assert off["combine_s"] - on["combine_s"] == pytest.approx(6 * 2048 * 2048 * 2 / p.achievable_bw())


def test_view_loads_refuses_an_unknown_source():
    from lcmac.core.errors import ToolchainError
    from lcmac.schedules.cuda.host_source import view_loads
    side = {"tensor": "At", "input": "A", "blocks_per_row": 2, "sources": [0, -1], "virtual_dims": [64, 64, 2, 2],
            "virtual_strides": [2, 256, 128, 16384], "view_dims": [64, 64, 2, 2], "ws_dims": [64, 64, 1, 1],
            "ws_strides": [2, 128, 8192, 8192]}
    with pytest.raises(ToolchainError, match="direct_views='none'"):
        view_loads('extern "C" __global__ void k_kernel(__grid_constant__ const CUtensorMap H_desc) {}',
                   "k", [side])
