"""The C entry point of a CUDA artifact: one source that chains the kernels of a composition
(``lcmac.schedules.cuda.compose``) on a stream, with the workspace slices between them.

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

A batched artifact has ``lcmac_run_batched``, a block-sparse one ``lcmac_run_bsr`` and one
whose row count is a run-time value ``lcmac_run_rows`` (``rows_entry``), one whose M, N
and K are ``lcmac_run_shape`` (``shape_entry``) instead of ``lcmac_run`` (which then
refuses, naming the one to call).  A prepared B
(``prepared_b_plan``) is the output of the kernels that read B alone — the combines of B into
B̃ — kept by the caller, so a static B (a weight matrix) is combined once.  Loading the
library needs only ctypes and the driver (``lcmac.runtime.cuda_loader``).
"""
from __future__ import annotations

__all__ = ["prepared_b_plan", "entry_source", "rows_entry", "shape_entry", "artifact_entry",
           "SCALAR_ARGS"]


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


def entry_source(kernels: list[dict], workspace: list[tuple[str, int]],
                 zero: list[str] = (), prepared: dict | None = None) -> str:
    """kernels: [{"name", "args": [buffer names in call order]}] in launch order.

    Buffers: A, B, C (user) and workspace slices (name, byte offset); ``zero``: workspace
    slices cleared (cudaMemsetAsync, same stream) before the first kernel (atomic maxima).
    ``prepared``: ``prepared_b_plan``'s answer — ``lcmac_prepare_b`` runs the B-side kernels
    into the caller's buffer P, ``lcmac_run_prepared`` runs the others reading them from P
    (both return -3 with the reason when the artifact cannot prepare B)."""
    prepared = prepared or {"unsupported": "not generated"}
    lines = _head(kernels, max([off for _, off in workspace] + [0]))

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
    prepare, in_p = _prepare_b(kernels, prepared)
    pb, bnames = dict.fromkeys(in_p), set(prepared["kernels"])
    lines += prepare
    lines += ['extern "C" int lcmac_run_prepared(const void* A, const void* P, void* C, void* ws, void* stream) {',
              '  cudaStream_t s = (cudaStream_t)stream;', '  lcmac_err[0] = 0;',
              '  char* w = (char*)ws; (void)w; char* p = (char*)P;',
              '  void* bufs_A = (void*)A; void* bufs_C = C;']
    lines += slices(skip=pb) + list(in_p.values()) + memsets + _launches([k for k in kernels if k["name"] not in bnames])
    lines += ['  return 0;', '}', '']
    return "\n".join(lines)


def _head(kernels: list[dict], workspace_bytes: int) -> list[str]:
    """The entry file's declarations of the kernels' launchers, ``lcmac_last_error``,
    ``lcmac_workspace_bytes`` and ``lcmac_init``."""
    lines = ['#include <cuda_runtime.h>', '#include <cstdio>', '#include <cstring>', '']
    for k in kernels:
        params = ", ".join("int" if a in SCALAR_ARGS else "void*" for a in k["args"])
        lines.append(f'extern "C" int {k["name"]}_init();')
        lines.append(f'extern "C" int {k["name"]}_call({params}, cudaStream_t);')
        lines.append(f'extern "C" const char* {k["name"]}_get_last_error();')
    lines += ['', 'static char lcmac_err[1024];',
              'extern "C" const char* lcmac_last_error() { return lcmac_err; }',
              f'extern "C" long long lcmac_workspace_bytes() {{ return {workspace_bytes}LL; }}',
              'extern "C" int lcmac_init() {', '  lcmac_err[0] = 0;']
    for k in kernels:
        lines.append(f'  if ({k["name"]}_init() != 0) {{ snprintf(lcmac_err, sizeof lcmac_err, '
                     f'"%s", {k["name"]}_get_last_error()); return -1; }}')
    return lines + ['  return 0;', '}', '']


def _prepare_b(kernels: list[dict], prepared: dict) -> tuple[list[str], dict]:
    """``lcmac_prepared_b_bytes`` and ``lcmac_prepare_b`` (the B-side kernels of
    ``prepared_b_plan``'s answer into the caller's buffer P), and {buffer: the C line that
    points it into P}."""
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
    lines = [f'extern "C" long long lcmac_prepared_b_bytes() {{ return {prepared["bytes"]}LL; }}',
             'extern "C" int lcmac_prepare_b(const void* B, void* P, void* stream) {',
             '  cudaStream_t s = (cudaStream_t)stream;', '  lcmac_err[0] = 0;',
             '  char* p = (char*)P; void* bufs_B = (void*)B;']
    lines += ([ln for n, ln in in_p.items() if n != "B"] + _launches([k for k in kernels if k["name"] in bnames])
              + copy_b + ['  return 0;', '}', ''])
    return lines, in_p


#: kernel arguments passed as int (TileLang's dynamic dimensions), not as pointers
SCALAR_ARGS = ("batch", "nnzb", "K", "N", "M", "Mb", "Nb", "Kb")


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


def rows_entry(kernels: list[dict], workspace: list[tuple[str, int]], rows: dict,
               prepared: dict | None = None) -> str:
    """The entry file of a run-time-M artifact (``schedules.cuda.rows``; ``rows`` its
    ``info["rows"]``: ``max_rows``, the block rows ``m`` and ``row_tile`` of Mb (0: the plain
    GEMM, no Mb), ``workspace`` [[buffer, bytes, bytes per row of Mb]]):

        long long lcmac_max_rows(void);
        long long lcmac_workspace_bytes_rows(long long M);      // what a launch of M rows needs
        int lcmac_run_rows(const void* A, const void* B, void* C, long long M, void* ws, void* stream);
        int lcmac_run_rows_prepared(const void* A, const void* P, void* C, long long M, void* ws,
                                    void* stream);

    the workspace slices laid out from the run-time Mb (each 256-byte aligned, in the order
    given), M and Mb passed to the kernels that take them; M = 0 launches nothing.
    ``lcmac_workspace_bytes`` is what ``max_rows`` need; ``lcmac_prepare_b`` is the
    fixed-size artifact's (B̃ does not depend on M); ``lcmac_run`` refuses."""
    prepared = prepared or {"unsupported": "not generated"}
    lines = _head(kernels, max([off for _, off in workspace] + [0]))
    m, tile, max_rows = int(rows["m"]), int(rows["row_tile"]), int(rows["max_rows"])
    mb = f"((M + {m - 1}LL) / {m}LL + {tile - 1}LL) / {tile}LL * {tile}LL" if m else "0LL"

    def slices(skip=(), pointers=True):
        out = ['  long long off = 0; (void)off;']
        for name, fixed, per_row in rows["workspace"]:
            if name not in skip:
                out += [f'  void* bufs_{name} = (void*)(w + off);'] * pointers
                out += [f'  off += ({int(fixed)}LL + {int(per_row)}LL * Mb + 255LL) / 256LL * 256LL;']
        return out

    size = ['extern "C" long long lcmac_workspace_bytes_rows(long long M) {',
            f'  const long long Mb = {mb}; (void)Mb;'] + slices(pointers=False) + ['  return off;', '}', '']
    start = ['  cudaStream_t s = (cudaStream_t)stream;', '  lcmac_err[0] = 0;',
             f'  if (M < 0 || M > {max_rows}LL) {{ snprintf(lcmac_err, sizeof lcmac_err, "this artifact '
             f'takes 0 to {max_rows} rows a launch, not %lld", M); return -4; }}',
             '  if (M == 0) return 0;',
             f'  const long long Mb = {mb};',
             '  int bufs_M = (int)M; int bufs_Mb = (int)Mb; (void)bufs_M; (void)bufs_Mb;',
             '  char* w = (char*)ws; (void)w;',
             '  void* bufs_A = (void*)A; void* bufs_C = C;']
    lines += [f'extern "C" long long lcmac_max_rows() {{ return {max_rows}LL; }}'] + size
    lines += ['extern "C" int lcmac_run_rows(const void* A, const void* B, void* C, long long M, '
              'void* ws, void* stream) {'] + start + ['  void* bufs_B = (void*)B;']
    lines += slices() + _launches(kernels) + ['  return 0;', '}', '']
    refuse = ('  snprintf(lcmac_err, sizeof lcmac_err, "this artifact takes its row count at run time: '
              'call lcmac_run_rows"); return -3;')
    run = ['extern "C" int lcmac_run(const void* A, const void* B, void* C, void* ws, void* stream) {',
           '  (void)A; (void)B; (void)C; (void)ws; (void)stream;', refuse, '}',
           'extern "C" int lcmac_run_prepared(const void* A, const void* P, void* C, void* ws, void* stream) {',
           '  (void)A; (void)P; (void)C; (void)ws; (void)stream;', refuse, '}', '']
    head = 'extern "C" int lcmac_run_rows_prepared(const void* A, const void* P, void* C, long long M, ' \
           'void* ws, void* stream) {'
    if "unsupported" in prepared:
        why = prepared["unsupported"].replace('"', "'")
        cannot = f'  snprintf(lcmac_err, sizeof lcmac_err, "cannot prepare B: %s", "{why}"); return -3;'
        return "\n".join(lines + run + [
            'extern "C" long long lcmac_prepared_b_bytes() { return -1LL; }',
            'extern "C" int lcmac_prepare_b(const void* B, void* P, void* stream) {',
            '  (void)B; (void)P; (void)stream;', cannot, '}', head,
            '  (void)A; (void)P; (void)C; (void)M; (void)ws; (void)stream;', cannot, '}', ''])
    prepare, in_p = _prepare_b(kernels, prepared)
    bnames = set(prepared["kernels"])
    lines += run + prepare + [head] + start + ['  char* p = (char*)P;']
    lines += slices(skip=in_p) + list(in_p.values()) + _launches([k for k in kernels if k["name"] not in bnames])
    return "\n".join(lines + ['  return 0;', '}', ''])


def shape_entry(kernels: list[dict], workspace: list[tuple[str, int]], shape: dict) -> str:
    """The entry file of a run-time-shape artifact (``schedules.cuda.rows``; ``shape`` its
    ``info["dynamic_shape"]``: ``max`` [M, N, K], the grid ``m``, ``k``, ``n`` (0: the plain
    GEMM, no blocks), the units Mb, Nb, Kb are rounded up to (``row_tile``, ``col_tile``,
    ``depth_tile``), ``vec`` (N and K are multiples of it: 16-byte row strides) and
    ``workspace`` [[buffer, bytes per element, [block dims]]], ``item`` C's element size
    (K = 0 zeroes C)):

        long long lcmac_max_rows(void), lcmac_max_cols(void), lcmac_max_depth(void);
        long long lcmac_workspace_bytes_shape(long long M, long long N, long long K);   // -1: refused
        int lcmac_run_shape(const void* A, const void* B, void* C, long long M, long long N,
                            long long K, void* ws, void* stream);

    A shape past ``max``, with N or K not a multiple of ``vec``, negative, or operands not
    16-byte aligned is refused (-4) with a message naming the shape and the rule; M = 0 or
    N = 0 launches nothing.  ``lcmac_run`` and the prepared-B entries refuse (-3)."""
    lines = _head(kernels, max([off for _, off in workspace] + [0]))
    Mx, Nx, Kx = (int(d) for d in shape["max"])
    m, k, n, vec = int(shape["m"]), int(shape["k"]), int(shape["n"]), int(shape["vec"])

    def blocks(extent, parts, unit):
        return f"((({extent} + {parts - 1}LL) / {parts}LL + {unit - 1}LL) / {unit}LL * {unit}LL)" if parts else "0LL"

    sizes = [f'  const long long Mb = {blocks("M", m, int(shape["row_tile"]))}, '
             f'Nb = {blocks("N", n, int(shape["col_tile"]))}, Kb = {blocks("K", k, int(shape["depth_tile"]))};',
             '  (void)Mb; (void)Nb; (void)Kb;']

    def slices(pointers=True):
        out = ['  long long off = 0; (void)off;']
        for name, item, dims in shape["workspace"]:
            out += [f'  void* bufs_{name} = (void*)(w + off);'] * pointers
            out += [f'  off += ({int(item)}LL * {" * ".join(dims)} + 255LL) / 256LL * 256LL;']
        return out

    why = ['static int lcmac_shape_refused(long long M, long long N, long long K) {',
           '  if (M < 0 || N < 0 || K < 0) { snprintf(lcmac_err, sizeof lcmac_err, "%lldx%lldx%lld: '
           'M, N and K must not be negative", M, N, K); return 1; }',
           f'  if (M > {Mx}LL || N > {Nx}LL || K > {Kx}LL) {{ snprintf(lcmac_err, sizeof lcmac_err, '
           f'"%lldx%lldx%lld: this artifact takes up to {Mx}x{Nx}x{Kx} (MxNxK) a launch", M, N, K); return 1; }}',
           f'  if (N % {vec}LL || K % {vec}LL) {{ snprintf(lcmac_err, sizeof lcmac_err, "%lldx%lldx%lld: N and K '
           f'must be multiples of {vec} (16-byte row strides of A, B and C for the TMA copies)", M, N, K); '
           'return 1; }', '  return 0;', '}', '']
    size = (['extern "C" long long lcmac_workspace_bytes_shape(long long M, long long N, long long K) {',
             '  if (lcmac_shape_refused(M, N, K)) return -1LL;'] + sizes + slices(pointers=False)
            + ['  return off;', '}', ''])
    lines += [f'extern "C" long long lcmac_max_rows() {{ return {Mx}LL; }}',
              f'extern "C" long long lcmac_max_cols() {{ return {Nx}LL; }}',
              f'extern "C" long long lcmac_max_depth() {{ return {Kx}LL; }}', ''] + why + size
    lines += ['extern "C" int lcmac_run_shape(const void* A, const void* B, void* C, long long M, long long N, '
              'long long K, void* ws, void* stream) {',
              '  cudaStream_t s = (cudaStream_t)stream;', '  lcmac_err[0] = 0;',
              '  if (lcmac_shape_refused(M, N, K)) return -4;',
              '  if (M == 0 || N == 0) return 0;',
              '  if (((unsigned long long)A | (unsigned long long)B | (unsigned long long)C | '
              '(unsigned long long)ws) % 16ULL) { snprintf(lcmac_err, sizeof lcmac_err, "%lldx%lldx%lld: A, B, '
              'C and the workspace must be 16-byte aligned (TMA)", M, N, K); return -4; }',
              f'  if (K == 0) {{ if (cudaMemsetAsync(C, 0, M * N * {int(shape["item"])}LL, s) != cudaSuccess) {{ '
              'snprintf(lcmac_err, sizeof lcmac_err, "memset C: %s", cudaGetErrorString(cudaGetLastError())); '
              'return -2; } return 0; }']
    lines += sizes + ['  int bufs_M = (int)M, bufs_N = (int)N, bufs_K = (int)K, bufs_Mb = (int)Mb, '
                      'bufs_Nb = (int)Nb, bufs_Kb = (int)Kb;',
                      '  (void)bufs_M; (void)bufs_N; (void)bufs_K; (void)bufs_Mb; (void)bufs_Nb; (void)bufs_Kb;',
                      '  char* w = (char*)ws; (void)w;',
                      '  void* bufs_A = (void*)A; void* bufs_B = (void*)B; void* bufs_C = C;']
    lines += slices() + _launches(kernels) + ['  return 0;', '}', '']
    refuse = ('  snprintf(lcmac_err, sizeof lcmac_err, "this artifact takes its shape at run time: call '
              'lcmac_run_shape (it has no prepared B: the size of B~ depends on N and K)"); return -3;')
    return "\n".join(lines + _refusals(refuse))


def artifact_entry(composition, name: str, b_bytes: int) -> tuple[str, dict]:
    """(entry source, prepared-B plan) of a composition whose kernels are linked as
    ``<name>_<kernel>``; the plan names its kernels without that prefix, as the manifest
    records them.  ``b_bytes``: the bytes of B (a prepared buffer may hold a copy)."""
    klist = [{"name": f"{name}_{k.name}", "args": k.args} for k in composition.kernels]
    zero = (composition.info or {}).get("zero", [])
    shape = (composition.info or {}).get("dynamic_shape")
    if shape is not None:
        return (shape_entry(klist, composition.workspace, shape),
                {"unsupported": "the size of B~ depends on the run-time N and K"})
    prepared = prepared_b_plan(klist, composition.workspace, zero, b_bytes=b_bytes)
    rows = (composition.info or {}).get("rows")
    if rows is not None:
        entry = rows_entry(klist, composition.workspace, rows, prepared)
    else:
        entry = entry_source(klist, composition.workspace, zero=zero, prepared=prepared)
    if "kernels" in prepared:
        prepared = dict(prepared, kernels=[k[len(name) + 1:] for k in prepared["kernels"]])
    return entry, prepared
