// AVX-512 (F, BW, DQ, VL) kernels (16 floats per vector). Compiled with the
// AVX-512 flags and only called after the CPU has been checked for all four.
#include <immintrin.h>

#include <cstdint>

#include "kernels/dispatch.h"

namespace specdec {
namespace {

struct Avx512Traits {
    using vf = __m512;
    using vm = __mmask16;
    static constexpr size_t W = 16;

    static vf load(const float* p) { return _mm512_loadu_ps(p); }
    static void store(float* p, vf v) { _mm512_storeu_ps(p, v); }
    static vf set1(float x) { return _mm512_set1_ps(x); }
    static vf zero() { return _mm512_setzero_ps(); }
    static vf add(vf a, vf b) { return _mm512_add_ps(a, b); }
    static vf sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
    static vf mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
    static vf min(vf a, vf b) { return _mm512_min_ps(a, b); }
    static vf max(vf a, vf b) { return _mm512_max_ps(a, b); }
    static vf fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
    static vm cmp_ge(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
    static vm cmp_gt(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
    static vm cmp_eq(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
    static vm cmp_bad(vf a) { return _mm512_cmp_ps_mask(a, _mm512_set1_ps(__builtin_huge_valf()), _CMP_NLT_UQ); }
    static vm mask_or(vm a, vm b) { return static_cast<vm>(a | b); }
    static bool any(vm m) { return m != 0; }
    static uint32_t bits(vm m) { return static_cast<uint32_t>(m); }
    static vf keep(vm m, vf v) { return _mm512_maskz_mov_ps(m, v); }
    static vf exp2_from_magic(vf t) {
        const __m512i u = _mm512_add_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(127 - 0x4B400000));
        return _mm512_castsi512_ps(_mm512_slli_epi32(u, 23));
    }
    static size_t compress_indices(uint32_t* dst, vm m, uint32_t base) {
        const __m512i ids = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(base)),
                                             _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
        _mm512_storeu_si512(dst, _mm512_maskz_compress_epi32(m, ids));
        return static_cast<size_t>(__builtin_popcount(static_cast<uint32_t>(m)));
    }
    static double hsum_d(vf v) {
        const __m512d d =
            _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(v)),
                          _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
        return _mm512_reduce_add_pd(d);
    }
    static float hmax(vf v) { return _mm512_reduce_max_ps(v); }
};

}  // namespace
}  // namespace specdec

#include "kernels/simd_ops_impl.h"

namespace specdec {

const KernelTable* kernel_table_avx512() { return Ops<Avx512Traits>::table("avx512"); }

}  // namespace specdec
