// Vocabulary-wide primitives, written once over a small "vector traits" type.
//
// Included by each instruction-set translation unit (isa_*.cpp) after it has
// defined its traits struct. Everything here lives in an anonymous namespace
// and uses no standard-library templates, so code compiled with AVX flags can
// never be shared with (and picked by the linker for) the portable path.
//
// A traits type T provides:
//   vf, vm            vector of floats, comparison mask
//   W                 lanes per vector
//   load/store (unaligned), set1, zero
//   add, sub, mul, min, max, fmadd(a, b, c) = a * b + c
//   cmp_ge, cmp_gt, cmp_eq (ordered), cmp_bad(a) = a is NaN or +inf
//   mask_or, any(m), bits(m) (lane i -> bit i), keep(m, v) (v where m else 0)
//   exp2_from_magic(t) 2^n where t = n + 1.5 * 2^23 (n integral in [-126, 127])
//   compress_indices(dst, m, base)
//                     writes base + i for the lanes i set in m, in order, to
//                     dst (may write up to W entries); returns their count
//   hsum_d(v)         sum of the lanes in double
//   hmax(v)           largest lane
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/dispatch.h"

namespace specdec {
namespace {

constexpr float kPosInf = __builtin_huge_valf();
constexpr float kNegInf = -__builtin_huge_valf();

inline size_t lowest_bit(uint32_t bits) { return static_cast<size_t>(__builtin_ctz(bits)); }

template <class T>
struct Ops {
    using vf = typename T::vf;
    using vm = typename T::vm;
    static constexpr size_t W = T::W;
    static constexpr size_t kChunk = 64 * W;  // float partial sums per chunk, then double

    // Loads r < W values and pads the vector with `fill`.
    static vf load_part(const float* x, size_t r, float fill) {
        float buf[W];
        for (size_t j = 0; j < W; ++j) buf[j] = j < r ? x[j] : fill;
        return T::load(buf);
    }

    static void store_part(float* x, size_t r, vf v) {
        float buf[W];
        T::store(buf, v);
        for (size_t j = 0; j < r; ++j) x[j] = buf[j];
    }

    // exp(x) in float for x <= 88: round-to-nearest range reduction
    // x = n ln2 + r with a two-part ln2, a degree-6 polynomial on |r| <= ln2/2,
    // and scaling by 2^n through the exponent bits. Inputs below ln(FLT_MIN)
    // (including -inf) give 0, without clamping: whatever the lanes compute
    // there is masked. The relative error elsewhere is within 2 ulp.
    static vf exp_v(vf x) {
        const vf magic = T::set1(12582912.0f);  // 1.5 * 2^23: x * log2(e) + magic rounds to an integer
        const vf t = T::fmadd(x, T::set1(1.44269504088896341f), magic);
        const vf n = T::sub(t, magic);
        vf r = T::fmadd(n, T::set1(-0.693359375f), x);
        r = T::fmadd(n, T::set1(2.12194440054690583e-4f), r);
        // e^r = 1 + r + r^2 P(r) with P of degree 4, fitted to minimise the
        // relative error of e^r on |r| <= ln2/2 (3.7e-9 with these float
        // coefficients, far below half an ulp), evaluated with short chains.
        const vf r2 = T::mul(r, r);
        const vf a = T::fmadd(T::set1(0x1.555492p-3f), r, T::set1(0x1.fffffcp-2f));
        const vf b = T::fmadd(T::set1(0x1.123a04p-7f), r, T::set1(0x1.5558f2p-5f));
        const vf p = T::fmadd(T::fmadd(T::set1(0x1.6a235cp-10f), r2, b), r2, a);
        vf y = T::fmadd(p, r2, r);
        y = T::add(y, T::set1(1.0f));
        // The low bits of t hold magic + n: shift n + 127 into the exponent.
        y = T::mul(y, T::exp2_from_magic(t));
        return T::keep(T::cmp_ge(x, T::set1(-87.33654475f)), y);
    }

    static float max_checked(const float* x, size_t n, int64_t* bad) {
        vf m0 = T::set1(kNegInf), m1 = m0, m2 = m0, m3 = m0;
        vm b = T::cmp_bad(T::zero());
        size_t i = 0;
        for (; i + 4 * W <= n; i += 4 * W) {
            const vf a0 = T::load(x + i), a1 = T::load(x + i + W);
            const vf a2 = T::load(x + i + 2 * W), a3 = T::load(x + i + 3 * W);
            m0 = T::max(m0, a0);
            m1 = T::max(m1, a1);
            m2 = T::max(m2, a2);
            m3 = T::max(m3, a3);
            b = T::mask_or(
                b, T::mask_or(T::mask_or(T::cmp_bad(a0), T::cmp_bad(a1)), T::mask_or(T::cmp_bad(a2), T::cmp_bad(a3))));
        }
        for (; i + W <= n; i += W) {
            const vf a = T::load(x + i);
            m0 = T::max(m0, a);
            b = T::mask_or(b, T::cmp_bad(a));
        }
        if (i < n) {
            const vf a = load_part(x + i, n - i, kNegInf);
            m0 = T::max(m0, a);
            b = T::mask_or(b, T::cmp_bad(a));
        }
        *bad = -1;
        if (T::any(b)) {
            for (size_t j = 0; j < n; ++j) {
                if (!(x[j] < kPosInf)) {
                    *bad = static_cast<int64_t>(j);
                    break;
                }
            }
        }
        return T::hmax(T::max(T::max(m0, m1), T::max(m2, m3)));
    }

    static int64_t first_equal(const float* x, size_t n, float value) {
        const vf v = T::set1(value);
        size_t i = 0;
        for (; i + W <= n; i += W) {
            const uint32_t bits = T::bits(T::cmp_eq(T::load(x + i), v));
            if (bits != 0) return static_cast<int64_t>(i + lowest_bit(bits));
        }
        for (; i < n; ++i) {
            if (x[i] == value) return static_cast<int64_t>(i);
        }
        return -1;
    }

    static double exp_shift(const float* x, size_t n, float shift, float scale, float* out) {
        const vf sh = T::set1(shift);
        const vf sc = T::set1(scale);
        double total = 0.0;
        size_t i = 0;
        while (i + W <= n) {
            size_t end = i + kChunk;
            if (end > n) end = n;
            vf acc0 = T::zero(), acc1 = T::zero();
            for (; i + 4 * W <= end; i += 4 * W) {
                const vf e0 = exp_v(T::mul(T::sub(T::load(x + i), sh), sc));
                const vf e1 = exp_v(T::mul(T::sub(T::load(x + i + W), sh), sc));
                const vf e2 = exp_v(T::mul(T::sub(T::load(x + i + 2 * W), sh), sc));
                const vf e3 = exp_v(T::mul(T::sub(T::load(x + i + 3 * W), sh), sc));
                T::store(out + i, e0);
                T::store(out + i + W, e1);
                T::store(out + i + 2 * W, e2);
                T::store(out + i + 3 * W, e3);
                acc0 = T::add(acc0, T::add(e0, e1));
                acc1 = T::add(acc1, T::add(e2, e3));
            }
            for (; i + W <= end; i += W) {
                const vf e0 = exp_v(T::mul(T::sub(T::load(x + i), sh), sc));
                T::store(out + i, e0);
                acc0 = T::add(acc0, e0);
            }
            total += T::hsum_d(T::add(acc0, acc1));
        }
        if (i < n) {
            const vf e = exp_v(T::mul(T::sub(load_part(x + i, n - i, kNegInf), sh), sc));
            store_part(out + i, n - i, e);
            total += T::hsum_d(e);
        }
        return total;
    }

    static void exp_array(const float* x, size_t n, float* out) {
        size_t i = 0;
        const vf hi = T::set1(88.0f);
        for (; i + W <= n; i += W) T::store(out + i, exp_v(T::min(T::load(x + i), hi)));
        if (i < n) store_part(out + i, n - i, exp_v(T::min(load_part(x + i, n - i, 0.0f), hi)));
    }

    static void scale(float* x, size_t n, float s) {
        const vf v = T::set1(s);
        size_t i = 0;
        for (; i + 2 * W <= n; i += 2 * W) {
            T::store(x + i, T::mul(T::load(x + i), v));
            T::store(x + i + W, T::mul(T::load(x + i + W), v));
        }
        for (; i + W <= n; i += W) T::store(x + i, T::mul(T::load(x + i), v));
        if (i < n) store_part(x + i, n - i, T::mul(load_part(x + i, n - i, 0.0f), v));
    }

    static double sum(const float* x, size_t n) {
        double total = 0.0;
        size_t i = 0;
        while (i + W <= n) {
            size_t end = i + kChunk;
            if (end > n) end = n;
            vf acc0 = T::zero(), acc1 = T::zero();
            for (; i + 2 * W <= end; i += 2 * W) {
                acc0 = T::add(acc0, T::load(x + i));
                acc1 = T::add(acc1, T::load(x + i + W));
            }
            for (; i + W <= end; i += W) acc0 = T::add(acc0, T::load(x + i));
            total += T::hsum_d(T::add(acc0, acc1));
        }
        if (i < n) total += T::hsum_d(load_part(x + i, n - i, 0.0f));
        return total;
    }

    static double sum_min(const float* p, const float* q, size_t n) {
        double total = 0.0;
        size_t i = 0;
        while (i + W <= n) {
            size_t end = i + kChunk;
            if (end > n) end = n;
            vf acc0 = T::zero(), acc1 = T::zero();
            for (; i + 2 * W <= end; i += 2 * W) {
                acc0 = T::add(acc0, T::min(T::load(p + i), T::load(q + i)));
                acc1 = T::add(acc1, T::min(T::load(p + i + W), T::load(q + i + W)));
            }
            for (; i + W <= end; i += W) acc0 = T::add(acc0, T::min(T::load(p + i), T::load(q + i)));
            total += T::hsum_d(T::add(acc0, acc1));
        }
        if (i < n) total += T::hsum_d(T::min(load_part(p + i, n - i, 0.0f), load_part(q + i, n - i, 0.0f)));
        return total;
    }

    static double residual(const float* p, const float* q, size_t n, float* out) {
        const vf z = T::zero();
        double total = 0.0;
        size_t i = 0;
        while (i + W <= n) {
            size_t end = i + kChunk;
            if (end > n) end = n;
            vf acc0 = T::zero(), acc1 = T::zero();
            for (; i + 2 * W <= end; i += 2 * W) {
                const vf r0 = T::max(z, T::sub(T::load(p + i), T::load(q + i)));
                const vf r1 = T::max(z, T::sub(T::load(p + i + W), T::load(q + i + W)));
                T::store(out + i, r0);
                T::store(out + i + W, r1);
                acc0 = T::add(acc0, r0);
                acc1 = T::add(acc1, r1);
            }
            for (; i + W <= end; i += W) {
                const vf r0 = T::max(z, T::sub(T::load(p + i), T::load(q + i)));
                T::store(out + i, r0);
                acc0 = T::add(acc0, r0);
            }
            total += T::hsum_d(T::add(acc0, acc1));
        }
        if (i < n) {
            const vf r0 = T::max(z, T::sub(load_part(p + i, n - i, 0.0f), load_part(q + i, n - i, 0.0f)));
            store_part(out + i, n - i, r0);
            total += T::hsum_d(r0);
        }
        return total;
    }

    static size_t compress_ge(const float* x, size_t n, float threshold, uint32_t* idx) {
        const vf t = T::set1(threshold);
        size_t count = 0;
        size_t i = 0;
        for (; i + W <= n; i += W) {
            const vm m = T::cmp_ge(T::load(x + i), t);
            if (T::any(m)) count += T::compress_indices(idx + count, m, static_cast<uint32_t>(i));
        }
        for (; i < n; ++i) {
            if (x[i] >= threshold) idx[count++] = static_cast<uint32_t>(i);
        }
        return count;
    }

    static double keep_above(float* x, size_t n, float threshold, bool strict) {
        const vf t = T::set1(threshold);
        double total = 0.0;
        size_t i = 0;
        while (i + W <= n) {
            size_t end = i + kChunk;
            if (end > n) end = n;
            vf acc = T::zero();
            if (strict) {
                for (; i + W <= end; i += W) {
                    const vf v = T::load(x + i);
                    const vf k = T::keep(T::cmp_gt(v, t), v);
                    T::store(x + i, k);
                    acc = T::add(acc, k);
                }
            } else {
                for (; i + W <= end; i += W) {
                    const vf v = T::load(x + i);
                    const vf k = T::keep(T::cmp_ge(v, t), v);
                    T::store(x + i, k);
                    acc = T::add(acc, k);
                }
            }
            total += T::hsum_d(acc);
        }
        for (; i < n; ++i) {
            const bool keep = strict ? x[i] > threshold : x[i] >= threshold;
            if (!keep) x[i] = 0.0f;
            total += x[i];
        }
        return total;
    }

    static double block_sums(const float* x, size_t n, size_t block, double* sums) {
        double total = 0.0;
        size_t b = 0;
        for (size_t start = 0; start < n; start += block, ++b) {
            size_t end = start + block;
            if (end > n) end = n;
            vf acc0 = T::zero(), acc1 = T::zero();
            size_t i = start;
            for (; i + 2 * W <= end; i += 2 * W) {
                acc0 = T::add(acc0, T::load(x + i));
                acc1 = T::add(acc1, T::load(x + i + W));
            }
            for (; i + W <= end; i += W) acc0 = T::add(acc0, T::load(x + i));
            double s = T::hsum_d(T::add(acc0, acc1));
            for (; i < end; ++i) s += x[i];
            sums[b] = s;
            total += s;
        }
        return total;
    }

    static const KernelTable* table(const char* name) {
        static const KernelTable t = {
            name, &max_checked, &first_equal, &exp_shift,   &exp_array,  &scale,
            &sum, &sum_min,     &residual,    &compress_ge, &keep_above, &block_sums,
        };
        return &t;
    }
};

}  // namespace
}  // namespace specdec
