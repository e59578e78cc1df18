// AVX2 + FMA kernels (8 floats per vector). Compiled with -mavx2 -mfma and only
// called after the CPU has been checked for both.
#include <immintrin.h>

#include <cstdint>

#include "kernels/dispatch.h"

namespace specdec {
namespace {

// For each 8-bit lane mask, the positions of its set bits packed as 4-bit
// fields (first set lane in the lowest field).
struct CompressLut {
    uint32_t lanes[256];
    constexpr CompressLut() : lanes() {
        for (uint32_t m = 0; m < 256; ++m) {
            uint32_t packed = 0;
            uint32_t k = 0;
            for (uint32_t b = 0; b < 8; ++b) {
                if ((m >> b) & 1u) packed |= b << (4 * k++);
            }
            lanes[m] = packed;
        }
    }
};
constexpr CompressLut kCompressLut{};

struct Avx2Traits {
    using vf = __m256;
    using vm = __m256;
    static constexpr size_t W = 8;

    static vf load(const float* p) { return _mm256_loadu_ps(p); }
    static void store(float* p, vf v) { _mm256_storeu_ps(p, v); }
    static vf set1(float x) { return _mm256_set1_ps(x); }
    static vf zero() { return _mm256_setzero_ps(); }
    static vf add(vf a, vf b) { return _mm256_add_ps(a, b); }
    static vf sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
    static vf mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
    static vf min(vf a, vf b) { return _mm256_min_ps(a, b); }
    static vf max(vf a, vf b) { return _mm256_max_ps(a, b); }
    static vf fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
    static vm cmp_ge(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_GE_OQ); }
    static vm cmp_gt(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
    static vm cmp_eq(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
    static vm cmp_bad(vf a) { return _mm256_cmp_ps(a, _mm256_set1_ps(__builtin_huge_valf()), _CMP_NLT_UQ); }
    static vm mask_or(vm a, vm b) { return _mm256_or_ps(a, b); }
    static bool any(vm m) { return _mm256_movemask_ps(m) != 0; }
    static uint32_t bits(vm m) { return static_cast<uint32_t>(_mm256_movemask_ps(m)); }
    static vf keep(vm m, vf v) { return _mm256_and_ps(m, v); }
    static vf exp2_from_magic(vf t) {
        const __m256i u = _mm256_add_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(127 - 0x4B400000));
        return _mm256_castsi256_ps(_mm256_slli_epi32(u, 23));
    }
    static size_t compress_indices(uint32_t* dst, vm m, uint32_t base) {
        const uint32_t bits = static_cast<uint32_t>(_mm256_movemask_ps(m));
        const __m256i lanes =
            _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(kCompressLut.lanes[bits])),
                                               _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                             _mm256_set1_epi32(7));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                            _mm256_add_epi32(lanes, _mm256_set1_epi32(static_cast<int>(base))));
        return static_cast<size_t>(__builtin_popcount(bits));
    }
    static double hsum_d(vf v) {
        const __m256d d =
            _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
        const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(d), _mm256_extractf128_pd(d, 1));
        return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    }
    static float hmax(vf v) {
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        return _mm_cvtss_f32(m);
    }
};

}  // namespace
}  // namespace specdec

#include "kernels/simd_ops_impl.h"

namespace specdec {

const KernelTable* kernel_table_avx2() { return Ops<Avx2Traits>::table("avx2"); }

}  // namespace specdec
