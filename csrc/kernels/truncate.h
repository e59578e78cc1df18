// The sampling distribution of a logits row:
// temperature -> top-k -> top-p -> min-p -> normalise.
//
// Tokens are ordered by descending probability, ties by ascending id, so every
// truncation keeps a prefix of that order and the final support is the
// shortest of the three prefixes. No full sort of the vocabulary is done: the
// thresholds are found by a radix select over the float bit patterns of a
// pruned candidate list.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace specdec {

struct DistParams {
    double temperature = 1.0;  // >= 0; 0 means greedy
    int64_t top_k = 0;         // >= 0; 0 (or >= V) means off
    double top_p = 1.0;        // (0, 1]; 1 means off
    double min_p = 0.0;        // [0, 1); 0 means off

    bool greedy() const { return temperature == 0.0 || top_k == 1; }
};

// Empty when the parameters are usable, else a message naming the bad one.
std::string validate_params(const DistParams& params);

// Per-thread scratch memory, grown on demand and reused across calls.
struct Workspace {
    std::vector<float> p;          // a distribution row
    std::vector<float> r;          // a residual row
    std::vector<float> adj;        // an adjusted logits row (kernels/adjust.h)
    std::vector<float> vals;       // compact values
    std::vector<uint32_t> cand;    // candidate token ids
    std::vector<uint32_t> tmp;     // radix-select scratch
    std::vector<double> blocks;    // block sums for sampling
    uint32_t hist_count[4][1024];  // radix-select histograms (4 interleaved)
    double hist_mass[4][1024];

    void reserve(size_t n_vocab);
};

Workspace& thread_workspace();

struct DistResult {
    // >= 0: the row is one-hot at this token (greedy).
    int64_t one_hot = -1;
    // When non-null: the support (ids ascending, all with positive mass);
    // points into the workspace and stays valid until its next use.
    const uint32_t* support = nullptr;
    size_t support_size = 0;
};

// Writes the final distribution of x[0..n) (n >= 1) to out[0..n) (zeros off
// the support, sum 1; out may alias x). Throws InvalidLogits for bad rows,
// naming `what` and `row`.
DistResult compute_distribution(const float* x, size_t n, const DistParams& params, float* out, Workspace& ws,
                                const char* what, int64_t row);

// Given candidates cand[0..m) (distinct ids with e[id] > 0), reorders them so
// that cand[0..L) is the shortest prefix, in the order (e desc, id asc), that
// holds at least `count_target` ids or at least `mass_target` summed mass;
// returns L (m when neither target is reached).
size_t select_prefix(const float* e, uint32_t* cand, size_t m, size_t count_target, double mass_target, Workspace& ws);

}  // namespace specdec
