// AArch64 Advanced SIMD (NEON) kernels (4 floats per vector). NEON is part of
// the AArch64 base architecture, so this unit needs no extra compiler flag; it
// is only built for aarch64 targets (CMakeLists.txt).
//
// min and max are written as compare-and-select, not with FMIN/FMAX (which
// return NaN when either input is NaN) or FMINNM/FMAXNM (which return the
// number): both lanes and NaNs then behave exactly as in the scalar path,
// a < b ? a : b, like the x86 MINPS/MAXPS paths.
#if !defined(__aarch64__)
#error "isa_neon.cpp is for AArch64 targets only"
#endif

#include <arm_neon.h>

#include <cstdint>

#include "kernels/dispatch.h"

namespace specdec {
namespace {

// For each 4-bit lane mask, a byte shuffle that gathers the 32-bit lanes set
// in it to the front, in order (the rest of the vector is don't-care).
struct CompressLut {
    uint8_t bytes[16][16];
    constexpr CompressLut() : bytes() {
        for (uint32_t m = 0; m < 16; ++m) {
            uint32_t k = 0;
            for (uint32_t lane = 0; lane < 4; ++lane) {
                if ((m >> lane) & 1u) {
                    for (uint32_t b = 0; b < 4; ++b) bytes[m][4 * k + b] = static_cast<uint8_t>(4 * lane + b);
                    ++k;
                }
            }
            for (uint32_t j = 4 * k; j < 16; ++j) bytes[m][j] = 0xFF;  // table lookup gives 0
        }
    }
};
constexpr CompressLut kCompressLut{};

struct NeonTraits {
    using vf = float32x4_t;
    using vm = uint32x4_t;
    static constexpr size_t W = 4;

    static vf load(const float* p) { return vld1q_f32(p); }
    static void store(float* p, vf v) { vst1q_f32(p, v); }
    static vf set1(float x) { return vdupq_n_f32(x); }
    static vf zero() { return vdupq_n_f32(0.0f); }
    static vf add(vf a, vf b) { return vaddq_f32(a, b); }
    static vf sub(vf a, vf b) { return vsubq_f32(a, b); }
    static vf mul(vf a, vf b) { return vmulq_f32(a, b); }
    static vf min(vf a, vf b) { return vbslq_f32(vcltq_f32(a, b), a, b); }
    static vf max(vf a, vf b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }
    static vf fmadd(vf a, vf b, vf c) { return vfmaq_f32(c, a, b); }  // c + a * b, one rounding
    static vm cmp_ge(vf a, vf b) { return vcgeq_f32(a, b); }
    static vm cmp_gt(vf a, vf b) { return vcgtq_f32(a, b); }
    static vm cmp_eq(vf a, vf b) { return vceqq_f32(a, b); }
    static vm cmp_bad(vf a) { return vmvnq_u32(vcltq_f32(a, vdupq_n_f32(__builtin_huge_valf()))); }
    static vm mask_or(vm a, vm b) { return vorrq_u32(a, b); }
    static bool any(vm m) { return vmaxvq_u32(m) != 0; }
    static uint32_t bits(vm m) {
        static const uint32_t kLaneBit[4] = {1u, 2u, 4u, 8u};
        return vaddvq_u32(vandq_u32(m, vld1q_u32(kLaneBit)));
    }
    static vf keep(vm m, vf v) { return vreinterpretq_f32_u32(vandq_u32(m, vreinterpretq_u32_f32(v))); }
    static vf exp2_from_magic(vf t) {
        const uint32x4_t u = vaddq_u32(vreinterpretq_u32_f32(t), vdupq_n_u32(127u - 0x4B400000u));
        return vreinterpretq_f32_u32(vshlq_n_u32(u, 23));
    }
    static size_t compress_indices(uint32_t* dst, vm m, uint32_t base) {
        static const uint32_t kLanes[4] = {0u, 1u, 2u, 3u};
        const uint32_t b = bits(m);
        const uint32x4_t ids = vaddq_u32(vdupq_n_u32(base), vld1q_u32(kLanes));
        const uint8x16_t packed = vqtbl1q_u8(vreinterpretq_u8_u32(ids), vld1q_u8(kCompressLut.bytes[b]));
        vst1q_u32(dst, vreinterpretq_u32_u8(packed));
        return static_cast<size_t>(__builtin_popcount(b));
    }
    static double hsum_d(vf v) {
        const float64x2_t d = vaddq_f64(vcvt_f64_f32(vget_low_f32(v)), vcvt_high_f64_f32(v));
        return vaddvq_f64(d);
    }
    static float hmax(vf v) {
        vf m = max(v, vextq_f32(v, v, 2));
        m = max(m, vextq_f32(m, m, 1));
        return vgetq_lane_f32(m, 0);
    }
};

}  // namespace
}  // namespace specdec

#include "kernels/simd_ops_impl.h"

namespace specdec {

const KernelTable* kernel_table_neon() { return Ops<NeonTraits>::table("neon"); }

}  // namespace specdec
