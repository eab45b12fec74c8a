// Microbenchmark (experiment, not committed): issue throughput of the decode's instruction kinds on SM90.
// Each thread runs N iterations of 8 independent chains of one instruction; cycles from clock64.
#include <cstdint>
#define CHAINS 8
#define DEF(NAME, ...)                                                                      \
extern "C" __global__ void NAME(uint32_t *out, long long *cyc, int n) {                     \
  uint32_t r[CHAINS];                                                                       \
  for (int i = 0; i < CHAINS; ++i) r[i] = threadIdx.x * 0x00010001u + i + 0x3f803f80u;      \
  uint32_t c = 0x3f813f81u, d = 0x00010001u;                                               \
  __syncthreads();                                                                          \
  long long t0 = clock64();                                                                 \
  for (int it = 0; it < n; ++it) {                                                          \
    _Pragma("unroll") for (int i = 0; i < CHAINS; ++i) { __VA_ARGS__ }                             \
  }                                                                                         \
  __syncthreads();                                                                          \
  long long t1 = clock64();                                                                 \
  uint32_t acc = 0;                                                                         \
  for (int i = 0; i < CHAINS; ++i) acc ^= r[i];                                             \
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;                                         \
  if (threadIdx.x == 0) cyc[blockIdx.x] = t1 - t0;                                          \
}
DEF(k_hmul2_bf16, asm volatile("mul.rn.bf16x2 %0, %0, %1;" : "+r"(r[i]) : "r"(c));)
DEF(k_hadd2_bf16, asm volatile("add.rn.bf16x2 %0, %0, %1;" : "+r"(r[i]) : "r"(c));)
DEF(k_hfma2_bf16, asm volatile("fma.rn.bf16x2 %0, %0, %1, %2;" : "+r"(r[i]) : "r"(c), "r"(d));)
DEF(k_hmul2_f16, asm volatile("mul.rn.f16x2 %0, %0, %1;" : "+r"(r[i]) : "r"(c));)
DEF(k_hfma2_f16, asm volatile("fma.rn.f16x2 %0, %0, %1, %2;" : "+r"(r[i]) : "r"(c), "r"(d));)
DEF(k_lop3, asm volatile("lop3.b32 %0, %0, %1, %2, 0xea;" : "+r"(r[i]) : "r"(c), "r"(d));)
DEF(k_shf, asm volatile("shr.s32 %0, %0, 3;" : "+r"(r[i]));)
DEF(k_prmt, asm volatile("prmt.b32 %0, %0, %1, 0x1032;" : "+r"(r[i]) : "r"(c));)
DEF(k_ffma, asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+r"(r[i]) : "r"(c), "r"(d));)
DEF(k_iadd, asm volatile("add.u32 %0, %0, %1;" : "+r"(r[i]) : "r"(c));)
DEF(k_cvt_pack, asm volatile("cvt.rn.bf16x2.f32 %0, %0, %1;" : "+r"(r[i]) : "r"(c));)
// the decode's mix: per word, 3 shifts, 4 lop3, 4 hadd2, 4 hmul2 (one chain per i)
DEF(k_mix_decode, {
  uint32_t w = r[i];
  uint32_t a0, a1, a2, a3, s1, s2, s3;
  asm volatile("shr.s32 %0, %1, 4;" : "=r"(s1) : "r"(w)); asm volatile("shr.s32 %0, %1, 8;" : "=r"(s2) : "r"(w));
  asm volatile("shr.s32 %0, %1, 12;" : "=r"(s3) : "r"(w));
  asm volatile("lop3.b32 %0, %1, 0x000f000f, 0x43004300, 0xea;" : "=r"(a0) : "r"(w));
  asm volatile("lop3.b32 %0, %1, 0x000f000f, 0x43004300, 0xea;" : "=r"(a1) : "r"(s1));
  asm volatile("lop3.b32 %0, %1, 0x000f000f, 0x43004300, 0xea;" : "=r"(a2) : "r"(s2));
  asm volatile("lop3.b32 %0, %1, 0x000f000f, 0x43004300, 0xea;" : "=r"(a3) : "r"(s3));
  asm volatile("add.rn.bf16x2 %0, %0, %1;" : "+r"(a0) : "r"(0xC308C308u)); asm volatile("add.rn.bf16x2 %0, %0, %1;" : "+r"(a1) : "r"(0xC308C308u));
  asm volatile("add.rn.bf16x2 %0, %0, %1;" : "+r"(a2) : "r"(0xC308C308u)); asm volatile("add.rn.bf16x2 %0, %0, %1;" : "+r"(a3) : "r"(0xC308C308u));
  asm volatile("mul.rn.bf16x2 %0, %0, %1;" : "+r"(a0) : "r"(c)); asm volatile("mul.rn.bf16x2 %0, %0, %1;" : "+r"(a1) : "r"(c));
  asm volatile("mul.rn.bf16x2 %0, %0, %1;" : "+r"(a2) : "r"(c)); asm volatile("mul.rn.bf16x2 %0, %0, %1;" : "+r"(a3) : "r"(c));
  r[i] = (a0 ^ a1 ^ a2 ^ a3) + w;
})
// the single-FMA decode: 3 shifts, 4 lop3, 4 hfma2
DEF(k_mix_fma, {
  uint32_t w = r[i];
  uint32_t a0, a1, a2, a3, s1, s2, s3;
  asm volatile("shr.s32 %0, %1, 4;" : "=r"(s1) : "r"(w)); asm volatile("shr.s32 %0, %1, 8;" : "=r"(s2) : "r"(w));
  asm volatile("shr.s32 %0, %1, 12;" : "=r"(s3) : "r"(w));
  asm volatile("lop3.b32 %0, %1, 0x000f000f, 0x43004300, 0xea;" : "=r"(a0) : "r"(w));
  asm volatile("lop3.b32 %0, %1, 0x000f000f, 0x43004300, 0xea;" : "=r"(a1) : "r"(s1));
  asm volatile("lop3.b32 %0, %1, 0x000f000f, 0x43004300, 0xea;" : "=r"(a2) : "r"(s2));
  asm volatile("lop3.b32 %0, %1, 0x000f000f, 0x43004300, 0xea;" : "=r"(a3) : "r"(s3));
  asm volatile("fma.rn.bf16x2 %0, %0, %1, %2;" : "+r"(a0) : "r"(c), "r"(d)); asm volatile("fma.rn.bf16x2 %0, %0, %1, %2;" : "+r"(a1) : "r"(c), "r"(d));
  asm volatile("fma.rn.bf16x2 %0, %0, %1, %2;" : "+r"(a2) : "r"(c), "r"(d)); asm volatile("fma.rn.bf16x2 %0, %0, %1, %2;" : "+r"(a3) : "r"(c), "r"(d));
  r[i] = (a0 ^ a1 ^ a2 ^ a3) + w;
})
