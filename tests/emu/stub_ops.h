// Temporary stand-in for codegen/emu/include/derivc_emu_ops.h (helper emuops) so the execution
// model compiles before that header is merged: used only when the real header is absent.
#pragma once
#include <cstdint>
#include <cstring>
namespace derivc_emu {
enum class Dtype { F16, BF16 };
[[noreturn]] void fail(const char* fmt, ...);
namespace ops {
inline float f16_bits_to_f32(uint16_t h) { _Float16 f; std::memcpy(&f, &h, 2); return (float)f; }
inline uint16_t f32_to_f16_rn(float x) { _Float16 f = (_Float16)x; uint16_t h; std::memcpy(&h, &f, 2); return h; }
inline float bf16_bits_to_f32(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; std::memcpy(&f, &u, 4); return f; }
inline uint16_t f32_to_bf16_rn(float x) {
    uint32_t u; std::memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u); return (uint16_t)(u >> 16);
}
inline void ldmatrix_x4(const uint8_t*, uint32_t, const uint32_t[32], bool, uint32_t[32][4]) { fail("stub ops: ldmatrix"); }
inline void mma_m16n8k16(Dtype, const uint32_t[32][4], const uint32_t[32][2], float[32][4]) { fail("stub ops: mma"); }
inline void wgmma(Dtype, int, const uint8_t*, uint32_t, uint64_t, const uint32_t (*)[4], uint64_t, int, int, int,
                  float* const[128]) { fail("stub ops: wgmma"); }
struct alignas(64) TensorMap { uint8_t bytes[128]; };
inline uint32_t tma_load_tile(const TensorMap&, const int32_t*, uint8_t*, uint32_t, uint32_t) { fail("stub ops: tma"); }
}  // namespace ops
}  // namespace derivc_emu
