#include "kernels/sample.h"

#include "kernels/dispatch.h"

namespace specdec {

namespace {

constexpr size_t kBlock = 256;

int64_t last_positive(const float* w, size_t n) {
    for (size_t i = n; i > 0; --i) {
        if (w[i - 1] > 0.0f) return static_cast<int64_t>(i - 1);
    }
    return -1;
}

}  // namespace

int64_t sample_weights(const float* w, size_t n, double u, Workspace& ws) {
    const size_t n_blocks = (n + kBlock - 1) / kBlock;
    if (ws.blocks.size() < n_blocks + 1) ws.blocks.resize(n_blocks + 1);
    double* sums = ws.blocks.data();
    const double total = kernels().block_sums(w, n, kBlock, sums);
    if (!(total > 0.0)) return -1;
    const double target = u * total;
    double cum = 0.0;
    for (size_t b = 0; b < n_blocks; ++b) {
        if (!(cum + sums[b] > target)) {
            cum += sums[b];
            continue;
        }
        // The crossing block: walk it exactly. If rounding of the block sum
        // overshot, carry on from the next block with the exact running sum.
        const size_t end = (b + 1) * kBlock < n ? (b + 1) * kBlock : n;
        for (size_t i = b * kBlock; i < end; ++i) {
            if (w[i] > 0.0f) {
                cum += w[i];
                if (cum > target) return static_cast<int64_t>(i);
            }
        }
    }
    return last_positive(w, n);
}

int64_t sample_compact(const float* vals, const uint32_t* ids, size_t m, double u) {
    double total = 0.0;
    for (size_t j = 0; j < m; ++j) {
        if (vals[j] > 0.0f) total += vals[j];
    }
    if (!(total > 0.0)) return -1;
    const double target = u * total;
    double cum = 0.0;
    int64_t last = -1;
    for (size_t j = 0; j < m; ++j) {
        if (vals[j] > 0.0f) {
            cum += vals[j];
            last = ids[j];
            if (cum > target) return ids[j];
        }
    }
    return last;
}

int64_t sample_distribution(const float* row, size_t n, const DistResult& dist, Rng& rng, Workspace& ws) {
    const double u = rng.uniform();
    if (dist.one_hot >= 0) return dist.one_hot;
    if (dist.support != nullptr) {
        // compute_distribution sized the workspace for the whole row.
        float* vals = ws.vals.data();
        for (size_t j = 0; j < dist.support_size; ++j) vals[j] = row[dist.support[j]];
        return sample_compact(vals, dist.support, dist.support_size, u);
    }
    return sample_weights(row, n, u, ws);
}

}  // namespace specdec
