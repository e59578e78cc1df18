#include "kernels/truncate.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/dispatch.h"
#include "kernels/softmax.h"

namespace specdec {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr float kTiny = std::numeric_limits<float>::denorm_min();
// Supports up to this size are also returned as a sorted id list.
constexpr size_t kSortedSupportMax = 4096;
// Ranges this small are finished by a comparison sort.
constexpr size_t kSmallRange = 48;

inline uint32_t float_bits(float v) {
    uint32_t u;
    std::memcpy(&u, &v, sizeof u);
    return u;
}

// The smallest float that is >= v (v in [0, 1)).
float float_at_least(double v) {
    float f = static_cast<float>(v);
    if (static_cast<double>(f) < v) f = std::nextafter(f, 2.0f);
    return f;
}

struct Before {
    const float* e;
    bool operator()(uint32_t a, uint32_t b) const { return e[a] > e[b] || (e[a] == e[b] && a < b); }
};

// Keeps the candidates with e >= threshold (order not preserved); returns the count.
size_t filter_at_least(const float* e, uint32_t* cand, size_t m, float threshold) {
    size_t kept = 0;
    for (size_t j = 0; j < m; ++j) {
        if (e[cand[j]] >= threshold) cand[kept++] = cand[j];
    }
    return kept;
}

// A value that likely has between k and a few hundred values of e at or
// above it, read off every kSampleStride-th entry; 0 when sampling does not
// pay (short rows, or a k that is a large share of the row).
constexpr size_t kSampleStride = 64;
float sampled_threshold(const float* e, size_t n, size_t k, float* scratch) {
    const size_t ns = n / kSampleStride;
    if (ns < 256 || k * 16 > ns) return 0.0f;
    for (size_t j = 0; j < ns; ++j) scratch[j] = e[j * kSampleStride];
    const size_t rank = std::min(ns - 1, 4 * k * ns / n + 4);
    std::nth_element(scratch, scratch + rank, scratch + ns, [](float a, float b) { return a > b; });
    return scratch[rank];
}

}  // namespace

std::string validate_params(const DistParams& p) {
    if (!(p.temperature >= 0.0) || !std::isfinite(p.temperature)) {
        return "temperature must be a finite number >= 0 (0 means greedy), got " + std::to_string(p.temperature);
    }
    if (p.top_k < 0) return "top_k must be >= 0 (0 means off), got " + std::to_string(p.top_k);
    if (!(p.top_p > 0.0 && p.top_p <= 1.0)) {
        return "top_p must be in (0, 1] (1 means off), got " + std::to_string(p.top_p);
    }
    if (!(p.min_p >= 0.0 && p.min_p < 1.0)) {
        return "min_p must be in [0, 1) (0 means off), got " + std::to_string(p.min_p);
    }
    return std::string();
}

void Workspace::reserve(size_t n) {
    if (p.size() < n) p.resize(n);
    if (r.size() < n) r.resize(n);
    if (vals.size() < n) vals.resize(n);
    if (cand.size() < n + kCompressSlack) cand.resize(n + kCompressSlack);
    if (tmp.size() < n) tmp.resize(n);
    const size_t nb = n / 64 + 2;
    if (blocks.size() < nb) blocks.resize(nb);
}

Workspace& thread_workspace() {
    thread_local Workspace ws;
    return ws;
}

size_t select_prefix(const float* e, uint32_t* cand, size_t m, size_t count_target, double mass_target, Workspace& ws) {
    if (m == 0) return 0;
    if (count_target >= m && !(mass_target < kInf)) return m;
    const Before before{e};

    // Radix select on the bit patterns (non-negative floats order like their
    // bits): 10 bits per level. cand[0..lo) is decided "in", cand[lo..hi) is
    // the undecided bucket, everything after hi is "out".
    size_t lo = 0;
    size_t hi = m;
    size_t cum_count = 0;
    double cum_mass = 0.0;
    static const int kShift[3] = {20, 10, 0};
    int levels = 0;
    for (; levels < 3 && hi - lo > kSmallRange; ++levels) {
        const int shift = kShift[levels];
        // Ties put everything in one bucket; notice that without building a
        // histogram (whose same-bucket updates form a slow dependency chain).
        uint32_t lo_bits = 0xFFFFFFFFu, hi_bits = 0;
        for (size_t j = lo; j < hi; ++j) {
            const uint32_t u = float_bits(e[cand[j]]);
            lo_bits = u < lo_bits ? u : lo_bits;
            hi_bits = u > hi_bits ? u : hi_bits;
        }
        if (((lo_bits ^ hi_bits) >> shift) == 0) continue;
        uint32_t* count = ws.hist_count[0];
        double* mass = ws.hist_mass[0];
        const size_t ways = hi - lo >= 4096 ? 4 : 1;
        std::memset(ws.hist_count, 0, ways * sizeof ws.hist_count[0]);
        std::memset(ws.hist_mass, 0, ways * sizeof ws.hist_mass[0]);
        size_t j = lo;
        if (ways == 4) {
            // Four interleaved histograms: repeated keys do not serialise on
            // one memory slot.
            for (; j + 4 <= hi; j += 4) {
                for (size_t w = 0; w < 4; ++w) {
                    const float v = e[cand[j + w]];
                    const uint32_t key = (float_bits(v) >> shift) & 1023u;
                    ++ws.hist_count[w][key];
                    ws.hist_mass[w][key] += v;
                }
            }
        }
        for (; j < hi; ++j) {
            const float v = e[cand[j]];
            const uint32_t key = (float_bits(v) >> shift) & 1023u;
            ++count[key];
            mass[key] += v;
        }
        if (ways == 4) {
            for (size_t b = 0; b < 1024; ++b) {
                count[b] += ws.hist_count[1][b] + ws.hist_count[2][b] + ws.hist_count[3][b];
                mass[b] += (ws.hist_mass[1][b] + ws.hist_mass[2][b]) + ws.hist_mass[3][b];
            }
        }
        int crossing = -1;
        for (int b = 1023; b >= 0; --b) {
            if (count[b] == 0) continue;
            if (cum_count + count[b] >= count_target || cum_mass + mass[b] >= mass_target) {
                crossing = b;
                break;
            }
            cum_count += count[b];
            cum_mass += mass[b];
        }
        if (crossing < 0) return hi;               // rounding: the whole range is needed
        if (count[crossing] == hi - lo) continue;  // one bucket holds everything
        // Stable, branch-free split: ids above the crossing bucket stay in
        // place (writes never overtake reads), its own ids go through tmp.
        const uint32_t cb = static_cast<uint32_t>(crossing);
        uint32_t* tmp = ws.tmp.data();
        size_t n_above = 0, n_cross = 0;
        for (size_t i = lo; i < hi; ++i) {
            const uint32_t id = cand[i];
            const uint32_t key = (float_bits(e[id]) >> shift) & 1023u;
            cand[lo + n_above] = id;
            n_above += (cb - key) >> 31;  // key > cb (both < 1024)
            tmp[n_cross] = id;
            n_cross += ((key ^ cb) - 1u) >> 31;  // key == cb
        }
        std::memcpy(cand + lo + n_above, tmp, n_cross * sizeof(uint32_t));
        lo += n_above;
        hi = lo + n_cross;
    }

    if (levels == 3) {
        // All 31 value bits were used: the range holds one value, ordered by
        // id alone. Count how many of it are needed, take the lowest ids.
        const double v = e[cand[lo]];
        size_t need = 0;
        while (lo + need < hi) {
            ++need;
            ++cum_count;
            cum_mass += v;
            if (cum_count >= count_target || cum_mass >= mass_target) break;
        }
        if (lo + need < hi && !std::is_sorted(cand + lo, cand + hi)) {
            std::nth_element(cand + lo, cand + lo + (need - 1), cand + hi);
        }
        return lo + need;
    }

    // A small range (or a count target): finish with comparisons.
    if (!(mass_target < kInf)) {
        const size_t need = count_target - cum_count;  // 1 <= need <= hi - lo
        std::nth_element(cand + lo, cand + lo + (need - 1), cand + hi, before);
        return lo + need;
    }
    std::sort(cand + lo, cand + hi, before);
    for (size_t j = lo; j < hi; ++j) {
        cum_count += 1;
        cum_mass += e[cand[j]];
        if (cum_count >= count_target || cum_mass >= mass_target) return j + 1;
    }
    return hi;
}

DistResult compute_distribution(const float* x, size_t n, const DistParams& prm, float* out, Workspace& ws,
                                const char* what, int64_t row) {
    const KernelTable& K = kernels();
    const float max = checked_row_max(x, n, what, row);
    DistResult res;
    if (prm.greedy()) {
        const int64_t a = argmax_of(x, n, max);
        std::memset(out, 0, n * sizeof(float));
        out[a] = 1.0f;
        res.one_hot = a;
        return res;
    }

    // e[i] = exp((x[i] - max) / T): the largest is exactly 1.
    const double total = tempered_exp(x, n, max, prm.temperature, out);
    const float* e = out;
    const bool k_on = prm.top_k > 0 && static_cast<uint64_t>(prm.top_k) < n;
    const bool p_on = prm.top_p < 1.0;
    const bool m_on = prm.min_p > 0.0;
    // min-p: p >= min_p * max p  <=>  e >= min_p (the max has e = 1).
    const float min_e = m_on ? float_at_least(prm.min_p) : 0.0f;

    if (!k_on && !p_on) {
        const double z = m_on ? K.keep_above(out, n, min_e, false) : total;
        K.scale(out, n, static_cast<float>(1.0 / z));
        return res;
    }

    ws.reserve(n);
    uint32_t* cand = ws.cand.data();
    size_t m = 0;
    double mass = total;  // mass of the distribution top-p is measured against
    if (k_on) {
        const size_t k = static_cast<size_t>(prm.top_k);
        // Any threshold that keeps >= k tokens keeps all of the top k.  Real
        // rows have a few large values over a long tail whose depth varies
        // row to row, so guess one from a strided sample first (expected
        // ~4k + 5·stride candidates), then fall back to a fixed ladder.
        m = 0;
        const float guess = sampled_threshold(e, n, k, ws.vals.data());
        if (guess > 0.0f) m = K.compress_ge(e, n, guess, cand);
        static const float kLadder[] = {0x1p-7f, 0x1p-20f, 0x1p-60f, kTiny};
        for (size_t i = 0; m < k && i < sizeof kLadder / sizeof kLadder[0]; ++i) {
            if (kLadder[i] < guess || guess == 0.0f) m = K.compress_ge(e, n, kLadder[i], cand);
        }
        if (m > k) m = select_prefix(e, cand, m, k, kInf, ws);
        mass = 0.0;
        for (size_t j = 0; j < m; ++j) mass += e[cand[j]];
    }
    if (p_on) {
        // If the sorted kept values are v_1 >= ... >= v_N with mass M and the
        // prefix first reaches top_p * M at v_c, the tail from c on holds more
        // than (1 - top_p) * M in at most N values each <= v_c, so
        // v_c > (1 - top_p) * M / N: smaller values can never be needed.
        const double pool = static_cast<double>(k_on ? m : n);
        float threshold = static_cast<float>((1.0 - prm.top_p) * mass / pool * (1.0 - 1e-5));
        if (!(threshold >= kTiny)) threshold = kTiny;
        // Pruning by min-p as well is safe: the prefix walk either crosses
        // above min_e (unchanged) or min-p cuts below its end anyway.
        if (m_on && min_e > threshold) threshold = min_e;
        m = k_on ? filter_at_least(e, cand, m, threshold) : K.compress_ge(e, n, threshold, cand);
        m = select_prefix(e, cand, m, SIZE_MAX, prm.top_p * mass, ws);
    }
    if (m_on) m = filter_at_least(e, cand, m, min_e);

    // cand[0..m) is the support (m >= 1: the argmax always survives).
    float* vals = ws.vals.data();
    if (m <= n / 8) {
        if (m <= kSortedSupportMax) std::sort(cand, cand + m);
        double z = 0.0;
        for (size_t j = 0; j < m; ++j) {
            vals[j] = e[cand[j]];
            z += vals[j];
        }
        std::memset(out, 0, n * sizeof(float));
        for (size_t j = 0; j < m; ++j) out[cand[j]] = static_cast<float>(static_cast<double>(vals[j]) / z);
        if (m <= kSortedSupportMax) {
            res.support = cand;
            res.support_size = m;
        }
        return res;
    }
    // Large support: it is {i : (e_i, i) at or before (v, id)} for its last
    // element (v, id) in the order, so zero the rest in two vector passes.
    float v = e[cand[0]];
    uint32_t last = cand[0];
    for (size_t j = 1; j < m; ++j) {
        const float w = e[cand[j]];
        if (w < v || (w == v && cand[j] > last)) {
            v = w;
            last = cand[j];
        }
    }
    const size_t split = static_cast<size_t>(last) + 1;
    double z = K.keep_above(out, split, v, false);
    z += K.keep_above(out + split, n - split, v, true);
    K.scale(out, n, static_cast<float>(1.0 / z));
    return res;
}

}  // namespace specdec
