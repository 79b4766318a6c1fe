// Bandwidth probe for group-parallel combines (research/probe_combine_bw.py): NO outputs from
// NI inputs, each output the +/- sum of the inputs i with (i + o) % 3 == 0 (about NI/3
// terms), blocks of `len` elements
// laid out [NI][len] / [NO][len] as lcmac's workspaces.  VEC bf16 per load (4: 8 B, 8: 16 B),
// EPT vectors per thread, MINB the launch bound's blocks per SM.
#include <cuda_bf16.h>
#include <cstdint>
template <int NI, int NO, int VEC, int EPT, int MINB>
__global__ void __launch_bounds__(256, MINB) comb(const __nv_bfloat16* RESTRICT X, __nv_bfloat16* RESTRICT Y, long len) {
  long base = ((long)blockIdx.x * 256 * EPT + threadIdx.x) * VEC;
  #pragma unroll
  for (int e = 0; e < EPT; ++e) {
    long off = base + (long)e * 256 * VEC;
    if (off >= len) return;
    float in[NI][VEC];
    #pragma unroll
    for (int i = 0; i < NI; ++i) {
      if constexpr (VEC == 8) {
        uint4 v = *(const uint4*)(X + i * len + off);
        const __nv_bfloat162* h = (const __nv_bfloat162*)&v;
        #pragma unroll
        for (int t = 0; t < 4; ++t) { float2 f = __bfloat1622float2(h[t]); in[i][2*t] = f.x; in[i][2*t+1] = f.y; }
      } else {
        uint2 v = *(const uint2*)(X + i * len + off);
        const __nv_bfloat162* h = (const __nv_bfloat162*)&v;
        #pragma unroll
        for (int t = 0; t < 2; ++t) { float2 f = __bfloat1622float2(h[t]); in[i][2*t] = f.x; in[i][2*t+1] = f.y; }
      }
    }
    #pragma unroll
    for (int o = 0; o < NO; ++o) {
      float acc[VEC];
      #pragma unroll
      for (int t = 0; t < VEC; ++t) acc[t] = 0.f;
      #pragma unroll
      for (int i = 0; i < NI; ++i)
        if ((i + o) % 3 == 0) {
          #pragma unroll
          for (int t = 0; t < VEC; ++t) acc[t] += ((i ^ o) & 1) ? -in[i][t] : in[i][t];
        }
      if constexpr (VEC == 8) {
        uint4 v; __nv_bfloat162* h = (__nv_bfloat162*)&v;
        #pragma unroll
        for (int t = 0; t < 4; ++t) h[t] = __floats2bfloat162_rn(acc[2*t], acc[2*t+1]);
        *(uint4*)(Y + o * len + off) = v;
      } else {
        uint2 v; __nv_bfloat162* h = (__nv_bfloat162*)&v;
        #pragma unroll
        for (int t = 0; t < 2; ++t) h[t] = __floats2bfloat162_rn(acc[2*t], acc[2*t+1]);
        *(uint2*)(Y + o * len + off) = v;
      }
    }
  }
}
#define V(NI, NO, VEC, EPT, MINB) \
  extern "C" int run_##NI##_##NO##_##VEC##_##EPT##_##MINB(const void* X, void* Y, long len, void* s) { \
    long per = 256L * EPT * VEC; comb<NI, NO, VEC, EPT, MINB><<<(len + per - 1) / per, 256, 0, (cudaStream_t)s>>>( \
      (const __nv_bfloat16*)X, (__nv_bfloat16*)Y, len); return (int)cudaGetLastError(); }
// Combine H of Strassen² (49 -> 16) and Combine A (16 -> 49), Strassen (4 -> 7, 7 -> 4)
V(49, 16, 4, 4, 1) V(49, 16, 4, 1, 1) V(49, 16, 8, 1, 1) V(49, 16, 8, 2, 1) V(49, 16, 4, 1, 2) V(49, 16, 8, 1, 2)
V(16, 49, 4, 4, 1) V(16, 49, 4, 1, 2) V(16, 49, 8, 1, 1) V(16, 49, 8, 1, 2) V(16, 49, 8, 2, 2) V(16, 49, 4, 2, 2)
V(4, 7, 4, 4, 1) V(4, 7, 8, 1, 2) V(4, 7, 8, 2, 4) V(7, 4, 4, 4, 1) V(7, 4, 8, 1, 2) V(7, 4, 8, 2, 4)
