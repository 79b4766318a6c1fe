/*
 * lcmac.h — calling lcmac artifacts (the <name>.so + <name>.json written by `lcmac build`)
 * and bundles (`lcmac export`) from C or C++, CPU and CUDA alike, with no Python, no TVM
 * runtime and no compiler on the machine that runs them.  The CUDA functions are at the end.
 *
 * Implementation: lcmac/runtime/harness/lcmac_c.c (C99 + POSIX: dlopen, pthreads; it
 * #includes lcmac_check.c, lcmac_json.c, lcmac_cuda.c and lcmac_bundle.c, with lcmac_pieces.c
 * and lcmac_bundle_cuda.c, from its own directory).  `lcmac capi --cmake-dir` gives a CMake
 * package (find_package(lcmac)) that builds it into your project; docs/c-api.md shows both
 * ways and the ABI's versioning.
 * Compile it into your program and export its symbols to the libraries it loads, e.g.
 *
 *     INC=$(python3 -c "import lcmac.runtime as r; print(r.c_include_dir())")
 *     gcc -O2 -rdynamic -I"$INC" app.c "$INC/../harness/lcmac_c.c" -ldl -lpthread
 *
 * Why -rdynamic: an artifact has one undefined symbol, TVMFFIErrorSetRaisedFromCStrParts
 * (how it reports errors), which lcmac_c.c defines and the dynamic loader must be able to
 * see; opening fails with a message saying so otherwise.  (Building lcmac_c.c into a
 * shared library that the program links against works too.)
 *
 * What lcmac_c.c provides an artifact with: the tvm-ffi calling convention of its entry
 * point `__tvm_ffi_<entry>`, and the parallel-launch / barrier / workspace hooks an
 * apache-tvm CPU library calls through (`__TVMBackendParallelLaunch`, ...): a persistent
 * pthread pool per handle and a per-handle cache of workspace blocks (kept until
 * lcmac_close, so repeated calls do not map and fault in fresh memory).
 *
 * Opening: lcmac_open_artifact(manifest) checks, before anything is loaded,
 *   - the manifest: strict JSON; format "lcmac-artifact/1" (another is LCMAC_EFORMAT, naming
 *     it); the shape, dtype, entry_points[0].name and library fields well-formed;
 *   - the target: target.family is this machine's architecture (x86 on x86-64, aarch64 on
 *     AArch64) and backend "tvm"; on x86 every flag in extra.cpu_flags (and the target's own)
 *     is in /proc/cpuinfo; on AArch64 an SVE target's SVE and vector length (LCMAC_ETARGET,
 *     naming what is missing);
 *   - the library (library.file, beside the manifest): it exists (LCMAC_EIO), has
 *     library.bytes bytes (where recorded) and the SHA-256 library.sha256 (LCMAC_ECORRUPT),
 *     and is a 64-bit little-endian ELF shared object for this machine whose program and
 *     section headers lie inside the file (LCMAC_ECORRUPT; another machine's code is
 *     LCMAC_ETARGET);
 * then loads it and finds the entry point (LCMAC_ELOAD if that fails).  A truncated, damaged
 * or foreign file is an error with a message, not a crash in the dynamic loader.
 * lcmac_open(so_path, entry) loads a bare library with no manifest: only the ELF check, so
 * a damaged library whose headers are intact still loads and may crash when called; and the
 * shape and dtype are not known to it.  Neither guards against a file replaced after it is
 * opened.
 *
 * Contract of lcmac_matmul
 *   C[M][N] = A[M][K] · B[K][N], all three row-major and contiguous, of the artifact's dtype,
 *   C written in full.  An artifact accepts exactly one shape and one dtype: those in its
 *   manifest ("shape", "dtype"; lcmac_shape and lcmac_dtype_of return them).  On a handle
 *   from lcmac_open_artifact another shape or dtype is LCMAC_EINVAL, naming both, before the
 *   library is called; on one from lcmac_open the library itself refuses it (LCMAC_EKERNEL
 *   with its message).  C must not overlap A or B (checked).  Alignment: the element size
 *   suffices.
 *
 * Threads
 *   A handle is used by one thread at a time (calls on one handle are serialised by a
 *   mutex); several handles — of the same library or not — may run concurrently.
 *   num_threads <= 0 takes LCMAC_NUM_THREADS, else TVM_NUM_THREADS, else the CPUs this
 *   process may run on.
 *
 * Errors
 *   Functions return LCMAC_OK (0) or an lcmac_status; lcmac_last_error(h) is the message of
 *   the handle's last failed call ("" after a success).  The open functions return NULL on
 *   failure and write the message into err/errlen (lcmac_open_artifact its status too).
 */
#ifndef LCMAC_H
#define LCMAC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LCMAC_API_VERSION 7   /* 2: lcmac_open_artifact and the checks; 3: bundles; 4: CUDA;
                                 5: lcmac_cuda_bmm; 6: prepared B on the CPU; 7: piece
                                 bundles (lcmac-bundle/2, /3) */

typedef struct lcmac_handle lcmac_handle;
typedef struct lcmac_bundle lcmac_bundle;
struct CUstream_st;   /* cudaStream_t and CUstream are `struct CUstream_st*`; NULL: the default stream */

/* element types (an artifact's manifest "dtype") */
typedef enum {
  LCMAC_FLOAT32 = 0,   /* "float32" */
  LCMAC_FLOAT64 = 1,   /* "float64" */
  LCMAC_BFLOAT16 = 2,  /* "bfloat16": uint16_t storage, the upper half of an IEEE float */
  LCMAC_FLOAT16 = 3    /* "float16" (no CPU artifact uses it today) */
} lcmac_dtype;

typedef enum {
  LCMAC_OK = 0,
  LCMAC_EINVAL = 1,    /* a bad argument: NULL pointer, size <= 0, unknown dtype, C overlaps A/B,
                          a shape or dtype other than the manifest's */
  LCMAC_EKERNEL = 2,   /* the entry point reported an error, e.g. a shape or dtype other than
                          the artifact's, or a failed workspace allocation (its message) */
  LCMAC_EFORMAT = 3,   /* the manifest is not JSON, lacks or garbles a field, or has a format
                          other than "lcmac-artifact/1" */
  LCMAC_ETARGET = 4,   /* the artifact is for another architecture or backend, or this CPU
                          lacks a feature it needs */
  LCMAC_ECORRUPT = 5,  /* the library's size or SHA-256 is not the manifest's, or it is not a
                          well-formed ELF shared library (truncated, damaged, replaced) */
  LCMAC_EIO = 6,       /* the manifest or the library is missing or unreadable */
  LCMAC_ELOAD = 7      /* the checks passed but loading failed: the dynamic loader's error,
                          no such entry point, no -rdynamic, no threads or memory */
} lcmac_status;

/* Check the artifact whose manifest is `manifest_path` (<name>.json; the checks are listed
 * above), then load its library and find its entry point.  Returns NULL on failure with the
 * status in *status and a message in err (each where not NULL). */
lcmac_handle* lcmac_open_artifact(const char* manifest_path, int num_threads, int* status,
                                  char* err, size_t errlen);

/* Load the bare library `so_path` (no manifest: only the ELF check) and find its entry point
 * `entry` (the manifest's entry_points[0].name, "lcmac_matmul" for `lcmac build`).  Returns
 * NULL on failure with a message in err (if err is not NULL). */
lcmac_handle* lcmac_open(const char* so_path, const char* entry, int num_threads, char* err,
                         size_t errlen);

/* The manifest's M, N, K (each pointer may be NULL): LCMAC_OK, or LCMAC_EINVAL and zeros for
 * a NULL handle or one from lcmac_open (no manifest). */
int lcmac_shape(const lcmac_handle* h, int64_t* M, int64_t* N, int64_t* K);

/* The manifest's dtype (an lcmac_dtype), or -1 for a NULL handle or one from lcmac_open. */
int lcmac_dtype_of(const lcmac_handle* h);

/* C = A · B (see the contract above); dtype is an lcmac_dtype. */
int lcmac_matmul(lcmac_handle* h, const void* A, const void* B, void* C, int64_t M, int64_t N,
                 int64_t K, int dtype);

/* Prepared B (CPU artifacts opened with lcmac_open_artifact): where B stays the same across
 * calls (a weight), lcmac_prepare_b runs Combine B (the packing of B, for a plain GEMM) once
 * into a caller-owned, 64-byte aligned buffer P of lcmac_prepared_b_bytes(h) bytes, and
 * lcmac_matmul_prepared(h, A, P, C, ...) runs the rest, giving the same C bit for bit.  P is
 * valid only for the handle's artifact; prepare again after B changes.
 * lcmac_prepared_b_bytes is -1 for a handle that cannot prepare (CUDA: lcmac_cuda_prepare_b;
 * lcmac_open; an artifact built before prepared B), and the two calls then say why. */
int64_t lcmac_prepared_b_bytes(const lcmac_handle* h);
int lcmac_prepare_b(lcmac_handle* h, const void* B, void* P, size_t P_bytes);
int lcmac_matmul_prepared(lcmac_handle* h, const void* A, const void* P, void* C, int64_t M,
                          int64_t N, int64_t K, int dtype);

/* The message of the last failed call on h ("" if it succeeded); for h == NULL, the last
 * error of a call that got a NULL handle on this thread.  Valid until the next call on h. */
const char* lcmac_last_error(const lcmac_handle* h);

/* Threads the handle's pool runs (the calling thread included). */
int lcmac_num_threads(const lcmac_handle* h);

/* Stop the pool, free the cached workspaces, unload the library (NULL is a no-op). */
void lcmac_close(lcmac_handle* h);

/* Name of a status code. */
const char* lcmac_status_name(int status);

/* SHA-256 (FIPS 180-4) of n bytes as 64 lowercase hex digits and a NUL (the digest the
 * open check compares with library.sha256).  LCMAC_OK, or LCMAC_EINVAL for NULL pointers. */
int lcmac_sha256_hex(const void* data, size_t n, char hex[65]);

/* ---- bundles: one directory of bucket kernels serving shape rules ----
 *
 * A bundle (`lcmac build` without --shape, or with --shape ?xNxK; lcmac.artifact.bundle) is a
 * directory DIR with an index DIR/bundle.json (format "lcmac-bundle/1", /2 or /3) and one ordinary
 * artifact (<kernel>.so + <kernel>.json) per bucket shape.  Its rules, tried exact first, then
 * rows, then any (in the index's order within a kind):
 *   exact:MxNxK   that kernel;
 *   rows:?xNxK    any M: the rows of A and C cut greedily over the rule's row buckets
 *                 (largest first) as contiguous slices; the rows left under the smallest
 *                 bucket P_min are copied into a zeroed P_min x K buffer, run, and copied back;
 *   any:?x?x?     any shape: the row cut over T_N x T_K tiles (the rule's "tile") of A and B
 *                 copied into zeroed buffers, the products added into C (for bfloat16, when K
 *                 spans several tiles, in a float32 buffer rounded once to nearest even;
 *                 float16 with K above the tile is LCMAC_EINVAL);
 *   any:?x?x? of piece kernels (/3, /2: a CPU float32/float64 bundle built without --shape)
 *                 the cut of lcmac.runtime.bundle_pieces on views of A, B and C
 *                 (lcmac_pieces.c); the products it gives to the vendor GEMM (small or thin)
 *                 run on the CBLAS of LCMAC_BLAS or of the program (cblas_sgemm), else on a
 *                 plain loop.
 * The cut is lcmac/spec/shape_rules.py's, so C gives Python's results.  The padding and tile
 * buffers belong to the bundle handle (grown as needed, freed by lcmac_bundle_close). */

/* Read DIR/bundle.json (strict JSON; a format other than "lcmac-bundle/1", /2 or /3, a missing
 * or garbled field, a rule naming a kernel not listed or lacking a bucket or piece kernel,
 * piece sizes not whole run_time units: LCMAC_EFORMAT), then check every kernel's library
 * against the index (size, SHA-256, ELF) and open every kernel with lcmac_open_artifact (all of its checks), each with its own pool
 * of num_threads threads.  A failure is that status with a message naming the kernel.
 * Returns NULL on failure with the status in *status and a message in err (each where not
 * NULL). */
lcmac_bundle* lcmac_open_bundle(const char* dir, int num_threads, int* status, char* err,
                                size_t errlen);

/* C = A . B (row-major, contiguous, the bundle's dtype; C must not overlap A or B) through
 * the first rule admitting (M, N, K).  LCMAC_EINVAL: NULL pointers, sizes < 1 or >= 2^31,
 * another dtype than the bundle's, or no rule admitting the shape (the message names the
 * shape and the rules); a kernel's failure is its status with its message.  Calls on one
 * bundle are serialised; several bundles may run concurrently. */
int lcmac_bundle_matmul(lcmac_bundle* b, const void* A, const void* B, void* C, int64_t M,
                        int64_t N, int64_t K, int dtype);

/* The message of the last failed call on b ("" after a success); for b == NULL, as
 * lcmac_last_error(NULL). */
const char* lcmac_bundle_last_error(const lcmac_bundle* b);

/* The bundle's dtype (an lcmac_dtype), or -1 for NULL. */
int lcmac_bundle_dtype(const lcmac_bundle* b);

/* Its rules in the order they are tried, as canonical text ("exact:64x48x40",
 * "rows:?x48x40", "any:?x?x?"): lcmac_bundle_rule(b, i) for 0 <= i < lcmac_bundle_num_rules(b)
 * (NULL otherwise); lcmac_bundle_rule_for(b, M, N, K) is the index of the rule that serves a
 * shape, -1 when none does. */
int lcmac_bundle_num_rules(const lcmac_bundle* b);
const char* lcmac_bundle_rule(const lcmac_bundle* b, int i);
int lcmac_bundle_rule_for(const lcmac_bundle* b, int64_t M, int64_t N, int64_t K);

/* Number of kernels (each an open artifact handle), and the threads each kernel's pool runs. */
int lcmac_bundle_num_kernels(const lcmac_bundle* b);
int lcmac_bundle_num_threads(const lcmac_bundle* b);

/* Close every kernel, free the buffers (NULL is a no-op). */
void lcmac_bundle_close(lcmac_bundle* b);

/* ---- CUDA: artifacts and bundles for --target cuda-* (lcmac_cuda.c) ----
 *
 * A CUDA artifact (backend "tilelang": <name>.so + <name>.json) runs on device memory, on the
 * caller's stream.  Its library links the CUDA runtime statically; the harness takes what it
 * needs itself from the driver, libcuda.so.1, loaded when the first CUDA artifact is opened,
 * so this file compiles with no CUDA headers and links no CUDA library.
 *
 * Opening (lcmac_open_cuda_artifact, lcmac_open_cuda_bundle) checks, before the library is
 * loaded: the manifest as above, but target.family "cuda" and backend "tilelang" (a CPU
 * artifact is LCMAC_ETARGET, as a CUDA one is for lcmac_open_artifact); the library's size,
 * SHA-256 and ELF headers; that the driver loads (LCMAC_ETARGET: none, or too old), that
 * `device` exists (LCMAC_ETARGET; a negative ordinal is LCMAC_EINVAL) and that its compute
 * capability runs target.dict.arch ("sm_90a": exactly 9.0; "sm_80": 8.x) — LCMAC_ETARGET naming
 * the GPU.  Then it loads the library, checks that its workspace size is the manifest's
 * (LCMAC_ECORRUPT), runs its lcmac_init on the device and allocates the handle's workspace.
 *
 * Contract of lcmac_cuda_matmul
 *   As lcmac_matmul (row-major, contiguous, the manifest's shape and dtype, C not overlapping
 *   A or B), with A, B and C device memory (cudaMalloc, or managed) of the handle's device,
 *   each 16-byte aligned and inside its allocation (checked: LCMAC_EINVAL naming the operand,
 *   never a fault on the GPU).  The call enqueues the kernels on `stream` (a stream of that
 *   device; NULL: its default stream) and returns without waiting; the caller synchronises.
 *   The handle's device is made current for the call only: the caller's current device is
 *   untouched.  A launch error is LCMAC_EKERNEL with the CUDA runtime's message; an error
 *   while the kernels run shows, as for any kernel, at the caller's next synchronisation.
 *
 * Workspace: the kernels keep intermediate products in a workspace of
 * lcmac_cuda_workspace_bytes(h) bytes.  workspace == NULL uses the handle's own (allocated at
 * open); calls that may run concurrently (on different streams) each need their own, passed
 * in (device memory of the handle's device, at least that size).  Calls on one handle are
 * serialised on the host; the kernels run in the order of their streams.
 *
 * Prepared B: where B stays the same across calls (a weight), lcmac_cuda_prepare_b runs once
 * the kernels that read B alone (Combine B) into a caller-owned device buffer P of
 * lcmac_cuda_prepared_b_bytes(h) bytes, and lcmac_cuda_matmul_prepared(h, A, P, C, ...) runs
 * the rest.  P is valid only for the handle (artifact) that prepared it; prepare again after B
 * changes.  The plain GEMM and scaled-operand artifacts have nothing to prepare
 * (lcmac_cuda_prepared_b_bytes is -1; lcmac_cuda_prepare_b says why).
 *
 * CUDA graphs: the calls only enqueue work on `stream` and allocate nothing, so they may be
 * captured; a bundle's padding buffer and a handle's workspace are then part of the graph.
 */

/* Check (see above) and open the CUDA artifact whose manifest is `manifest_path` on CUDA
 * device `device`.  NULL on failure, with the status in *status and a message in err. */
lcmac_handle* lcmac_open_cuda_artifact(const char* manifest_path, int device, int* status,
                                       char* err, size_t errlen);

/* C = A . B on device memory, enqueued on `stream` (contract above).  workspace: NULL for the
 * handle's, else at least lcmac_cuda_workspace_bytes(h) bytes of device memory. */
int lcmac_cuda_matmul(lcmac_handle* h, const void* A, const void* B, void* C, int64_t M,
                      int64_t N, int64_t K, int dtype, void* workspace, size_t workspace_bytes,
                      struct CUstream_st* stream);

/* C[b] = A[b] . B[b] for b < batch, on a batched artifact (config {"batched": true}; what
 * lcmac.bmm builds): A [batch, M, K], B [batch, K, N], C [batch, M, N], contiguous device
 * memory as for lcmac_cuda_matmul, M, N, K the manifest's and batch any count from 0 to
 * 2^31-1 (one kernel serves them all).  Enqueued on `stream`; needs no workspace.
 * lcmac_cuda_matmul refuses a batched artifact, and this call an artifact of one product. */
int lcmac_cuda_bmm(lcmac_handle* h, const void* A, const void* B, void* C, int64_t batch,
                   int64_t M, int64_t N, int64_t K, int dtype, struct CUstream_st* stream);

/* Bytes of the prepared form of B (-1: nothing to prepare, or not a CUDA handle). */
int64_t lcmac_cuda_prepared_b_bytes(const lcmac_handle* h);

/* Combine B into P (P_bytes >= lcmac_cuda_prepared_b_bytes(h)), enqueued on `stream`. */
int lcmac_cuda_prepare_b(lcmac_handle* h, const void* B, void* P, size_t P_bytes,
                         struct CUstream_st* stream);

/* C = A . B with B given by P from lcmac_cuda_prepare_b on this handle. */
int lcmac_cuda_matmul_prepared(lcmac_handle* h, const void* A, const void* P, void* C, int64_t M,
                               int64_t N, int64_t K, int dtype, void* workspace,
                               size_t workspace_bytes, struct CUstream_st* stream);

/* Bytes of workspace a call needs (-1 for NULL or a CPU handle). */
int64_t lcmac_cuda_workspace_bytes(const lcmac_handle* h);

/* The CUDA device the handle runs on; -1 for a CPU artifact or NULL. */
int lcmac_device_of(const lcmac_handle* h);

/* Open a CUDA bundle on `device`: the index and every kernel checked and opened as
 * lcmac_open_cuda_artifact does, then the bundle's workspace allocated (the largest kernel
 * workspace plus the padding buffers of its rows rules).  Exact and rows rules are served;
 * an any-shape rule (`lcmac build --target cuda` without --shape) is LCMAC_ETARGET: its tiles
 * are summed on the device by Python (lcmac.load), not by this harness. */
lcmac_bundle* lcmac_open_cuda_bundle(const char* dir, int device, int* status, char* err,
                                     size_t errlen);

/* C = A . B through the first rule admitting (M, N, K), enqueued on `stream`: A, B, C device
 * memory as for lcmac_cuda_matmul; a rows rule runs contiguous slices of A and C, and the rows
 * under its smallest bucket through the bundle's padding buffer (zeroed and copied on the
 * stream).  workspace: NULL for the bundle's own, else at least
 * lcmac_bundle_cuda_workspace_bytes(b) bytes (what concurrent calls on other streams need). */
int lcmac_bundle_cuda_matmul(lcmac_bundle* b, const void* A, const void* B, void* C, int64_t M,
                             int64_t N, int64_t K, int dtype, void* workspace,
                             size_t workspace_bytes, struct CUstream_st* stream);

/* Bytes of workspace a bundle call needs (-1 for NULL or a CPU bundle). */
int64_t lcmac_bundle_cuda_workspace_bytes(const lcmac_bundle* b);

/* The CUDA device the bundle runs on; -1 for a CPU bundle or NULL. */
int lcmac_bundle_device(const lcmac_bundle* b);

#ifdef __cplusplus
}
#endif

#endif /* LCMAC_H */
