"""Measuring in the fp8 operand mode (``tune --operands fp8``, CudaConfig.operands="fp8").

The vendor baseline is cuBLAS's FP8 GEMM on the contract's operands (``lcmac.spec.fp8``,
``lcmac.runtime.fp8_gemm``): DeepSeek-V3's blockwise recipe (A per 1×128, the weight per
128×128; ``torch.nn.functional.scaled_mm``, SM90 with cuBLASLt ≥ 12.9) where this torch and
GPU run it, else rowwise scales (``torch._scaled_mm``); the record's config names which.
A's quantisation is timed in; the weight is quantised once per input set, as an artifact's
B̃ is prepared once (``prepare_b``) — the two sides of the comparison do the same work per
call.  Both are checked against float64 on the first rows with an FP8-sized tolerance
(``FP8_TOLERANCE``): E4M3 itself is a few percent off, an LCMA adds a few times that, a
misread scale or block is O(1).

``Fp8MeasureWorker`` runs these in the measuring process, as ``MeasureWorker`` runs the
native ones.
"""
from __future__ import annotations

import itertools

from lcmac.runtime.loader import load
from lcmac.tune.measure import GPU_WARM_S, MeasureWorker, gpu_inputs, gpu_timer, time_callable

#: relative error against float64 (first rows) beyond which an fp8 result is wrong
FP8_TOLERANCE = 0.25
#: cuBLAS recipes tried in order: (name, A's blocks, W's blocks) given K
RECIPES = (("1x128,128x128", lambda K: ((1, 128), (128, 128))), ("rowwise", lambda K: ((1, K), (1, K))))


def vendor_config(recipe: str | None, refused: dict | None = None) -> dict:
    """The ``config`` of the fp8 vendor record: cuBLAS's FP8 GEMM through torch, its recipe."""
    import torch
    api = "torch.nn.functional.scaled_mm" if recipe and recipe.startswith("1x128") else "torch._scaled_mm"
    out = {"library": "cublas", "api": api, "torch": torch.__version__, "operands": "fp8",
           "recipe": recipe, "quantize_a": "timed in", "weights": "quantized once"}
    if refused:
        out["recipes_refused"] = refused
    return out


def _checked(out, ref, rows) -> str | None:
    import torch
    if not bool(torch.isfinite(out).all()):
        return "wrong result: not every element of C was written (NaN poison survived) or non-finite"
    err = float(torch.linalg.norm(out[:rows].double() - ref) / torch.linalg.norm(ref).clamp_min(1e-30))
    if not err <= FP8_TOLERANCE:
        return f"wrong result: relative error {err:.3g} > {FP8_TOLERANCE:g} (fp8) on the first {rows} rows"
    return None


def _timed(runs, ref, rows, *, warmup, repeats, min_run_s, check, warm_s) -> dict:
    """``runs``: one callable per input set, each returning its C; the first checked (C
    poisoned by the caller), then warmed up for ``warm_s`` and timed rotating among them."""
    import time
    import torch
    C = runs[0]()
    torch.cuda.synchronize()
    if check and (why := _checked(C, ref, rows)):
        return {"status": "error", "error": why}
    cycle = itertools.cycle(runs)

    def run():
        next(cycle)()
    t_end = time.perf_counter() + warm_s
    while time.perf_counter() < t_end:
        run()
        torch.cuda.synchronize()
    out = time_callable(run, sync=torch.cuda.synchronize, warmup=warmup, repeats=repeats,
                        min_run_s=min_run_s, timer=gpu_timer())
    out.update(status="ok", input_sets=len(runs), warm_s=warm_s)
    return out


def measure_vendor_fp8(target: str, dtype: str, shape, *, warmup: int = 2, repeats: int = 5,
                       min_run_s: float = 0.02, check: bool = True, operands: str = "fp8",
                       warm_s: float = 2 * GPU_WARM_S) -> dict:
    """cuBLAS's FP8 GEMM on the artifacts' operands, the first recipe that runs and is right."""
    import torch
    from lcmac.runtime.fp8_gemm import quantize, scaled_mm
    ins, ref, rows = gpu_inputs(dtype, shape)
    K = int(shape[2])
    refused = {}
    for name, blocks in RECIPES:
        a_block, w_block = blocks(K)

        def runner(A, B, a_block=a_block, w_block=w_block):
            qw, sw = quantize(B.t().contiguous(), w_block)      # the weight W = Bᵀ, once

            def run():
                qa, sa = quantize(A, a_block)
                return scaled_mm(qa, sa, a_block, qw, sw, w_block, out_dtype=A.dtype)
            return run
        try:
            runs = [runner(A, B) for A, B in ins]
            out = _timed(runs, ref, rows, warmup=warmup, repeats=repeats, min_run_s=min_run_s,
                         check=check, warm_s=warm_s)
        except Exception as e:  # noqa: BLE001 - a recipe this torch / cuBLASLt / GPU lacks
            out = {"status": "error", "error": f"{type(e).__name__}: {str(e)[:300]}"}
        torch.cuda.synchronize()
        if out["status"] == "ok":
            out["config"] = vendor_config(name, refused)
            return out
        refused[name] = out["error"]
    return {"status": "error", "error": f"no cuBLAS FP8 recipe ran: {refused}",
            "config": vendor_config(None, refused)}


def measure_artifact_fp8(path: str, target: str, dtype: str, shape, *, warmup: int = 2,
                         repeats: int = 5, min_run_s: float = 0.02, check: bool = True,
                         warm_s: float = GPU_WARM_S, paired: bool = False) -> dict:
    """An fp8 artifact with B̃ prepared once per input set (``prepare_b``), checked with the
    fp8 tolerance, timed as the vendor is."""
    import torch
    f = load(path)
    ins, ref, rows = gpu_inputs(dtype, shape)
    M, N = int(shape[0]), int(shape[1])

    def runner(A, B):
        C = torch.full((M, N), float("nan"), dtype=A.dtype, device=A.device)
        Bp = f.prepare_b(B)
        return lambda: f(A, Bp, out=C)
    out = _timed([runner(A, B) for A, B in ins], ref, rows, warmup=warmup, repeats=repeats,
                 min_run_s=min_run_s, check=check, warm_s=warm_s)
    if out["status"] == "ok":
        out["b_operand"] = "prepared once (prepare_b)"
    return out


def _safe_fp8(path, target, dtype, shape, vendor: bool = False, **kw) -> dict:
    try:
        if vendor:
            return measure_vendor_fp8(target, dtype, shape, **kw)
        return measure_artifact_fp8(path, target, dtype, shape, **kw)
    except Exception as e:  # noqa: BLE001 - reported as a failed trial
        return {"status": "error", "error": f"{type(e).__name__}: {e}"}


class Fp8MeasureWorker(MeasureWorker):
    """``MeasureWorker`` for the fp8 operand mode: the same kind of process, timeout and
    restart after a device fault, the fp8 vendor and checks."""

    measuring = staticmethod(_safe_fp8)
