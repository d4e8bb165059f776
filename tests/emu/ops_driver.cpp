// extern "C" face of derivc_emu_ops.h for the ctypes tests (tests/emu/conftest.py builds it).
#include "derivc_emu_ops.h"

#include <cstdarg>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace derivc_emu {
void fail(const char* fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    throw std::runtime_error(buf);
}
}  // namespace derivc_emu

namespace ops = derivc_emu::ops;
using derivc_emu::Dtype;

template <class F>
static int guarded(char* err, F&& f) {
    try {
        f();
        return 0;
    } catch (const std::exception& e) {
        std::snprintf(err, 512, "%s", e.what());
        return 1;
    }
}

extern "C" {

void t_f32_to_f16(const float* in, uint16_t* out, int n) { for (int i = 0; i < n; ++i) out[i] = ops::f32_to_f16_rn(in[i]); }
void t_f32_to_bf16(const float* in, uint16_t* out, int n) { for (int i = 0; i < n; ++i) out[i] = ops::f32_to_bf16_rn(in[i]); }
void t_f16_to_f32(const uint16_t* in, float* out, int n) { for (int i = 0; i < n; ++i) out[i] = ops::f16_bits_to_f32(in[i]); }
void t_bf16_to_f32(const uint16_t* in, float* out, int n) { for (int i = 0; i < n; ++i) out[i] = ops::bf16_bits_to_f32(in[i]); }
uint32_t t_pack_f16x2(float hi, float lo) { return ops::cvt_rn_f16x2_f32(hi, lo); }
uint32_t t_pack_bf16x2(float hi, float lo) { return ops::cvt_rn_bf16x2_f32(hi, lo); }

int t_ldmatrix(const uint8_t* smem, uint32_t size, const uint32_t* addr, int trans, uint32_t* out, char* err) {
    return guarded(err, [&] { ops::ldmatrix_x4(smem, size, addr, trans != 0, reinterpret_cast<uint32_t (*)[4]>(out)); });
}

int t_mma(int bf16, const uint32_t* a, const uint32_t* b, float* d, char* err) {
    return guarded(err, [&] {
        ops::mma_m16n8k16(bf16 ? Dtype::BF16 : Dtype::F16, reinterpret_cast<const uint32_t (*)[4]>(a),
                          reinterpret_cast<const uint32_t (*)[2]>(b), reinterpret_cast<float (*)[4]>(d));
    });
}

// d: [128][n / 2] floats; a_regs: [128][4] or null
int t_wgmma(int bf16, int n, const uint8_t* smem, uint32_t size, uint64_t da, const uint32_t* a_regs,
            uint64_t db, int ta, int tb, int sd, float* d, char* err) {
    return guarded(err, [&] {
        float* rows[128];
        for (int t = 0; t < 128; ++t) rows[t] = d + t * (n / 2);
        ops::wgmma(bf16 ? Dtype::BF16 : Dtype::F16, n, smem, size, da,
                   reinterpret_cast<const uint32_t (*)[4]>(a_regs), db, ta, tb, sd, rows);
    });
}

// rank < 0: the rank-less form
int t_tma(const uint8_t* map_bytes, int rank, const int32_t* coords, uint8_t* smem, uint32_t size,
          uint32_t dst, uint32_t* bytes, char* err) {
    return guarded(err, [&] {
        ops::TensorMap map;
        std::memcpy(&map, map_bytes, sizeof map);
        *bytes = rank < 0 ? ops::tma_load_tile(map, coords, smem, size, dst)
                          : ops::tma_load_tile(map, uint32_t(rank), coords, smem, size, dst);
    });
}

}  // extern "C"
