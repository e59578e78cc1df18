// Log-probabilities of emitted tokens, as an API reports them (OpenAI's
// `logprobs` and `top_logprobs`).  They are read off rows the verify pass
// already holds: no extra model pass.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/truncate.h"

namespace specdec {

// For one row x[0..n) (n >= 1) and an emitted `token` in [0, n):
//  - `probabilities` false: x is a logits row, reported as the model's own
//    distribution, log softmax(x) at temperature 1 with nothing cut;
//  - `probabilities` true: x is a distribution (e.g. compute_distribution's
//    output), reported as log x (−inf where x is 0).
// Writes log p(token) to *token_logprob and the `top_n` most likely ids
// (by probability, descending; ties to the lower id) with their
// log-probabilities to top_ids[0..top_n) and top_logprobs[0..top_n);
// top_n <= n.  Throws InvalidLogits (naming `what` and `row`, row < 0 for a
// single row) for a logits row with NaN, +inf or nothing finite.
void row_logprobs(const float* x, size_t n, bool probabilities, int64_t token, size_t top_n, float* token_logprob,
                  int32_t* top_ids, float* top_logprobs, Workspace& ws, const char* what, int64_t row);

}  // namespace specdec
