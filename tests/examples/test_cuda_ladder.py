"""The GEMM optimisation ladder (examples/cuda_ladder) without a GPU: each step's generated CUDA
for sm_90a shows what the step is about, wrong requests are refused by name, and all seven
kernels compile with nvcc in one run.

Every code generation runs in one TileLang process (the example's ``generate``, called in a
loop: one TileLang import for all of them), and the seven bf16 kernels are compiled as one
translation unit (one nvcc run: the TileLang headers are parsed once).
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from tests.schedules.cuda.test_cuda_codegen import ROOT, kernel_body, needs_nvcc

EXAMPLE = os.path.join(ROOT, "examples", "cuda_ladder")
SHAPE = [512, 768, 256]            # M, N, K: whole tiles of every step, M != N

#: code generation of many requests in one TileLang process: the example's answer (or its
#: error), one JSON line each
_GENERATE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import run
for req in json.loads(sys.stdin.read()):
    try:
        r = {"ok": True, **run.generate(req["step"], req["shape"], req["dtype"], req["out_dir"],
                                         req["name"], **req["tile"])}
    except Exception as e:
        r = {"ok": False, "error": str(e), "error_type": type(e).__name__}
    print("\n" + json.dumps(r), flush=True)
"""


def _request(out_dir, name: str, step: int, dtype: str = "bfloat16", shape=SHAPE, **tile) -> dict:
    return {"step": step, "shape": shape, "dtype": dtype, "out_dir": str(out_dir / name),
            "name": name, "tile": tile}


REFUSED = {   # request → words its error must contain
    "step": (dict(step=8), "the GEMM ladder has steps 1..7, not 8"),
    "shape": (dict(step=3, shape=[520, 768, 256]), "multiples of its 128x128x16 tile, and 520x768x256 is not"),
    "tile": (dict(step=4, block_k=4), "ladder step 4 (vectorised): a 128x128x4 tile does not split"),
    "dtype": (dict(step=2, dtype="float64"), "not float64"),
}


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    """{request name: the example's answer}: the seven steps in bf16, steps 5–7 in float32, an
    overridden tile, the refusals."""
    if importlib.util.find_spec("tilelang") is None:
        pytest.skip("tilelang is not installed")
    out = tmp_path_factory.mktemp("ladder")
    reqs = {f"ladder{k}": _request(out, f"ladder{k}", k) for k in range(1, 8)}
    reqs.update({f"ladder{k}_f32": _request(out, f"ladder{k}_f32", k, "float32") for k in (5, 6, 7)})
    reqs["ladder3_64"] = _request(out, "ladder3_64", 3, block_n=64)
    for name, (kw, _) in REFUSED.items():
        kw = dict(kw)
        reqs[name] = _request(out, name, kw.pop("step"), **kw)
    p = subprocess.run([sys.executable, "-c", _GENERATE, EXAMPLE], input=json.dumps(list(reqs.values())),
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    lines = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    assert len(lines) == len(reqs), p.stderr[-3000:]
    return dict(zip(reqs, lines))


def _kernel(r: dict) -> tuple[dict, str]:
    """(launch facts, kernel body) of one step's generated source (one kernel)."""
    assert r["ok"], r.get("error")
    assert r["source"].endswith("_gemm.cu") and r["kernel"].endswith("_gemm_kernel")
    return r, kernel_body(open(r["source"]).read())


def test_naive_reads_global_memory_only(ladder):
    info, body = _kernel(ladder["ladder1"])
    assert ladder["ladder1"]["step"] == 1
    # one thread per C element: 32 x 32 threads per CTA, a grid of 768/32 x 512/32
    assert (info["grid"], info["block"], info["smem_bytes"]) == ([24, 16, 1], [1024, 1, 1], 0)
    assert "__shared__" not in body and "__syncthreads" not in body
    assert re.search(r"for \(int k = 0; k < 256; \+\+k\) \{\s*acc = \(acc \+ \(\(\(float\)A\[.*\]\) \* \(\(float\)B\[", body)


def test_shared_tiling_stages_slabs(ladder):
    info, body = _kernel(ladder["ladder2"])
    assert (info["grid"], info["block"], info["smem_bytes"]) == ([24, 16, 1], [1024, 1, 1], 2 * 32 * 32 * 2)
    assert "__shared__" in body and body.count("__syncthreads();") == 2
    # one element of each slab per thread, scalar loads; the products read shared memory only
    assert re.search(r"\(\(bfloat16_t\*\)A_shared\)\[\(\(int\)threadIdx.x\)\] = A\[", body)
    loop = body[body.index("for (int kk"):]
    assert "A_shared" in loop and "B_shared" in loop and "A[" not in loop and "B[" not in loop


def test_register_tiling_holds_a_micro_tile(ladder):
    info, body = _kernel(ladder["ladder3"])
    # 128 x 128 outputs, 8 x 8 per thread: 256 threads, K slabs of 16
    assert (info["grid"], info["block"], info["smem_bytes"]) == ([6, 4, 1], [256, 1, 1], 2 * 128 * 16 * 2)
    assert "float C_local[64];" in body and "bfloat16_t A_reg[8];" in body and "bfloat16_t B_reg[8];" in body
    assert "uint4" not in body.split("C_local_cast")[0]            # element-wise loads (the store is wide)
    # block_n is a knob: 128 x 64 outputs take 128 threads
    info64, _ = _kernel(ladder["ladder3_64"])
    assert (info64["grid"], info64["block"]) == ([12, 4, 1], [128, 1, 1])


def test_vectorised_loads_are_128_bits(ladder):
    info, body = _kernel(ladder["ladder4"])
    assert (info["grid"], info["block"], info["smem_bytes"]) == ([6, 4, 1], [256, 1, 1], 2 * 128 * 16 * 2)
    # global → registers, registers → shared (B as is, A transposed), shared → registers
    assert re.search(r"\*\(uint4\*\)\(A_vec \+ 0\) = \*\(uint4\*\)\(A \+ ", body)
    assert re.search(r"\*\(uint4\*\)\(B_vec \+ 0\) = \*\(uint4\*\)\(B \+ ", body)
    assert re.search(r"\*\(uint4\*\)\(\(\(bfloat16_t\*\)B_shared\) \+ [^;]*\) = \*\(uint4\*\)\(B_vec", body)
    assert re.search(r"\(\(bfloat16_t\*\)At_shared\)\[[^;]*\] = A_vec\[v\]", body)
    assert re.search(r"\*\(uint4\*\)\(A_reg \+ 0\) = \*\(uint4\*\)\(\(\(bfloat16_t\*\)At_shared\)", body)
    assert "cp_async" not in body and len(re.findall(r"for \(int ko", body)) == 1


def test_double_buffering_overlaps_loads_and_products(ladder):
    for name, vec in (("ladder5", "uint4"), ("ladder5_f32", "float4")):
        info, body = _kernel(ladder[name])
        # a 2-stage pipeline: slab 0 loaded before the loop, which then runs num_k - 1 times
        # (K 256 in slabs of 16 bf16 or 8 float32) and drains the last slab after it
        num_k = 256 // (16 if vec == "uint4" else 8)
        loop = body[body.index("for (int ko"):]
        loop = loop[:loop.index("\n  }\n")]
        assert f"for (int ko = 0; ko < {num_k - 1}; ++ko)" in loop, loop[:200]
        assert body.index(f"*({vec}*)(A_vec + 0) = *({vec}*)(A + ") < body.index("for (int ko")
        # in the loop: slab k+1's global loads, then slab k's products, then slab k+1's stores
        load_next = loop.index(f"*({vec}*)(B_vec + 0) = *({vec}*)(B + ")
        products = loop.index("C_local[")
        store_next = loop.index("At_shared)[")
        assert load_next < products < store_next, (load_next, products, store_next)
        assert info["block"] == [256, 1, 1]


def test_tensor_cores_use_mma_sync(ladder):
    info, body = _kernel(ladder["ladder6"])
    # 2 warps of 64 x 64 (a multiple of 4 warps would make TileLang pick wgmma on sm_90a)
    assert (info["grid"], info["block"]) == ([12, 4, 1], [64, 1, 1])
    assert info["smem_bytes"] == (128 * 64 + 64 * 64) * 2            # one buffer per operand
    assert "tl::mma_sync<tl::DataType::kBFloat16" in body and "tl::ptx_ldmatrix_x4" in body
    for absent in ("wgmma", "tma_load", "cp_async", "mbarrier"):
        assert absent not in body, absent
    _, f32 = _kernel(ladder["ladder6_f32"])
    assert "tl::mma_sync<tl::DataType::kTensorFloat32" in f32       # float32 as TF32


def test_async_tensor_cores_are_the_production_gemm(ladder):
    info, body = _kernel(ladder["ladder7"])
    # the plain GEMM template: TMA loads into a 4-stage pipeline, wgmma, a TMA producer warpgroup
    assert (info["grid"], info["block"]) == ([3, 4, 1], [384, 1, 1])
    assert info["smem_bytes"] == 4 * (128 * 64 + 64 * 256) * 2
    assert "tl::tma_load(A_desc" in body and "tl::wgmma_ss<tl::DataType::kBFloat16" in body
    assert "mbarrier" in body and "mma_sync" not in body
    _, f32 = _kernel(ladder["ladder7_f32"])
    # float32: TF32 mma.sync (TileLang has TF32 wgmma only for K-major B), still TMA-fed
    assert "tl::mma_sync<tl::DataType::kTensorFloat32" in f32 and "tl::tma_load(A_desc" in f32


def test_every_step_waits_for_the_previous_kernel(ladder):
    # TileLang launches with programmatic dependent launch allowed: each kernel must wait
    # (griddepcontrol.wait) before reading A and B
    for k in range(1, 8):
        _, body = _kernel(ladder[f"ladder{k}"])
        assert "cudaGridDependencySynchronize()" in body, k


def test_wrong_requests_are_refused_by_name(ladder):
    for name, (_, words) in REFUSED.items():
        r = ladder[name]
        assert not r["ok"] and words in r["error"], (name, r.get("error"))
    r = ladder["dtype"]
    assert not r["ok"] and r["error_type"] == "NotSupportedYet", r
    assert "ladder step 2 (shared_tiling)" in r["error"] and "not float64" in r["error"]


@needs_nvcc
def test_all_steps_compile_for_sm90a(ladder, tmp_path):
    """The seven bf16 kernels as one translation unit (the device code of each generated
    source), one nvcc run for sm_90a: every kernel compiles, none spills."""
    from lcmac.targets import cuda as host
    parts = []
    for k in range(1, 8):
        src = open(ladder[f"ladder{k}"]["source"]).read()
        parts.append(src[:src.index("#include <cutlass/cuda_host_adapter.hpp>")])   # the kernel
    unit = tmp_path / "ladder.cu"
    unit.write_text("\n".join(parts))
    root = os.path.dirname(importlib.util.find_spec("tilelang").origin)
    cmd = [host.find_nvcc(), *host.nvcc_flags("sm_90a", host.tilelang_include_dirs(root)),
           "-c", str(unit), "-o", str(tmp_path / "ladder.o")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    report = dict(re.findall(r"Compiling entry function '(\w+)' for 'sm_90a'\n.*?\n\s*\d+ bytes stack frame, "
                             r"(\d+) bytes spill stores", p.stderr))
    assert sorted(report) == [f"ladder{k}_gemm_kernel" for k in range(1, 8)], p.stderr[-3000:]
    assert all(v == "0" for v in report.values()), report
