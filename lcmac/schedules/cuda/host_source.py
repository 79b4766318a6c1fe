"""The host-side rewrites of the CUDA that TileLang generates for lcmac's templates.

TileLang lowers each template to CUDA source that already holds a small host launcher (its
wrapper: TMA descriptors, dynamic shared memory, ``cudaLaunchKernelEx``).  Before the kernels
of one artifact are linked into one library (``lcmac.schedules.cuda.entry_point`` chains
them), each source is made ready here (``kernel_source``):

    rename_launcher      unique symbols per kernel, so several link into one ``.so``
    cluster_pipeline     a 2-CTA multicast pipeline made safe (``CudaConfig.cluster``)
    async_reduce_stores  the TMA-engine epilogue's reductions left in flight (``tma_reduce``)
    restrict_pointers    ``__restrict__`` back on the streaming kernels' pointers
    view_loads           operands read in place through two descriptors (``direct_views``)
    dmma_pairs           float64's m8n8k4 products paired into m16n8k4 (``dmma``, sm_90a)
    persistent_steps     a persistent pipeline over a run-time K walked tile by tile, k by k

Each rewrite checks that the generated source has exactly the form it rewrites and raises
otherwise (another TileLang version), rather than produce a kernel that races.  Imports
neither TileLang nor TVM.
"""
from __future__ import annotations

import re

from lcmac.core.errors import ToolchainError

__all__ = ["rename_launcher", "cluster_pipeline", "async_reduce_stores", "STREAMING_KERNELS",
           "restrict_pointers", "view_loads", "dmma_pairs", "persistent_steps", "launch_info", "kernel_source"]


def rename_launcher(code: str, func_name: str, kname: str) -> str:
    """Give one TileLang-wrapped source unique symbols so several link into one .so."""
    code = code.replace(f"{func_name}_kernel", f"{kname}_kernel")
    code = re.sub(r'extern "C" TL_EXPORT const char\* get_last_error\(\)',
                  f'extern "C" const char* {kname}_get_last_error()', code)
    code = re.sub(r'extern "C" TL_EXPORT int init\(\)', f'extern "C" int {kname}_init()', code)
    code = re.sub(r'extern "C" TL_EXPORT int call\(', f'extern "C" int {kname}_call(', code)
    return code


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
    before the stores of earlier ones and go through the read-only path (docs/cuda-templates.md
    has what it gains).  Both the declaration and the definition are rewritten (pointers that
    have it keep theirs); a source without exactly those two raises."""
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
    "blocks_per_row": Q, "sources": per-product source (``lcmac.spec.cuda.operand_sources``),
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


# float64 GEMM stages (CudaConfig.dmma="m16n8k4", sm_90a): TileLang 0.1.15 emits the fp64
# tensor-core product as m8n8k4 mma.sync, one per 8-row tile i of a warp's rows and 8-column
# tile j.  m16n8k4 (sm_90) is two of them sharing the B fragment: its a0/c0,c1 are m8n8k4's
# a/c of rows 0-7, a1/c2,c3 those of rows 8-15 (the PTX ISA's fragment layouts), so tiles i
# and i + 1 of the same j become one instruction, half as many issued.
_DMMA_PAIR = """
// lcmac: two m8n8k4 fp64 products sharing B (row tiles i, i + 1) as one m16n8k4
__device__ __forceinline__ void lcmac_dmma_m16n8k4(double* c01, double* c23, const double* a,
                                                   const double* b) {
  asm volatile("mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5}, "
               "{%6}, {%0, %1, %2, %3};\\n"
               : "+d"(c01[0]), "+d"(c01[1]), "+d"(c23[0]), "+d"(c23[1])
               : "d"(a[0]), "d"(a[1]), "d"(b[0]));
}
"""
_DMMA_8x8x4 = ("tl::mma_sync<tl::DataType::kFloat64, tl::DataType::kFloat64, "
               "tl::DataType::kFloat64, 8, 8, 4, false, true>")
_DMMA_LOOP = re.compile(
    r"for \(int (?P<i>\w+) = 0; (?P=i) < (?P<e>\d+); \+\+(?P=i)\) \{\n"
    r"(?P<ind>[ ]*)for \(int (?P<j>\w+) = 0; (?P=j) < (?P<f>\d+); \+\+(?P=j)\) \{\n"
    r"[ ]*" + re.escape(_DMMA_8x8x4) +
    r"\(reinterpret_cast<double\*>\((?P<c>\w+) \+ \(\((?P=i) \* (?P<s>\d+)\) \+ \((?P=j) \* 2\)\)\), "
    r"reinterpret_cast<const double\*>\((?P<a>\w+) \+ (?P=i)\), "
    r"reinterpret_cast<const double\*>\((?P<b>\w+) \+ (?P=j)\)\);\n")


def dmma_pairs(code: str, kname: str) -> str:
    """Every fp64 m8n8k4 mma.sync of ``kname``'s GEMM loop as half as many m16n8k4
    (``_DMMA_PAIR``): the row-tile loop steps by two and each step issues one m16n8k4 for
    tiles i and i + 1.  Every m8n8k4 must sit in a loop of that form, with an even row-tile
    count; anything else raises."""
    def pair(m):
        if int(m["e"]) % 2:
            raise ToolchainError(f"dmma='m16n8k4': {kname} has an odd number ({m['e']}) of 8-row "
                                 f"tiles a warp; use dmma='m8n8k4' or a taller warp tile")
        i, j, c, st = m["i"], m["j"], m["c"], m["s"]
        return (f"for (int {i} = 0; {i} < {m['e']}; {i} += 2) {{\n"
                f"{m['ind']}for (int {j} = 0; {j} < {m['f']}; ++{j}) {{\n"
                f"{m['ind']}  lcmac_dmma_m16n8k4({c} + (({i} * {st}) + ({j} * 2)), "
                f"{c} + ((({i} + 1) * {st}) + ({j} * 2)), {m['a']} + {i}, {m['b']} + {j});\n")
    total = code.count(_DMMA_8x8x4 + "(")
    code, n = _DMMA_LOOP.subn(pair, code)
    if n == 0 or n != total:
        raise ToolchainError(f"dmma='m16n8k4': {kname}'s generated source has {total} fp64 mma.sync "
                             f"calls, {n} of them in the loop form this build rewrites (another "
                             f"TileLang version?); build with dmma='m8n8k4'")
    head = code.index('extern "C" __global__')
    return code[:head] + _DMMA_PAIR + "\n" + code[head:]


# m16n8k8 and m16n8k16 (sm_90) are two and four m16n8k4 in a row along K with one
# accumulator: A's a(2c), a(2c+1) and B's b(c) are the m16n8k4 fragments of the c-th 4-wide
# K chunk (the PTX ISA's fragment layouts).  TileLang loads the fragments of one chunk, ki,
# then issues its products; dmma_k_groups makes each step of that loop load the fragments
# of G chunks (ki .. ki + G - 1, into copies of the fragment arrays) and issue one
# m16n8k(4G) per pair of row tiles and column tile: a G-th of the instructions, and the
# accumulators read and written once per 4G of K instead of once per 4.
_DMMA_CALL = re.compile(r"lcmac_dmma_m16n8k4\((?P<c01>[^,]+), (?P<c23>[^,]+), (?P<a>\w+) \+ (?P<i>\w+), "
                        r"(?P<b>\w+) \+ (?P<j>\w+)\);")
_KI_LOOP = re.compile(r"(?P<ind>[ ]*)for \(int (?P<k>ki(?:_\d+)?) = 0; (?P=k) < (?P<n>\d+); \+\+(?P=k)\) \{\n")


def _dmma_group(g: int) -> str:
    a = ", ".join(f'"d"(a{c}[0]), "d"(a{c}[1])' for c in range(g))
    b = ", ".join(f'"d"(b{c}[0])' for c in range(g))
    regs = lambda first, n: ", ".join(f"%{first + r}" for r in range(n))
    args = ", ".join([f"const double* a{c}" for c in range(g)] + [f"const double* b{c}" for c in range(g)])
    return (f"\n// lcmac: {g} m16n8k4 fp64 products along K (chunks of 4) as one m16n8k{4 * g}\n"
            f"__device__ __forceinline__ void lcmac_dmma_m16n8k{4 * g}(double* c01, double* c23, {args}) {{\n"
            f'  asm volatile("mma.sync.aligned.m16n8k{4 * g}.row.col.f64.f64.f64.f64 {{%0, %1, %2, %3}}, '
            f'{{{regs(4, 2 * g)}}}, {{{regs(4 + 2 * g, g)}}}, {{%0, %1, %2, %3}};\\n"\n'
            f'               : "+d"(c01[0]), "+d"(c01[1]), "+d"(c23[0]), "+d"(c23[1])\n'
            f"               : {a}, {b});\n}}\n")


def dmma_k_groups(code: str, kname: str, g: int) -> str:
    """``kname``'s m16n8k4 products (after ``dmma_pairs``) issued G chunks of K at a time as
    m16n8k(4G) (the comment above).  Every loop over K chunks that issues them must count a
    multiple of G and load its fragments before its products; anything else raises."""
    out, pos, groups = [], 0, 0
    for m in _KI_LOOP.finditer(code):
        ind, k, n = m["ind"], m["k"], int(m["n"])
        end = code.index(f"\n{ind}}}\n", m.end())
        body = code[m.end():end + 1]
        calls = list(_DMMA_CALL.finditer(body))
        if not calls:
            continue
        if n % g:
            raise ToolchainError(f"dmma='m16n8k{4 * g}': {kname} walks its K slab in {n} chunks of 4, "
                                 f"not a multiple of {g}; use a block_k that is, or dmma='m16n8k4'")
        # the loads are the loop statements before the one that holds the products
        split = body.rfind(f"\n{ind}  for (", 0, calls[0].start()) + 1
        loads, products = body[:split], body[split:]
        a, b = calls[0]["a"], calls[0]["b"]
        # the products: the last statement of the K-chunk loop, a loop of its own, over the
        # fragments the statements before it load
        last = bool(split) and products.endswith(f"\n{ind}  }}\n")
        same = all(c["a"] == a and c["b"] == b for c in calls)
        if not (last and same and a in loads and b in loads):
            raise ToolchainError(f"dmma='m16n8k{4 * g}': {kname}'s K-chunk loop does not load its "
                                 "fragments before its products (another TileLang version?)")
        decl = f"{ind}  double {a}_k{{c}}[{_array_size(code, a)}];\n{ind}  double {b}_k{{c}}[{_array_size(code, b)}];\n"
        copies = [loads]
        for c in range(1, g):
            chunk = re.sub(rf"\b{k}\b", f"({k} + {c})", loads)
            chunk = re.sub(rf"\b{a}\b", f"{a}_k{c}", re.sub(rf"\b{b}\b", f"{b}_k{c}", chunk))
            copies.append(decl.format(c=c) + chunk)

        def grouped(cm):
            a_args = ", ".join([f"{a} + {cm['i']}"] + [f"{a}_k{c} + {cm['i']}" for c in range(1, g)])
            b_args = ", ".join([f"{b} + {cm['j']}"] + [f"{b}_k{c} + {cm['j']}" for c in range(1, g)])
            return f"lcmac_dmma_m16n8k{4 * g}({cm['c01']}, {cm['c23']}, {a_args}, {b_args});"
        out += [code[pos:m.start()], f"{ind}for (int {k} = 0; {k} < {n}; {k} += {g}) {{\n",
                "".join(copies), _DMMA_CALL.sub(grouped, products)]
        pos = end + 1
        groups += len(calls)
    if groups != code.count("lcmac_dmma_m16n8k4(C") or groups == 0:
        raise ToolchainError(f"dmma='m16n8k{4 * g}': {kname}'s m16n8k4 products are not all in "
                             "loops over K chunks (another TileLang version?); use dmma='m16n8k4'")
    code = "".join(out) + code[pos:]
    head = code.index('extern "C" __global__')
    return code[:head] + _dmma_group(g) + code[head:]


def _array_size(code: str, name: str) -> str:
    m = re.search(rf"double {name}\[(\d+)\];", code)
    if not m:
        raise ToolchainError(f"no declaration of the fragment array {name} in the generated source")
    return m.group(1)


# A persistent CTA's software pipeline is one loop over every (tile, k) step of its share
# (schedules.cuda.gemm._persistent_tiles): a step's tile is it / num_k and its slab it % num_k.
# With a run-time K, num_k = ceil(K / block_k) is a kernel argument, so every step divides by
# a run-time value, in the producer thread and in each consumer thread before its wgmma, and
# decodes the tile's coordinates (more divisions) again.  persistent_steps splits each such
# loop into a loop over tiles around a loop over k: the same steps in the same order, no
# division by num_k, and the tile's coordinates, which no longer change in the inner loop,
# computed once per tile.
_STEP_LOOP = re.compile(r"(?P<ind>[ ]*)for \(int (?P<it>it(?:_\d+)?) = 0; (?P=it) < "
                        r"\((?P<steps>.+) \* (?P<nk>\(\((?:Kb|K) \+ \d+\) (?:>> \d+|/ \d+)\))\); "
                        r"\+\+(?P=it)\) \{\n")


def persistent_steps(code: str, kname: str) -> str:
    """Split the (tile, k) step loops of persistent kernel ``kname`` whose K is a run-time
    value into a tile loop around a k loop (the comment above); raises where the kernel has
    no such loop or a step uses its index otherwise than as tile, slab or pipeline stage."""
    loops = list(_STEP_LOOP.finditer(code))
    if not loops:
        raise ToolchainError(f"{kname}: no persistent step loop over a run-time K in the "
                             "generated source (another TileLang version?)")
    out, pos = [], 0
    for m in loops:
        ind, it, nk = m["ind"], m["it"], m["nk"]
        end = code.index(f"\n{ind}}}\n", m.end())
        body = code[m.end():end + 1]
        body = body.replace(f"({it} / {nk})", f"lcmac_tile_{it}").replace(f"({it} % {nk})", f"lcmac_k_{it}")
        # what is left of the index: the pipeline stage, it % stages (and % 2·stages)
        if re.search(rf"\b{it}\b(?! % \d+\))", body):
            raise ToolchainError(f"{kname}: a pipelined step uses {it} otherwise than as tile, "
                                 "slab or stage (another TileLang version?)")
        out += [code[pos:m.start()],
                f"{ind}for (int lcmac_tile_{it} = 0; lcmac_tile_{it} < {m['steps']}; ++lcmac_tile_{it}) {{\n",
                f"{ind}for (int lcmac_k_{it} = 0; lcmac_k_{it} < {nk}; ++lcmac_k_{it}) {{\n",
                f"{ind}  const int {it} = lcmac_tile_{it} * {nk} + lcmac_k_{it};\n", body, f"{ind}}}\n"]
        pos = end + 1
    return "".join(out) + code[pos:]


def launch_info(code: str, kname: str) -> dict:
    """The launch of kernel ``kname`` as its generated host launcher sets it: grid, block and
    dynamic shared memory."""
    grid = re.search(r"config\.gridDim = dim3\((.*)\);", code)
    block = re.search(r"config\.blockDim = dim3\((.*)\);", code)
    smem = re.search(r"config\.dynamicSmemBytes = (\d+)", code)
    # a dynamic dimension (a batched kernel's batch count, "(M + 127) / 128") stays its
    # expression; the extents are split at the commas outside parentheses
    tup = (lambda m: [int(x) if x.strip().isdigit() else x.strip()
                      for x in re.split(r",(?![^(]*\))", m.group(1))] if m else None)
    return {"name": kname, "grid": tup(grid), "block": tup(block),
            "smem_bytes": int(smem.group(1)) if smem else 0}


def kernel_source(code: str, kernel, symbol: str, cfg, clustered: tuple, info: dict | None) -> str:
    """One lowered kernel (``compose.Kernel``) made ready to link beside the others
    (``symbol``: its unique name): its launcher renamed, then the rewrites its template
    needs (``clustered``: the kernels built as 2-CTA clusters; ``info``: the composition's
    facts, which name the view sides)."""
    fname = kernel.func.attrs["global_symbol"] if "global_symbol" in kernel.func.attrs else "main"
    code = rename_launcher(code, str(fname), symbol)
    if kernel.name in clustered:
        code = cluster_pipeline(code, cfg.stages, cfg.threads)
    if kernel.name == "reduce_gemm_h":
        code = async_reduce_stores(code)
    if kernel.name.startswith(STREAMING_KERNELS):
        code = restrict_pointers(code, symbol)
    if kernel.name == "batched_gemm" and (info or {}).get("view_loads"):
        code = view_loads(code, symbol, info["view_loads"])
    dmma = getattr(cfg, "dmma", "m8n8k4")
    if dmma != "m8n8k4" and kernel.name in ("gemm", "batched_gemm"):
        code = dmma_pairs(code, symbol)
        if dmma != "m16n8k4":
            code = dmma_k_groups(code, symbol, int(dmma.rsplit("k", 1)[1]) // 4)
    if kernel.name in ("gemm", "batched_gemm") and (info or {}).get("dynamic_shape") \
            and (info or {}).get("persistent_ctas"):
        code = persistent_steps(code, symbol)
    return code
