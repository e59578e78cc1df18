// Exact speculative verification of one step of gamma draft tokens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/adjust.h"
#include "kernels/truncate.h"
#include "rng.h"

namespace specdec {

struct VerifyOutcome {
    int64_t n_accepted = 0;
    int64_t token = -1;
    std::vector<double> alphas;  // sum(min(p, q)) of each verified row
};

// logits: k = gamma + 1 rows of n_vocab floats (row gamma gives the bonus).
// tokens: gamma draft ids. draft_probs: gamma rows of n_vocab floats (the q
// each token was drawn from), or nullptr for a deterministic drafter
// (q = one-hot at the token).
//
// Row i < gamma: p = distribution(row i); draw u; accept iff u * q(x) < p(x);
// on rejection return a sample from max(0, p - q) (from p when that is
// numerically empty). All accepted: sample the bonus from row gamma.
// adjust: k row changes (row i's before its distribution: the mask and
// penalties of the prefix that row i continues), or nullptr.
// Throws std::invalid_argument (bad draft token / q(x) = 0, before any draw)
// or InvalidLogits.
void verify_step(const float* logits, size_t k, size_t n_vocab, const int64_t* tokens, const float* draft_probs,
                 const DistParams& params, Rng& rng, VerifyOutcome* out, const RowAdjust* adjust = nullptr);

// sum(min(p, q)) over n entries.
double acceptance_rate(const float* p, const float* q, size_t n);

}  // namespace specdec
