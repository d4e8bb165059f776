// derivc CPU emulation: pure semantics of the hardware instructions the emitted kernels use.
//
// Whole-group functions (a warp's 32 lanes, a warpgroup's 128 threads at once), no fibers, no
// global state: the execution model (derivc_emu.h) gathers the operands of a collective and calls
// these. Shared-memory addresses are 32-bit byte offsets into the block's shared window
// `smem[0, smem_size)`; every access is checked against the window and its alignment, and any
// violation calls derivc_emu::fail (defined by the execution model, or by the tests).
//
// Choices where the PTX ISA leaves the hardware's behaviour open (documented, deterministic):
// - mma / wgmma accumulate in fp32 in k order: acc = c; acc = acc + a_k * b_k for k = 0, 1, ...
//   A product of two f16 values is exact in fp32 (of two bf16 values too, barring fp32 overflow
//   and underflow), so a contraction into fma does not change the result.
// - f32 -> f16 / bf16 of a NaN gives the canonical NaN 0x7fff; f16 -> f32 keeps sign and payload.
// - Descriptors and tensor maps are checked strictly: reserved descriptor bits, a non-zero matrix
//   base offset, and swizzled operands / TMA boxes not aligned to their swizzle repeat (256, 512,
//   1024 bytes) are refused instead of guessed at.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace derivc_emu {

[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Operand type of mma / wgmma (EMU_API.md's Dtype; defined here, used by derivc_emu.h too).
enum class Dtype { F16, BF16 };

namespace ops {

// ------------------------------------------------------------------------------ conversions

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// cvt.f32.f16 (exact)
inline float f16_bits_to_f32(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0x1f) return bits_f32(mant ? 0x7fffffffu : (sign | 0x7f800000u));  // NaN: canonical (GPU-checked)
    if (exp == 0) {
        const float mag = float(mant) * 5.9604644775390625e-08f;  // mant * 2^-24, exact
        return sign ? -mag : mag;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

// cvt.rn.f16.f32: round to nearest even, f16 subnormals, overflow to inf, NaN -> 0x7fff
inline uint16_t f32_to_f16_rn(float f) {
    const uint32_t x = f32_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return 0x7fff;
    if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 = max + half ulp
    if (ax >= 0x38800000u) {                                   // >= 2^-14: normal f16
        const uint32_t rounded = ax + 0xfffu + ((ax >> 13) & 1u);
        return uint16_t(sign | ((rounded - 0x38000000u) >> 13));
    }
    if (ax <= 0x33000000u) return uint16_t(sign);              // <= 2^-25 (tie to even 0)
    const uint32_t shift = 126u - (ax >> 23);                  // 14 .. 23: units of 2^-24
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return uint16_t(sign | q);
}

inline float bf16_bits_to_f32(uint16_t h) { return bits_f32(uint32_t(h) << 16); }

// cvt.rn.bf16.f32: round to nearest even, overflow to inf, NaN -> 0x7fff
inline uint16_t f32_to_bf16_rn(float f) {
    const uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
    return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// cvt.rn.f16x2.f32 d, a, b / cvt.rn.bf16x2.f32: the first source goes to the upper half
inline uint32_t cvt_rn_f16x2_f32(float hi, float lo) {
    return (uint32_t(f32_to_f16_rn(hi)) << 16) | f32_to_f16_rn(lo);
}
inline uint32_t cvt_rn_bf16x2_f32(float hi, float lo) {
    return (uint32_t(f32_to_bf16_rn(hi)) << 16) | f32_to_bf16_rn(lo);
}

inline float element_to_f32(Dtype dt, uint16_t bits) {
    return dt == Dtype::F16 ? f16_bits_to_f32(bits) : bf16_bits_to_f32(bits);
}

namespace detail {

inline void check_window(uint32_t addr, uint32_t nbytes, uint32_t align, uint32_t smem_size,
                         const char* what) {
    if (addr % align != 0) fail("%s: shared address 0x%x not %u-byte aligned", what, addr, align);
    if (uint64_t(addr) + nbytes > smem_size)
        fail("%s: shared access [0x%x, 0x%llx) outside the %u-byte shared window", what, addr,
             (unsigned long long)(uint64_t(addr) + nbytes), smem_size);
}

inline uint16_t load_u16(const uint8_t* smem, uint32_t smem_size, uint32_t addr, const char* what) {
    check_window(addr, 2, 2, smem_size, what);
    uint16_t v;
    std::memcpy(&v, smem + addr, 2);
    return v;
}

// The shared-memory swizzle of wgmma operands and TMA boxes, on absolute shared addresses:
// span = 32 / 64 / 128 bytes XORs address bits [4, 4 + b) with bits [7, 7 + b), b = 1 / 2 / 3
// (CuTe Swizzle<b, 4, 3>); the pattern repeats every 8 * span bytes. span 0: no swizzle.
inline uint32_t swizzle(uint32_t addr, uint32_t span) {
    if (span == 0) return addr;
    const uint32_t mask = span / 16u - 1u;
    return addr ^ (((addr >> 7) & mask) << 4);
}

}  // namespace detail

// ------------------------------------------------------------------------------ ldmatrix

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16. addr[l] is lane l's address: row l % 8 of
// matrix l / 8 (16 bytes, 16-byte aligned). Lane t receives out[t][i] = elements (t / 4,
// 2 (t % 4)) (low half) and (t / 4, 2 (t % 4) + 1) (high half) of matrix i; with trans, of the
// transposed matrix, i.e. elements (2 (t % 4), t / 4) and (2 (t % 4) + 1, t / 4).
inline void ldmatrix_x4(const uint8_t* smem, uint32_t smem_size, const uint32_t addr[32], bool trans,
                        uint32_t out[32][4]) {
    uint16_t m[4][8][8];
    for (int l = 0; l < 32; ++l) {
        detail::check_window(addr[l], 16, 16, smem_size, "ldmatrix");
        std::memcpy(m[l / 8][l % 8], smem + addr[l], 16);
    }
    for (int t = 0; t < 32; ++t) {
        const int r = t / 4, c = 2 * (t % 4);
        for (int i = 0; i < 4; ++i) {
            const uint16_t lo = trans ? m[i][c][r] : m[i][r][c];
            const uint16_t hi = trans ? m[i][c + 1][r] : m[i][r][c + 1];
            out[t][i] = uint32_t(lo) | (uint32_t(hi) << 16);
        }
    }
}

// ------------------------------------------------------------------------------ mma.sync

// Rows x 16 A operand of mma.sync m16n8k16 (and of the register form of wgmma, per warp), lane
// l = 4 g + q: reg 0 (g, 2q..2q+1), reg 1 (g + 8, 2q..), reg 2 (g, 2q + 8..), reg 3 (g + 8, 2q + 8..);
// the lower column in the low half.
namespace detail {
inline void unpack_a_fragment(Dtype dt, const uint32_t a[32][4], float out[16][16]) {
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, q = l % 4;
        for (int reg = 0; reg < 4; ++reg) {
            const int row = g + 8 * (reg & 1), col = 2 * q + 8 * (reg >> 1);
            out[row][col] = element_to_f32(dt, uint16_t(a[l][reg] & 0xffffu));
            out[row][col + 1] = element_to_f32(dt, uint16_t(a[l][reg] >> 16));
        }
    }
}
}  // namespace detail

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 with D = C (in place):
// B (16 k x 8 n), lane l = 4 g + q: b[l][0] = (k 2q, 2q + 1; n g), b[l][1] = (k 2q + 8, 2q + 9; n g);
// D: d[l][0..1] = (g, 2q..2q+1), d[l][2..3] = (g + 8, 2q..2q+1).
inline void mma_m16n8k16(Dtype dt, const uint32_t a[32][4], const uint32_t b[32][2], float d[32][4]) {
    float A[16][16], B[16][8];
    detail::unpack_a_fragment(dt, a, A);
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, q = l % 4;
        for (int reg = 0; reg < 2; ++reg) {
            B[2 * q + 8 * reg][g] = element_to_f32(dt, uint16_t(b[l][reg] & 0xffffu));
            B[2 * q + 8 * reg + 1][g] = element_to_f32(dt, uint16_t(b[l][reg] >> 16));
        }
    }
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, q = l % 4;
        for (int e = 0; e < 4; ++e) {
            const int row = g + 8 * (e >> 1), col = 2 * q + (e & 1);
            float acc = d[l][e];
            for (int k = 0; k < 16; ++k) acc = acc + A[row][k] * B[k][col];
            d[l][e] = acc;
        }
    }
}

// ------------------------------------------------------------------------------ wgmma

// Fields of a 64-bit wgmma shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format"):
// bits 0-13 start address >> 4, 16-29 leading byte offset (LBO) >> 4, 32-45 stride byte offset
// (SBO) >> 4, 49-51 matrix base offset, 62-63 layout: 0 interleave (no swizzle), 1 128B, 2 64B,
// 3 32B swizzle. Other bits are reserved (must be zero).
struct MatrixDescriptor {
    uint32_t start, lbo, sbo, base_offset, span;  // bytes; span: swizzle bytes, 0 = none
};

inline MatrixDescriptor decode_descriptor(uint64_t desc, const char* operand) {
    const uint64_t reserved = desc & ~((0x3fffull) | (0x3fffull << 16) | (0x3fffull << 32) |
                                       (0x7ull << 49) | (0x3ull << 62));
    if (reserved) fail("wgmma %s descriptor 0x%016llx: reserved bits set (0x%016llx)", operand,
                       (unsigned long long)desc, (unsigned long long)reserved);
    static const uint32_t spans[4] = {0, 128, 64, 32};
    MatrixDescriptor m;
    m.start = uint32_t(desc & 0x3fffu) << 4;
    m.lbo = uint32_t((desc >> 16) & 0x3fffu) << 4;
    m.sbo = uint32_t((desc >> 32) & 0x3fffu) << 4;
    m.base_offset = uint32_t((desc >> 49) & 0x7u);
    m.span = spans[desc >> 62];
    if (m.base_offset != 0)
        fail("wgmma %s descriptor 0x%016llx: matrix base offset %u is not emulated (tiles must be "
             "aligned to the swizzle repeat)", operand, (unsigned long long)desc, m.base_offset);
    if (m.span && (m.start & (8u * m.span - 1u) & ~127u))
        fail("wgmma %s descriptor 0x%016llx: start 0x%x not aligned to the %u-byte repeat of the "
             "%uB swizzle (base offset 0)", operand, (unsigned long long)desc, m.start, 8u * m.span,
             m.span);
    return m;
}

// Byte address of element (mn, k) of a rows x 16 operand tile, in the canonical layouts of the
// PTX ISA (as CuTe's make_gmma_desc states them; T = 16 bytes = 8 elements; S = swizzle span):
//   K-major,  none:     ((8, m), (T, 2)) : ((1T, SBO), (1, LBO))   core matrix 8 rows x 16 bytes
//   K-major,  swizzled: ((8, m), (T, 2)) : ((S, SBO), (1, T))      rows of S bytes, LBO unused
//   MN-major, none:     ((T, 1, m), (8, k)) : ((1, T, SBO), (1T, LBO))
//   MN-major, swizzled: ((T, S/16, m), (8, k)) : ((1, T, LBO), (S, SBO))  k rows of S bytes
// then swizzled on the absolute address (detail::swizzle).
inline uint32_t operand_address(const MatrixDescriptor& m, bool mn_major, uint32_t mn, uint32_t k) {
    uint32_t off;
    if (!mn_major) {
        const uint32_t r = mn % 8, group = mn / 8, chunk = k / 8, e = k % 8;
        off = m.span == 0 ? group * m.sbo + chunk * m.lbo + r * 16 + e * 2
                          : group * m.sbo + r * m.span + chunk * 16 + e * 2;
    } else {
        const uint32_t kr = k % 8, kgroup = k / 8;
        if (m.span == 0) {
            off = (mn / 8) * m.sbo + kgroup * m.lbo + kr * 16 + (mn % 8) * 2;
        } else {
            const uint32_t per_row = m.span / 2;
            off = (mn / per_row) * m.lbo + kgroup * m.sbo + kr * m.span + (mn % per_row) * 2;
        }
    }
    return detail::swizzle(m.start + off, m.span);
}

namespace detail {
// rows x 16 operand from shared memory: out[mn * 16 + k]
inline void load_operand(Dtype dt, const uint8_t* smem, uint32_t smem_size, uint64_t desc,
                         bool mn_major, uint32_t rows, const char* operand, float* out) {
    const MatrixDescriptor m = decode_descriptor(desc, operand);
    for (uint32_t mn = 0; mn < rows; ++mn)
        for (uint32_t k = 0; k < 16; ++k) {
            const uint32_t addr = operand_address(m, mn_major, mn, k);
            out[mn * 16 + k] = element_to_f32(dt, load_u16(smem, smem_size, addr, "wgmma operand"));
        }
}
}  // namespace detail

// wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}.{f16,bf16}: D (64 x N) = (scale_d ? D : 0)
// + A (64 x 16) * B (16 x N). A from shared memory (desc_a, a_regs == nullptr) or registers
// (a_regs[128][4]: warp w holds rows 16w .. 16w + 15 in the mma.sync A layout); B from shared
// memory. tnsp_a / tnsp_b (imm-trans): 0 K-major, 1 MN-major. d[t] (thread t = 32 w + 4 g + q)
// points at N / 2 floats: d[t][4j + e] = D[16w + g + 8 (e >> 1)][8j + 2q + (e & 1)].
inline void wgmma(Dtype dt, int n, const uint8_t* smem, uint32_t smem_size, uint64_t desc_a,
                  const uint32_t (*a_regs)[4], uint64_t desc_b, int tnsp_a, int tnsp_b, int scale_d,
                  float* const d[128]) {
    if (n < 8 || n > 256 || n % 8 != 0) fail("wgmma: N = %d is not 8 .. 256 in steps of 8", n);
    if ((tnsp_a != 0 && tnsp_a != 1) || (tnsp_b != 0 && tnsp_b != 1))
        fail("wgmma: imm-trans must be 0 or 1 (got %d, %d)", tnsp_a, tnsp_b);
    if (a_regs && tnsp_a) fail("wgmma: A from registers cannot be transposed");
    float A[64 * 16];
    if (a_regs) {
        float frag[16][16];
        for (int w = 0; w < 4; ++w) {
            detail::unpack_a_fragment(dt, a_regs + 32 * w, frag);
            for (int r = 0; r < 16; ++r)
                for (int k = 0; k < 16; ++k) A[(16 * w + r) * 16 + k] = frag[r][k];
        }
    } else {
        detail::load_operand(dt, smem, smem_size, desc_a, tnsp_a, 64, "A", A);
    }
    float B[256 * 16];  // B[nn * 16 + k]
    detail::load_operand(dt, smem, smem_size, desc_b, tnsp_b, uint32_t(n), "B", B);
    for (int t = 0; t < 128; ++t) {
        const int w = t / 32, g = (t % 32) / 4, q = t % 4;
        for (int i = 0; i < n / 2; ++i) {
            const int j = i / 4, e = i % 4;
            const int row = 16 * w + g + 8 * (e >> 1), col = 8 * j + 2 * q + (e & 1);
            float acc = scale_d ? d[t][i] : 0.0f;
            const float* a = A + row * 16;
            const float* b = B + col * 16;
            for (int k = 0; k < 16; ++k) acc = acc + a[k] * b[k];
            d[t][i] = acc;
        }
    }
}

// ------------------------------------------------------------------------------ TMA

// The emulated CUtensorMap (tiled), 128 bytes, little endian; written by
// codegen/emu/tensor_map.py (encode_tiled_emulated), which documents the same layout:
//   0 u32 magic 'DTMA' (0x414d5444)    4 u32 rank (1..5)          8 u64 global address
//  16 u32 CUtensorMapDataType          20 u32 element bytes
//  24 u8 interleave (0 only)  25 u8 swizzle (0 none, 1 32B, 2 64B, 3 128B)  26 u8 L2 promotion
//  27 u8 oob fill (0 zeros, 1 NaN)     28 u32 reserved (0)
//  32 u64 dims[5] (innermost first)   72 u64 byte strides[5] (strides[0] = element bytes)
// 112 u16 box[5]                     122 u8 element strides[5]  127 u8 reserved (0)
// Entries past the rank are 0.
struct alignas(64) TensorMap {
    uint32_t magic, rank;
    uint64_t global_address;
    uint32_t data_type, elem_bytes;
    uint8_t interleave, swizzle, l2_promotion, oob_fill;
    uint32_t reserved0;
    uint64_t dims[5], strides[5];
    uint16_t box[5];
    uint8_t elem_strides[5], reserved1;
};
static_assert(sizeof(TensorMap) == 128, "TensorMap is 128 bytes");
static_assert(offsetof(TensorMap, dims) == 32 && offsetof(TensorMap, strides) == 72 &&
              offsetof(TensorMap, box) == 112 && offsetof(TensorMap, elem_strides) == 122,
              "TensorMap layout");
constexpr uint32_t kTensorMapMagic = 0x414d5444u;

inline uint32_t tensor_map_swizzle_span(const TensorMap& map) {
    static const uint32_t spans[4] = {0, 32, 64, 128};
    return spans[map.swizzle & 3];
}

inline void check_tensor_map(const TensorMap& map) {
    if (map.magic != kTensorMapMagic) fail("tma: not an emulated tensor map (magic 0x%08x)", map.magic);
    if (map.rank < 1 || map.rank > 5) fail("tma: tensor map rank %u", map.rank);
    if (map.elem_bytes != 1 && map.elem_bytes != 2 && map.elem_bytes != 4 && map.elem_bytes != 8)
        fail("tma: element size %u bytes", map.elem_bytes);
    if (map.interleave != 0) fail("tma: interleaved tensor maps are not emulated");
    if (map.swizzle > 3 || map.oob_fill > 1) fail("tma: bad swizzle %u / oob fill %u", map.swizzle, map.oob_fill);
    for (uint32_t i = 0; i < map.rank; ++i) {
        if (map.box[i] < 1 || map.box[i] > 256) fail("tma: box[%u] = %u is not 1 .. 256", i, map.box[i]);
        if (map.elem_strides[i] < 1 || map.elem_strides[i] > 8)
            fail("tma: element stride[%u] = %u is not 1 .. 8", i, map.elem_strides[i]);
        if (map.dims[i] < 1) fail("tma: dim[%u] = 0", i);
    }
    if (map.elem_strides[0] != 1) fail("tma: element stride of dim 0 must be 1 (non-interleaved map)");
    const uint32_t inner = map.box[0] * map.elem_bytes, span = tensor_map_swizzle_span(map);
    if (inner % 16 != 0) fail("tma: inner box %u bytes is not a multiple of 16", inner);
    if (span && inner > span) fail("tma: inner box %u bytes exceeds the %uB swizzle span", inner, span);
}

// cp.async.bulk.tensor.<rank>d.shared::cluster.global.tile: the box at coords (innermost first;
// element i of dim d at coords[d] + i * elem_strides[d], ceil(box / elem_strides) per dim)
// written densely, innermost fastest, from dst, swizzled by address (detail::swizzle); elements
// outside the tensor (negative or past the end) are filled (zeros, or all-ones NaN). Returns the
// bytes written, the transaction count the mbarrier receives, zero-filled ones included.
inline uint32_t tma_load_tile(const TensorMap& map, const int32_t* coords, uint8_t* smem,
                              uint32_t smem_size, uint32_t dst) {
    check_tensor_map(map);
    const uint32_t rank = map.rank, eb = map.elem_bytes, span = tensor_map_swizzle_span(map);
    uint32_t count[5] = {1, 1, 1, 1, 1};
    uint64_t total = 1;
    for (uint32_t i = 0; i < rank; ++i) {
        count[i] = (map.box[i] + map.elem_strides[i] - 1u) / map.elem_strides[i];
        total *= count[i];
    }
    const uint32_t bytes = uint32_t(total * eb);
    // 128-byte aligned; swizzled boxes at their pattern's repeat, so that the swizzle phase is
    // the box's own row (the swizzled address of each element is checked against the window)
    detail::check_window(dst, 0, span ? 8u * span : 128u, smem_size, "tma destination");
    const uint8_t* base = reinterpret_cast<const uint8_t*>(uintptr_t(map.global_address));
    const uint8_t fill = map.oob_fill ? 0xff : 0x00;
    uint32_t idx[5] = {0, 0, 0, 0, 0};
    for (uint64_t e = 0; e < total; ++e) {
        bool inside = true;
        uint64_t src = 0;
        for (uint32_t i = 0; i < rank; ++i) {
            const int64_t c = int64_t(coords[i]) + int64_t(idx[i]) * map.elem_strides[i];
            if (c < 0 || uint64_t(c) >= map.dims[i]) inside = false;
            else src += uint64_t(c) * (i == 0 ? eb : map.strides[i]);
        }
        const uint32_t at = detail::swizzle(dst + uint32_t(e) * eb, span);
        if (uint64_t(at) + eb > smem_size)
            fail("tma: box element at shared 0x%x outside the %u-byte shared window", at, smem_size);
        if (inside) std::memcpy(smem + at, base + src, eb);
        else std::memset(smem + at, fill, eb);
        for (uint32_t i = 0; i < rank; ++i) {  // next box index, innermost fastest
            if (++idx[i] < count[i]) break;
            idx[i] = 0;
        }
    }
    return bytes;
}

// The same, for the cp.async.bulk.tensor.<rank>d form: the instruction's rank must be the map's.
inline uint32_t tma_load_tile(const TensorMap& map, uint32_t rank, const int32_t* coords, uint8_t* smem,
                              uint32_t smem_size, uint32_t dst) {
    if (rank != map.rank) fail("tma: a %ud load through a rank-%u tensor map", rank, map.rank);
    return tma_load_tile(map, coords, smem, smem_size, dst);
}

}  // namespace ops
}  // namespace derivc_emu
