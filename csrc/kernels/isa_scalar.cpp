// Portable kernels: one float per "vector". Built on every architecture; it is
// also the reference the SIMD paths are tested against.
#include <cstdint>
#include <cstring>

#include "kernels/dispatch.h"

namespace specdec {
namespace {

struct ScalarTraits {
    using vf = float;
    using vm = bool;
    static constexpr size_t W = 1;

    static vf load(const float* p) { return *p; }
    static void store(float* p, vf v) { *p = v; }
    static vf set1(float x) { return x; }
    static vf zero() { return 0.0f; }
    static vf add(vf a, vf b) { return a + b; }
    static vf sub(vf a, vf b) { return a - b; }
    static vf mul(vf a, vf b) { return a * b; }
    static vf min(vf a, vf b) { return a < b ? a : b; }
    static vf max(vf a, vf b) { return a > b ? a : b; }
    static vf fmadd(vf a, vf b, vf c) { return a * b + c; }
    static vm cmp_ge(vf a, vf b) { return a >= b; }
    static vm cmp_gt(vf a, vf b) { return a > b; }
    static vm cmp_eq(vf a, vf b) { return a == b; }
    static vm cmp_bad(vf a) { return !(a < __builtin_huge_valf()); }
    static vm mask_or(vm a, vm b) { return a || b; }
    static bool any(vm m) { return m; }
    static uint32_t bits(vm m) { return m ? 1u : 0u; }
    static vf keep(vm m, vf v) { return m ? v : 0.0f; }
    static vf exp2_from_magic(vf t) {
        uint32_t u;
        std::memcpy(&u, &t, sizeof u);
        u = (u + (127u - 0x4B400000u)) << 23;
        float f;
        std::memcpy(&f, &u, sizeof f);
        return f;
    }
    static size_t compress_indices(uint32_t* dst, vm m, uint32_t base) {
        dst[0] = base;
        return m ? 1 : 0;
    }
    static double hsum_d(vf v) { return static_cast<double>(v); }
    static float hmax(vf v) { return v; }
};

}  // namespace
}  // namespace specdec

#include "kernels/simd_ops_impl.h"

namespace specdec {

const KernelTable* kernel_table_scalar() { return Ops<ScalarTraits>::table("scalar"); }

}  // namespace specdec
