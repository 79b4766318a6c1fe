/*
 * lcmac_run: a small host program that runs one function of an lcmac CPU artifact
 * (a shared library produced by apache-tvm + LLVM) with no Python and no TVM runtime.
 *
 * It is built for the artifact's architecture (e.g. with aarch64-linux-gnu-gcc) and run
 * natively or under qemu-user.  lcmac.runtime.qemu_runner builds and drives it.
 *
 * What an apache-tvm 0.25 CPU library needs from the program that loads it (the tvm-ffi
 * calling convention, the error callback, the parallel-launch and workspace hooks) comes
 * from lcmac_c.c, the C API of lcmac/runtime/include/lcmac.h, included below: this file is
 * only the command line.  Build it as one file: cc -O2 -std=gnu99 -rdynamic -o lcmac_run
 * lcmac_run.c -ldl -lpthread.
 *
 * Usage:
 *   lcmac_run LIB FUNC [--repeat N] ARG...
 *   ARG := in:DTYPE:D0xD1x...:PATH    tensor read from PATH (raw, C order)
 *        | out:DTYPE:D0xD1x...:PATH   tensor written to PATH after the call
 *        | i64:VALUE                  an integer argument
 *   DTYPE := f32 | f64 | f16 | bf16 | i32 | i64
 * Exit status 0 on success; 2 when the function reports an error (message on stderr);
 * 1 on usage or I/O errors.  With --repeat N it prints "seconds_per_call=..." on stdout.
 *
 * LCMAC_GUARD_PAGES=after (or 1) | before: every tensor and workspace gets a mapping of its
 * own between two PROT_NONE pages, placed so that its last byte (after) or its first byte
 * (before) touches a guard page.  A kernel that reads or writes past the end (or before the
 * start) of any buffer then dies with SIGSEGV instead of silently using a neighbour's bytes,
 * which an out-of-range lane that is masked or multiplied by zero would otherwise hide.
 * "after" gives up the 64-byte alignment TVM assumes (AArch64 loads do not need it).
 */
#include "lcmac_c.c"

#include <sys/mman.h>
#include <time.h>

/* ---- buffers: aligned heap memory, or guarded mappings (LCMAC_GUARD_PAGES) ---- */
enum { kGuardNone = 0, kGuardAfter = 1, kGuardBefore = 2 };
static int g_guard = kGuardNone;

typedef struct Guarded { void* user; char* base; size_t len; struct Guarded* next; } Guarded;
static Guarded* g_guarded = NULL;
static pthread_mutex_t g_guard_lock = PTHREAD_MUTEX_INITIALIZER;

static void* guarded_alloc(size_t nbytes, size_t elem) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  if (elem < 1) elem = 1;
  size_t n = nbytes ? (nbytes + elem - 1) / elem * elem : elem;   /* whole elements */
  size_t data = (n + page - 1) / page * page;
  size_t len = data + 2 * page;
  char* base = (char*)mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return NULL;
  if (mprotect(base, page, PROT_NONE) || mprotect(base + page + data, page, PROT_NONE)) {
    munmap(base, len);
    return NULL;
  }
  Guarded* g = (Guarded*)malloc(sizeof *g);
  if (!g) { munmap(base, len); return NULL; }
  g->base = base;
  g->len = len;
  g->user = g_guard == kGuardAfter ? base + page + data - n : base + page;
  pthread_mutex_lock(&g_guard_lock);
  g->next = g_guarded;
  g_guarded = g;
  pthread_mutex_unlock(&g_guard_lock);
  return g->user;
}

static void* buffer_alloc(size_t nbytes, size_t elem) {
  if (g_guard != kGuardNone) return guarded_alloc(nbytes, elem);
  void* p = NULL;
  if (posix_memalign(&p, 128, nbytes ? nbytes : 1)) return NULL;
  return p;
}

static void buffer_free(void* ptr) {
  if (g_guard != kGuardNone) {
    pthread_mutex_lock(&g_guard_lock);
    for (Guarded** pg = &g_guarded; *pg; pg = &(*pg)->next) {
      if ((*pg)->user == ptr) {
        Guarded* g = *pg;
        *pg = g->next;
        pthread_mutex_unlock(&g_guard_lock);
        munmap(g->base, g->len);
        free(g);
        return;
      }
    }
    pthread_mutex_unlock(&g_guard_lock);
  }
  free(ptr);
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
  const char* guard = getenv("LCMAC_GUARD_PAGES");
  if (guard && *guard && strcmp(guard, "0")) {
    if (!strcmp(guard, "before")) g_guard = kGuardBefore;
    else if (!strcmp(guard, "after") || !strcmp(guard, "1")) g_guard = kGuardAfter;
    else { fprintf(stderr, "lcmac_run: LCMAC_GUARD_PAGES must be after, before or 0\n"); return 1; }
    /* every workspace guarded too (instead of lcmac_c.c's cache) */
    g_ws_alloc = buffer_alloc;
    g_ws_free = buffer_free;
  }
  char err[LCMAC_ERRLEN];
  /* threads: LCMAC_NUM_THREADS, else TVM_NUM_THREADS, else the CPUs (lcmac_open's rule) */
  lcmac_handle* h = lcmac_open(argv[1], argv[2], 0, err, sizeof err);
  if (!h) { fprintf(stderr, "lcmac_run: %s\n", err); return 1; }

  int repeat = 0, first = 3;
  if (argc > 4 && !strcmp(argv[3], "--repeat")) { repeat = atoi(argv[4]); first = 5; }
  int nargs = argc - first;
  Arg* args = (Arg*)calloc((size_t)(nargs > 0 ? nargs : 1), sizeof(Arg));
  TVMFFIAny* packed = (TVMFFIAny*)calloc((size_t)(nargs > 0 ? nargs : 1), sizeof(TVMFFIAny));
  for (int i = 0; i < nargs; ++i) {
    char* spec = strdup(argv[first + i]);
    char* kind = strtok(spec, ":");
    if (kind && !strcmp(kind, "i64")) {
      char* val = strtok(NULL, ":");
      if (!val) { fprintf(stderr, "lcmac_run: bad argument %s\n", argv[first + i]); return 1; }
      packed[i].type_index = kTVMFFIInt;
      packed[i].v.v_int64 = strtoll(val, NULL, 10);
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
    a->t.device.device_type = kDLCPU;
    a->nbytes = n * a->t.dtype.bits / 8;
    a->t.data = buffer_alloc(a->nbytes, a->t.dtype.bits / 8);
    if (!a->t.data) { fprintf(stderr, "lcmac_run: out of memory\n"); return 1; }
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

  if (lcmac_internal_call(h, packed, nargs) != LCMAC_OK) {
    /* lcmac_last_error is "<func> failed: <the library's message>" */
    fprintf(stderr, "lcmac_run: %s\n", lcmac_last_error(h));
    return 2;
  }
  if (repeat > 0) {
    double t0 = now();
    for (int r = 0; r < repeat; ++r) lcmac_internal_call(h, packed, nargs);
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
  lcmac_close(h);
  return 0;
}
