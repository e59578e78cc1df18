#include "kernels/logprob.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/dispatch.h"
#include "kernels/softmax.h"

namespace specdec {

namespace {

// The ids of the `top_n` largest entries of x (descending, ties to the lower
// id).  Candidates come from a SIMD compress over a threshold that widens
// until it holds at least top_n entries: a few dozen to sort at a
// 152k vocabulary, not the whole row.
void top_entries(const float* x, size_t n, float max, size_t top_n, bool probabilities, Workspace& ws, int32_t* out) {
    if (top_n == 0) return;
    const KernelTable& k = kernels();
    if (ws.cand.size() < n + kCompressSlack) ws.cand.resize(n + kCompressSlack);
    uint32_t* cand = ws.cand.data();
    size_t m = 0;
    // Logits: within 8, 16, 32 nats of the max; probabilities: above a share of it.
    const float widths[] = {8.0f, 16.0f, 32.0f};
    for (float w : widths) {
        const float threshold = probabilities ? max * std::exp(-w) : max - w;
        m = k.compress_ge(x, n, threshold, cand);
        if (m >= top_n) break;
    }
    if (m < top_n) {  // the row is flat or cut: every id is a candidate
        for (size_t i = 0; i < n; ++i) cand[i] = static_cast<uint32_t>(i);
        m = n;
    }
    auto better = [x](uint32_t a, uint32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
    std::partial_sort(cand, cand + top_n, cand + m, better);
    for (size_t i = 0; i < top_n; ++i) out[i] = static_cast<int32_t>(cand[i]);
}

}  // namespace

void row_logprobs(const float* x, size_t n, bool probabilities, int64_t token, size_t top_n, float* token_logprob,
                  int32_t* top_ids, float* top_logprobs, Workspace& ws, const char* what, int64_t row) {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    if (probabilities) {
        float max = 0.0f;
        for (size_t i = 0; i < n; ++i) max = std::max(max, x[i]);
        auto lp = [](float v) { return v > 0.0f ? std::log(v) : kNegInf; };
        *token_logprob = lp(x[token]);
        top_entries(x, n, max, top_n, true, ws, top_ids);
        for (size_t i = 0; i < top_n; ++i) top_logprobs[i] = lp(x[top_ids[i]]);
        return;
    }
    const float max = checked_row_max(x, n, what, row);
    if (ws.p.size() < n) ws.p.resize(n);
    // log Z = max + log Σ exp(x − max), the sum in double.
    const double log_z = static_cast<double>(max) + std::log(kernels().exp_shift(x, n, max, 1.0f, ws.p.data()));
    auto lp = [log_z](float v) { return v == kNegInf ? kNegInf : static_cast<float>(static_cast<double>(v) - log_z); };
    *token_logprob = lp(x[token]);
    top_entries(x, n, max, top_n, false, ws, top_ids);
    for (size_t i = 0; i < top_n; ++i) top_logprobs[i] = lp(x[top_ids[i]]);
}

}  // namespace specdec
