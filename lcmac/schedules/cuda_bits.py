"""The GPU kernels for products of packed bit matrices, as one CUDA source: over GF(2) (AND,
then the parity of the count) and over the Boolean semiring (AND, then count > 0).

Layout (``lcmac.bits.packing``, the same on the GPU): an M×N bit matrix is M rows of
⌈N/64⌉ 64-bit words, entry (i, 64·w + j) at bit j of word w of row i.  Seen as 32-bit
words (little-endian), entry (i, 32·w + j) is bit j of 32-bit word w.  The products take A
(M×K) and Bᵀ (N×K, B transposed by ``lcmac_bits_transpose``), both packed along K, so that
C[i, j] is a function of the count popc(A_i AND Bᵀ_j) over the K bits: its parity over
GF(2), count > 0 over the Boolean semiring.  K's words per row must be even (whole 128-bit
loads); the caller pads with zero words.

Two kernels, one CTA tile (128 rows of A × 128 rows of Bᵀ, K in slabs of 512 bits):

``mma``      the 1-bit tensor-core MMA, ``mma.sync.m16n8k256.row.col.s32.b1.b1.s32.and.popc``:
             8 warps of 64×32 outputs, fragments by ``ldmatrix`` (a 16×256-bit A fragment is
             the 16×16 16-bit matrix of an fp16 m16n8k16 A fragment, bit for bit), slabs
             staged by ``cp.async`` in a 4-stage pipeline, int32 counts in registers.
``bitwise``  the CUDA cores: each thread XORs (ORs) ``a AND b`` into 8×8 32-bit accumulators
             (one LOP3 per 32 bit products), slabs staged through registers into shared memory
             stored k-major; parity = popc(acc) AND 1, Boolean = acc ≠ 0.

Both pack a tile's 128×128 result bits into bytes in shared memory and store whole 32-bit
words of C, zero past column N (rows of Bᵀ past N are loaded as zeros).

Entry points (C ABI; pointers are device pointers, strides in 64-bit words, ``stream`` a
cudaStream_t; 0 on success, else a negative code and ``lcmac_bits_last_error``):

    int lcmac_bits_mm(int kernel /*0 mma, 1 bitwise*/, int semiring /*0 gf2, 1 boolean*/,
                      const void* A, const void* Bt, void* C, int P, int M, int N, int KW,
                      long long strideA, long long strideBt, long long strideC, int ldc,
                      void* stream);       // P products: A_p M×KW words, Bt_p N×KW, C_p M×ldc
    int lcmac_bits_transpose(const void* B, void* Bt, int P, int K, int N, int ldb, int ldbt,
                             long long strideB, long long strideBt, void* stream);
                                           // Bt_p (N×ldbt words) = B_p (K×ldb words)ᵀ, zero past K
    const char* lcmac_bits_last_error(void);

The transpose gives each warp a 32×32 block: lane i holds 32-bit word (32·kb + i, nb) of B,
and bit i of ``__ballot_sync`` over bit j is entry (32·kb + i, 32·nb + j): word kb of row
32·nb + j of Bᵀ.

``source()`` is pure text; ``lcmac.bits.cuda`` compiles it with nvcc (``lcmac.targets.cuda``).
"""
from __future__ import annotations

#: bumped whenever the text below changes, so cached libraries of an older text are not loaded
TEMPLATE_VERSION = 1
#: the kernels' names, in the order of ``lcmac_bits_mm``'s ``kernel`` argument
KERNELS = ("mma", "bitwise")
#: the semirings, in the order of its ``semiring`` argument
SEMIRINGS = ("gf2", "boolean")

_SOURCE = r"""
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

namespace {

constexpr int BM = 128, BN = 128;   // C tile: rows of A x rows of Bt
constexpr int BKW = 16;             // 32-bit words of K per slab (512 bits)
constexpr int LDW = BKW + 4;        // shared row stride (words): 8 ldmatrix rows on distinct banks
constexpr int STAGES = 4;
constexpr int THREADS = 256;
constexpr int MMA_SMEM = STAGES * (BM + BN) * LDW * 4;

thread_local char last_error[512] = "";

int fail(int code, const char* what, cudaError_t e) {
  snprintf(last_error, sizeof last_error, "%s: %s", what, cudaGetErrorString(e));
  return code;
}

__device__ __forceinline__ void cp_async16(uint32_t* smem, const uint32_t* gmem, bool valid) {
  unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  int bytes = valid ? 16 : 0;      // 0: the 16 bytes are zero-filled, nothing is read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(s), "l"(gmem), "r"(bytes));
}

// one slab (rows row0.., words k0..k0+BKW) of a packed operand into shared memory
__device__ __forceinline__ void load_slab(uint32_t* dst, const uint32_t* X, int rows, int row0,
                                          int kw32, int k0, int tid) {
  #pragma unroll
  for (int i = 0; i < (BM * BKW / 4) / THREADS; ++i) {
    int c = tid + i * THREADS, r = c / (BKW / 4), part = c % (BKW / 4);
    int word = k0 + part * 4;
    bool valid = row0 + r < rows && word < kw32;
    const uint32_t* src = valid ? X + (long long)(row0 + r) * kw32 + word : X;
    cp_async16(dst + r * LDW + part * 4, src, valid);
  }
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const uint32_t* p) {
  unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}

__device__ __forceinline__ void mma_b1(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k256.row.col.s32.b1.b1.s32.and.popc "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int SEMIRING>
__device__ __forceinline__ uint32_t bit_of(int count) {
  return SEMIRING == 0 ? (uint32_t)(count & 1) : (uint32_t)(count != 0);
}

// the packed bytes of the tile (C_bytes: BM rows x BN/8 bytes) to C as whole 32-bit words
__device__ __forceinline__ void store_tile(const uint8_t* C_bytes, uint32_t* C, int M, int row0,
                                           int ldc32, int word0, int tid) {
  const uint32_t* words = reinterpret_cast<const uint32_t*>(C_bytes);
  #pragma unroll
  for (int i = 0; i < (BM * BN / 32) / THREADS; ++i) {
    int idx = tid + i * THREADS, r = idx / (BN / 32), w = idx % (BN / 32);
    if (row0 + r < M && word0 + w < ldc32) C[(long long)(row0 + r) * ldc32 + word0 + w] = words[idx];
  }
}

template <int SEMIRING>
__global__ void __launch_bounds__(THREADS) bits_mma(const uint32_t* __restrict__ A,
    const uint32_t* __restrict__ Bt, uint32_t* __restrict__ C, int M, int N, int kw32,
    long long sA, long long sB, long long sC, int ldc32) {
  extern __shared__ __align__(16) uint32_t smem[];
  uint32_t* A_shared = smem;                           // STAGES x BM x LDW
  uint32_t* B_shared = smem + STAGES * BM * LDW;       // STAGES x BN x LDW
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / 4, wn = warp % 4;              // warp tile: 64 rows x 32 columns
  const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
  A += blockIdx.z * sA; Bt += blockIdx.z * sB; C += blockIdx.z * sC;
  int C_local[4][4][4] = {};                           // [m fragment][n fragment][4 counts]
  const int slabs = (kw32 + BKW - 1) / BKW;
  #pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < slabs) {
      load_slab(A_shared + s * BM * LDW, A, M, row0, kw32, s * BKW, tid);
      load_slab(B_shared + s * BN * LDW, Bt, N, col0, kw32, s * BKW, tid);
    }
    asm volatile("cp.async.commit_group;\n");
  }
  for (int t = 0; t < slabs; ++t) {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(STAGES - 2));
    __syncthreads();
    int next = t + STAGES - 1;
    if (next < slabs) {
      load_slab(A_shared + (next % STAGES) * BM * LDW, A, M, row0, kw32, next * BKW, tid);
      load_slab(B_shared + (next % STAGES) * BN * LDW, Bt, N, col0, kw32, next * BKW, tid);
    }
    asm volatile("cp.async.commit_group;\n");
    const uint32_t* As = A_shared + (t % STAGES) * BM * LDW;
    const uint32_t* Bs = B_shared + (t % STAGES) * BN * LDW;
    #pragma unroll
    for (int ks = 0; ks < BKW / 8; ++ks) {             // 256 bits per MMA
      uint32_t a[4][4], b[4][2];
      #pragma unroll
      for (int mf = 0; mf < 4; ++mf)
        ldmatrix_x4(a[mf], As + (wm * 64 + mf * 16 + lane % 16) * LDW + ks * 8 + (lane / 16) * 4);
      #pragma unroll
      for (int nf = 0; nf < 4; nf += 2) {
        uint32_t r[4];
        ldmatrix_x4(r, Bs + (wn * 32 + nf * 8 + (lane / 16) * 8 + lane % 8) * LDW + ks * 8 + ((lane / 8) % 2) * 4);
        b[nf][0] = r[0]; b[nf][1] = r[1]; b[nf + 1][0] = r[2]; b[nf + 1][1] = r[3];
      }
      #pragma unroll
      for (int mf = 0; mf < 4; ++mf)
        #pragma unroll
        for (int nf = 0; nf < 4; ++nf) mma_b1(C_local[mf][nf], a[mf], b[nf][0], b[nf][1]);
    }
  }
  asm volatile("cp.async.wait_group 0;\n");
  __syncthreads();
  uint8_t* C_bytes = reinterpret_cast<uint8_t*>(smem);  // BM x BN/8, over the drained pipeline
  const int g = lane / 4, q = lane % 4;
  #pragma unroll
  for (int mf = 0; mf < 4; ++mf)
    #pragma unroll
    for (int nf = 0; nf < 4; ++nf)
      #pragma unroll
      for (int h = 0; h < 2; ++h) {                    // rows g and g + 8 of the fragment
        uint32_t bits = (bit_of<SEMIRING>(C_local[mf][nf][2 * h]) |
                         bit_of<SEMIRING>(C_local[mf][nf][2 * h + 1]) << 1) << (2 * q);
        bits |= __shfl_xor_sync(0xffffffffu, bits, 1);
        bits |= __shfl_xor_sync(0xffffffffu, bits, 2);
        if (q == 0) C_bytes[(wm * 64 + mf * 16 + h * 8 + g) * (BN / 8) + wn * 4 + nf] = (uint8_t)bits;
      }
  __syncthreads();
  store_tile(C_bytes, C, M, row0, ldc32, col0 / 32, tid);
}

template <int SEMIRING>
__global__ void __launch_bounds__(THREADS) bits_bitwise(const uint32_t* __restrict__ A,
    const uint32_t* __restrict__ Bt, uint32_t* __restrict__ C, int M, int N, int kw32,
    long long sA, long long sB, long long sC, int ldc32) {
  __shared__ __align__(16) uint32_t A_shared[BKW][BM];  // k-major: a thread's 8 rows in 2 loads
  __shared__ __align__(16) uint32_t B_shared[BKW][BN];
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;   // 8 rows x 8 columns each
  const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
  A += blockIdx.z * sA; Bt += blockIdx.z * sB; C += blockIdx.z * sC;
  uint32_t C_local[8][8] = {};
  const int slabs = (kw32 + BKW - 1) / BKW;
  uint4 a_next[2], b_next[2];
  auto fetch = [&](int k0) {            // thread: rows (tid + i*256) % 128, words part*4..+3
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
      int c = tid + i * THREADS, r = c % BM, part = c / BM, word = k0 + part * 4;
      a_next[i] = (row0 + r < M && word < kw32) ? *reinterpret_cast<const uint4*>(A + (long long)(row0 + r) * kw32 + word) : make_uint4(0, 0, 0, 0);
      b_next[i] = (col0 + r < N && word < kw32) ? *reinterpret_cast<const uint4*>(Bt + (long long)(col0 + r) * kw32 + word) : make_uint4(0, 0, 0, 0);
    }
  };
  auto stash = [&]() {
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
      int c = tid + i * THREADS, r = c % BM, part = c / BM;
      A_shared[part * 4 + 0][r] = a_next[i].x; A_shared[part * 4 + 1][r] = a_next[i].y;
      A_shared[part * 4 + 2][r] = a_next[i].z; A_shared[part * 4 + 3][r] = a_next[i].w;
      B_shared[part * 4 + 0][r] = b_next[i].x; B_shared[part * 4 + 1][r] = b_next[i].y;
      B_shared[part * 4 + 2][r] = b_next[i].z; B_shared[part * 4 + 3][r] = b_next[i].w;
    }
  };
  if (slabs > 0) fetch(0);
  for (int t = 0; t < slabs; ++t) {
    __syncthreads();
    stash();
    __syncthreads();
    if (t + 1 < slabs) fetch((t + 1) * BKW);            // flies while this slab is multiplied
    #pragma unroll
    for (int kk = 0; kk < BKW; ++kk) {
      uint4 a0 = *reinterpret_cast<const uint4*>(&A_shared[kk][ty * 8]);
      uint4 a1 = *reinterpret_cast<const uint4*>(&A_shared[kk][ty * 8 + 4]);
      uint4 b0 = *reinterpret_cast<const uint4*>(&B_shared[kk][tx * 8]);
      uint4 b1 = *reinterpret_cast<const uint4*>(&B_shared[kk][tx * 8 + 4]);
      const uint32_t a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
      const uint32_t b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
      #pragma unroll
      for (int i = 0; i < 8; ++i)
        #pragma unroll
        for (int j = 0; j < 8; ++j)
          C_local[i][j] = SEMIRING == 0 ? C_local[i][j] ^ (a[i] & b[j]) : C_local[i][j] | (a[i] & b[j]);
    }
  }
  __syncthreads();
  uint8_t* C_bytes = reinterpret_cast<uint8_t*>(&A_shared[0][0]);   // BM x BN/8 = 2 kB
  #pragma unroll
  for (int i = 0; i < 8; ++i) {
    uint32_t bits = 0;
    #pragma unroll
    for (int j = 0; j < 8; ++j)
      bits |= (SEMIRING == 0 ? (uint32_t)(__popc(C_local[i][j]) & 1) : (uint32_t)(C_local[i][j] != 0)) << j;
    C_bytes[(ty * 8 + i) * (BN / 8) + tx] = (uint8_t)bits;
  }
  __syncthreads();
  store_tile(C_bytes, C, M, row0, ldc32, col0 / 32, tid);
}

__global__ void bits_transpose(const uint32_t* __restrict__ B, uint32_t* __restrict__ Bt, int K,
    int N, int ldb32, int ldbt32, long long sB, long long sBt) {
  const int lane = threadIdx.x % 32;
  const long long block = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int col_blocks = (N + 31) / 32;
  if (block >= (long long)ldbt32 * col_blocks) return;
  const int kb = (int)(block / col_blocks), nb = (int)(block % col_blocks);
  B += blockIdx.y * sB; Bt += blockIdx.y * sBt;
  const int k = kb * 32 + lane;
  uint32_t w = (k < K && nb < ldb32) ? B[(long long)k * ldb32 + nb] : 0u;
  uint32_t mine = 0;
  #pragma unroll
  for (int j = 0; j < 32; ++j) {
    uint32_t t = __ballot_sync(0xffffffffu, (w >> j) & 1u);
    if (lane == j) mine = t;
  }
  const int n = nb * 32 + lane;
  if (n < N) Bt[(long long)n * ldbt32 + kb] = mine;
}

template <int SEMIRING>
int launch(int kernel, const void* A, const void* Bt, void* C, int P, int M, int N, int KW,
           long long sA, long long sB, long long sC, int ldc, cudaStream_t stream) {
  dim3 grid((N + BN - 1) / BN, (M + BM - 1) / BM, P);
  const uint32_t* a = static_cast<const uint32_t*>(A);
  const uint32_t* b = static_cast<const uint32_t*>(Bt);
  uint32_t* c = static_cast<uint32_t*>(C);
  if (kernel == 0) {
    // per call, not once: the attribute belongs to the current device
    cudaError_t e = cudaFuncSetAttribute(bits_mma<SEMIRING>, cudaFuncAttributeMaxDynamicSharedMemorySize, MMA_SMEM);
    if (e != cudaSuccess) return fail(-5, "cudaFuncSetAttribute(bits_mma)", e);
    bits_mma<SEMIRING><<<grid, THREADS, MMA_SMEM, stream>>>(a, b, c, M, N, 2 * KW, 2 * sA, 2 * sB, 2 * sC, 2 * ldc);
  } else {
    bits_bitwise<SEMIRING><<<grid, THREADS, 0, stream>>>(a, b, c, M, N, 2 * KW, 2 * sA, 2 * sB, 2 * sC, 2 * ldc);
  }
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? 0 : fail(-6, "launching the bit product", e);
}

}  // namespace

extern "C" const char* lcmac_bits_last_error(void) { return last_error; }

extern "C" int lcmac_bits_mm(int kernel, int semiring, const void* A, const void* Bt, void* C,
                             int P, int M, int N, int KW, long long strideA, long long strideBt,
                             long long strideC, int ldc, void* stream) {
  if (kernel < 0 || kernel > 1 || semiring < 0 || semiring > 1) {
    snprintf(last_error, sizeof last_error, "kernel %d / semiring %d: unknown", kernel, semiring);
    return -1;
  }
  if (P < 0 || M < 0 || N < 0 || KW < 0 || KW % 2 || ldc < (N + 63) / 64 || P > 65535) {
    snprintf(last_error, sizeof last_error, "bad sizes: P=%d M=%d N=%d KW=%d (even) ldc=%d", P, M, N, KW, ldc);
    return -2;
  }
  if (P == 0 || M == 0 || N == 0) return 0;
  if ((M + BM - 1) / BM > 65535) {
    snprintf(last_error, sizeof last_error, "M=%d: at most %d rows", M, 65535 * BM);
    return -2;
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  return semiring == 0 ? launch<0>(kernel, A, Bt, C, P, M, N, KW, strideA, strideBt, strideC, ldc, s)
                       : launch<1>(kernel, A, Bt, C, P, M, N, KW, strideA, strideBt, strideC, ldc, s);
}

extern "C" int lcmac_bits_transpose(const void* B, void* Bt, int P, int K, int N, int ldb, int ldbt,
                                    long long strideB, long long strideBt, void* stream) {
  if (P < 0 || K < 0 || N < 0 || ldb < (N + 63) / 64 || ldbt < (K + 63) / 64 || P > 65535) {
    snprintf(last_error, sizeof last_error, "bad sizes: P=%d K=%d N=%d ldb=%d ldbt=%d", P, K, N, ldb, ldbt);
    return -2;
  }
  if (P == 0 || N == 0 || ldbt == 0) return 0;
  const long long blocks = (long long)(2 * ldbt) * ((N + 31) / 32);
  const int warps = 8;
  dim3 grid((unsigned)((blocks + warps - 1) / warps), P);
  bits_transpose<<<grid, 32 * warps, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint32_t*>(B), static_cast<uint32_t*>(Bt), K, N, 2 * ldb, 2 * ldbt,
      2 * strideB, 2 * strideBt);
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? 0 : fail(-6, "launching the bit transpose", e);
}
"""


def source() -> str:
    """The CUDA source of the bit kernels (see the module's docstring)."""
    return _SOURCE
