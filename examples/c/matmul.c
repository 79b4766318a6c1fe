/*
 * matmul.c — run an lcmac artifact from C: random A and B, C = A·B through lcmac.h, checked
 * against a naive triple loop in double, timed.
 *
 *   lcmac build --algo strassen --shape 1024x1024x1024 -o out
 *   make -C examples/c
 *   examples/c/matmul out/strassen-x86_64-avx512-float32-1024x1024x1024.json
 *
 * Usage: matmul ARTIFACT.json [M N K] [--dtype f32|f64|bf16] [--threads T] [--repeat R] [--prepared]
 *        matmul LIB.so M N K [--dtype f32|f64|bf16] [--threads T] [--repeat R] [--entry NAME]
 *        matmul BUNDLE_DIR M N K [--dtype f32|f64|bf16] [--threads T] [--repeat R]
 * A directory holding bundle.json is opened as a bundle (lcmac_open_bundle: every kernel
 * checked as an artifact) and M N K may be any shape one of its rules admits; the dtype
 * defaults to the bundle's.
 * With the manifest (<name>.json) the artifact is checked before it is loaded (format, target
 * and CPU features, the library's size, SHA-256 and ELF headers: see lcmac.h) and M, N, K and
 * the dtype default to the manifest's; others are refused before the library runs.  A bare
 * LIB.so gets only the ELF check, and M, N, K and the dtype must be given (the library refuses
 * others).  The check uses at most 256 rows of C (all of them for M <= 256).
 * --prepared (an artifact's manifest) combines B once with lcmac_prepare_b, times
 * lcmac_matmul_prepared as well and checks it gives the same C bit for bit.
 * Exit status: 0 ok; 1 usage; 2 an lcmac error (its status name and message on stderr);
 * 3 an error above a loose bound for the dtype.
 */
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lcmac.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static double uniform(void) {   /* xorshift64*, in [-1, 1) */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) / 4503599627370496.0 - 1.0;
}

static uint16_t to_bf16(float f) {   /* round to nearest even (no NaNs here) */
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static double from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* element i of a matrix of the given dtype, as a double */
static double get(const void* x, size_t i, int dtype) {
  switch (dtype) {
    case LCMAC_FLOAT64: return ((const double*)x)[i];
    case LCMAC_BFLOAT16: return from_bf16(((const uint16_t*)x)[i]);
    default: return ((const float*)x)[i];
  }
}

static void put(void* x, size_t i, int dtype, double v) {
  switch (dtype) {
    case LCMAC_FLOAT64: ((double*)x)[i] = v; break;
    case LCMAC_BFLOAT16: ((uint16_t*)x)[i] = to_bf16((float)v); break;
    default: ((float*)x)[i] = (float)v;
  }
}

static int usage(const char* prog) {
  fprintf(stderr, "usage: %s ARTIFACT.json [M N K] [--dtype f32|f64|bf16] [--threads T] [--repeat R] "
                  "[--prepared]\n"
                  "       %s LIB.so M N K [--dtype f32|f64|bf16] [--threads T] [--repeat R] "
                  "[--entry NAME]\n"
                  "       %s BUNDLE_DIR M N K [--dtype f32|f64|bf16] [--threads T] [--repeat R]\n",
          prog, prog, prog);
  return 1;
}

int main(int argc, char** argv) {
  if (argc < 2) return usage(argv[0]);
  const char* lib = argv[1];
  size_t len = strlen(lib);
  int manifest = len > 5 && !strcmp(lib + len - 5, ".json");
  struct stat st;
  int bundle = stat(lib, &st) == 0 && S_ISDIR(st.st_mode);
  int64_t M = 0, N = 0, K = 0;
  int first = 2;   /* first option */
  if (argc >= 5 && strncmp(argv[2], "--", 2)) {
    M = atoll(argv[2]), N = atoll(argv[3]), K = atoll(argv[4]);
    first = 5;
    if (M < 1 || N < 1 || K < 1) { fprintf(stderr, "M, N, K must be positive\n"); return 1; }
  } else if (!manifest || bundle) {
    return usage(argv[0]);
  }
  int dtype = -1, threads = 0, repeat = 10, prepared = 0;
  const char* entry = "lcmac_matmul";
  for (int i = first; i < argc; i += 2) {
    if (!strcmp(argv[i], "--prepared") && manifest && !bundle) { prepared = 1; --i; continue; }
    if (i + 1 >= argc) return usage(argv[0]);
    if (!strcmp(argv[i], "--dtype")) {
      const char* d = argv[i + 1];
      dtype = !strcmp(d, "f64") || !strcmp(d, "float64") ? LCMAC_FLOAT64
            : !strcmp(d, "bf16") || !strcmp(d, "bfloat16") ? LCMAC_BFLOAT16 : LCMAC_FLOAT32;
    } else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--repeat")) repeat = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--entry") && !manifest) entry = argv[i + 1];
    else { fprintf(stderr, "unknown option %s\n", argv[i]); return usage(argv[0]); }
  }

  char err[1024];
  int status = LCMAC_OK;
  lcmac_handle* h = NULL;
  lcmac_bundle* bd = NULL;
  if (bundle) bd = lcmac_open_bundle(lib, threads, &status, err, sizeof err);
  else h = manifest ? lcmac_open_artifact(lib, threads, &status, err, sizeof err)
                    : lcmac_open(lib, entry, threads, err, sizeof err);
  if (!h && !bd) {
    if (manifest || bundle) fprintf(stderr, "%s: ", lcmac_status_name(status));
    fprintf(stderr, "%s\n", err);
    return 2;
  }
  if (bundle && dtype < 0) dtype = lcmac_bundle_dtype(bd);
  if (manifest) {   /* the manifest's shape and dtype unless given */
    if (!M) lcmac_shape(h, &M, &N, &K);
    if (dtype < 0) dtype = lcmac_dtype_of(h);
  }
  if (dtype < 0) dtype = LCMAC_FLOAT32;
  size_t sz = dtype == LCMAC_FLOAT64 ? 8 : dtype == LCMAC_BFLOAT16 ? 2 : 4;

  void* A = malloc((size_t)(M * K) * sz);
  void* B = malloc((size_t)(K * N) * sz);
  void* C = malloc((size_t)(M * N) * sz);
  if (!A || !B || !C) { fprintf(stderr, "out of memory\n"); return 1; }
  for (size_t i = 0; i < (size_t)(M * K); ++i) put(A, i, dtype, uniform());
  for (size_t i = 0; i < (size_t)(K * N); ++i) put(B, i, dtype, uniform());

#define MATMUL() (bd ? lcmac_bundle_matmul(bd, A, B, C, M, N, K, dtype) \
                     : lcmac_matmul(h, A, B, C, M, N, K, dtype))
#define LAST_ERROR() (bd ? lcmac_bundle_last_error(bd) : lcmac_last_error(h))
  int rc = MATMUL();   /* first call: warm-up and check */
  if (rc != LCMAC_OK) {
    fprintf(stderr, "%s: %s\n", lcmac_status_name(rc), LAST_ERROR());
    return 2;
  }

  /* naive triple loop in double on the same (rounded) inputs */
  int64_t step = M <= 256 ? 1 : M / 256, rows = 0;
  double max_err = 0, max_ref = 0;
  double* ref = (double*)malloc((size_t)N * sizeof(double));
  for (int64_t i = 0; i < M; i += step, ++rows) {
    for (int64_t j = 0; j < N; ++j) ref[j] = 0;
    for (int64_t k = 0; k < K; ++k) {
      double a = get(A, (size_t)(i * K + k), dtype);
      for (int64_t j = 0; j < N; ++j) ref[j] += a * get(B, (size_t)(k * N + j), dtype);
    }
    for (int64_t j = 0; j < N; ++j) {
      double e = fabs(get(C, (size_t)(i * N + j), dtype) - ref[j]);
      if (e > max_err) max_err = e;
      if (fabs(ref[j]) > max_ref) max_ref = fabs(ref[j]);
    }
  }
  double rel = max_ref > 0 ? max_err / max_ref : max_err;

  double best = 1e30;
  for (int r = 0; r < repeat; ++r) {
    double t0 = now();
    rc = MATMUL();
    double t = now() - t0;
    if (rc != LCMAC_OK) {
      fprintf(stderr, "%s: %s\n", lcmac_status_name(rc), LAST_ERROR());
      return 2;
    }
    if (t < best) best = t;
  }
  if (prepared) {   /* B combined once: the same C, bit for bit, and its time */
    int64_t pbytes = lcmac_prepared_b_bytes(h);
    size_t cb = (size_t)(M * N) * sz;
    void* P = NULL;
    void* C2 = malloc(cb);
    if (!C2 || (pbytes > 0 && posix_memalign(&P, 64, (size_t)pbytes))) {
      fprintf(stderr, "out of memory\n");
      return 1;
    }
    rc = lcmac_prepare_b(h, B, P, pbytes > 0 ? (size_t)pbytes : 0);
    if (rc == LCMAC_OK) rc = lcmac_matmul_prepared(h, A, P, C2, M, N, K, dtype);
    if (rc != LCMAC_OK) {
      fprintf(stderr, "%s: %s\n", lcmac_status_name(rc), lcmac_last_error(h));
      return 2;
    }
    double pbest = 1e30;
    for (int r = 0; r < repeat; ++r) {
      double t0 = now();
      rc = lcmac_matmul_prepared(h, A, P, C2, M, N, K, dtype);
      double t = now() - t0;
      if (rc != LCMAC_OK) { fprintf(stderr, "%s: %s\n", lcmac_status_name(rc), lcmac_last_error(h)); return 2; }
      if (t < pbest) pbest = t;
    }
    printf("prepared B: %lld bytes, C %s", (long long)pbytes,
           memcmp(C, C2, cb) ? "DIFFERS from lcmac_matmul's\n" : "identical to lcmac_matmul's");
    if (repeat > 0 && !memcmp(C, C2, cb))
      printf(", seconds_per_call=%.6g (best of %d)\n", pbest, repeat);
    else if (!memcmp(C, C2, cb))
      printf("\n");
    int same = !memcmp(C, C2, cb);
    free(P); free(C2);
    if (!same) return 3;
  }
  if (bd) {
    int ri = lcmac_bundle_rule_for(bd, M, N, K);
    printf("bundle %s (rule %s, %d kernels checked), ", lib, lcmac_bundle_rule(bd, ri),
           lcmac_bundle_num_kernels(bd));
  } else {
    printf("artifact %s (%s), ", lib, manifest ? "checked against its manifest" : entry);
  }
  printf("%lldx%lldx%lld %s, %d threads\n", (long long)M,
         (long long)N, (long long)K,
         dtype == LCMAC_FLOAT64 ? "float64" : dtype == LCMAC_BFLOAT16 ? "bfloat16" : "float32",
         bd ? lcmac_bundle_num_threads(bd) : lcmac_num_threads(h));
  printf("max_abs_error=%.6g max_rel_error=%.6g (vs a naive triple loop in double, %lld of "
         "%lld rows)\n", max_err, rel, (long long)rows, (long long)M);
  if (repeat > 0)
    printf("seconds_per_call=%.6g GFLOP/s=%.4g (best of %d)\n", best,
           2.0 * (double)M * (double)N * (double)K / best * 1e-9, repeat);
  lcmac_close(h);
  lcmac_bundle_close(bd);
  free(A); free(B); free(C); free(ref);
  /* loose bounds: a bf16 LCMA rounds its combined operands and C to bf16 */
  double bound = dtype == LCMAC_FLOAT64 ? 1e-10 : dtype == LCMAC_BFLOAT16 ? 5e-2 : 1e-4;
  return rel < bound ? 0 : 3;
}
