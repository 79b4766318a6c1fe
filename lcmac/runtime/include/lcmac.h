/*
 * lcmac.h — calling an lcmac CPU artifact (the .so written by `lcmac build`) from C, with no
 * Python, no TVM runtime and no compiler on the machine that runs it.
 *
 * Implementation: lcmac/runtime/harness/lcmac_c.c (one file, C99 + POSIX: dlopen, pthreads).
 * Compile it into your program and export its symbols to the libraries it loads, e.g.
 *
 *     INC=$(python3 -c "import lcmac.runtime as r; print(r.c_include_dir())")
 *     gcc -O2 -rdynamic -I"$INC" app.c "$INC/../harness/lcmac_c.c" -ldl -lpthread
 *
 * Why -rdynamic: an artifact has one undefined symbol, TVMFFIErrorSetRaisedFromCStrParts
 * (how it reports errors), which lcmac_c.c defines and the dynamic loader must be able to
 * see; lcmac_open fails with a message saying so otherwise.  (Building lcmac_c.c into a
 * shared library that the program links against works too.)
 *
 * What lcmac_c.c provides an artifact with: the tvm-ffi calling convention of its entry
 * point `__tvm_ffi_<entry>`, and the parallel-launch / barrier / workspace hooks an
 * apache-tvm CPU library calls through (`__TVMBackendParallelLaunch`, ...): a persistent
 * pthread pool per handle and a per-handle cache of workspace blocks (kept until
 * lcmac_close, so repeated calls do not map and fault in fresh memory).
 *
 * Contract of lcmac_matmul
 *   C[M][N] = A[M][K] · B[K][N], all three row-major and contiguous, of the artifact's dtype,
 *   C written in full.  An artifact accepts exactly one shape and one dtype: those in its
 *   manifest (<name>.json: "shape", "dtype", "entry_points"[0].name).  Matching them is the
 *   caller's job; the library itself checks the shape and dtype it is given and a mismatch
 *   comes back as LCMAC_EKERNEL with the library's message.  C must not overlap A or B
 *   (checked).  Alignment: the element size suffices.
 *
 * Threads
 *   A handle is used by one thread at a time (calls on one handle are serialised by a
 *   mutex); several handles — of the same library or not — may run concurrently.
 *   num_threads <= 0 takes LCMAC_NUM_THREADS, else TVM_NUM_THREADS, else the CPUs this
 *   process may run on.
 *
 * Errors
 *   Functions return LCMAC_OK (0) or an lcmac_status; lcmac_last_error(h) is the message of
 *   the handle's last failed call ("" after a success).  lcmac_open reports into err/errlen.
 */
#ifndef LCMAC_H
#define LCMAC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LCMAC_API_VERSION 1

typedef struct lcmac_handle lcmac_handle;

/* element types (an artifact's manifest "dtype") */
typedef enum {
  LCMAC_FLOAT32 = 0,   /* "float32" */
  LCMAC_FLOAT64 = 1,   /* "float64" */
  LCMAC_BFLOAT16 = 2,  /* "bfloat16": uint16_t storage, the upper half of an IEEE float */
  LCMAC_FLOAT16 = 3    /* "float16" (no CPU artifact uses it today) */
} lcmac_dtype;

typedef enum {
  LCMAC_OK = 0,
  LCMAC_EINVAL = 1,    /* a bad argument: NULL pointer, size <= 0, unknown dtype, C overlaps A/B */
  LCMAC_EKERNEL = 2    /* the entry point reported an error, e.g. a shape or dtype other than
                          the artifact's, or a failed workspace allocation (its message) */
} lcmac_status;

/* Load the artifact library `so_path` and find its entry point `entry` (the manifest's
 * entry_points[0].name, "lcmac_matmul" for `lcmac build`).  Returns NULL on failure with a
 * message in err (if err is not NULL). */
lcmac_handle* lcmac_open(const char* so_path, const char* entry, int num_threads, char* err,
                         size_t errlen);

/* C = A · B (see the contract above); dtype is an lcmac_dtype. */
int lcmac_matmul(lcmac_handle* h, const void* A, const void* B, void* C, int64_t M, int64_t N,
                 int64_t K, int dtype);

/* The message of the last failed call on h ("" if it succeeded); for h == NULL, the last
 * error of a call that got a NULL handle on this thread.  Valid until the next call on h. */
const char* lcmac_last_error(const lcmac_handle* h);

/* Threads the handle's pool runs (the calling thread included). */
int lcmac_num_threads(const lcmac_handle* h);

/* Stop the pool, free the cached workspaces, unload the library (NULL is a no-op). */
void lcmac_close(lcmac_handle* h);

/* Name of a status code. */
const char* lcmac_status_name(int status);

#ifdef __cplusplus
}
#endif

#endif /* LCMAC_H */
