// The AMX bf16 micro-kernel's own rate on one core, without lcmac's loops around it: the pattern of
// lcmac's AMX kernel (schedules/cpu_gemm.py, amx_ll: a 32x32 fp32 block of C as 2x2 tiles, per 32-k step
// 2 A and 2 B tile loads feeding 4 tdpbf16ps, the 4 C tiles stored after KC k) over NA A panels and NB B
// panels of KC k each (the working set: which cache level they come from), TFLOP/s of the best of 5.
// CFG=1 reloads the tile configuration (ldtilecfg) before every block, as a function that uses tiles
// does on entry (LLVM's x86 AMX lowering configures the tiles in each function's prologue).
//
//   gcc -O2 -mamx-tile -mamx-bf16 -o /tmp/amx_probe scripts/amx_probe.c
//   /tmp/amx_probe KC NA NB REPEATS          e.g. 512 22 1 1000; CFG=1 /tmp/amx_probe 512 22 1 1000
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
typedef struct { uint8_t palette, start; uint8_t rsv[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;
static double now(void){ struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9; }
int main(int argc, char **argv) {
  int KC = atoi(argv[1]), NA = atoi(argv[2]), NB = atoi(argv[3]); long reps = atol(argv[4]);
  if (syscall(SYS_arch_prctl, 0x1023, 18)) { perror("arch_prctl"); return 1; }
  cfg_t c; memset(&c, 0, sizeof c); c.palette = 1;
  for (int i = 0; i < 8; i++) { c.rows[i] = 16; c.colsb[i] = 64; }
  _tile_loadconfig(&c);
  size_t pa = (size_t)KC * 64, pb = (size_t)KC * 64;
  uint8_t *A = aligned_alloc(64, pa * NA), *B = aligned_alloc(64, pb * NB); float *C = aligned_alloc(64, 4096);
  memset(A, 0x3c, pa * NA); memset(B, 0x3c, pb * NB);
  double best = 1e30;
  for (int trial = 0; trial < 5; trial++) {
    double t0 = now();
    for (long r = 0; r < reps; r++) {
      for (int jb = 0; jb < NB; jb++) for (int ia = 0; ia < NA; ia++) {
        uint8_t *a = A + ia * pa, *b = B + jb * pb;
        if (getenv("CFG")) _tile_loadconfig(&c);
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        for (int s = 0; s < KC / 32; s++) {
          _tile_loadd(4, a + s * 2048, 64); _tile_loadd(5, a + s * 2048 + 1024, 64);
          _tile_loadd(6, b + s * 2048, 128); _tile_loadd(7, b + s * 2048 + 64, 128);
          _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, C, 128); _tile_stored(1, C + 16, 128); _tile_stored(2, C + 512, 128); _tile_stored(3, C + 528, 128);
      }
    }
    double t = now() - t0; if (t < best) best = t;
  }
  double flops = 2.0 * 32 * 32 * KC * (double)NA * NB * reps;
  printf("KC %5d  A panels %3d (%6.0f KB)  B panels %3d (%6.0f KB): %.2f TFLOP/s\n", KC, NA, pa*NA/1024.0, NB, pb*NB/1024.0, flops / best / 1e12);
  _tile_release();
  return 0;
}
