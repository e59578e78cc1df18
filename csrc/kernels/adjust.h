// Changes to a logits row made before the sampling chain: a token mask
// (structured output: a grammar's allowed set) and sparse per-token changes
// (repetition, frequency and presence penalties, logit biases).  The same
// changes must apply to the target's and the draft's rows of a position for
// the verification to stay exact (docs/math.md §11).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace specdec {

struct RowAdjust {
    // ceil(n / 32) words; token t is allowed iff bit (t % 32) of word t / 32
    // is set.  nullptr: every token is allowed.
    const uint32_t* mask = nullptr;
    // n_ids token ids, each in [0, n); the logit x of ids[j] becomes
    // (x > 0 ? x * scale_pos[j] : x * scale_neg[j]) + add[j].  An id the
    // mask excludes stays excluded.
    const int32_t* ids = nullptr;
    const float* scale_pos = nullptr;
    const float* scale_neg = nullptr;
    const float* add = nullptr;
    size_t n_ids = 0;

    bool none() const { return mask == nullptr && n_ids == 0; }
};

// Writes x[0..n) with `adj` applied to out[0..n) (out must not alias x):
// tokens outside the mask become -inf, listed ids change as described.
// Throws InvalidLogits (NaN or +inf anywhere in x, naming `what` and `row`,
// row < 0 for a single row), std::invalid_argument (an id outside [0, n)).
void adjust_row(const float* x, size_t n, const RowAdjust& adj, float* out, const char* what, int64_t row);

// The row to sample from: x itself when `adj` changes nothing, else x
// adjusted into `scratch` (grown to n) by adjust_row.
const float* adjusted_row(const float* x, size_t n, const RowAdjust* adj, std::vector<float>& scratch, const char* what,
                          int64_t row);

}  // namespace specdec
