// Inverse-CDF sampling from non-negative weights with one uniform draw.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/truncate.h"
#include "rng.h"

namespace specdec {

// First index i (ascending) whose running sum of w exceeds u * sum(w), found
// through block sums. Never an index with zero weight; -1 when no weight is
// positive. u in [0, 1).
int64_t sample_weights(const float* w, size_t n, double u, Workspace& ws);

// The same over a compact list: returns ids[j] for the first j whose running
// sum of vals exceeds u * sum(vals); -1 when no value is positive.
int64_t sample_compact(const float* vals, const uint32_t* ids, size_t m, double u);

// Draws one token from a row produced by compute_distribution (one uniform).
int64_t sample_distribution(const float* row, size_t n, const DistResult& dist, Rng& rng, Workspace& ws);

}  // namespace specdec
