/*
 * matmul_cuda.c — run an lcmac CUDA bundle or artifact on device memory from C: random A and
 * B copied to the GPU, C = A·B through lcmac.h on a stream of your own, C copied back and
 * checked against a triple loop in double on sampled rows, timed with CUDA events.
 *
 *   lcmac export "?x4096x4096" --target cuda --dtype bfloat16 -o bundle
 *   make -C examples/cuda            # nvcc, or CC=gcc with CUDA_HOME set
 *   examples/cuda/matmul_cuda bundle 3000 4096 4096
 *
 * Usage: matmul_cuda BUNDLE_DIR M N K [--device D] [--repeat R] [--save PREFIX]
 *        matmul_cuda ARTIFACT.json [--device D] [--repeat R] [--save PREFIX] [--prepared]
 * A bundle is opened with lcmac_open_cuda_bundle and M N K may be any shape one of its rules
 * admits; an artifact (lcmac_open_cuda_artifact) runs its manifest's shape.  Both are checked
 * before anything is loaded (lcmac.h: the files, the driver, the device and its compute
 * capability).  --prepared (an artifact) combines B once with lcmac_cuda_prepare_b and runs
 * lcmac_cuda_matmul_prepared, checking that it gives the same C bit for bit.  --save writes
 * PREFIX.A, PREFIX.B, PREFIX.C (raw row-major elements of the dtype) for comparison elsewhere.
 * Exit status: 0 ok; 1 usage; 2 an lcmac error (its status name and message on stderr);
 * 3 a CUDA runtime error; 4 an error above a loose bound for the dtype.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cuda_runtime.h>

#include "lcmac.h"

#define CHECK_CUDA(call)                                                          \
  do {                                                                            \
    cudaError_t e_ = (call);                                                      \
    if (e_ != cudaSuccess) {                                                      \
      fprintf(stderr, "CUDA error: %s: %s\n", #call, cudaGetErrorString(e_));     \
      return 3;                                                                   \
    }                                                                             \
  } while (0)

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

/* IEEE half from a float in [-1, 1) scaled sums: normal numbers and zero, round to nearest even */
static uint16_t to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u, mag = u & 0x7FFFFFFFu;
  if (mag < 0x38800000u) return (uint16_t)sign;              /* below half's normal range: 0 */
  uint32_t h = ((mag >> 13) - (112u << 10));                  /* rebias 127 -> 15 */
  uint32_t rest = mag & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return (uint16_t)(sign | (h > 0x7BFFu ? 0x7BFFu : h));
}

static double from_f16(uint16_t h) {
  int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  double v = e ? ldexp(1.0 + m / 1024.0, e - 15) : ldexp(m / 1024.0, -14);
  return (h & 0x8000) ? -v : v;
}

static size_t elem_bytes(int dtype) { return dtype == LCMAC_FLOAT32 ? 4 : dtype == LCMAC_FLOAT64 ? 8 : 2; }

static const char* dtype_label(int dtype) {
  return dtype == LCMAC_FLOAT32 ? "float32" : dtype == LCMAC_FLOAT64 ? "float64"
       : dtype == LCMAC_BFLOAT16 ? "bfloat16" : "float16";
}

static double get(const void* x, size_t i, int dtype) {
  switch (dtype) {
    case LCMAC_FLOAT64: return ((const double*)x)[i];
    case LCMAC_BFLOAT16: return from_bf16(((const uint16_t*)x)[i]);
    case LCMAC_FLOAT16: return from_f16(((const uint16_t*)x)[i]);
    default: return ((const float*)x)[i];
  }
}

static void put(void* x, size_t i, int dtype, double v) {
  switch (dtype) {
    case LCMAC_FLOAT64: ((double*)x)[i] = v; break;
    case LCMAC_BFLOAT16: ((uint16_t*)x)[i] = to_bf16((float)v); break;
    case LCMAC_FLOAT16: ((uint16_t*)x)[i] = to_f16((float)v); break;
    default: ((float*)x)[i] = (float)v;
  }
}

static int save(const char* prefix, const char* what, const void* x, size_t bytes) {
  char path[4096];
  snprintf(path, sizeof path, "%s.%s", prefix, what);
  FILE* f = fopen(path, "wb");
  int ok = f && fwrite(x, 1, bytes, f) == bytes;
  if (f && fclose(f)) ok = 0;
  if (!ok) fprintf(stderr, "cannot write %s\n", path);
  return ok ? 0 : 1;
}

static int usage(const char* prog) {
  fprintf(stderr, "usage: %s BUNDLE_DIR M N K [--device D] [--repeat R] [--save PREFIX]\n"
                  "       %s ARTIFACT.json [--device D] [--repeat R] [--save PREFIX] [--prepared]\n",
          prog, prog);
  return 1;
}

int main(int argc, char** argv) {
  if (argc < 2) return usage(argv[0]);
  const char* path = argv[1];
  struct stat st;
  int bundle = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
  int64_t M = 0, N = 0, K = 0;
  int i = 2, device = 0, repeat = 20, prepared = 0;
  const char* prefix = NULL;
  if (bundle) {
    if (argc < 5) return usage(argv[0]);
    M = atoll(argv[2]), N = atoll(argv[3]), K = atoll(argv[4]);
    if (M < 1 || N < 1 || K < 1) { fprintf(stderr, "M, N, K must be positive\n"); return 1; }
    i = 5;
  }
  for (; i < argc; ++i) {
    if (!strcmp(argv[i], "--prepared") && !bundle) prepared = 1;
    else if (i + 1 >= argc) return usage(argv[0]);
    else if (!strcmp(argv[i], "--device")) device = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--repeat")) repeat = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--save")) prefix = argv[++i];
    else { fprintf(stderr, "unknown option %s\n", argv[i]); return usage(argv[0]); }
  }

  /* open: every check runs before the library is loaded or anything is launched */
  char err[2048];
  int status = LCMAC_OK, dtype;
  lcmac_handle* h = NULL;
  lcmac_bundle* bd = NULL;
  if (bundle) bd = lcmac_open_cuda_bundle(path, device, &status, err, sizeof err);
  else h = lcmac_open_cuda_artifact(path, device, &status, err, sizeof err);
  if (!h && !bd) {
    fprintf(stderr, "%s: %s\n", lcmac_status_name(status), err);
    return 2;
  }
  if (bd) {
    dtype = lcmac_bundle_dtype(bd);
  } else {
    dtype = lcmac_dtype_of(h);
    lcmac_shape(h, &M, &N, &K);
  }
  size_t sz = elem_bytes(dtype);
  size_t na = (size_t)M * K * sz, nb = (size_t)K * N * sz, nc = (size_t)M * N * sz;

  void *A = malloc(na), *B = malloc(nb), *C = malloc(nc);
  if (!A || !B || !C) { fprintf(stderr, "out of host memory\n"); return 1; }
  for (size_t q = 0; q < (size_t)M * K; ++q) put(A, q, dtype, uniform());
  for (size_t q = 0; q < (size_t)K * N; ++q) put(B, q, dtype, uniform());

  void *dA, *dB, *dC, *dP = NULL;
  cudaStream_t stream;
  CHECK_CUDA(cudaSetDevice(device));
  CHECK_CUDA(cudaMalloc(&dA, na));
  CHECK_CUDA(cudaMalloc(&dB, nb));
  CHECK_CUDA(cudaMalloc(&dC, nc));
  CHECK_CUDA(cudaMemcpy(dA, A, na, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dB, B, nb, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

#define MATMUL() (bd ? lcmac_bundle_cuda_matmul(bd, dA, dB, dC, M, N, K, dtype, NULL, 0, stream) \
                     : lcmac_cuda_matmul(h, dA, dB, dC, M, N, K, dtype, NULL, 0, stream))
#define LAST_ERROR() (bd ? lcmac_bundle_last_error(bd) : lcmac_last_error(h))
  int rc = MATMUL();
  if (rc != LCMAC_OK) {
    fprintf(stderr, "%s: %s\n", lcmac_status_name(rc), LAST_ERROR());
    return 2;
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaMemcpy(C, dC, nc, cudaMemcpyDeviceToHost));

  if (prepared) {   /* B combined once: the same C, bit for bit */
    int64_t pbytes = lcmac_cuda_prepared_b_bytes(h);
    void* C2 = malloc(nc);
    if (pbytes < 0 || !C2) {
      rc = lcmac_cuda_prepare_b(h, dB, NULL, 0, stream);   /* says why */
      fprintf(stderr, "%s: %s\n", lcmac_status_name(rc), lcmac_last_error(h));
      return 2;
    }
    CHECK_CUDA(cudaMalloc(&dP, (size_t)pbytes));
    CHECK_CUDA(cudaMemsetAsync(dC, 0, nc, stream));
    if ((rc = lcmac_cuda_prepare_b(h, dB, dP, (size_t)pbytes, stream)) ||
        (rc = lcmac_cuda_matmul_prepared(h, dA, dP, dC, M, N, K, dtype, NULL, 0, stream))) {
      fprintf(stderr, "%s: %s\n", lcmac_status_name(rc), lcmac_last_error(h));
      return 2;
    }
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaMemcpy(C2, dC, nc, cudaMemcpyDeviceToHost));
    int same = !memcmp(C, C2, nc);
    printf("prepared B: %lld bytes, C %s\n", (long long)pbytes,
           same ? "identical to the unprepared call" : "DIFFERS from the unprepared call");
    free(C2);
    if (!same) return 4;
  }

  /* a triple loop in double on at most 64 rows spread over C */
  int64_t step = M <= 64 ? 1 : M / 64, rows = 0;
  double num = 0, den = 0;
  double* ref = (double*)malloc((size_t)N * sizeof(double));
  for (int64_t r = 0; r < M; r += step, ++rows) {
    for (int64_t j = 0; j < N; ++j) ref[j] = 0;
    for (int64_t k = 0; k < K; ++k) {
      double a = get(A, (size_t)(r * K + k), dtype);
      for (int64_t j = 0; j < N; ++j) ref[j] += a * get(B, (size_t)(k * N + j), dtype);
    }
    for (int64_t j = 0; j < N; ++j) {
      double e = get(C, (size_t)(r * N + j), dtype) - ref[j];
      num += e * e;
      den += ref[j] * ref[j];
    }
  }
  double rel = den > 0 ? sqrt(num / den) : sqrt(num);

  float ms = 0;
  if (repeat > 0) {
    cudaEvent_t t0, t1;
    CHECK_CUDA(cudaEventCreate(&t0));
    CHECK_CUDA(cudaEventCreate(&t1));
    CHECK_CUDA(cudaEventRecord(t0, stream));
    for (int r = 0; r < repeat && rc == LCMAC_OK; ++r) rc = MATMUL();
    CHECK_CUDA(cudaEventRecord(t1, stream));
    CHECK_CUDA(cudaEventSynchronize(t1));
    if (rc != LCMAC_OK) {
      fprintf(stderr, "%s: %s\n", lcmac_status_name(rc), LAST_ERROR());
      return 2;
    }
    CHECK_CUDA(cudaEventElapsedTime(&ms, t0, t1));
    ms /= repeat;
  }
  if (bd)
    printf("bundle %s (rule %s, %d kernels checked) on CUDA device %d, ", path,
           lcmac_bundle_rule(bd, lcmac_bundle_rule_for(bd, M, N, K)),
           lcmac_bundle_num_kernels(bd), device);
  else
    printf("artifact %s (checked against its manifest) on CUDA device %d, ", path, device);
  printf("%lldx%lldx%lld %s\n", (long long)M, (long long)N, (long long)K, dtype_label(dtype));
  printf("rel_error=%.6g (Frobenius, vs a triple loop in double on %lld of %lld rows)\n", rel,
         (long long)rows, (long long)M);
  if (repeat > 0)
    printf("ms_per_call=%.6g TFLOP/s=%.2f (mean of %d back-to-back calls)\n", ms,
           2.0 * (double)M * (double)N * (double)K / (ms * 1e-3) * 1e-12, repeat);
  if (prefix && (save(prefix, "A", A, na) || save(prefix, "B", B, nb) || save(prefix, "C", C, nc)))
    return 1;

  lcmac_close(h);
  lcmac_bundle_close(bd);
  cudaFree(dA); cudaFree(dB); cudaFree(dC); cudaFree(dP);
  cudaStreamDestroy(stream);
  free(A); free(B); free(C); free(ref);
  /* loose bounds: a 16-bit LCMA rounds its combined operands to 16 bits; float32 runs as tf32 */
  double bound = dtype == LCMAC_FLOAT64 ? 1e-10 : dtype == LCMAC_FLOAT32 ? 1e-2 : 5e-2;
  return rel < bound ? 0 : 4;
}
