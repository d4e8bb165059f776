// derivc CPU emulation: the CUDA language surface for host C++ and the emulation API the
// instruction wrappers call (codegen/mappings/templates/constructs/instr.cu.j2, DERIVC_EMU branch).
// Force-included (-include) before an emitted kernel.cu; the execution model (fibers, barriers,
// collectives, async queues) lives in derivc_emu_runtime.cpp, compiled once and linked in.
// Kept lean on purpose: every kernel compile parses this header.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "derivc_emu_ops.h"  // Dtype, fail, the whole-group instruction semantics

// ---------------------------------------------------------------- CUDA qualifiers
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __restrict__ __restrict
// static storage (one block runs at a time) in a section of its own, poisoned at every block start
#define __shared__ __attribute__((section("derivc_emu_static_shared"))) static
#define __constant__ static const

#define DERIVC_DYNAMIC_SMEM(name, A) unsigned char* const name = derivc_emu::dynamic_smem()

struct uint3 { unsigned x, y, z; };
struct dim3 { unsigned x, y, z; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

// the running fiber's indices (set by the scheduler at every switch)
extern uint3 threadIdx;
extern uint3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;
constexpr int warpSize = 32;

// ---------------------------------------------------------------- bit casts and math
inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline float __uint_as_float(unsigned x) { float f; std::memcpy(&f, &x, 4); return f; }
inline int __float_as_int(float x) { int i; std::memcpy(&i, &x, 4); return i; }
inline unsigned __float_as_uint(float x) { unsigned i; std::memcpy(&i, &x, 4); return i; }
inline double __longlong_as_double(long long x) { double d; std::memcpy(&d, &x, 8); return d; }
inline float __expf(float x) { return ::expf(x); }
inline float __logf(float x) { return ::logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / ::sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / ::sqrt(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
template <class T> inline T __ldg(const T* p) { return *p; }
template <class A, class B> inline auto min(A a, B b) -> decltype(a + b) { return b < a ? b : a; }
template <class A, class B> inline auto max(A a, B b) -> decltype(a + b) { return a < b ? b : a; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }

// ---------------------------------------------------------------- the execution model
void __syncthreads();
void __syncwarp(unsigned mask = 0xffffffffu);
inline void __threadfence_block() {}
inline void __threadfence() {}

namespace derivc_emu {

// shuffles: kinds of shfl.sync
enum ShflKind { SHFL_IDX = 0, SHFL_UP = 1, SHFL_DOWN = 2, SHFL_BFLY = 3 };
std::uint64_t shfl_sync(int kind, unsigned mask, std::uint64_t value, int lane_arg, int width);

unsigned char* dynamic_smem();
unsigned smem_addr(const void* p);
void st_shared(unsigned addr, const void* bytes, int nbytes);
void ld_shared(unsigned addr, void* bytes, int nbytes);

float cvt_f32_f16(unsigned short h);
unsigned short cvt_rn_f16_f32(float x);
float cvt_f32_bf16(unsigned short h);
unsigned short cvt_rn_bf16_f32(float x);
unsigned cvt_rn_f16x2_f32(float hi, float lo);
unsigned cvt_rn_bf16x2_f32(float hi, float lo);
float ex2_approx_ftz(float x);
float tanh_approx(float x);

inline uint4 ld_global_cs_v4(const void* p) { uint4 v; std::memcpy(&v, p, 16); return v; }
inline void st_global_cs_v4(void* p, uint4 v) { std::memcpy(p, &v, 16); }

void cp_async_cg16(unsigned dst, const void* src, int src_bytes);
void cp_async_commit_group();
void cp_async_wait_group(int n);

void ldmatrix_x4(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, unsigned addr, bool trans);
void mma_m16n8k16(Dtype dtype, float* d, const unsigned* a, unsigned b0, unsigned b1);

void wgmma_fence();
void wgmma_commit_group();
void wgmma_wait_group(int n);
void wgmma_ss(Dtype dtype, int n, float* d, unsigned long long desc_a, unsigned long long desc_b,
              int scale_d, int tnsp_a, int tnsp_b);
void wgmma_rs(Dtype dtype, int n, float* d, const unsigned* a4, unsigned long long desc_b, int scale_d, int tnsp_b);

void fence_proxy_async();
void fence_mbarrier_init();
void mbar_init(unsigned bar, unsigned count);
void mbar_arrive_expect_tx(unsigned bar, unsigned bytes);
void mbar_arrive(unsigned bar);
void mbar_wait_parity(unsigned bar, unsigned parity);
void tma_load(unsigned dst, const void* tensor_map, unsigned bar, int rank, const int* coords);
void setmaxnreg(int n, bool inc);
void bar_sync(int id, int count);

template <class T> inline T shfl_as(int kind, unsigned mask, T v, int lane_arg, int width) {
    static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
    std::uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    bits = shfl_sync(kind, mask, bits, lane_arg, width);
    T out;
    std::memcpy(&out, &bits, sizeof(T));
    return out;
}

}  // namespace derivc_emu

template <class T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return derivc_emu::shfl_as(derivc_emu::SHFL_IDX, mask, v, src, width);
}
template <class T> inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return derivc_emu::shfl_as(derivc_emu::SHFL_UP, mask, v, (int)delta, width);
}
template <class T> inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return derivc_emu::shfl_as(derivc_emu::SHFL_DOWN, mask, v, (int)delta, width);
}
template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return derivc_emu::shfl_as(derivc_emu::SHFL_BFLY, mask, v, lane_mask, width);
}
