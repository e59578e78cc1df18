// Cross-checks every vectorised KernelTable this build and CPU offer (NEON on
// AArch64, AVX2 and AVX-512 on x86-64) against the scalar table, with no
// Python involved, so that it can run under a user-mode emulator.
// tools/test_arm.sh cross-compiles it for aarch64 and runs it under QEMU; it
// builds and runs natively just as well.
//
//   kernel_tables [--require ISA]... [--draws N]
//
// --require fails the run unless ISA is among the supported tables (so an
// aarch64 run cannot pass with the scalar table alone). --draws sets the
// verify calls of each chi-square check (default 40000).
//
// Checked, per table, on random and edge inputs (NaN, +-inf, -0, subnormals,
// ties; sizes 1..33, around the chunk sizes, 1 and 152,064; starts 0, 1 and 3
// floats past an allocation, with canaries after every output):
//   - every KernelTable entry against the scalar one: comparisons, indices,
//     masks and elementwise arithmetic exactly; exponentials within 3 ulp of
//     the scalar ones and within 1.5 ulp of exp in double; sums within 1e-6
//     of the sum of the magnitudes summed;
//   - the dispatch: SPECDEC_ISA, set_isa, supported_isas;
//   - compute_distribution, sampling and verify_step run through the table
//     against the same calls on the scalar table (same supports, values
//     within rtol 1e-5 / atol 1e-12, same tokens, alphas within 1e-5),
//     top-p cuts placed on and around cumulative-mass boundaries;
//   - Pearson chi-square of verify_step's emitted tokens against p and of
//     the residual sampler (the tokens emitted on rejection) against
//     max(0, p - q), p computed in float64 without the kernels, and a
//     binomial check of the acceptance rate; each at p < 1e-7 with fixed
//     seeds (under 1e-6 false failures for the whole run).
//
// Prints one line per group and a closing "N passed, M failed" line; exits 1
// on any failure.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/sample.h"
#include "kernels/softmax.h"
#include "kernels/truncate.h"
#include "kernels/verify.h"
#include "rng.h"

namespace {

using specdec::KernelTable;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kCanary = -12345.678f;
constexpr size_t kGuard = 16;  // canary floats after every output

std::string format(const char* fmt, ...) {
    char buf[512];
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, args);
    va_end(args);
    return buf;
}

// --- bookkeeping --------------------------------------------------------------

struct Tally {
    size_t passed = 0;
    size_t failed = 0;
    size_t group_passed = 0;
    size_t group_failed = 0;
    std::string group;
    std::chrono::steady_clock::time_point start;

    void begin(const std::string& name) {
        group = name;
        group_passed = group_failed = 0;
        start = std::chrono::steady_clock::now();
    }
    void end() {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::printf("  %-44s %7zu checks %6.1f s  %s\n", group.c_str(), group_passed + group_failed, s,
                    group_failed == 0 ? "ok" : format("%zu FAILED", group_failed).c_str());
        std::fflush(stdout);
    }
    bool check(bool ok, const std::string& what) {
        if (ok) {
            ++passed;
            ++group_passed;
        } else {
            ++failed;
            ++group_failed;
            if (group_failed <= 10) std::fprintf(stderr, "FAIL [%s] %s\n", group.c_str(), what.c_str());
        }
        return ok;
    }
};

Tally g_tally;

bool check(bool ok, const std::string& what) { return g_tally.check(ok, what); }

// --- deterministic random numbers (no std:: distributions: portable output) ---

struct Gen {
    uint64_t s;
    explicit Gen(uint64_t seed) : s(seed) {}
    uint64_t next() {  // splitmix64
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
    size_t below(size_t n) { return static_cast<size_t>(uniform() * static_cast<double>(n)); }
    double normal() {
        const double u1 = 1.0 - uniform();
        const double u2 = uniform();
        return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }
};

// --- float helpers ------------------------------------------------------------

uint32_t bits_of(float v) {
    uint32_t u;
    std::memcpy(&u, &v, sizeof u);
    return u;
}

// Same bits, or both NaN.
bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || bits_of(a) == bits_of(b); }

int64_t ordered(float v) {
    const uint32_t u = bits_of(v);
    return (u & 0x80000000u) ? -static_cast<int64_t>(u & 0x7FFFFFFFu) : static_cast<int64_t>(u);
}

int64_t ulp_distance(float a, float b) {
    const int64_t d = ordered(a) - ordered(b);
    return d < 0 ? -d : d;
}

// Sums of floats: equal non-finite results, else within rel * (sum of |x|).
bool close_sum(double got, double want, double magnitude, double rel = 1e-6) {
    if (!std::isfinite(got) || !std::isfinite(want)) return (std::isnan(got) && std::isnan(want)) || got == want;
    return std::fabs(got - want) <= rel * magnitude;
}

// --- inputs -------------------------------------------------------------------

// A float buffer whose data starts `offset` floats into an allocation (so not
// aligned to a vector boundary unless offset is 0) and is followed by canaries.
struct Buf {
    std::vector<float> mem;
    float* x = nullptr;
    size_t n = 0;

    Buf(size_t n_, size_t offset) : mem(n_ + offset + kGuard, kCanary), x(mem.data() + offset), n(n_) {}
    Buf(const std::vector<float>& v, size_t offset) : Buf(v.size(), offset) { std::copy(v.begin(), v.end(), x); }
    bool guard_intact() const {
        for (size_t j = 0; j < kGuard; ++j) {
            if (!same(x[n + j], kCanary)) return false;
        }
        return true;
    }
};

enum class Kind { Normal, Ties, Masked, Special, Probs, Wide };
const char* kind_name(Kind k) {
    switch (k) {
        case Kind::Normal:
            return "normal";
        case Kind::Ties:
            return "ties";
        case Kind::Masked:
            return "masked";
        case Kind::Special:
            return "special";
        case Kind::Probs:
            return "probs";
        case Kind::Wide:
            return "wide";
    }
    return "?";
}
const Kind kAllKinds[] = {Kind::Normal, Kind::Ties, Kind::Masked, Kind::Special, Kind::Probs, Kind::Wide};

std::vector<float> make_values(Gen& g, size_t n, Kind kind) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) {
        switch (kind) {
            case Kind::Normal:
            case Kind::Masked:
            case Kind::Special:
                v[i] = static_cast<float>(std::max(-12.0, std::min(12.0, g.normal() * 2.5)));
                break;
            case Kind::Ties:
                v[i] = static_cast<float>(static_cast<int>(g.below(13)) - 6) * 0.5f;
                break;
            case Kind::Probs:
                v[i] = static_cast<float>(g.uniform() * g.uniform());
                break;
            case Kind::Wide:
                v[i] = static_cast<float>((g.uniform() - 0.3) * std::pow(10.0, g.below(61) - 30.0));
                break;
        }
    }
    if (kind == Kind::Masked) {
        for (size_t i = 0; i < n; ++i) {
            if (g.uniform() < 0.1) v[i] = -kInf;
        }
    }
    if (kind == Kind::Special) {
        static const float kSpecial[] = {kNaN,  kInf,   -kInf,   -kInf,  0.0f,
                                         -0.0f, 1e-45f, -1e-45f, 1e-40f, std::numeric_limits<float>::min(),
                                         1.0f,  -1.0f,  88.0f,   -87.5f, -104.0f};
        const size_t count = 1 + n / 8;
        for (size_t j = 0; j < count; ++j) v[g.below(n)] = kSpecial[g.below(sizeof kSpecial / sizeof kSpecial[0])];
        if (n > 1 && g.uniform() < 0.5) v[n - 1] = g.uniform() < 0.5 ? kNaN : kInf;  // in the tail
    }
    return v;
}

std::vector<size_t> test_sizes() {
    std::vector<size_t> sizes;
    for (size_t n = 1; n <= 33; ++n) sizes.push_back(n);  // 1 .. 2 * 16 + 1: every tail of every width
    for (size_t n : {63, 64, 65, 127, 255, 256, 257, 1023, 1024, 1025, 4097, 152064}) sizes.push_back(n);
    return sizes;
}
const size_t kOffsets[] = {0, 1, 3};

// --- primitive checks ---------------------------------------------------------

void check_max_and_first(const KernelTable& S, const KernelTable& T, const Buf& in, const std::string& label) {
    int64_t bad_s = -2, bad_t = -2;
    const float ms = S.max_checked(in.x, in.n, &bad_s);
    const float mt = T.max_checked(in.x, in.n, &bad_t);
    int64_t bad_ref = -1;
    float max_ref = -kInf;
    for (size_t i = 0; i < in.n; ++i) {
        if (!(in.x[i] < kInf)) {
            bad_ref = static_cast<int64_t>(i);
            break;
        }
        if (in.x[i] > max_ref) max_ref = in.x[i];
    }
    check(bad_s == bad_ref && bad_t == bad_ref, format("max_checked bad index %s: scalar %lld, %s %lld, expected %lld",
                                                       label.c_str(), static_cast<long long>(bad_s), T.name,
                                                       static_cast<long long>(bad_t), static_cast<long long>(bad_ref)));
    if (bad_ref < 0) {
        check(ms == max_ref && mt == max_ref,
              format("max_checked %s: scalar %.9g, %s %.9g, expected %.9g", label.c_str(), ms, T.name, mt, max_ref));
    }
    Gen g(in.n * 7 + 1);
    const float probes[] = {in.x[g.below(in.n)], in.x[in.n - 1], in.x[0], max_ref, kNaN, 1234.5f, -0.0f};
    for (float v : probes) {
        int64_t want = -1;
        for (size_t i = 0; i < in.n; ++i) {
            if (in.x[i] == v) {
                want = static_cast<int64_t>(i);
                break;
            }
        }
        const int64_t a = S.first_equal(in.x, in.n, v), b = T.first_equal(in.x, in.n, v);
        check(a == want && b == want,
              format("first_equal(%.9g) %s: scalar %lld, %s %lld, expected %lld", v, label.c_str(),
                     static_cast<long long>(a), T.name, static_cast<long long>(b), static_cast<long long>(want)));
    }
}

// Arguments stay in the exponential's domain (<= 0): shifts at or above the
// largest finite entry. NaN entries must give 0, +inf entries NaN, on both.
void check_exp_shift(const KernelTable& S, const KernelTable& T, const Buf& in, size_t offset,
                     const std::string& label) {
    float finite_max = -kInf;
    bool bad = false;
    for (size_t i = 0; i < in.n; ++i) {
        if (!(in.x[i] < kInf))
            bad = true;
        else if (in.x[i] > finite_max)
            finite_max = in.x[i];
    }
    std::vector<float> shifts{0.0f};
    if (finite_max > -kInf) shifts = {finite_max, finite_max + 0.5f};
    const float scales[] = {1.0f, 1.0f / 0.3f, 0.5f, std::numeric_limits<float>::max()};
    for (float shift : shifts) {
        for (float scale : scales) {
            Buf os(in.n, offset), ot(in.n, offset);
            const double ts = S.exp_shift(in.x, in.n, shift, scale, os.x);
            const double tt = T.exp_shift(in.x, in.n, shift, scale, ot.x);
            const std::string where = format("exp_shift(shift %.9g, scale %.9g) %s", shift, scale, label.c_str());
            check(os.guard_intact() && ot.guard_intact(), where + ": wrote past the end");
            int64_t worst = 0;
            size_t worst_i = 0, pattern_i = 0;
            bool pattern = true;
            double own_sum = 0.0;
            for (size_t i = 0; i < in.n; ++i) {
                own_sum += ot.x[i];
                const bool want_nan = in.x[i] == kInf;
                const bool want_zero = std::isnan(in.x[i]) || in.x[i] == -kInf;
                if (std::isnan(os.x[i]) != want_nan || std::isnan(ot.x[i]) != want_nan ||
                    (want_zero && (os.x[i] != 0.0f || ot.x[i] != 0.0f)) || (os.x[i] == 0.0f) != (ot.x[i] == 0.0f)) {
                    if (pattern) pattern_i = i;
                    pattern = false;
                    continue;
                }
                if (want_nan) continue;
                const int64_t d = ulp_distance(os.x[i], ot.x[i]);
                if (d > worst) {
                    worst = d;
                    worst_i = i;
                }
            }
            check(pattern, where + format(": zero/NaN pattern wrong at %zu (x %.9g: scalar %.9g, %s %.9g)", pattern_i,
                                          in.x[pattern_i], os.x[pattern_i], T.name, ot.x[pattern_i]));
            check(worst <= 3,
                  where + format(": %lld ulp at %zu (x %.9g: scalar %.9g, %s %.9g)", static_cast<long long>(worst),
                                 worst_i, in.x[worst_i], os.x[worst_i], T.name, ot.x[worst_i]));
            if (!bad && shift == finite_max) {
                const int64_t a = S.first_equal(in.x, in.n, finite_max);
                check(os.x[a] == 1.0f && ot.x[a] == 1.0f, where + ": the argmax is not exactly 1");
            }
            check(close_sum(tt, ts, std::fabs(ts)), where + format(": sum scalar %.17g, %s %.17g", ts, T.name, tt));
            check(close_sum(tt, own_sum, std::fabs(own_sum)),
                  where + format(": %s returns %.17g, its outputs sum to %.17g", T.name, tt, own_sum));
        }
    }
}

void check_exp_array(const KernelTable& S, const KernelTable& T, const Buf& in, size_t offset,
                     const std::string& label) {
    Buf os(in.n, offset), ot(in.n, offset);
    S.exp_array(in.x, in.n, os.x);
    T.exp_array(in.x, in.n, ot.x);
    check(os.guard_intact() && ot.guard_intact(), "exp_array " + label + ": wrote past the end");
    size_t i = 0;
    for (; i < in.n; ++i) {
        const bool ok = !std::isnan(os.x[i]) && !std::isnan(ot.x[i]) && ((os.x[i] == 0.0f) == (ot.x[i] == 0.0f)) &&
                        ulp_distance(os.x[i], ot.x[i]) <= 3;
        if (!ok) break;
    }
    check(i == in.n, i == in.n ? std::string()
                               : format("exp_array %s at %zu: exp(%.9g) scalar %.9g, %s %.9g", label.c_str(), i,
                                        in.x[i], os.x[i], T.name, ot.x[i]));
}

// The accuracy grid of tests/test_kernels_reference.py::test_exp_accuracy.
void check_exp_accuracy(const KernelTable& T) {
    std::vector<float> x;
    for (int i = 0; i <= 200000; ++i) x.push_back(static_cast<float>(-87.3 + 87.3 * i / 200000.0));
    for (int i = 0; i <= 1000; ++i) x.push_back(static_cast<float>(-std::pow(10.0, -8.0 + 9.0 * i / 1000.0)));
    std::vector<float> out(x.size());
    T.exp_array(x.data(), x.size(), out.data());
    double worst = 0.0;
    size_t worst_i = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        const double want = std::exp(static_cast<double>(x[i]));
        const float wf = static_cast<float>(want);
        const double ulp = static_cast<double>(std::nextafter(wf, kInf) - wf);
        const double err = std::fabs(out[i] - want) / ulp;
        if (err > worst) {
            worst = err;
            worst_i = i;
        }
    }
    check(worst <= 1.5, format("exp_array accuracy: %.3f ulp at x = %.9g", worst, x[worst_i]));
    const float special[] = {-kInf, -1e30f, -200.0f, -104.0f, -88.0f, 0.0f};
    const float want[] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 1.0f};
    float got[6];
    T.exp_array(special, 6, got);
    for (int i = 0; i < 6; ++i)
        check(got[i] == want[i], format("exp(%g) = %.9g, expected %g", special[i], got[i], want[i]));
    std::printf("    %s exp: worst %.3f ulp over %zu points in [-87.3, 0]\n", T.name, worst, x.size());
}

void check_scale_sum(const KernelTable& S, const KernelTable& T, const Buf& in, size_t offset,
                     const std::string& label) {
    for (float s : {0.5f, 1.0f / 3.0f, 0.0f, -1.0f, 1e30f}) {
        Buf a(in.n, offset), b(in.n, offset);
        std::copy(in.x, in.x + in.n, a.x);
        std::copy(in.x, in.x + in.n, b.x);
        S.scale(a.x, in.n, s);
        T.scale(b.x, in.n, s);
        bool ok = a.guard_intact() && b.guard_intact();
        for (size_t i = 0; ok && i < in.n; ++i) ok = same(a.x[i], b.x[i]);
        check(ok, format("scale(%g) %s", s, label.c_str()));
    }
    double magnitude = 0.0;
    for (size_t i = 0; i < in.n; ++i) magnitude += std::fabs(in.x[i]);
    const double a = S.sum(in.x, in.n), b = T.sum(in.x, in.n);
    check(close_sum(b, a, magnitude), format("sum %s: scalar %.17g, %s %.17g", label.c_str(), a, T.name, b));
}

void check_pairwise(const KernelTable& S, const KernelTable& T, const Buf& p, const Buf& q, size_t offset,
                    const std::string& label) {
    double mag_min = 0.0, mag_res = 0.0;
    for (size_t i = 0; i < p.n; ++i) {
        mag_min += std::fabs(p.x[i] < q.x[i] ? p.x[i] : q.x[i]);
        const float r = p.x[i] - q.x[i];
        mag_res += r > 0.0f ? r : 0.0f;
    }
    const double a = S.sum_min(p.x, q.x, p.n), b = T.sum_min(p.x, q.x, p.n);
    check(close_sum(b, a, mag_min), format("sum_min %s: scalar %.17g, %s %.17g", label.c_str(), a, T.name, b));
    Buf rs(p.n, offset), rt(p.n, offset);
    const double ts = S.residual(p.x, q.x, p.n, rs.x), tt = T.residual(p.x, q.x, p.n, rt.x);
    bool ok = rs.guard_intact() && rt.guard_intact();
    size_t at = 0;
    for (; ok && at < p.n; ++at) ok = same(rs.x[at], rt.x[at]);
    check(ok, format("residual values %s (first difference at %zu)", label.c_str(), at - 1));
    check(close_sum(tt, ts, mag_res), format("residual sum %s: scalar %.17g, %s %.17g", label.c_str(), ts, T.name, tt));
}

void check_compress_keep(const KernelTable& S, const KernelTable& T, const Buf& in, size_t offset,
                         const std::string& label) {
    Gen g(in.n * 13 + offset);
    const float thresholds[] = {
        in.x[g.below(in.n)], in.x[g.below(in.n)], 0.0f, -kInf, kInf, kNaN, 1e-45f, 0.25f, -1.5f};
    for (float t : thresholds) {
        std::vector<uint32_t> is(in.n + specdec::kCompressSlack + kGuard, 0xDEADBEEFu), it = is;
        const size_t cs = S.compress_ge(in.x, in.n, t, is.data());
        const size_t ct = T.compress_ge(in.x, in.n, t, it.data());
        bool ok = cs == ct;
        for (size_t j = 0; ok && j < cs; ++j) ok = is[j] == it[j];
        for (size_t j = in.n + specdec::kCompressSlack; ok && j < is.size(); ++j) ok = it[j] == 0xDEADBEEFu;
        size_t want = 0;
        for (size_t i = 0; i < in.n; ++i) want += in.x[i] >= t ? 1 : 0;
        check(ok && cs == want, format("compress_ge(%.9g) %s: counts scalar %zu, %s %zu, expected %zu", t,
                                       label.c_str(), cs, T.name, ct, want));
        for (bool strict : {false, true}) {
            Buf a(in.n, offset), b(in.n, offset);
            std::copy(in.x, in.x + in.n, a.x);
            std::copy(in.x, in.x + in.n, b.x);
            const double sa = S.keep_above(a.x, in.n, t, strict), sb = T.keep_above(b.x, in.n, t, strict);
            bool same_rows = a.guard_intact() && b.guard_intact();
            double magnitude = 0.0;
            for (size_t i = 0; same_rows && i < in.n; ++i) {
                same_rows = same(a.x[i], b.x[i]);
                magnitude += std::fabs(a.x[i]);
            }
            check(same_rows, format("keep_above(%.9g, strict %d) %s: rows differ", t, strict, label.c_str()));
            check(close_sum(sb, sa, magnitude), format("keep_above(%.9g, strict %d) %s: sum scalar %.17g, %s %.17g", t,
                                                       strict, label.c_str(), sa, T.name, sb));
        }
    }
}

void check_block_sums(const KernelTable& S, const KernelTable& T, const Buf& in, const std::string& label) {
    for (size_t block : {64, 256}) {
        const size_t nb = (in.n + block - 1) / block;
        std::vector<double> bs(nb + 4, -7.0), bt(nb + 4, -7.0);
        const double ts = S.block_sums(in.x, in.n, block, bs.data());
        const double tt = T.block_sums(in.x, in.n, block, bt.data());
        double total_mag = 0.0;
        bool ok = bt[nb] == -7.0;
        for (size_t b = 0; b < nb; ++b) {
            double magnitude = 0.0;
            for (size_t i = b * block; i < std::min(in.n, (b + 1) * block); ++i) magnitude += std::fabs(in.x[i]);
            total_mag += magnitude;
            if (!close_sum(bt[b], bs[b], magnitude)) ok = false;
        }
        check(ok, format("block_sums(%zu) %s: blocks differ", block, label.c_str()));
        check(close_sum(tt, ts, total_mag),
              format("block_sums(%zu) %s: total scalar %.17g, %s %.17g", block, label.c_str(), ts, T.name, tt));
    }
}

void check_primitives(const KernelTable& S, const KernelTable& T) {
    g_tally.begin(std::string(T.name) + " vs scalar: max_checked, first_equal");
    Gen g(1);
    const std::vector<size_t> sizes = test_sizes();
    for (Kind kind : kAllKinds) {
        for (size_t n : sizes) {
            for (size_t offset : kOffsets) {
                const std::vector<float> v = make_values(g, n, kind);
                const Buf in(v, offset);
                check_max_and_first(S, T, in, format("[%s n=%zu +%zu]", kind_name(kind), n, offset));
            }
        }
    }
    // Every position of a NaN / +inf, in the body and in the tail of a vector.
    for (size_t n : {1, 7, 33, 257}) {
        for (size_t at = 0; at < n; ++at) {
            for (float bad : {kNaN, kInf}) {
                std::vector<float> v(n, -1.0f);
                v[at] = bad;
                if (at + 1 < n) v[n - 1] = bad;
                check_max_and_first(S, T, Buf(v, 1), format("[bad %g at %zu of %zu]", bad, at, n));
            }
        }
    }
    std::vector<float> all_masked(40, -kInf);
    check_max_and_first(S, T, Buf(all_masked, 2), "[all -inf]");
    g_tally.end();

    g_tally.begin(std::string(T.name) + " vs scalar: exp_shift, exp_array");
    for (Kind kind : kAllKinds) {
        for (size_t n : sizes) {
            for (size_t offset : kOffsets) {
                const std::vector<float> v = make_values(g, n, kind);
                const Buf in(v, offset);
                const std::string label = format("[%s n=%zu +%zu]", kind_name(kind), n, offset);
                check_exp_shift(S, T, in, offset, label);
                check_exp_array(S, T, in, offset, label);
            }
        }
    }
    check_exp_accuracy(T);
    g_tally.end();

    g_tally.begin(std::string(T.name) + " vs scalar: scale, sum");
    for (Kind kind : kAllKinds) {
        for (size_t n : sizes) {
            for (size_t offset : kOffsets) {
                const Buf in(make_values(g, n, kind), offset);
                check_scale_sum(S, T, in, offset, format("[%s n=%zu +%zu]", kind_name(kind), n, offset));
            }
        }
    }
    g_tally.end();

    g_tally.begin(std::string(T.name) + " vs scalar: sum_min, residual");
    for (Kind kind : {Kind::Probs, Kind::Normal, Kind::Special, Kind::Ties}) {
        for (size_t n : sizes) {
            for (size_t offset : kOffsets) {
                const Buf p(make_values(g, n, kind), offset);
                Buf q(make_values(g, n, Kind::Probs), (offset + 1) % 4);
                if (kind == Kind::Ties || kind == Kind::Probs) {
                    for (size_t i = 0; i < n; i += 3) q.x[i] = p.x[i];  // p == q: a zero residual
                }
                check_pairwise(S, T, p, q, offset, format("[%s n=%zu +%zu]", kind_name(kind), n, offset));
            }
        }
    }
    g_tally.end();

    g_tally.begin(std::string(T.name) + " vs scalar: compress_ge, keep_above");
    for (Kind kind : kAllKinds) {
        for (size_t n : sizes) {
            for (size_t offset : kOffsets) {
                const Buf in(make_values(g, n, kind), offset);
                check_compress_keep(S, T, in, offset, format("[%s n=%zu +%zu]", kind_name(kind), n, offset));
            }
        }
    }
    g_tally.end();

    g_tally.begin(std::string(T.name) + " vs scalar: block_sums");
    for (Kind kind : {Kind::Probs, Kind::Normal, Kind::Wide, Kind::Special}) {
        for (size_t n : sizes) {
            for (size_t offset : kOffsets) {
                const Buf in(make_values(g, n, kind), offset);
                check_block_sums(S, T, in, format("[%s n=%zu +%zu]", kind_name(kind), n, offset));
            }
        }
    }
    g_tally.end();
}

// --- dispatch -------------------------------------------------------------------

void check_dispatch(const std::vector<std::string>& isas) {
    g_tally.begin("dispatch: SPECDEC_ISA, set_isa");
    std::string error;
    ::unsetenv("SPECDEC_ISA");
    check(specdec::init_isa_from_environment(&error), "init without SPECDEC_ISA: " + error);
    check(specdec::active_isa_name() == isas.back(),
          format("default ISA %s, expected the best supported (%s)", specdec::active_isa_name(), isas.back().c_str()));
    for (const std::string& name : isas) {
        ::setenv("SPECDEC_ISA", name.c_str(), 1);
        error.clear();
        check(specdec::init_isa_from_environment(&error), "SPECDEC_ISA=" + name + ": " + error);
        check(specdec::active_isa_name() == name, "SPECDEC_ISA=" + name + " selected " + specdec::active_isa_name());
        check(specdec::set_isa(name, &error), "set_isa(" + name + "): " + error);
    }
    ::setenv("SPECDEC_ISA", "avx9000", 1);
    error.clear();
    check(!specdec::init_isa_from_environment(&error) && error.find("unknown instruction set") != std::string::npos,
          "SPECDEC_ISA=avx9000 accepted or badly reported: " + error);
    for (const char* name : {"scalar", "avx2", "avx512", "neon"}) {
        const bool listed = std::find(isas.begin(), isas.end(), name) != isas.end();
        error.clear();
        const bool ok = specdec::set_isa(name, &error);
        check(ok == listed,
              format("set_isa(%s) returned %d but supported_isas %s it", name, ok, listed ? "lists" : "does not list"));
        if (!ok) check(error.find("not supported by this CPU") != std::string::npos, "set_isa error: " + error);
    }
    ::unsetenv("SPECDEC_ISA");
    specdec::set_isa(isas.back(), nullptr);
    g_tally.end();
}

// --- the pipeline through the table ----------------------------------------------

struct DistRun {
    std::vector<float> out;
    std::string error;
    specdec::DistResult res;
};

DistRun run_distribution(const std::string& isa, const std::vector<float>& x, const specdec::DistParams& prm) {
    specdec::set_isa(isa, nullptr);
    DistRun r;
    r.out.assign(x.size(), -1.0f);
    try {
        r.res = specdec::compute_distribution(x.data(), x.size(), prm, r.out.data(), specdec::thread_workspace(),
                                              "logits", -1);
    } catch (const specdec::InvalidLogits& e) {
        r.error = e.what();
    }
    return r;
}

// True when a top-p cut sits within 1e-6 of a cumulative-mass boundary (the
// reference test's rule, tests/reference.py::top_p_ambiguous).
bool top_p_ambiguous(const std::vector<float>& x, const specdec::DistParams& prm) {
    if (prm.top_p >= 1.0 || prm.greedy()) return false;
    double mx = -HUGE_VAL;
    for (float v : x) mx = std::max(mx, static_cast<double>(v));
    std::vector<std::pair<double, size_t>> e;
    for (size_t i = 0; i < x.size(); ++i) e.emplace_back(std::exp((x[i] - mx) / prm.temperature), i);
    std::sort(e.begin(), e.end(), [](const auto& a, const auto& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    if (prm.top_k > 0 && static_cast<size_t>(prm.top_k) < e.size()) e.resize(static_cast<size_t>(prm.top_k));
    double total = 0.0;
    for (const auto& v : e) total += v.first;
    double cum = 0.0;
    for (const auto& v : e) {
        cum += v.first / total;
        if (std::fabs(cum - prm.top_p) < 1e-6) return true;
    }
    return false;
}

// Compares one row's distribution on `isa` with the scalar one; returns 1 when
// the supports differ on an ambiguous top-p cut (tolerated), else 0.
int compare_distribution(const std::string& isa, const std::vector<float>& x, const specdec::DistParams& prm,
                         const std::string& label) {
    const DistRun a = run_distribution("scalar", x, prm);
    const DistRun b = run_distribution(isa, x, prm);
    const std::string where = format("%s T=%g top_k=%lld top_p=%.17g min_p=%g", label.c_str(), prm.temperature,
                                     static_cast<long long>(prm.top_k), prm.top_p, prm.min_p);
    if (!check(a.error == b.error, where + ": errors '" + a.error + "' vs '" + b.error + "'")) return 0;
    if (!a.error.empty()) return 0;
    check(a.res.one_hot == b.res.one_hot, where + ": one-hot token differs");
    size_t support_diff = 0, value_diff = 0, first = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        if ((a.out[i] > 0.0f) != (b.out[i] > 0.0f)) {
            if (support_diff++ == 0) first = i;
        } else if (!(std::fabs(a.out[i] - b.out[i]) <= 1e-12 + 1e-5 * std::fabs(a.out[i]))) {
            if (value_diff++ == 0 && support_diff == 0) first = i;
        }
    }
    if (support_diff != 0 && top_p_ambiguous(x, prm)) return 1;
    check(support_diff == 0 && value_diff == 0,
          where + format(": %zu support and %zu value differences (first at %zu: scalar %.9g, %s %.9g)", support_diff,
                         value_diff, first, a.out[first], isa.c_str(), b.out[first]));
    double sum = 0.0;
    for (float v : b.out) sum += v;
    check(std::fabs(sum - 1.0) < 1e-5, where + format(": sums to %.9g", sum));
    return 0;
}

std::vector<float> make_logits(Gen& g, size_t n, bool ties) {
    std::vector<float> x = make_values(g, n, ties ? Kind::Ties : Kind::Normal);
    if (!ties && n > 4) {
        for (size_t j = 0; j < n / 8; ++j) x[g.below(n)] = x[g.below(n)];
        x[g.below(n)] = *std::max_element(x.begin(), x.end());
    }
    if (n > 2) {
        const size_t top = static_cast<size_t>(std::max_element(x.begin(), x.end()) - x.begin());
        for (size_t i = 0; i < n; ++i) {
            if (i != top && g.uniform() < 0.1) x[i] = -kInf;
        }
    }
    return x;
}

void check_pipeline(const std::string& isa) {
    g_tally.begin(isa + " vs scalar: distribution");
    Gen g(2);
    size_t ambiguous = 0;
    const double temps[] = {0.0, 0.3, 1.0, 2.0};
    const double top_ps[] = {0.01, 0.5, 0.9, 1.0};
    const double min_ps[] = {0.0, 0.05, 0.3};
    std::vector<size_t> sizes;
    for (size_t n = 1; n <= 33; ++n) sizes.push_back(n);
    for (size_t n : {64, 257, 1000, 4097}) sizes.push_back(n);
    for (size_t n : sizes) {
        for (bool ties : {false, true}) {
            const std::vector<float> x = make_logits(g, n, ties);
            for (double t : temps) {
                for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{5}, static_cast<int64_t>(n)}) {
                    for (double p : top_ps) {
                        for (double mp : min_ps) {
                            specdec::DistParams prm{t, k, p, mp};
                            ambiguous += compare_distribution(isa, x, prm, format("[n=%zu ties=%d]", n, ties));
                        }
                    }
                }
            }
        }
    }
    for (size_t n : {152064}) {
        for (bool ties : {false, true}) {
            const std::vector<float> x = make_logits(g, n, ties);
            const specdec::DistParams cases[] = {{1.0, 0, 1.0, 0.0},     {0.0, 0, 1.0, 0.0}, {0.3, 5, 1.0, 0.0},
                                                 {0.8, 0, 0.95, 0.0},    {1.0, 0, 0.5, 0.0}, {2.0, 0, 0.01, 0.0},
                                                 {1.0, 40, 0.95, 0.05},  {2.0, 0, 1.0, 0.3}, {1.0, 1000, 0.5, 0.0},
                                                 {2.0, 50000, 1.0, 0.0}, {0.7, 0, 0.97, 0.0}};
            for (const auto& prm : cases)
                ambiguous += compare_distribution(isa, x, prm, format("[n=%zu ties=%d]", n, ties));
        }
    }
    // Rows that are refused: the same message on both paths.
    for (size_t n : {1, 5, 33, 152064}) {
        std::vector<float> x(n, 0.0f);
        x[n - 1] = kNaN;
        compare_distribution(isa, x, {1.0, 0, 1.0, 0.0}, "[NaN last]");
        x[n - 1] = kInf;
        compare_distribution(isa, x, {0.0, 0, 1.0, 0.0}, "[+inf last]");
        std::fill(x.begin(), x.end(), -kInf);
        compare_distribution(isa, x, {1.0, 0, 1.0, 0.0}, "[all -inf]");
    }
    std::printf("    %zu top-p cuts on a cumulative-mass tie (either side is right)\n", ambiguous);
    g_tally.end();

    g_tally.begin(isa + " vs scalar: top-p on mass boundaries");
    size_t tolerated = 0;
    for (size_t n : {1000, 152064}) {
        const std::vector<float> x = make_logits(g, n, false);
        const DistRun full = run_distribution("scalar", x, {1.0, 0, 1.0, 0.0});
        std::vector<size_t> order(n);
        for (size_t i = 0; i < n; ++i) order[i] = i;
        std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
            return full.out[a] > full.out[b] || (full.out[a] == full.out[b] && a < b);
        });
        std::vector<double> cum(n);
        double c = 0.0;
        for (size_t j = 0; j < n; ++j) cum[j] = (c += full.out[order[j]]);
        for (size_t k : {size_t{0}, size_t{1}, size_t{2}, size_t{10}, size_t{100}, n / 2}) {
            if (cum[k] >= 1.0) continue;
            const double base = cum[k];
            const double ps[] = {
                base,       std::nextafter(base, 0.0), std::nextafter(base, 2.0), base - 1e-7, base + 1e-7, base - 1e-5,
                base + 1e-5};
            for (size_t which = 0; which < 7; ++which) {
                const double p = ps[which];
                if (!(p > 0.0 && p <= 1.0)) continue;
                const specdec::DistParams prm{1.0, 0, p, 0.0};
                tolerated += compare_distribution(isa, x, prm, format("[boundary n=%zu k=%zu]", n, k));
                // Clear of the boundary, the support is exactly the prefix a
                // float64 reference keeps, on both paths.
                const double gap_lo = k > 0 ? base - cum[k - 1] : base;
                const double gap_hi = k + 1 < n ? cum[k + 1] - base : 1.0;
                if (which >= 5 && gap_lo > 2e-5 && gap_hi > 2e-5) {
                    const size_t want = p < base ? k + 1 : k + 2;
                    for (const std::string& name : {std::string("scalar"), isa}) {
                        const DistRun r = run_distribution(name, x, prm);
                        size_t m = 0;
                        for (float v : r.out) m += v > 0.0f ? 1 : 0;
                        check(m == want, format("[boundary n=%zu k=%zu] %s top_p=cum%+g keeps %zu, expected %zu", n, k,
                                                name.c_str(), p - base, m, want));
                    }
                }
            }
        }
    }
    std::printf("    %zu cuts within 1e-6 of a boundary kept a different side (tolerated)\n", tolerated);
    g_tally.end();

    g_tally.begin(isa + " vs scalar: sampling, verify");
    for (size_t n : {1, 7, 33, 300, 5000, 152064}) {
        const std::vector<float> x = make_logits(g, n, false);
        for (const specdec::DistParams& prm :
             {specdec::DistParams{1.0, 0, 1.0, 0.0}, specdec::DistParams{0.7, 50, 0.9, 0.0},
              specdec::DistParams{1.5, 0, 0.8, 0.02}, specdec::DistParams{0.0, 0, 1.0, 0.0}}) {
            const DistRun a = run_distribution("scalar", x, prm);
            specdec::Rng ra(99, 3), rb(99, 3);
            for (int draw = 0; draw < 20; ++draw) {
                // Each run reuses the workspace its support points into.
                const DistRun a2 = run_distribution("scalar", x, prm);
                const int64_t ta =
                    specdec::sample_distribution(a2.out.data(), n, a2.res, ra, specdec::thread_workspace());
                const DistRun b2 = run_distribution(isa, x, prm);
                const int64_t tb =
                    specdec::sample_distribution(b2.out.data(), n, b2.res, rb, specdec::thread_workspace());
                check(ta == tb && ta >= 0 && a.out[static_cast<size_t>(ta)] > 0.0f,
                      format("sample n=%zu T=%g draw %d: scalar %lld, %s %lld", n, prm.temperature, draw,
                             static_cast<long long>(ta), isa.c_str(), static_cast<long long>(tb)));
            }
        }
    }
    for (size_t n_vocab : {1, 7, 33, 1000, 152064}) {
        const int trials = n_vocab > 10000 ? 3 : 25;
        const specdec::DistParams settings[] = {
            {0.0, 0, 1.0, 0.0}, {1.0, 0, 1.0, 0.0}, {0.7, 5, 0.9, 0.0}, {1.5, 0, 0.5, 0.05}};
        for (int trial = 0; trial < trials; ++trial) {
            for (const auto& prm : settings) {
                const size_t gamma = g.below(5);
                const std::vector<float> base = make_logits(g, n_vocab, false);
                std::vector<float> target((gamma + 1) * n_vocab), q(gamma * n_vocab);
                for (size_t r = 0; r <= gamma; ++r) {
                    for (size_t i = 0; i < n_vocab; ++i)
                        target[r * n_vocab + i] = base[i] + static_cast<float>(g.normal() * 0.5);
                }
                std::vector<int64_t> tokens(gamma);
                for (size_t r = 0; r < gamma; ++r) {
                    std::vector<float> d(target.begin() + r * n_vocab, target.begin() + (r + 1) * n_vocab);
                    for (float& v : d) v += static_cast<float>(g.normal() * 0.7);
                    const DistRun qd = run_distribution("scalar", d, prm);
                    std::copy(qd.out.begin(), qd.out.end(), q.begin() + r * n_vocab);
                    double u = g.uniform(), c = 0.0;
                    size_t pick = 0;
                    for (size_t i = 0; i < n_vocab; ++i) {
                        if (qd.out[i] > 0.0f) pick = i;
                        c += qd.out[i];
                        if (c > u && qd.out[i] > 0.0f) break;
                    }
                    tokens[r] = static_cast<int64_t>(pick);
                }
                for (bool with_q : {true, false}) {
                    specdec::VerifyOutcome oa, ob;
                    specdec::Rng ra(1000 * trial + n_vocab, 1), rb(1000 * trial + n_vocab, 1);
                    specdec::set_isa("scalar", nullptr);
                    specdec::verify_step(target.data(), gamma + 1, n_vocab, tokens.data(), with_q ? q.data() : nullptr,
                                         prm, ra, &oa);
                    specdec::set_isa(isa, nullptr);
                    specdec::verify_step(target.data(), gamma + 1, n_vocab, tokens.data(), with_q ? q.data() : nullptr,
                                         prm, rb, &ob);
                    bool ok = oa.n_accepted == ob.n_accepted && oa.token == ob.token && ra.counter == rb.counter &&
                              oa.alphas.size() == ob.alphas.size();
                    for (size_t j = 0; ok && j < oa.alphas.size(); ++j) {
                        ok = std::fabs(oa.alphas[j] - ob.alphas[j]) <= 1e-7 + 1e-5 * std::fabs(oa.alphas[j]);
                    }
                    check(ok,
                          format("verify V=%zu trial %d T=%g gamma=%zu q=%d: scalar (%lld, %lld), %s (%lld, %lld)",
                                 n_vocab, trial, prm.temperature, gamma, with_q, static_cast<long long>(oa.n_accepted),
                                 static_cast<long long>(oa.token), isa.c_str(), static_cast<long long>(ob.n_accepted),
                                 static_cast<long long>(ob.token)));
                }
            }
        }
    }
    g_tally.end();
}

// --- chi-square -------------------------------------------------------------------

// Upper regularised incomplete gamma Q(a, x) (series / continued fraction).
double gamma_q(double a, double x) {
    if (x <= 0.0) return 1.0;
    const double lg = std::lgamma(a);
    if (x < a + 1.0) {
        double sum = 1.0 / a, term = sum;
        for (int n = 1; n < 10000; ++n) {
            term *= x / (a + n);
            sum += term;
            if (std::fabs(term) < std::fabs(sum) * 1e-16) break;
        }
        return 1.0 - sum * std::exp(-x + a * std::log(x) - lg);
    }
    double b = x + 1.0 - a, c = 1e300, d = 1.0 / b, h = d;
    for (int i = 1; i < 10000; ++i) {
        const double an = -i * (i - a);
        b += 2.0;
        d = an * d + b;
        if (std::fabs(d) < 1e-300) d = 1e-300;
        c = b + an / c;
        if (std::fabs(c) < 1e-300) c = 1e-300;
        d = 1.0 / d;
        const double del = d * c;
        h *= del;
        if (std::fabs(del - 1.0) < 1e-16) break;
    }
    return std::exp(-x + a * std::log(x) - lg) * h;
}

// Pearson chi-square p-value of counts against probabilities (bins expecting
// fewer than 5 pooled, as tests/stats_helpers.py does); also fails when an
// outcome of probability 0 was seen.
bool chi_square(const std::vector<int64_t>& counts, const std::vector<double>& probs, const std::string& what) {
    double total_p = 0.0;
    int64_t n = 0, impossible = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
        n += counts[i];
        if (probs[i] > 0.0) {
            total_p += probs[i];
        } else {
            impossible += counts[i];
        }
    }
    std::vector<std::pair<double, double>> bins;  // (observed, expected)
    double pool_o = 0.0, pool_e = 0.0;
    for (size_t i = 0; i < counts.size(); ++i) {
        if (!(probs[i] > 0.0)) continue;
        const double e = static_cast<double>(n) * probs[i] / total_p;
        if (e >= 5.0) {
            bins.emplace_back(static_cast<double>(counts[i]), e);
        } else {
            pool_o += static_cast<double>(counts[i]);
            pool_e += e;
        }
    }
    if (pool_e > 0.0) {
        if (pool_e >= 5.0 || bins.empty()) {
            bins.emplace_back(pool_o, pool_e);
        } else {
            auto smallest = std::min_element(bins.begin(), bins.end(),
                                             [](const auto& a, const auto& b) { return a.second < b.second; });
            smallest->first += pool_o;
            smallest->second += pool_e;
        }
    }
    double stat = 0.0;
    for (const auto& b : bins) stat += (b.first - b.second) * (b.first - b.second) / b.second;
    const size_t dof = bins.size() > 1 ? bins.size() - 1 : 0;
    const double pvalue = dof > 0 ? gamma_q(0.5 * static_cast<double>(dof), 0.5 * stat) : 1.0;
    std::printf("    %-52s n=%-7lld chi2=%9.1f dof=%4zu p=%.3g\n", what.c_str(), static_cast<long long>(n), stat, dof,
                pvalue);
    check(impossible == 0, what + format(": %lld draws of probability-0 tokens", static_cast<long long>(impossible)));
    return check(pvalue >= 1e-7, what + format(": chi-square p = %.3g < 1e-7", pvalue));
}

// The distribution of a row after temperature and top-p (ties by ascending
// id), in float64 and without the kernels.
std::vector<double> reference_distribution(const std::vector<float>& x, double temperature, double top_p) {
    double mx = -HUGE_VAL;
    for (float v : x) mx = std::max(mx, static_cast<double>(v));
    std::vector<double> e(x.size());
    double total = 0.0;
    for (size_t i = 0; i < x.size(); ++i) total += (e[i] = std::exp((x[i] - mx) / temperature));
    if (top_p < 1.0) {
        std::vector<size_t> order(x.size());
        for (size_t i = 0; i < x.size(); ++i) order[i] = i;
        std::sort(order.begin(), order.end(),
                  [&](size_t a, size_t b) { return e[a] > e[b] || (e[a] == e[b] && a < b); });
        double cum = 0.0;
        size_t j = 0;
        while (j < order.size() && cum < top_p * total) cum += e[order[j++]];
        for (; j < order.size(); ++j) e[order[j]] = 0.0;
        total = cum;
    }
    for (double& v : e) v /= total;
    return e;
}

void check_residual_sampler(const std::string& isa, int64_t draws) {
    g_tally.begin(isa + ": chi-square of verify and its residual");
    specdec::set_isa(isa, nullptr);
    Gen g(3);
    struct Case {
        size_t v;
        specdec::DistParams prm;
    };
    // Full-row supports (no top-k / top-p, or a top-p support larger than an
    // eighth of the row) take the vectorised residual and block-sum path.
    const Case cases[] = {{256, {1.0, 0, 1.0, 0.0}}, {1024, {1.0, 0, 0.95, 0.0}}, {64, {0.8, 0, 1.0, 0.0}}};
    for (const Case& cs : cases) {
        const size_t v = cs.v;
        std::vector<float> target(2 * v), draft(v);
        for (size_t i = 0; i < v; ++i) {
            target[i] = static_cast<float>(g.normal() * 1.2);
            target[v + i] = static_cast<float>(g.normal() * 1.2);
            draft[i] = target[i] + static_cast<float>(g.normal() * 0.8);
        }
        const std::vector<float> row0(target.begin(), target.begin() + v);
        const DistRun pd = run_distribution(isa, row0, cs.prm);
        check(pd.res.support == nullptr, format("V=%zu: the target row should take the full-row path", v));
        check(!top_p_ambiguous(row0, cs.prm), format("V=%zu: the top-p cut is ambiguous, pick another row", v));
        // q is an input of verify: the scalar table's draft distribution.
        const DistRun qd = run_distribution("scalar", draft, cs.prm);
        specdec::set_isa(isa, nullptr);
        // What the emitted tokens must follow, in float64 without the
        // kernels: p, and the residual max(0, p - q) for the rejections.
        const std::vector<double> p = reference_distribution(row0, cs.prm.temperature, cs.prm.top_p);
        std::vector<double> r(v);
        double alpha = 0.0;
        for (size_t i = 0; i < v; ++i) {
            r[i] = std::max(0.0, p[i] - static_cast<double>(qd.out[i]));
            alpha += std::min(p[i], static_cast<double>(qd.out[i]));
        }
        std::vector<double> qcum(v);
        double c = 0.0;
        for (size_t i = 0; i < v; ++i) qcum[i] = (c += qd.out[i]);
        std::vector<int64_t> emitted(v, 0), rejected(v, 0);
        int64_t accepted = 0;
        specdec::Rng rng(777 + v, 1);
        specdec::VerifyOutcome out;
        for (int64_t t = 0; t < draws; ++t) {
            const double u = g.uniform() * c;
            int64_t x = static_cast<int64_t>(std::upper_bound(qcum.begin(), qcum.end(), u) - qcum.begin());
            if (x >= static_cast<int64_t>(v)) x = static_cast<int64_t>(v) - 1;
            while (!(qd.out[static_cast<size_t>(x)] > 0.0f)) --x;
            specdec::verify_step(target.data(), 2, v, &x, qd.out.data(), cs.prm, rng, &out);
            if (out.n_accepted == 1) {
                ++accepted;
                ++emitted[static_cast<size_t>(x)];
            } else {
                ++emitted[static_cast<size_t>(out.token)];
                ++rejected[static_cast<size_t>(out.token)];
            }
        }
        const std::string label = format("V=%zu T=%g top_p=%g", v, cs.prm.temperature, cs.prm.top_p);
        chi_square(emitted, p, "emitted ~ p, " + label);
        chi_square(rejected, r, "on rejection ~ max(0, p - q), " + label);
        const double mean = alpha * static_cast<double>(draws);
        const double sd = std::sqrt(static_cast<double>(draws) * alpha * (1.0 - alpha));
        const double z = (static_cast<double>(accepted) - mean) / sd;
        std::printf("    %-52s %lld/%lld accepted, alpha %.5f, z=%.2f\n", ("acceptance, " + label).c_str(),
                    static_cast<long long>(accepted), static_cast<long long>(draws), alpha, z);
        check(alpha > 0.0 && alpha < 1.0 && std::fabs(z) < 5.33,
              label + format(": acceptance z = %.2f (two-sided p < 1e-7), alpha %.6f", z, alpha));
    }
    g_tally.end();
}

// --- timing (a sanity line only) ----------------------------------------------------

volatile double g_sink = 0.0;

void print_timings(const std::vector<std::string>& isas) {
    Gen g(4);
    const std::vector<float> x = make_logits(g, 152064, false);
    std::vector<float> out(x.size());
    std::string line;
    for (const std::string& name : isas) {
        specdec::set_isa(name, nullptr);
        const KernelTable& K = specdec::kernels();
        const auto t0 = std::chrono::steady_clock::now();
        for (int rep = 0; rep < 10; ++rep) {
            int64_t bad;
            const float mx = K.max_checked(x.data(), x.size(), &bad);
            g_sink += K.exp_shift(x.data(), x.size(), mx, 1.0f, out.data());
        }
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 10;
        line += format("%s %.2f ms  ", name.c_str(), ms);
    }
    std::printf(
        "timing, max_checked + exp_shift at V=152064 (sanity only; under an emulator this is no speed "
        "measurement): %s\n",
        line.c_str());
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::string> required;
    int64_t draws = 40000;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--require" && i + 1 < argc) {
            required.emplace_back(argv[++i]);
        } else if (arg == "--draws" && i + 1 < argc) {
            draws = std::atoll(argv[++i]);
        } else {
            std::fprintf(stderr, "usage: %s [--require ISA]... [--draws N]\n", argv[0]);
            return 2;
        }
    }
#if defined(__aarch64__)
    const char* arch = "aarch64";
#elif defined(__x86_64__)
    const char* arch = "x86-64";
#else
    const char* arch = "other";
#endif
    const std::vector<std::string> isas = specdec::supported_isas();
    std::string listed;
    for (const std::string& name : isas) listed += (listed.empty() ? "" : ", ") + name;
    std::printf("kernel_tables (%s): supported instruction sets: %s\n", arch, listed.c_str());
    for (const std::string& name : required) {
        g_tally.begin("required instruction set " + name);
        check(std::find(isas.begin(), isas.end(), name) != isas.end(), name + " is not supported by this build/CPU");
        g_tally.end();
    }
    check_dispatch(isas);
    const KernelTable& scalar = *specdec::kernel_table_scalar();
    for (const std::string& name : isas) {
        if (name == "scalar") continue;
        specdec::set_isa(name, nullptr);
        const KernelTable& table = specdec::kernels();
        check_primitives(scalar, table);
        check_pipeline(name);
        check_residual_sampler(name, draws);
    }
    if (isas.size() == 1) std::printf("no vectorised table here: nothing to compare with the scalar one\n");
    print_timings(isas);
    std::printf("kernel_tables: %zu passed, %zu failed\n", g_tally.passed, g_tally.failed);
    return g_tally.failed == 0 ? 0 : 1;
}
