/*
 * cuda_misuse.c — the CUDA side of lcmac.h under misuse and under graph capture, for
 * tests/runtime/test_c_cuda.py (needs a GPU).
 *
 *   cuda_misuse ARTIFACT.json BUNDLE_DIR M_BUNDLE
 *
 * One line per case: "case=<name> status=<LCMAC_...> msg=<lcmac_last_error>"; the test judges
 * them.  The artifact and the bundle are bfloat16, the bundle a rows rule ?xNxK.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "lcmac.h"

#define CK(call)                                                                   \
  do {                                                                             \
    cudaError_t e_ = (call);                                                       \
    if (e_ != cudaSuccess) {                                                       \
      fprintf(stderr, "CUDA error: %s: %s\n", #call, cudaGetErrorString(e_));      \
      exit(3);                                                                     \
    }                                                                              \
  } while (0)

static void report(const char* name, int status, const char* msg) {
  printf("case=%s status=%s msg=%s\n", name, lcmac_status_name(status), msg);
}

static void* dev_fill(size_t bytes, unsigned seed) {   /* device memory of small bf16 values */
  uint16_t* host = (uint16_t*)malloc(bytes);
  for (size_t i = 0; i < bytes / 2; ++i) host[i] = (uint16_t)(0x3c00u + ((i * 2654435761u + seed) >> 24) % 128);
  void* d;
  CK(cudaMalloc(&d, bytes));
  CK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
  free(host);
  return d;
}

static int same_device_bytes(const void* x, const void* y, size_t bytes) {
  char *a = (char*)malloc(bytes), *b = (char*)malloc(bytes);
  CK(cudaMemcpy(a, x, bytes, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(b, y, bytes, cudaMemcpyDeviceToHost));
  int same = !memcmp(a, b, bytes);
  free(a);
  free(b);
  return same;
}

int main(int argc, char** argv) {
  if (argc != 4) return 1;
  char err[2048];
  int st;
  lcmac_handle* h = lcmac_open_cuda_artifact(argv[1], 0, &st, err, sizeof err);
  if (!h) { fprintf(stderr, "%s: %s\n", lcmac_status_name(st), err); return 2; }
  lcmac_bundle* b = lcmac_open_cuda_bundle(argv[2], 0, &st, err, sizeof err);
  if (!b) { fprintf(stderr, "%s: %s\n", lcmac_status_name(st), err); return 2; }
  int64_t M, N, K, Mb = atoll(argv[3]);
  lcmac_shape(h, &M, &N, &K);
  size_t na = (size_t)M * K * 2, nb = (size_t)K * N * 2, nc = (size_t)M * N * 2;
  const int bf = LCMAC_BFLOAT16;
  CK(cudaSetDevice(0));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void *A = dev_fill(na + 16, 1), *B = dev_fill(nb, 2), *C, *C2, *shortC;
  CK(cudaMalloc(&C, nc));
  CK(cudaMalloc(&C2, nc));
  CK(cudaMalloc(&shortC, nc - 2));
  void* hostA = malloc(na);
  memset(hostA, 0, na);

  /* misuse: each refused before anything is launched */
  report("host_A", lcmac_cuda_matmul(h, hostA, B, C, M, N, K, bf, NULL, 0, s), lcmac_last_error(h));
  report("short_C", lcmac_cuda_matmul(h, A, B, shortC, M, N, K, bf, NULL, 0, s), lcmac_last_error(h));
  report("misaligned_A", lcmac_cuda_matmul(h, (char*)A + 2, B, C, M, N, K, bf, NULL, 0, s),
         lcmac_last_error(h));
  report("wrong_shape", lcmac_cuda_matmul(h, A, B, C, M, N, K + 8, bf, NULL, 0, s), lcmac_last_error(h));
  report("wrong_dtype", lcmac_cuda_matmul(h, A, B, C, M, N, K, LCMAC_FLOAT32, NULL, 0, s),
         lcmac_last_error(h));
  report("cpu_call", lcmac_matmul(h, A, B, C, M, N, K, bf), lcmac_last_error(h));
  void* tiny;
  CK(cudaMalloc(&tiny, 256));
  report("small_workspace", lcmac_cuda_matmul(h, A, B, C, M, N, K, bf, tiny, 256, s), lcmac_last_error(h));
  report("overlap", lcmac_cuda_matmul(h, A, B, A, M, N, K, bf, NULL, 0, s), lcmac_last_error(h));
  report("bundle_no_rule", lcmac_bundle_cuda_matmul(b, A, B, C, M, N + 8, K, bf, NULL, 0, s),
         lcmac_bundle_last_error(b));
  report("bundle_cpu_call", lcmac_bundle_matmul(b, A, B, C, M, N, K, bf), lcmac_bundle_last_error(b));

  /* right use: the default stream, a workspace passed in, the same C as the handle's own */
  int rc = lcmac_cuda_matmul(h, A, B, C, M, N, K, bf, NULL, 0, NULL);
  report("default_stream", rc, lcmac_last_error(h));
  int64_t wsb = lcmac_cuda_workspace_bytes(h);
  void* ws;
  CK(cudaMalloc(&ws, (size_t)wsb));
  rc = lcmac_cuda_matmul(h, A, B, C2, M, N, K, bf, ws, (size_t)wsb, s);
  CK(cudaDeviceSynchronize());
  report("own_workspace", rc, rc ? lcmac_last_error(h)
         : same_device_bytes(C, C2, nc) ? "identical" : "DIFFERENT");

  /* a bundle call with padded rows captured in a CUDA graph, replayed on new A */
  size_t nab = (size_t)Mb * K * 2, ncb = (size_t)Mb * N * 2;
  void *Ab = dev_fill(nab, 3), *Ab2 = dev_fill(nab, 4), *Cg, *Cd;
  CK(cudaMalloc(&Cg, ncb));
  CK(cudaMalloc(&Cd, ncb));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  rc = lcmac_bundle_cuda_matmul(b, Ab, B, Cg, Mb, N, K, bf, NULL, 0, s);
  CK(cudaStreamEndCapture(s, &g));
  if (rc) {
    report("graph", rc, lcmac_bundle_last_error(b));
  } else {
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaMemcpy(Ab, Ab2, nab, cudaMemcpyDeviceToDevice));   /* new inputs, same addresses */
    CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    rc = lcmac_bundle_cuda_matmul(b, Ab2, B, Cd, Mb, N, K, bf, NULL, 0, s);
    CK(cudaStreamSynchronize(s));
    report("graph", rc, rc ? lcmac_bundle_last_error(b)
           : same_device_bytes(Cg, Cd, ncb) ? "identical" : "DIFFERENT");
  }
  lcmac_bundle_close(b);
  lcmac_close(h);
  return 0;
}
