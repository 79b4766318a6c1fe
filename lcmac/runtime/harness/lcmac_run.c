/*
 * lcmac_run: a small host program that runs one function of an lcmac CPU artifact
 * (a shared library produced by apache-tvm + LLVM) with no Python and no TVM runtime.
 *
 * It is built for the artifact's architecture (e.g. with aarch64-linux-gnu-gcc) and run
 * natively or under qemu-user.  lcmac.runtime.qemu_runner builds and drives it.
 *
 * What an apache-tvm 0.25 CPU library needs from the program that loads it:
 *   - the function symbol `__tvm_ffi_<name>`, called with the tvm-ffi "safe call" ABI:
 *         int fn(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result);
 *     each tensor argument is a TVMFFIAny with type_index 7 (DLTensor*) pointing at a DLTensor;
 *   - one undefined function, TVMFFIErrorSetRaisedFromCStrParts (defined below, exported with
 *     -rdynamic so dlopen resolves it against this executable);
 *   - data pointers `__TVMBackendParallelLaunch`, `__TVMBackendAllocWorkspace`,
 *     `__TVMBackendFreeWorkspace` (and `__TVMBackendParallelBarrier` where used) that the loader
 *     must fill in; this program fills them with its own pthread / malloc implementations.
 *
 * Usage:
 *   lcmac_run LIB FUNC [--repeat N] ARG...
 *   ARG := in:DTYPE:D0xD1x...:PATH    tensor read from PATH (raw, C order)
 *        | out:DTYPE:D0xD1x...:PATH   tensor written to PATH after the call
 *        | i64:VALUE                  an integer argument
 *   DTYPE := f32 | f64 | f16 | bf16 | i32 | i64
 * Exit status 0 on success; 2 when the function reports an error (message on stderr);
 * 1 on usage or I/O errors.  With --repeat N it prints "seconds_per_call=..." on stdout.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
typedef int (*TVMFFISafeCallType)(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);

/* ---- what the library calls back into ---- */
static char g_error[4096];

__attribute__((visibility("default")))
void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t n) {
  size_t len = 0;
  g_error[0] = 0;
  len += snprintf(g_error, sizeof g_error, "%s: ", kind ? kind : "Error");
  for (int32_t i = 0; i < n && len < sizeof g_error; ++i)
    if (parts[i]) len += snprintf(g_error + len, sizeof g_error - len, "%s", parts[i]);
}

typedef struct { void* sync_handle; int32_t num_task; } TVMParallelGroupEnv;
typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv* penv, void* cdata);

static int g_threads = 1;

typedef struct {
  FTVMParallelLambda f; void* cdata; TVMParallelGroupEnv* env; int task; int rc;
} Task;

static void* task_main(void* p) {
  Task* t = (Task*)p;
  t->rc = t->f(t->task, t->env, t->cdata);
  return NULL;
}

static int ParallelLaunch(FTVMParallelLambda f, void* cdata, int num_task) {
  int n = num_task > 0 ? num_task : g_threads;
  if (n > 256) n = 256;
  pthread_barrier_t barrier;
  TVMParallelGroupEnv env;
  env.num_task = n;
  env.sync_handle = &barrier;
  if (n == 1) return f(0, &env, cdata);
  pthread_barrier_init(&barrier, NULL, (unsigned)n);
  Task tasks[256];
  pthread_t th[256];
  for (int i = 0; i < n; ++i) {
    tasks[i].f = f; tasks[i].cdata = cdata; tasks[i].env = &env; tasks[i].task = i; tasks[i].rc = 0;
  }
  for (int i = 1; i < n; ++i) pthread_create(&th[i], NULL, task_main, &tasks[i]);
  task_main(&tasks[0]);
  int rc = tasks[0].rc;
  for (int i = 1; i < n; ++i) { pthread_join(th[i], NULL); if (tasks[i].rc) rc = tasks[i].rc; }
  pthread_barrier_destroy(&barrier);
  return rc;
}

static int ParallelBarrier(int task_id, TVMParallelGroupEnv* env) {
  (void)task_id;
  if (env->num_task > 1) pthread_barrier_wait((pthread_barrier_t*)env->sync_handle);
  return 0;
}

static void* AllocWorkspace(int dev_type, int dev_id, uint64_t nbytes, int code, int bits) {
  (void)dev_type; (void)dev_id; (void)code; (void)bits;
  void* p = NULL;
  if (posix_memalign(&p, 128, nbytes ? (size_t)nbytes : 1)) return NULL;
  return p;
}

static int FreeWorkspace(int dev_type, int dev_id, void* ptr) {
  (void)dev_type; (void)dev_id;
  free(ptr);
  return 0;
}

static void set_hook(void* lib, const char* name, void* fn) {
  void** slot = (void**)dlsym(lib, name);
  if (slot) *slot = fn;
}

/* ---- argument parsing ---- */
static int parse_dtype(const char* s, DLDataType* t) {
  t->lanes = 1;
  if (!strcmp(s, "f32")) { t->code = 2; t->bits = 32; }
  else if (!strcmp(s, "f64")) { t->code = 2; t->bits = 64; }
  else if (!strcmp(s, "f16")) { t->code = 2; t->bits = 16; }
  else if (!strcmp(s, "bf16")) { t->code = 4; t->bits = 16; }
  else if (!strcmp(s, "i32")) { t->code = 0; t->bits = 32; }
  else if (!strcmp(s, "i64")) { t->code = 0; t->bits = 64; }
  else return -1;
  return 0;
}

typedef struct { DLTensor t; int64_t shape[8]; int is_out; const char* path; size_t nbytes; } Arg;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s LIB FUNC [--repeat N] ARG...\n", argv[0]);
    return 1;
  }
  const char* env = getenv("LCMAC_NUM_THREADS");
  if (!env) env = getenv("TVM_NUM_THREADS");
  g_threads = env ? atoi(env) : (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (g_threads < 1) g_threads = 1;

  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) { fprintf(stderr, "lcmac_run: cannot load %s: %s\n", argv[1], dlerror()); return 1; }
  set_hook(lib, "__TVMBackendParallelLaunch", (void*)ParallelLaunch);
  set_hook(lib, "__TVMBackendParallelBarrier", (void*)ParallelBarrier);
  set_hook(lib, "__TVMBackendAllocWorkspace", (void*)AllocWorkspace);
  set_hook(lib, "__TVMBackendFreeWorkspace", (void*)FreeWorkspace);

  char sym[512];
  snprintf(sym, sizeof sym, "__tvm_ffi_%s", argv[2]);
  TVMFFISafeCallType fn = (TVMFFISafeCallType)dlsym(lib, sym);
  if (!fn) { fprintf(stderr, "lcmac_run: %s has no function %s\n", argv[1], argv[2]); return 1; }

  int repeat = 0, first = 3;
  if (argc > 4 && !strcmp(argv[3], "--repeat")) { repeat = atoi(argv[4]); first = 5; }
  int nargs = argc - first;
  Arg* args = (Arg*)calloc((size_t)(nargs > 0 ? nargs : 1), sizeof(Arg));
  TVMFFIAny* packed = (TVMFFIAny*)calloc((size_t)(nargs > 0 ? nargs : 1), sizeof(TVMFFIAny));
  for (int i = 0; i < nargs; ++i) {
    char* spec = strdup(argv[first + i]);
    char* kind = strtok(spec, ":");
    if (kind && !strcmp(kind, "i64")) {
      packed[i].type_index = kTVMFFIInt;
      packed[i].v.v_int64 = strtoll(strtok(NULL, ":"), NULL, 10);
      continue;
    }
    char* dt = strtok(NULL, ":");
    char* dims = strtok(NULL, ":");
    char* path = strtok(NULL, "");
    Arg* a = &args[i];
    if (!kind || !dt || !dims || !path || parse_dtype(dt, &a->t.dtype)) {
      fprintf(stderr, "lcmac_run: bad argument %s\n", argv[first + i]);
      return 1;
    }
    a->is_out = !strcmp(kind, "out");
    a->path = path;
    size_t n = 1;
    for (char* d = strtok(dims, "x"); d; d = strtok(NULL, "x")) {
      if (a->t.ndim >= 8) { fprintf(stderr, "lcmac_run: too many dims\n"); return 1; }
      a->shape[a->t.ndim++] = strtoll(d, NULL, 10);
      n *= (size_t)a->shape[a->t.ndim - 1];
    }
    a->t.shape = a->shape;
    a->t.device.device_type = 1; /* kDLCPU */
    a->nbytes = n * a->t.dtype.bits / 8;
    if (posix_memalign(&a->t.data, 128, a->nbytes ? a->nbytes : 1)) return 1;
    memset(a->t.data, 0, a->nbytes);
    if (!a->is_out) {
      FILE* f = fopen(path, "rb");
      if (!f || fread(a->t.data, 1, a->nbytes, f) != a->nbytes) {
        fprintf(stderr, "lcmac_run: cannot read %zu bytes from %s\n", a->nbytes, path);
        return 1;
      }
      fclose(f);
    }
    packed[i].type_index = kTVMFFIDLTensorPtr;
    packed[i].v.v_ptr = &a->t;
  }

  TVMFFIAny result;
  memset(&result, 0, sizeof result);
  result.type_index = kTVMFFINone;
  if (fn(NULL, packed, nargs, &result) != 0) {
    fprintf(stderr, "lcmac_run: %s failed: %s\n", argv[2], g_error);
    return 2;
  }
  if (repeat > 0) {
    double t0 = now();
    for (int r = 0; r < repeat; ++r) fn(NULL, packed, nargs, &result);
    printf("seconds_per_call=%.9g\n", (now() - t0) / repeat);
  }
  for (int i = 0; i < nargs; ++i) {
    if (!args[i].is_out) continue;
    FILE* f = fopen(args[i].path, "wb");
    if (!f || fwrite(args[i].t.data, 1, args[i].nbytes, f) != args[i].nbytes) {
      fprintf(stderr, "lcmac_run: cannot write %s\n", args[i].path);
      return 1;
    }
    fclose(f);
  }
  return 0;
}
