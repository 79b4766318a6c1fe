"""CUDA back end, host side: nvcc invocation and the C-ABI entry point.

Imports neither TileLang nor TVM.  The TileLang worker (``tilelang_worker.py``) turns each
template into CUDA source that already holds a small host launcher (TileLang's own wrapper:
TMA descriptors, dynamic shared memory, ``cudaLaunchKernelEx``); here those launchers are
renamed per kernel, an entry file chains them, and nvcc links everything into one plain
``.so`` (cubin inside, CUDA runtime linked statically).  Loading it needs only ctypes and the
driver (``lcmac.runtime.cuda_loader``).

Entry points of an artifact library:

    int         lcmac_init(void);                       // once per process (smem attributes)
    int         lcmac_run(const void* A, const void* B, void* C, void* workspace,
                          void* stream);                // enqueue on the stream, no sync
    const char* lcmac_last_error(void);
    long long   lcmac_workspace_bytes(void);
    long long   lcmac_prepared_b_bytes(void);               // -1: B cannot be prepared
    int         lcmac_prepare_b(const void* B, void* P, void* stream);   // B-side kernels → P
    int         lcmac_run_prepared(const void* A, const void* P, void* C, void* workspace,
                                   void* stream);       // the rest, B̃ read from P

A prepared B (``prepared_b_plan``) is the output of the kernels that read B alone — the
combines of B into B̃ — kept by the caller, so a static B (a weight matrix) is combined once.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

from lcmac.core.errors import ToolchainError

NVCC_CANDIDATES = ("/usr/local/bin/nvcc", "/usr/local/cuda/bin/nvcc")


def find_nvcc() -> str:
    env = os.environ.get("LCMAC_NVCC")
    if env:
        return env
    p = shutil.which("nvcc")
    if p:
        return p
    for c in NVCC_CANDIDATES:
        if os.path.exists(c):
            return c
    raise ToolchainError("nvcc not found: install the CUDA toolkit (12.x/13.x) or set LCMAC_NVCC")


def gencode(arch: str) -> list[str]:
    """Explicit -gencode (the -arch=sm_90a shorthand can run a plain sm_90 pass that rejects
    wgmma/setmaxnreg)."""
    num = arch.replace("sm_", "")
    return ["-gencode", f"arch=compute_{num},code=sm_{num}"]


def tilelang_include_dirs(tl_root: str) -> list[str]:
    return [os.path.join(tl_root, "src"), os.path.join(tl_root, "3rdparty", "cutlass", "include")]


def nvcc_flags(arch: str, includes: list[str]) -> list[str]:
    return (["-std=c++20", "-O3", "-w", "-Xcudafe", "--diag_suppress=177", "-lineinfo",
             "-Xcompiler", "-fPIC", "--ptxas-options=--verbose"]
            + gencode(arch) + [f"-I{d}" for d in includes])


def rename_launcher(code: str, func_name: str, kname: str) -> str:
    """Give one TileLang-wrapped source unique symbols so several link into one .so."""
    code = code.replace(f"{func_name}_kernel", f"{kname}_kernel")
    code = re.sub(r'extern "C" TL_EXPORT const char\* get_last_error\(\)',
                  f'extern "C" const char* {kname}_get_last_error()', code)
    code = re.sub(r'extern "C" TL_EXPORT int init\(\)', f'extern "C" int {kname}_init()', code)
    code = re.sub(r'extern "C" TL_EXPORT int call\(', f'extern "C" int {kname}_call(', code)
    return code


def _slice_bytes(workspace: list[tuple[str, int]]) -> dict[str, int]:
    """{buffer name: bytes} of a workspace layout [(name, offset)] ending in ("__end__", total)."""
    return {n: nxt - off for (n, off), (_, nxt) in zip(workspace, workspace[1:])}


def prepared_b_plan(kernels: list[dict], workspace: list[tuple[str, int]],
                    zero: list[str] = (), b_bytes: int = 0) -> dict:
    """Which kernels depend on B alone, so that B can be combined once and reused (static
    weights): ``{"kernels": [...], "buffers": [[name, offset, bytes]], "bytes": n}``, or
    ``{"unsupported": reason}``.  A kernel is B-side when it reads B and neither A nor C;
    its other buffers then live in the caller's prepared-B buffer instead of the workspace,
    which is only sound when no A-side kernel (one that reads A to write a workspace buffer:
    not a GEMM stage or Combine H, whose outputs are H or C) touches them.  Where a later
    kernel reads B itself (the GEMM stage's in-place operands, ``direct_views``), the prepared
    buffer also holds a copy of B (``b_bytes``), buffer "B"."""
    bside = [k for k in kernels if "B" in k["args"] and "A" not in k["args"] and "C" not in k["args"]]
    if not bside:
        return {"unsupported": "B is read directly by the GEMM (plain GEMM): nothing to prepare"}
    names = sorted({a for k in bside for a in k["args"] if a != "B"}, key=[n for n, _ in workspace].index)
    aside = [k for k in kernels if "A" in k["args"] and not {"H", "C"} & set(k["args"])]
    shared = sorted({a for k in aside for a in k["args"] if a in names} | {n for n in zero if n in names})
    if shared:
        return {"unsupported": f"the B-side buffer(s) {', '.join(shared)} are shared with the A "
                               f"side (e.g. one amax scale slot per operand in operands='fp16'/"
                               f"'fp16x2')"}
    size = _slice_bytes(workspace)
    if any("B" in k["args"] for k in kernels if k not in bside):
        names, size = names + ["B"], dict(size, B=b_bytes)
    off, bufs = 0, []
    for n in names:
        bufs.append([n, off, size[n]])
        off += -(-size[n] // 256) * 256
    return {"kernels": [k["name"] for k in bside], "buffers": bufs, "bytes": off}


def _launches(kernels: list[dict]) -> list[str]:
    """C lines launching ``kernels`` in order on stream ``s`` from ``bufs_<name>`` pointers,
    each checked (its launcher's error, then the CUDA runtime's)."""
    lines = []
    for k in kernels:
        args = ", ".join(f"bufs_{a}" for a in k["args"])
        lines.append(f'  if ({k["name"]}_call({args}, s) != 0) {{ snprintf(lcmac_err, sizeof lcmac_err, '
                     f'"{k["name"]}: %s", {k["name"]}_get_last_error()); return -1; }}')
        lines.append('  { cudaError_t e = cudaGetLastError(); if (e != cudaSuccess) { '
                     f'snprintf(lcmac_err, sizeof lcmac_err, "{k["name"]}: %s", cudaGetErrorString(e)); '
                     'return -2; } }')
    return lines


# What TileLang 0.1.15 emits for a pipelined loop whose B slab is a cluster multicast
# (T.copy_cluster): rank 0 writes each slab into both CTAs' shared memory, but its producer
# waits only for its *own* consumers to free a stage, no CTA waits for its peer's barriers to
# be initialised, and a CTA may exit while its peer still signals it.  cluster_pipeline
# completes that protocol (as CUTLASS's PipelineTmaAsync does for 2x1 clusters).
_BARRIER_INIT_SYNC = "  tl::fence_barrier_init();\n  __syncthreads();\n"
_EMPTY_INIT = re.compile(r"mbarrier\[(\d+)\]\.init\((\d+)\);")
# a consumer's "stage free" arrival: barrier stages + (k mod stages), or stages + k where
# the loop is no longer than the pipeline
_RELEASE = (r"(?P<ind>[ ]*)(?P<bar>mbarrier\[\((?:\(\w+ [&%] \d+\)|\w+) \+ {stages}\)\])"
            r"\.arrive\(\);\n")
_KERNEL_END = "\n}\n\n#include <cutlass/cuda_host_adapter.hpp>"


def cluster_pipeline(code: str, stages: int, consumers: int) -> str:
    """Make a 2-CTA multicast pipeline (``CudaConfig.cluster``) safe:

    * the barriers are initialised cluster-wide before any CTA loads (cluster_sync instead of
      __syncthreads), as rank 0's multicast completes transactions on rank 1's barriers;
    * rank 0's "stage free" barriers also count one arrival per consumer warpgroup of rank 1
      (their thread 0 arrives remotely after its wgmmas on the stage have retired), so rank 0
      never overwrites a stage rank 1 is still reading;
    * both CTAs meet at a cluster_sync before exiting (rank 1 may still be signalling rank
      0's shared memory).

    ``consumers``: consumer threads per CTA.  The generated source must have exactly the
    form described above; anything else raises rather than producing a kernel that races."""
    inits = [(int(i), int(n)) for i, n in _EMPTY_INIT.findall(code)]
    empty = [i for i, n in inits if n == consumers]
    release = re.compile(_RELEASE.format(stages=stages))
    releases = release.findall(code)
    if (code.count(_BARRIER_INIT_SYNC) != 1 or code.count(_KERNEL_END) != 1 or len(inits) != 2 * stages
            or empty != list(range(stages, 2 * stages)) or len(releases) != 1
            or "return;" in code.split(_KERNEL_END)[0]):
        raise ToolchainError("cluster=2: TileLang's generated GEMM loop for this shape does not have "
                             "the pipelined multicast form this build completes (a K of one slab, "
                             "or another TileLang version); build with cluster=1")
    code = code.replace(_BARRIER_INIT_SYNC, "  tl::fence_barrier_init();\n  tl::cluster_sync();\n")
    peers = consumers // 128
    for i in empty:
        code = code.replace(f"mbarrier[{i}].init({consumers});",
                            f"mbarrier[{i}].init({consumers} + (tl::block_rank_in_cluster() == 0 ? {peers} : 0));")
    code = release.sub(lambda m: (f"{m['ind']}{m['bar']}.arrive();\n"
                                   f"{m['ind']}if (tl::block_rank_in_cluster() == 1 && (((int)threadIdx.x) & 127) == 0) "
                                   f"{m['bar']}.arrive(0u);\n"), code)
    return code.replace(_KERNEL_END, "\n  tl::cluster_sync();" + _KERNEL_END)


# TileLang 0.1.15 waits for every TMA reduction's reads of shared memory right after issuing
# it (T.atomic_add(..., use_tma) has no asynchronous form, unlike T.tma_copy for stores)
_ADD_THEN_WAIT = re.compile(r"(tl::tma_store_add\([^;]*\);\n(?:[ ]*\}\n)?[ ]*tl::tma_store_arrive\(\);\n)"
                            r"[ ]*tl::tma_store_wait<0, true>\(\);\n")


def async_reduce_stores(code: str) -> str:
    """Drop the wait after each TMA reduction of the epilogue of
    ``schedules.cuda.fused.reduce_gemm_h``, which waits itself before it writes the shared
    tile again (and before the CTA exits).
    The generated source must have that form; anything else raises."""
    out, n = _ADD_THEN_WAIT.subn(r"\1", code)
    if n == 0 or n != code.count("tl::tma_store_add("):
        raise ToolchainError("tma_reduce: TileLang's generated epilogue does not have the form "
                             "this build makes asynchronous (another TileLang version?); build "
                             "with tma_reduce=False")
    return out


# A kernel that begins with the PDL wait (cudaGridDependencySynchronize) loses TileLang's
# __restrict__ on its pointers; without it nvcc may not move a load above an earlier store
#: the element-wise kernels (name prefixes) whose pointers are always distinct buffers
STREAMING_KERNELS = ("combine", "transpose_b", "amax", "split_fixup")
_POINTER_PARAM = re.compile(r"((?:const )?\w+\*)( \w+[,)])")


def restrict_pointers(code: str, kname: str) -> str:
    """Mark every pointer parameter of a streaming kernel (``STREAMING_KERNELS``: combines,
    amax passes, the split-group fixup) ``__restrict__``: its operands are distinct buffers
    (the caller's A, B or C and workspace slices), so loads of later elements may be issued
    before the stores of earlier ones and go through the read-only path (Strassen²'s Combine H
    at 16384³: 0.96 → 0.80 ms on the H100).  Both the declaration and the definition are
    rewritten (pointers that have it keep theirs); a source without exactly those two raises."""
    sig = re.compile(r'(extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?\w*' +
                     re.escape(kname) + r'_kernel\()([^)]*\))')
    found = sig.findall(code)
    if len(found) != 2:
        raise ToolchainError(f"{kname}: the generated kernel's signature does not have the form "
                             "restrict_pointers rewrites (another TileLang version?)")
    return sig.sub(lambda m: m.group(1) + _POINTER_PARAM.sub(r"\1 __restrict__\2", m.group(2)), code)


# The batched GEMM with single-block operands read in place (CudaConfig.direct_views) is
# written against one [R, rows, Q, cols] tensor per view side, indexed by the product r;
# TileLang makes one TMA descriptor of it.  Here that descriptor becomes two, the input's
# own block view and the workspace's, and each load looks r up in a table of sources.
_VIEW_LOAD = """
// lcmac: product r's operand is workspace slot s >= 0, or block (p, q) of the input, s = -1 - (p*Q + q)
__constant__ int lcmac_{t}_src[{R}] = {{{table}}};
template <typename BarrierType>
__device__ __forceinline__ void lcmac_view_load_{t}(const CUtensorMap& view, const CUtensorMap& ws,
    BarrierType& bar, void const* const smem, int32_t const& c0, int32_t const& c1,
    int32_t const& c2, int32_t const& r) {{
  const int s = lcmac_{t}_src[r];
  if (s >= 0) {{
    tl::tma_load(ws, bar, smem, c0, c1, 0, s);
  }} else {{
    tl::tma_load(view, bar, smem, c0, c1, (-1 - s) % {Q}, (-1 - s) / {Q});
  }}
}}
"""


def _desc_block(code: str, desc: str) -> str:
    """The host wrapper's lines that build TMA descriptor ``desc`` (exactly one block)."""
    m = re.findall(r"\tCUtensorMap " + desc + r";\n(?:.*\n)*?\t\}\n", code)
    if len(m) != 1:
        raise ToolchainError(f"direct_views: no single descriptor block for {desc} in the generated "
                             "host code (another TileLang version?); build with direct_views='none'")
    return m[0]


def view_loads(code: str, kname: str, sides: list[dict]) -> str:
    """Split each view side's descriptor (``sides``: [{"tensor": "At", "input": "A",
    "blocks_per_row": Q, "sources": per-product source (``schedules.cuda.config.operand_sources``),
    "virtual_dims"/"_strides" (what TileLang made of the tensor it was given), "view_dims",
    "ws_dims", "ws_strides"}], dims and byte strides innermost first as cuTensorMapEncodeTiled
    takes them) into the input's descriptor and the workspace's: the device loads go through
    ``lcmac_view_load_<tensor>``, the kernel and its launch take the second descriptor, the
    host builds it from the input pointer.  The generated source must have exactly the
    expected form; anything else raises."""
    def need(cond, what):
        if not cond:
            raise ToolchainError(f"direct_views: {kname}'s generated source does not have the form "
                                 f"this build rewrites ({what}; another TileLang version?); build "
                                 "with direct_views='none'")

    helpers = []
    for sd in sides:
        t, x = sd["tensor"], sd["input"]
        td, xd = f"{t}_desc", f"{x}_desc"
        param = f"__grid_constant__ const CUtensorMap {td}"
        need(code.count(param + ",") == 2, f"kernel parameter {td}")
        code = code.replace(param + ",", f"{param}, __grid_constant__ const CUtensorMap {xd},")
        loads = code.count(f"tl::tma_load({td}, ")
        need(loads >= 1, f"TMA loads from {td}")
        code = code.replace(f"tl::tma_load({td}, ", f"lcmac_view_load_{t}({xd}, {td}, ")
        helpers.append(_VIEW_LOAD.format(t=t, R=len(sd["sources"]), Q=sd["blocks_per_row"],
                                         table=", ".join(map(str, sd["sources"]))))
        pre = f"tl::prefetch_tma_descriptor({td});"
        need(code.count(pre) == 1, f"prefetch of {td}")
        code = code.replace(pre, f"{pre}\n    tl::prefetch_tma_descriptor({xd});")
        block = _desc_block(code, td)
        dim_line = "cuuint64_t {}_globalDim[4]= {{{}}};".format
        stride_line = "cuuint64_t {}_globalStride[4]= {{{}}};".format
        address = "void *{}_globalAddress= {};".format
        csv = lambda v: ",".join(map(str, v))  # noqa: E731
        virt = [dim_line(td, csv(sd["virtual_dims"])), stride_line(td, csv(sd["virtual_strides"])),
                address(td, t)]
        need(all(block.count(line) == 1 for line in virt), f"the 4-D descriptor of {td}")
        ws = (block.replace(virt[0], dim_line(td, csv(sd["ws_dims"])))
              .replace(virt[1], stride_line(td, csv(sd["ws_strides"]))))
        view = (block.replace(virt[0], dim_line(td, csv(sd["view_dims"]))).replace(virt[2], address(td, x))
                .replace(td, xd))
        code = code.replace(block, ws + "\n" + view)
        launch = re.findall(r"cudaLaunchKernelEx\(&config, \w+_kernel, [^;]*" + td + r", ", code)
        need(len(launch) == 1, f"the launch passing {td}")
        code = code.replace(launch[0], launch[0] + f"{xd}, ")
    head = code.index('extern "C" __global__')
    return code[:head] + "".join(helpers) + "\n" + code[head:]


def entry_source(kernels: list[dict], workspace: list[tuple[str, int]],
                 zero: list[str] = (), prepared: dict | None = None) -> str:
    """kernels: [{"name", "args": [buffer names in call order]}] in launch order.

    Buffers: A, B, C (user) and workspace slices (name, byte offset); ``zero``: workspace
    slices cleared (cudaMemsetAsync, same stream) before the first kernel (atomic maxima).
    ``prepared``: ``prepared_b_plan``'s answer — ``lcmac_prepare_b`` runs the B-side kernels
    into the caller's buffer P, ``lcmac_run_prepared`` runs the others reading them from P
    (both return -3 with the reason when the artifact cannot prepare B)."""
    prepared = prepared or {"unsupported": "not generated"}
    lines = ['#include <cuda_runtime.h>', '#include <cstdio>', '#include <cstring>', '']
    for k in kernels:
        params = ", ".join("int" if a in SCALAR_ARGS else "void*" for a in k["args"])
        lines.append(f'extern "C" int {k["name"]}_init();')
        lines.append(f'extern "C" int {k["name"]}_call({params}, cudaStream_t);')
        lines.append(f'extern "C" const char* {k["name"]}_get_last_error();')
    total = max([off for _, off in workspace] + [0])
    lines += ['', 'static char lcmac_err[1024];',
              'extern "C" const char* lcmac_last_error() { return lcmac_err; }',
              f'extern "C" long long lcmac_workspace_bytes() {{ return {total}LL; }}',
              'extern "C" int lcmac_init() {', '  lcmac_err[0] = 0;']
    for k in kernels:
        lines.append(f'  if ({k["name"]}_init() != 0) {{ snprintf(lcmac_err, sizeof lcmac_err, '
                     f'"%s", {k["name"]}_get_last_error()); return -1; }}')
    lines += ['  return 0;', '}', '']

    def slices(skip=()):
        return [f'  void* bufs_{name} = (void*)(w + {off}LL);'
                for name, off in workspace if name != "__end__" and name not in skip]

    size = _slice_bytes(workspace)
    memsets = [f'  if (cudaMemsetAsync(bufs_{name}, 0, {size[name]}, s) != cudaSuccess) {{ '
               f'snprintf(lcmac_err, sizeof lcmac_err, "memset {name}: %s", '
               'cudaGetErrorString(cudaGetLastError())); return -2; }' for name in zero]
    if any("batch" in k["args"] for k in kernels):
        return "\n".join(lines + _batched_entry(kernels))
    if any("nnzb" in k["args"] for k in kernels):
        return "\n".join(lines + _bsr_entry(kernels))
    lines += ['extern "C" int lcmac_run(const void* A, const void* B, void* C, void* ws, void* stream) {',
              '  cudaStream_t s = (cudaStream_t)stream;', '  lcmac_err[0] = 0;',
              '  char* w = (char*)ws; (void)w;',
              '  void* bufs_A = (void*)A; void* bufs_B = (void*)B; void* bufs_C = C;']
    lines += slices() + memsets + _launches(kernels) + ['  return 0;', '}', '']
    if "unsupported" in prepared:
        why = prepared["unsupported"].replace('"', "'")
        lines += ['extern "C" long long lcmac_prepared_b_bytes() { return -1LL; }',
                  'extern "C" int lcmac_prepare_b(const void* B, void* P, void* stream) {',
                  f'  snprintf(lcmac_err, sizeof lcmac_err, "cannot prepare B: %s", "{why}"); return -3;', '}',
                  'extern "C" int lcmac_run_prepared(const void* A, const void* P, void* C, void* ws, void* stream) {',
                  f'  snprintf(lcmac_err, sizeof lcmac_err, "cannot prepare B: %s", "{why}"); return -3;', '}', '']
        return "\n".join(lines)
    pb = {n: off for n, off, _ in prepared["buffers"]}
    bnames = set(prepared["kernels"])
    in_p = {n: f'  void* bufs_{n} = (void*)(p + {off}LL);' for n, off in pb.items()}
    # where the GEMM stage reads blocks of B in place, P holds a copy of B (buffer "B")
    copy_b = []
    if "B" in pb:
        size_b = next(b for n, _, b in prepared["buffers"] if n == "B")
        copy_b = [f'  if (cudaMemcpyAsync(p + {pb["B"]}LL, B, {size_b}LL, cudaMemcpyDeviceToDevice, s) != '
                  'cudaSuccess) { snprintf(lcmac_err, sizeof lcmac_err, "copy of B: %s", '
                  'cudaGetErrorString(cudaGetLastError())); return -2; }']
    lines += [f'extern "C" long long lcmac_prepared_b_bytes() {{ return {prepared["bytes"]}LL; }}',
              'extern "C" int lcmac_prepare_b(const void* B, void* P, void* stream) {',
              '  cudaStream_t s = (cudaStream_t)stream;', '  lcmac_err[0] = 0;',
              '  char* p = (char*)P; void* bufs_B = (void*)B;']
    lines += ([ln for n, ln in in_p.items() if n != "B"] + _launches([k for k in kernels if k["name"] in bnames])
              + copy_b + ['  return 0;', '}', ''])
    lines += ['extern "C" int lcmac_run_prepared(const void* A, const void* P, void* C, void* ws, void* stream) {',
              '  cudaStream_t s = (cudaStream_t)stream;', '  lcmac_err[0] = 0;',
              '  char* w = (char*)ws; (void)w; char* p = (char*)P;',
              '  void* bufs_A = (void*)A; void* bufs_C = C;']
    lines += slices(skip=pb) + list(in_p.values()) + memsets + _launches([k for k in kernels if k["name"] not in bnames])
    lines += ['  return 0;', '}', '']
    return "\n".join(lines)


#: kernel arguments passed as int (TileLang's dynamic dimensions), not as pointers
SCALAR_ARGS = ("batch", "nnzb", "K", "N", "M")


def _refusals(refuse: str) -> list[str]:
    """``lcmac_run`` and the prepared-B entries of an artifact that has its own entry point,
    each refusing with ``refuse`` (a C statement setting the error and returning)."""
    return ['extern "C" int lcmac_run(const void* A, const void* B, void* C, void* ws, void* stream) {',
            '  (void)A; (void)B; (void)C; (void)ws; (void)stream;', refuse, '}',
            'extern "C" long long lcmac_prepared_b_bytes() { return -1LL; }',
            'extern "C" int lcmac_prepare_b(const void* B, void* P, void* stream) {',
            '  (void)B; (void)P; (void)stream;', refuse, '}',
            'extern "C" int lcmac_run_prepared(const void* A, const void* P, void* C, void* ws, void* stream) {',
            '  (void)A; (void)P; (void)C; (void)ws; (void)stream;', refuse, '}', '']


def _bsr_entry(kernels: list[dict]) -> list[str]:
    """``lcmac_run_bsr(A, B, C, row_ptr, col_idx, nnzb, K, N, M, ws, stream)`` for a
    block-sparse artifact (``CudaConfig.bsr``: A the nnzb blocks sorted by block row, the CSR
    arrays int32); the sizes are checked for the kernel's int arguments, the shapes against
    one another by the caller (``runtime.cuda_loader``)."""
    refuse = ('  snprintf(lcmac_err, sizeof lcmac_err, "this artifact multiplies a block-sparse A: '
              'call lcmac_run_bsr"); return -3;')
    return (['extern "C" int lcmac_run_bsr(const void* A, const void* B, void* C, const void* row_ptr, '
             'const void* col_idx, long long nnzb, long long K, long long N, long long M, void* ws, '
             'void* stream) {',
             '  cudaStream_t s = (cudaStream_t)stream;', '  lcmac_err[0] = 0; (void)ws;',
             '  if (nnzb < 1 || K < 1 || N < 1 || M < 1 || nnzb > 2147483647LL || K > 2147483647LL || '
             'M * N > 2147483647LL) { snprintf(lcmac_err, sizeof lcmac_err, "nnzb, K, N and M must be '
             'positive and M*N, K and nnzb below 2^31 (got %lld, %lld, %lld, %lld)", nnzb, K, N, M); '
             'return -4; }',
             '  int bufs_nnzb = (int)nnzb; int bufs_K = (int)K; int bufs_N = (int)N; int bufs_M = (int)M;',
             '  void* bufs_A = (void*)A; void* bufs_B = (void*)B; void* bufs_C = C;',
             '  void* bufs_row_ptr = (void*)row_ptr; void* bufs_col_idx = (void*)col_idx;']
            + _launches(kernels) + ['  return 0;', '}', ''] + _refusals(refuse))


def _batched_entry(kernels: list[dict]) -> list[str]:
    """``lcmac_run_batched(A, B, C, batch, ws, stream)`` for a batched artifact (kernels taking
    the batch count), and ``lcmac_run`` / prepared-B entries that refuse with the reason."""
    refuse = ('  snprintf(lcmac_err, sizeof lcmac_err, "this artifact multiplies batches of '
              'products: call lcmac_run_batched"); return -3;')
    return (['extern "C" int lcmac_run_batched(const void* A, const void* B, void* C, long long batch, '
            'void* ws, void* stream) {',
            '  cudaStream_t s = (cudaStream_t)stream;', '  lcmac_err[0] = 0; (void)ws;',
            '  if (batch < 0 || batch > 2147483647LL) { snprintf(lcmac_err, sizeof lcmac_err, '
            '"batch must be 0 .. 2^31-1, not %lld", batch); return -4; }',
            '  if (batch == 0) return 0;',
            '  int bufs_batch = (int)batch;',
            '  void* bufs_A = (void*)A; void* bufs_B = (void*)B; void* bufs_C = C;']
            + _launches(kernels) + ['  return 0;', '}', ''] + _refusals(refuse))


def compile_so(sources: list[str], out_so: str, arch: str, includes: list[str],
               jobs: int = 2, timeout: float = 900) -> dict:
    """Compile each .cu to an object (in parallel), link one shared library. Returns the
    ptxas resource report per source."""
    nvcc = find_nvcc()
    flags = nvcc_flags(arch, includes)

    def one(src):
        obj = src[:-3] + ".o"
        cmd = [nvcc, *flags, "-c", src, "-o", obj]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise ToolchainError(f"nvcc failed on {src}:\n{' '.join(cmd)}\n{p.stderr[-4000:]}")
        return obj, p.stderr

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        results = list(ex.map(one, sources))
    objs = [o for o, _ in results]
    # TileLang's debug.h defines (identical) non-inline helpers in every source
    cmd = [nvcc, "--shared", *gencode(arch), "-Xcompiler", "-fPIC",
           "-Xlinker", "--allow-multiple-definition", *objs, "-o", out_so]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise ToolchainError(f"nvcc link failed:\n{' '.join(cmd)}\n{p.stderr[-4000:]}")
    for o in objs:
        os.remove(o)
    report = {}
    for src, (_, err) in zip(sources, results):
        regs = re.findall(r"Used (\d+) registers", err)
        spills = re.findall(r"(\d+) bytes spill stores", err)
        report[os.path.basename(src)] = {"registers": [int(x) for x in regs],
                                         "spill_stores": [int(x) for x in spills]}
    return report
