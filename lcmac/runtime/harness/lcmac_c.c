/*
 * lcmac_c.c — the C API of lcmac/runtime/include/lcmac.h: loads an lcmac CPU artifact (a
 * shared library produced by apache-tvm + LLVM) and calls it with no Python and no TVM
 * runtime.  The qemu harness lcmac_run.c #includes this file, so both share one
 * implementation of what such a library needs from the program that loads it:
 *
 *   - the function symbol `__tvm_ffi_<name>`, called with the tvm-ffi "safe call" ABI:
 *         int fn(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result);
 *     each tensor argument is a TVMFFIAny with type_index 7 (DLTensor*) pointing at a DLTensor;
 *   - one undefined function, TVMFFIErrorSetRaisedFromCStrParts (defined below; the program
 *     must export it, -rdynamic, so that dlopen resolves it);
 *   - data pointers `__TVMBackendParallelLaunch`, `__TVMBackendAllocWorkspace`,
 *     `__TVMBackendFreeWorkspace` (and `__TVMBackendParallelBarrier` where used) that the
 *     loader must fill in: here a persistent pthread pool and a workspace cache per handle.
 *
 * lcmac_open_artifact checks an artifact before it loads it (lcmac_check.c: its manifest, the
 * target, the library's size, SHA-256 and ELF headers): a damaged or foreign file is an error
 * with a message, not a crash in the dynamic loader.
 *
 * C99 + POSIX (dlopen, pthreads); builds for x86-64 and AArch64 alike.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../include/lcmac.h"
#include "lcmac_check.c"   /* what lcmac_open_artifact checks before dlopen; put_err */

/* ---- the two ABI structs (layouts fixed by dlpack.h and tvm/ffi/c_api.h) ---- */
typedef struct { int32_t device_type; int32_t device_id; } DLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } DLDataType;
typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} DLTensor;

typedef struct {
  int32_t type_index;
  uint32_t zero_padding;
  union { int64_t v_int64; double v_float64; void* v_ptr; } v;
} TVMFFIAny;

enum { kTVMFFINone = 0, kTVMFFIInt = 1, kTVMFFIDLTensorPtr = 7 };
enum { kDLCPU = 1 };
typedef int (*TVMFFISafeCallType)(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);

typedef struct { void* sync_handle; int32_t num_task; } TVMParallelGroupEnv;
typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv* penv, void* cdata);

#define LCMAC_MAX_THREADS 256
#define LCMAC_WS_SLOTS 32
#define LCMAC_ERRLEN 2048

/* ---- errors the library raises (on whichever thread raises them) ---- */
static __thread char tls_error[LCMAC_ERRLEN];

__attribute__((visibility("default")))
void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t n) {
  size_t len = (size_t)snprintf(tls_error, sizeof tls_error, "%s: ", kind ? kind : "Error");
  for (int32_t i = 0; i < n && len < sizeof tls_error; ++i)
    if (parts[i]) len += (size_t)snprintf(tls_error + len, sizeof tls_error - len, "%s", parts[i]);
}

/* ---- handle: library, entry, thread pool, workspace cache ---- */
typedef struct { void* ptr; size_t bytes; int used; } WsBlock;

struct lcmac_handle {
  void* lib;
  TVMFFISafeCallType fn;
  char entry[256];
  pthread_mutex_t call_mu;     /* one call at a time per handle */
  char err[LCMAC_ERRLEN];
  /* pool: nthreads - 1 workers plus the calling thread */
  int nthreads;
  int nworkers;
  pthread_t workers[LCMAC_MAX_THREADS];
  pthread_mutex_t mu;
  pthread_cond_t start, done;
  uint64_t gen;
  int pending, stop;
  FTVMParallelLambda job;
  void* job_data;
  TVMParallelGroupEnv env;
  pthread_barrier_t barrier;
  int job_rc;
  char job_err[LCMAC_ERRLEN];
  /* workspaces allocated on the calling thread, kept for the next call */
  WsBlock ws[LCMAC_WS_SLOTS];
  /* from the manifest (lcmac_open_artifact): what lcmac_matmul accepts */
  int has_manifest;
  int64_t M, N, K;
  int dtype;
  char sha256[65];             /* the library's, as checked at open (a bundle compares its index) */
  int64_t bytes;
  int piece;                   /* a bundle's piece kernel (lcmac_pieces.c calls it, not lcmac_matmul) */
  int64_t piece_units[2];      /* its run-time rows and depth: multiples of these (0: fixed) */
  /* CUDA artifacts (lcmac_cuda.c): the device, -1 for a CPU artifact */
  int device;
  void* cu_ctx;                /* the device's primary context, retained */
  int (*cu_run)(const void*, const void*, void*, void*, void*);
  int (*cu_run_prepared)(const void*, const void*, void*, void*, void*);
  int (*cu_prepare_b)(const void*, void*, void*);
  /* a batched artifact's entry (lcmac_run_batched); NULL for one product */
  int (*cu_run_batched)(const void*, const void*, void*, long long, void*, void*);
  const char* (*cu_last_error)(void);
  unsigned long long cu_ws;    /* the handle's workspace (device memory) */
  int64_t cu_ws_bytes;
  int64_t cu_prepared_bytes;   /* -1: B cannot be prepared; -2: no entry points for it */
  /* CPU artifacts: B combined once (<entry>_prepare_b, <entry>_prepared); -1: cannot */
  void* blas;                  /* a CBLAS dlopened for a vendor-base artifact (LCMAC_BLAS) */
  TVMFFISafeCallType prep_fn, prep_run_fn;
  int64_t prep_bytes, prep_shape[2];
  int prep_code, prep_bits;
};

/* the handle whose call is running on this thread (NULL on pool workers and elsewhere) */
static __thread lcmac_handle* tls_handle;
static __thread char tls_null_error[256];

typedef struct { lcmac_handle* h; int id; } WorkerArg;

/* Pool handshakes poll this many rounds, yielding the CPU each time, before sleeping on a
 * condition variable: a kernel makes several parallel launches per call (padding, Combine
 * A, Combine B, GEMM, crop) and a condition-variable wake-up costs tens of microseconds,
 * far more on a loaded machine; yielding (not pausing) keeps a poller from holding a core
 * that the thread it waits for needs (measured: pause-spinning was 500x slower here, with
 * other jobs on the 2 cores). */
#define LCMAC_SPIN 256
#define LCMAC_RELAX() sched_yield()

static void* worker_main(void* p) {
  lcmac_handle* h = ((WorkerArg*)p)->h;
  int id = ((WorkerArg*)p)->id;
  free(p);
  uint64_t seen = 0;
  for (;;) {
    for (int i = 0; i < LCMAC_SPIN && __atomic_load_n(&h->gen, __ATOMIC_ACQUIRE) == seen &&
                    !__atomic_load_n(&h->stop, __ATOMIC_ACQUIRE); ++i)
      LCMAC_RELAX();
    pthread_mutex_lock(&h->mu);
    while (__atomic_load_n(&h->gen, __ATOMIC_ACQUIRE) == seen && !h->stop)
      pthread_cond_wait(&h->start, &h->mu);
    int stop = h->stop;
    pthread_mutex_unlock(&h->mu);
    if (stop) break;
    seen = __atomic_load_n(&h->gen, __ATOMIC_ACQUIRE);   /* the job fields were set before */
    int rc = 0;
    if (id < h->env.num_task) {
      tls_error[0] = 0;
      rc = h->job(id, &h->env, h->job_data);
    }
    if (rc) {
      pthread_mutex_lock(&h->mu);
      h->job_rc = rc;
      if (!h->job_err[0]) snprintf(h->job_err, sizeof h->job_err, "%s", tls_error);
      pthread_mutex_unlock(&h->mu);
    }
    if (__atomic_sub_fetch(&h->pending, 1, __ATOMIC_ACQ_REL) == 0) {
      pthread_mutex_lock(&h->mu);
      pthread_cond_signal(&h->done);
      pthread_mutex_unlock(&h->mu);
    }
  }
  return NULL;
}

static int ParallelLaunch(FTVMParallelLambda f, void* cdata, int num_task) {
  lcmac_handle* h = tls_handle;
  /* the generated lambda splits its loop by penv->num_task, so fewer tasks than asked for
   * is correct; outside a call (a nested launch on a worker) the work runs serially */
  int n = h ? h->nthreads : 1;
  if (num_task > 0 && num_task < n) n = num_task;
  if (n <= 1) {
    TVMParallelGroupEnv env = {NULL, 1};
    return f(0, &env, cdata);
  }
  pthread_barrier_init(&h->barrier, NULL, (unsigned)n);
  pthread_mutex_lock(&h->mu);
  h->job = f;
  h->job_data = cdata;
  h->env.sync_handle = &h->barrier;
  h->env.num_task = n;
  h->job_rc = 0;
  h->job_err[0] = 0;
  __atomic_store_n(&h->pending, h->nworkers, __ATOMIC_RELAXED);
  __atomic_add_fetch(&h->gen, 1, __ATOMIC_RELEASE);   /* publishes the job to the spinners */
  pthread_cond_broadcast(&h->start);
  pthread_mutex_unlock(&h->mu);
  int rc = f(0, &h->env, cdata);
  for (int i = 0; i < LCMAC_SPIN && __atomic_load_n(&h->pending, __ATOMIC_ACQUIRE) > 0; ++i)
    LCMAC_RELAX();
  pthread_mutex_lock(&h->mu);
  while (__atomic_load_n(&h->pending, __ATOMIC_ACQUIRE) > 0) pthread_cond_wait(&h->done, &h->mu);
  if (!rc) rc = h->job_rc;
  if (h->job_rc && !tls_error[0]) snprintf(tls_error, sizeof tls_error, "%s", h->job_err);
  pthread_mutex_unlock(&h->mu);
  pthread_barrier_destroy(&h->barrier);
  return rc;
}

static int ParallelBarrier(int task_id, TVMParallelGroupEnv* env) {
  (void)task_id;
  if (env->num_task > 1) pthread_barrier_wait((pthread_barrier_t*)env->sync_handle);
  return 0;
}

static void* raw_alloc(size_t bytes) {
  void* p = NULL;
  if (posix_memalign(&p, 128, bytes ? bytes : 1)) return NULL;
  return p;
}

/* An allocator that replaces the workspace cache for every workspace (lcmac_run's guard
 * pages set it; elem = the element size, for allocators that place a buffer's end). */
static void* (*g_ws_alloc)(size_t nbytes, size_t elem) = NULL;
static void (*g_ws_free)(void* ptr) = NULL;

/* Workspaces the calling thread allocates (the kernel's packed operands and C workspace)
 * are cached in the handle: a large block freshly mapped every call costs page faults
 * comparable to the combine passes.  Other threads allocate plainly. */
static void* AllocWorkspace(int dev_type, int dev_id, uint64_t nbytes, int code, int bits) {
  (void)dev_type; (void)dev_id; (void)code;
  lcmac_handle* h = tls_handle;
  size_t n = (size_t)nbytes;
  if (g_ws_alloc) return g_ws_alloc(n, bits >= 8 ? (size_t)bits / 8 : 1);
  if (!h) return raw_alloc(n);
  int best = -1, empty = -1;
  for (int i = 0; i < LCMAC_WS_SLOTS; ++i) {
    WsBlock* b = &h->ws[i];
    if (!b->ptr) { if (empty < 0) empty = i; continue; }
    if (!b->used && b->bytes >= n && (best < 0 || b->bytes < h->ws[best].bytes)) best = i;
  }
  if (best >= 0) { h->ws[best].used = 1; return h->ws[best].ptr; }
  if (empty < 0) {   /* all slots hold blocks: drop an unused one that is too small */
    for (int i = 0; i < LCMAC_WS_SLOTS && empty < 0; ++i)
      if (!h->ws[i].used) { free(h->ws[i].ptr); h->ws[i].ptr = NULL; empty = i; }
  }
  void* p = raw_alloc(n);
  if (p && empty >= 0) { h->ws[empty].ptr = p; h->ws[empty].bytes = n; h->ws[empty].used = 1; }
  return p;
}

static int FreeWorkspace(int dev_type, int dev_id, void* ptr) {
  (void)dev_type; (void)dev_id;
  lcmac_handle* h = tls_handle;
  if (g_ws_free) { g_ws_free(ptr); return 0; }
  if (h)
    for (int i = 0; i < LCMAC_WS_SLOTS; ++i)
      if (h->ws[i].ptr == ptr) { h->ws[i].used = 0; return 0; }
  free(ptr);
  return 0;
}

static void set_hook(void* lib, const char* name, void* fn) {
  void** slot = (void**)dlsym(lib, name);
  if (slot) *slot = fn;
}

static int default_threads(void) {
  const char* env = getenv("LCMAC_NUM_THREADS");
  if (!env || !*env) env = getenv("TVM_NUM_THREADS");
  int n = env && *env ? atoi(env) : 0;
  if (n < 1) {
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
#endif
    if (n < 1) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
  }
  return n < 1 ? 1 : n;
}

static void stop_pool(lcmac_handle* h) {
  pthread_mutex_lock(&h->mu);
  __atomic_store_n(&h->stop, 1, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&h->start);
  pthread_mutex_unlock(&h->mu);
  for (int i = 0; i < h->nworkers; ++i) pthread_join(h->workers[i], NULL);
  h->nworkers = 0;
}

/* ---- opening ---- */

/* dlopen a checked library into a new handle (CPU until told otherwise, no pool yet); NULL
 * with a message on failure.  Shared by the CPU and the CUDA open. */
static lcmac_handle* new_handle(const char* who, const char* so_path, char* err, size_t errlen) {
  void* lib = dlopen(so_path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = dlerror();
    put_err(err, errlen, "%s: cannot load %s: %s", who, so_path, why ? why : "?");
    return NULL;
  }
  lcmac_handle* h = (lcmac_handle*)calloc(1, sizeof *h);
  if (!h) {
    put_err(err, errlen, "%s: out of memory", who);
    dlclose(lib);
    return NULL;
  }
  h->lib = lib;
  h->dtype = -1;
  h->device = -1;
  pthread_mutex_init(&h->call_mu, NULL);
  pthread_mutex_init(&h->mu, NULL);
  pthread_cond_init(&h->start, NULL);
  pthread_cond_init(&h->done, NULL);
  return h;
}

/* An artifact whose products run on the vendor BLAS (config vendor_base) exports pointer
 * slots __lcmac_cblas_<s|d>gemm_<ilp64|lp64>: fill them with the CBLAS of LCMAC_BLAS (a
 * library path) or, without it, the one the program is linked with (cblas_sgemm: -lopenblas,
 * MKL, BLIS).  0, or -1 with a message when the artifact needs one and none is found. */
static int bind_vendor_blas(lcmac_handle* h, const char* who, char* err, size_t errlen) {
  static const char* const kinds[][2] = {{"cblas_%cgemm", "lp64"}, {"scipy_cblas_%cgemm64_", "ilp64"},
                                          {"cblas_%cgemm64_", "ilp64"}};
  const char* env = getenv("LCMAC_BLAS");
  for (const char* l = "sd"; *l; ++l) {
    char slot[64], sym[64];
    snprintf(slot, sizeof slot, "__lcmac_cblas_%cgemm_lp64", *l);
    void** lp = (void**)dlsym(h->lib, slot);
    snprintf(slot, sizeof slot, "__lcmac_cblas_%cgemm_ilp64", *l);
    void** ilp = (void**)dlsym(h->lib, slot);
    if (!lp || !ilp) continue;                      /* not a vendor-base artifact of this dtype */
    if (env && *env && !h->blas && !(h->blas = dlopen(env, RTLD_NOW | RTLD_LOCAL))) {
      put_err(err, errlen, "%s: LCMAC_BLAS=%s cannot be loaded: %s", who, env, dlerror());
      return -1;
    }
    void* src = h->blas ? h->blas : RTLD_DEFAULT;
    int bound = 0;
    for (int k = 0; k < 3 && !bound; ++k) {
      snprintf(sym, sizeof sym, kinds[k][0], *l);
      void* fn = dlsym(src, sym);
      if (fn) {
        *(strcmp(kinds[k][1], "lp64") ? ilp : lp) = fn;
        bound = 1;
      }
    }
    if (!bound) {
      put_err(err, errlen, "%s: this artifact runs its products on a vendor BLAS and %s has no "
              "cblas_%cgemm: link the program with a CBLAS (e.g. -lopenblas) or set LCMAC_BLAS "
              "to one", who, h->blas ? env : "the program", *l);
      return -1;
    }
  }
  return 0;
}

/* dlopen a checked library, find its entry point, start the pool; NULL with *status and a
 * message on failure */
static lcmac_handle* open_library(const char* who, const char* so_path, const char* entry,
                                  int num_threads, int* status, char* err, size_t errlen) {
  *status = LCMAC_ELOAD;
  /* the library resolves this symbol against the program (see lcmac.h: -rdynamic) */
  if (!dlsym(RTLD_DEFAULT, "TVMFFIErrorSetRaisedFromCStrParts")) {
    put_err(err, errlen, "%s: TVMFFIErrorSetRaisedFromCStrParts is not visible to the "
            "libraries this process loads; link the program with -rdynamic", who);
    return NULL;
  }
  lcmac_handle* h = new_handle(who, so_path, err, errlen);
  if (!h) return NULL;
  void* lib = h->lib;
  char sym[300];
  snprintf(sym, sizeof sym, "__tvm_ffi_%s", entry);
  h->fn = (TVMFFISafeCallType)dlsym(lib, sym);
  if (!h->fn) {
    put_err(err, errlen, "%s: %s has no entry point %s (see the manifest's entry_points)", who,
            so_path, entry);
    lcmac_close(h);
    return NULL;
  }
  snprintf(h->entry, sizeof h->entry, "%s", entry);
  set_hook(lib, "__TVMBackendParallelLaunch", (void*)ParallelLaunch);
  set_hook(lib, "__TVMBackendParallelBarrier", (void*)ParallelBarrier);
  set_hook(lib, "__TVMBackendAllocWorkspace", (void*)AllocWorkspace);
  set_hook(lib, "__TVMBackendFreeWorkspace", (void*)FreeWorkspace);
  if (bind_vendor_blas(h, who, err, errlen)) {
    lcmac_close(h);
    return NULL;
  }
  int n = num_threads > 0 ? num_threads : default_threads();
  if (n > LCMAC_MAX_THREADS) n = LCMAC_MAX_THREADS;
  h->nthreads = n;
  for (int i = 1; i < n; ++i) {
    WorkerArg* a = (WorkerArg*)malloc(sizeof *a);
    if (!a) break;
    a->h = h;
    a->id = i;
    if (pthread_create(&h->workers[h->nworkers], NULL, worker_main, a)) { free(a); break; }
    h->nworkers++;
  }
  if (h->nworkers != n - 1) {
    put_err(err, errlen, "%s: cannot start %d worker threads", who, n - 1);
    lcmac_close(h);
    return NULL;
  }
  *status = LCMAC_OK;
  return h;
}

lcmac_handle* lcmac_open(const char* so_path, const char* entry, int num_threads, char* err,
                         size_t errlen) {
  if (err && errlen) err[0] = 0;
  if (!so_path || !entry || !*entry) {
    put_err(err, errlen, "lcmac_open: the library path and the entry name must not be NULL or empty");
    return NULL;
  }
  if (strlen(entry) > 200) {
    put_err(err, errlen, "lcmac_open: entry name too long: %s", entry);
    return NULL;
  }
  int status;
  if (check_library_file("lcmac_open", so_path, -1, NULL, err, errlen)) return NULL;
#if defined(__x86_64__)
  /* A bare library may hold an AMX kernel and has no manifest to say so: where the CPU has
   * AMX, ask Linux for tile state first (per process and harmless; lcmac_open_artifact asks
   * only for AMX artifacts), so that its first tile instruction is not an illegal one. */
  char* flags = cpuinfo_flags();
  if (flags && has_word(flags, "amx_tile")) syscall(SYS_arch_prctl, 0x1023, 18);
  free(flags);
#endif
  return open_library("lcmac_open", so_path, entry, num_threads, &status, err, errlen);
}

/* defined in lcmac_cuda.c (included below) */
static int check_gpu(const char* who, const char* arch, int device, char* err, size_t errlen);
static lcmac_handle* open_cuda_library(const char* who, const ArtifactInfo* a, int device,
                                       int* status, char* err, size_t errlen);

/* lcmac_open_artifact (cuda 0) and lcmac_open_cuda_artifact (cuda 1, on `device`): the
 * manifest, the library file and, for CUDA, the GPU checked, then the library opened; the
 * handle keeps the manifest's shape, dtype and record of the library */
static lcmac_handle* open_checked(const char* who, const char* manifest_path, int cuda,
                                  int device, int num_threads, int* status, char* err,
                                  size_t errlen) {
  lcmac_handle* h = NULL;
  ArtifactInfo* a = NULL;
  int rc;
  if (err && errlen) err[0] = 0;
  if (!manifest_path || !*manifest_path) {
    put_err(err, errlen, "%s: the manifest path must not be NULL or empty", who);
    rc = LCMAC_EINVAL;
  } else if (!(a = (ArtifactInfo*)calloc(1, sizeof *a))) {
    put_err(err, errlen, "%s: out of memory", who);
    rc = LCMAC_ELOAD;
  } else if (!((a->cuda = cuda), (rc = read_manifest(who, manifest_path, a, err, errlen))) &&
             !(rc = check_library_file(who, a->lib, a->bytes, a->sha256, err, errlen)) &&
             !(cuda && (rc = check_gpu(who, a->arch, device, err, errlen))) &&
             (h = cuda ? open_cuda_library(who, a, device, &rc, err, errlen)
                       : open_library(who, a->lib, a->entry, num_threads, &rc, err, errlen))) {
    h->has_manifest = 1;
    h->M = a->M;
    h->N = a->N;
    h->K = a->K;
    h->dtype = a->dtype;
    snprintf(h->sha256, sizeof h->sha256, "%s", a->sha256);
    h->bytes = a->bytes;
    h->piece = a->piece;
    memcpy(h->piece_units, a->piece_units, sizeof h->piece_units);
    h->prep_bytes = -1;
    if (!cuda && a->prep_bytes > 0) {   /* the manifest names them: the library must have them */
      char sym[300];
      snprintf(sym, sizeof sym, "__tvm_ffi_%s_prepare_b", a->entry);
      h->prep_fn = (TVMFFISafeCallType)dlsym(h->lib, sym);
      snprintf(sym, sizeof sym, "__tvm_ffi_%s_prepared", a->entry);
      h->prep_run_fn = (TVMFFISafeCallType)dlsym(h->lib, sym);
      if (!h->prep_fn || !h->prep_run_fn) {
        put_err(err, errlen, "%s: %s lacks the prepared-B entry points its manifest %s names",
                who, a->lib, manifest_path);
        lcmac_close(h);
        h = NULL;
        rc = LCMAC_ECORRUPT;
      } else {
        h->prep_bytes = a->prep_bytes;
        h->prep_shape[0] = a->prep_shape[0];
        h->prep_shape[1] = a->prep_shape[1];
        h->prep_code = a->prep_code;
        h->prep_bits = a->prep_bits;
      }
    }
  }
  /* a library that cannot be read: say which manifest named it */
  if (rc == LCMAC_EIO && a && a->lib[0] && err && errlen && errlen > strlen(err) + 1)
    snprintf(err + strlen(err), errlen - strlen(err), " (library.file of the manifest %s)",
             manifest_path);
  free(a);
  if (status) *status = rc;
  return h;
}

lcmac_handle* lcmac_open_artifact(const char* manifest_path, int num_threads, int* status,
                                  char* err, size_t errlen) {
  return open_checked("lcmac_open_artifact", manifest_path, 0, -1, num_threads, status, err,
                      errlen);
}

/* Call entry point fn (named what) with packed arguments.  The caller holds h->call_mu. */
static int call_entry(lcmac_handle* h, TVMFFISafeCallType fn, const char* what, TVMFFIAny* args,
                      int nargs) {
  TVMFFIAny result;
  memset(&result, 0, sizeof result);
  result.type_index = kTVMFFINone;
  lcmac_handle* prev = tls_handle;
  tls_handle = h;
  tls_error[0] = 0;
  int rc = fn(NULL, args, nargs, &result);
  tls_handle = prev;
  if (rc != 0) {
    snprintf(h->err, sizeof h->err, "%s failed: %s", what,
             tls_error[0] ? tls_error : "the library reported an error without a message");
    return LCMAC_EKERNEL;
  }
  h->err[0] = 0;
  return LCMAC_OK;
}

/* The main entry point with packed arguments (the harness's way in; lcmac_matmul's too). */
int lcmac_internal_call(lcmac_handle* h, TVMFFIAny* args, int nargs) {
  return call_entry(h, h->fn, h->entry, args, nargs);
}

static int dtype_of(int code, DLDataType* t) {
  t->lanes = 1;
  switch (code) {
    case LCMAC_FLOAT32: t->code = 2; t->bits = 32; return 0;
    case LCMAC_FLOAT64: t->code = 2; t->bits = 64; return 0;
    case LCMAC_BFLOAT16: t->code = 4; t->bits = 16; return 0;
    case LCMAC_FLOAT16: t->code = 2; t->bits = 16; return 0;
    default: return -1;
  }
}

static int overlaps(const void* a, size_t na, const void* b, size_t nb) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + nb && y < x + na;
}

/* a call on a NULL handle: LCMAC_EINVAL, its message where lcmac_last_error(NULL) finds it */
static int null_handle(const char* who) {
  snprintf(tls_null_error, sizeof tls_null_error, "%s: the handle is NULL", who);
  return LCMAC_EINVAL;
}

/* the element type of a handle's prepared B */
static DLDataType prepared_dtype(const lcmac_handle* h) {
  DLDataType t = {(uint8_t)h->prep_code, (uint8_t)h->prep_bits, 1};
  return t;
}

/* tensor argument i: a 2-D DLTensor on the CPU */
static void tensor_arg(DLTensor* t, TVMFFIAny* arg, const void* data, int64_t* shape, DLDataType dt) {
  memset(t, 0, sizeof *t);
  t->data = (void*)data;
  t->device.device_type = kDLCPU;
  t->ndim = 2;
  t->dtype = dt;
  t->shape = shape;
  memset(arg, 0, sizeof *arg);
  arg->type_index = kTVMFFIDLTensorPtr;
  arg->v.v_ptr = t;
}

/* The checks of a CPU call (who: the API function) on a handle whose call_mu is held: 0, or
 * LCMAC_EINVAL with h->err set.  X, Y: the two operands' names for the NULL check. */
static int check_cpu_call(lcmac_handle* h, const char* who, const void* x, const char* X,
                          const void* y, const char* Y, const void* C, int64_t M, int64_t N,
                          int64_t K, int dtype, DLDataType* dt) {
  if (!x || !y || !C)
    snprintf(h->err, sizeof h->err, "%s: %s is NULL", who, !x ? X : !y ? Y : "C");
  else if (M < 1 || N < 1 || K < 1)
    snprintf(h->err, sizeof h->err, "%s: M, N, K must be positive (got %lld, %lld, %lld)", who,
             (long long)M, (long long)N, (long long)K);
  else if (dtype_of(dtype, dt))
    snprintf(h->err, sizeof h->err, "%s: unknown dtype code %d (see lcmac_dtype)", who, dtype);
  else if (h->device >= 0)
    snprintf(h->err, sizeof h->err, "%s: this handle holds a CUDA artifact; call "
             "lcmac_cuda_matmul with device pointers and a stream", who);
  else if (h->piece)
    snprintf(h->err, sizeof h->err, "%s: this artifact is a piece kernel of a bundle (C (+)= A.B "
             "on row-strided views): open the bundle's directory with lcmac_open_bundle", who);
  else if (h->has_manifest && (M != h->M || N != h->N || K != h->K))
    snprintf(h->err, sizeof h->err, "%s: shape M=%lld N=%lld K=%lld is not the "
             "artifact's M=%lld N=%lld K=%lld (its manifest's shape)", who, (long long)M,
             (long long)N, (long long)K, (long long)h->M, (long long)h->N, (long long)h->K);
  else if (h->has_manifest && dtype != h->dtype)
    snprintf(h->err, sizeof h->err, "%s: dtype %s is not the artifact's %s", who,
             dtype_name(dtype), dtype_name(h->dtype));
  else
    return 0;
  return LCMAC_EINVAL;
}

int lcmac_matmul(lcmac_handle* h, const void* A, const void* B, void* C, int64_t M, int64_t N,
                 int64_t K, int dtype) {
  if (!h) return null_handle("lcmac_matmul");
  pthread_mutex_lock(&h->call_mu);
  DLDataType dt;
  int rc = check_cpu_call(h, "lcmac_matmul", A, "A", B, "B", C, M, N, K, dtype, &dt);
  if (!rc) {
    size_t sz = dt.bits / 8;
    size_t na = (size_t)M * (size_t)K * sz, nb = (size_t)K * (size_t)N * sz;
    size_t nc = (size_t)M * (size_t)N * sz;
    if (overlaps(C, nc, A, na) || overlaps(C, nc, B, nb)) {
      snprintf(h->err, sizeof h->err, "lcmac_matmul: C overlaps %s in memory",
               overlaps(C, nc, A, na) ? "A" : "B");
      rc = LCMAC_EINVAL;
    } else {
      int64_t sa[2] = {M, K}, sb[2] = {K, N}, sc[2] = {M, N};
      DLTensor t[3];
      TVMFFIAny args[3];
      tensor_arg(&t[0], &args[0], A, sa, dt);
      tensor_arg(&t[1], &args[1], B, sb, dt);
      tensor_arg(&t[2], &args[2], C, sc, dt);
      rc = lcmac_internal_call(h, args, 3);
    }
  }
  pthread_mutex_unlock(&h->call_mu);
  return rc;
}

/* ---- a B used many times, combined once (CPU artifacts built with the prepared pair) ---- */
int64_t lcmac_prepared_b_bytes(const lcmac_handle* h) {
  return h && h->device < 0 && h->prep_fn ? h->prep_bytes : -1;
}

/* why h cannot prepare B (into h->err); LCMAC_EINVAL */
static int cannot_prepare(lcmac_handle* h, const char* who) {
  if (h->device >= 0)
    snprintf(h->err, sizeof h->err, "%s: this handle holds a CUDA artifact; call "
             "lcmac_cuda_prepare_b / lcmac_cuda_matmul_prepared", who);
  else if (!h->has_manifest)
    snprintf(h->err, sizeof h->err, "%s: a handle from lcmac_open (a bare library) has no "
             "prepared B; open the artifact's manifest with lcmac_open_artifact", who);
  else
    snprintf(h->err, sizeof h->err, "%s: this artifact has no prepared-B entry points (built "
             "by an older lcmac): rebuild it", who);
  return LCMAC_EINVAL;
}

static int check_p(lcmac_handle* h, const char* who, const void* P) {
  if (P && ((uintptr_t)P & 63)) {
    snprintf(h->err, sizeof h->err, "%s: P must be 64-byte aligned (posix_memalign(&P, 64, bytes))", who);
    return LCMAC_EINVAL;
  }
  return 0;
}

int lcmac_prepare_b(lcmac_handle* h, const void* B, void* P, size_t P_bytes) {
  static const char who[] = "lcmac_prepare_b";
  if (!h) return null_handle(who);
  pthread_mutex_lock(&h->call_mu);
  DLDataType dt;
  int rc = lcmac_prepared_b_bytes(h) < 0 ? cannot_prepare(h, who)
         : check_cpu_call(h, who, B, "B", P, "P", P, h->M, h->N, h->K, h->dtype, &dt);
  if (!rc && (int64_t)P_bytes < h->prep_bytes) {
    snprintf(h->err, sizeof h->err, "%s: P holds %zu bytes; the prepared B needs %lld "
             "(lcmac_prepared_b_bytes)", who, P_bytes, (long long)h->prep_bytes);
    rc = LCMAC_EINVAL;
  }
  if (!rc && !(rc = check_p(h, who, P))) {
    if (overlaps(P, (size_t)h->prep_bytes, B, (size_t)(h->K * h->N) * (dt.bits / 8))) {
      snprintf(h->err, sizeof h->err, "%s: P overlaps B in memory", who);
      rc = LCMAC_EINVAL;
    } else {
      int64_t sb[2] = {h->K, h->N};
      DLDataType pt = prepared_dtype(h);
      DLTensor t[2];
      TVMFFIAny args[2];
      tensor_arg(&t[0], &args[0], B, sb, dt);
      tensor_arg(&t[1], &args[1], P, h->prep_shape, pt);
      rc = call_entry(h, h->prep_fn, who, args, 2);
    }
  }
  pthread_mutex_unlock(&h->call_mu);
  return rc;
}

int lcmac_matmul_prepared(lcmac_handle* h, const void* A, const void* P, void* C, int64_t M,
                          int64_t N, int64_t K, int dtype) {
  static const char who[] = "lcmac_matmul_prepared";
  if (!h) return null_handle(who);
  pthread_mutex_lock(&h->call_mu);
  DLDataType dt;
  int rc = lcmac_prepared_b_bytes(h) < 0 ? cannot_prepare(h, who)
         : check_cpu_call(h, who, A, "A", P, "P", C, M, N, K, dtype, &dt);
  if (!rc && !(rc = check_p(h, who, P))) {
    size_t sz = dt.bits / 8, nc = (size_t)M * (size_t)N * sz;
    if (overlaps(C, nc, A, (size_t)M * (size_t)K * sz) || overlaps(C, nc, P, (size_t)h->prep_bytes)) {
      snprintf(h->err, sizeof h->err, "%s: C overlaps %s in memory", who,
               overlaps(C, nc, A, (size_t)M * (size_t)K * sz) ? "A" : "P");
      rc = LCMAC_EINVAL;
    } else {
      int64_t sa[2] = {M, K}, sc[2] = {M, N};
      DLDataType pt = prepared_dtype(h);
      DLTensor t[3];
      TVMFFIAny args[3];
      tensor_arg(&t[0], &args[0], A, sa, dt);
      tensor_arg(&t[1], &args[1], P, h->prep_shape, pt);
      tensor_arg(&t[2], &args[2], C, sc, dt);
      rc = call_entry(h, h->prep_run_fn, who, args, 3);
    }
  }
  pthread_mutex_unlock(&h->call_mu);
  return rc;
}

const char* lcmac_last_error(const lcmac_handle* h) {
  return h ? h->err : tls_null_error;
}

int lcmac_num_threads(const lcmac_handle* h) {
  return h ? h->nthreads : 0;
}

int lcmac_shape(const lcmac_handle* h, int64_t* M, int64_t* N, int64_t* K) {
  int known = h && h->has_manifest;
  if (M) *M = known ? h->M : 0;
  if (N) *N = known ? h->N : 0;
  if (K) *K = known ? h->K : 0;
  return known ? LCMAC_OK : LCMAC_EINVAL;
}

int lcmac_dtype_of(const lcmac_handle* h) {
  return h && h->has_manifest ? h->dtype : -1;
}

static void close_cuda(lcmac_handle* h);

void lcmac_close(lcmac_handle* h) {
  if (!h) return;
  if (h->device >= 0) close_cuda(h);
  stop_pool(h);
  for (int i = 0; i < LCMAC_WS_SLOTS; ++i) free(h->ws[i].ptr);
  pthread_cond_destroy(&h->start);
  pthread_cond_destroy(&h->done);
  pthread_mutex_destroy(&h->mu);
  pthread_mutex_destroy(&h->call_mu);
  if (h->lib) dlclose(h->lib);
  if (h->blas) dlclose(h->blas);
  free(h);
}

const char* lcmac_status_name(int status) {
  switch (status) {
    case LCMAC_OK: return "LCMAC_OK";
    case LCMAC_EINVAL: return "LCMAC_EINVAL";
    case LCMAC_EKERNEL: return "LCMAC_EKERNEL";
    case LCMAC_EFORMAT: return "LCMAC_EFORMAT";
    case LCMAC_ETARGET: return "LCMAC_ETARGET";
    case LCMAC_ECORRUPT: return "LCMAC_ECORRUPT";
    case LCMAC_EIO: return "LCMAC_EIO";
    case LCMAC_ELOAD: return "LCMAC_ELOAD";
    default: return "unknown lcmac status";
  }
}

/* ---- CUDA artifacts: lcmac_open_cuda_artifact, lcmac_cuda_matmul, prepared B ---- */
#include "lcmac_cuda.c"

/* ---- bundles: lcmac_open_bundle, lcmac_bundle_matmul (on the artifact APIs above) ---- */
#include "lcmac_bundle.c"
