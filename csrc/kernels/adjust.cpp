#include "kernels/adjust.h"

#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/softmax.h"

namespace specdec {

void adjust_row(const float* x, size_t n, const RowAdjust& adj, float* out, const char* what, int64_t row) {
    // The raw row is validated as an unadjusted one would be: a NaN the mask
    // hides is still a broken model, not a token to skip.
    (void)checked_row_max(x, n, what, row);
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    if (adj.mask == nullptr) {
        std::memcpy(out, x, n * sizeof(float));
    } else {
        const size_t full = n / 32;
        for (size_t w = 0; w < full; ++w) {
            const uint32_t bits = adj.mask[w];
            const float* src = x + 32 * w;
            float* dst = out + 32 * w;
            if (bits == 0xFFFFFFFFu) {
                std::memcpy(dst, src, 32 * sizeof(float));
            } else if (bits == 0) {
                for (int b = 0; b < 32; ++b) dst[b] = kNegInf;
            } else {
                for (int b = 0; b < 32; ++b) dst[b] = (bits >> b) & 1u ? src[b] : kNegInf;
            }
        }
        for (size_t t = 32 * full; t < n; ++t) out[t] = (adj.mask[t / 32] >> (t % 32)) & 1u ? x[t] : kNegInf;
    }
    for (size_t j = 0; j < adj.n_ids; ++j) {
        const int32_t id = adj.ids[j];
        if (id < 0 || static_cast<size_t>(id) >= n) {
            throw std::invalid_argument("adjusted token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                        std::to_string(n) + ")");
        }
        float& v = out[id];
        if (v == kNegInf) continue;  // masked out (or already impossible): stays so
        v = (v > 0.0f ? v * adj.scale_pos[j] : v * adj.scale_neg[j]) + adj.add[j];
    }
}

const float* adjusted_row(const float* x, size_t n, const RowAdjust* adj, std::vector<float>& scratch, const char* what,
                          int64_t row) {
    if (adj == nullptr || adj->none()) return x;
    if (scratch.size() < n) scratch.resize(n);
    adjust_row(x, n, *adj, scratch.data(), what, row);
    return scratch.data();
}

}  // namespace specdec
