#include "kernels/verify.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/dispatch.h"
#include "kernels/sample.h"
#include "kernels/softmax.h"

namespace specdec {

namespace {

// A residual with less mass than this is rounding noise of p - q: sample
// from p instead (the rejection it stands for has probability below it).
constexpr double kEmptyResidual = 1e-9;

std::string format_float(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return buf;
}

void validate_drafts(const int64_t* tokens, size_t gamma, size_t n_vocab, const float* q) {
    for (size_t i = 0; i < gamma; ++i) {
        const int64_t x = tokens[i];
        if (x < 0 || static_cast<uint64_t>(x) >= n_vocab) {
            throw std::invalid_argument("draft_tokens[" + std::to_string(i) + "] = " + std::to_string(x) +
                                        " is outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
        }
        if (q != nullptr) {
            const float qx = q[i * n_vocab + static_cast<size_t>(x)];
            if (!(qx > 0.0f) || !std::isfinite(qx)) {
                throw std::invalid_argument("draft_probs[" + std::to_string(i) + ", " + std::to_string(x) +
                                            "] = " + format_float(qx) +
                                            ": a draft token must have positive finite probability under the q "
                                            "it was drawn from");
            }
        }
    }
}

// Sample from max(0, p - q) (q = one-hot at x when q_row is null); from p
// when that residual is numerically empty.
int64_t sample_residual(const float* p, const float* q_row, int64_t x, size_t n, const DistResult& dist, double u,
                        Workspace& ws) {
    if (dist.one_hot >= 0) return dist.one_hot;  // the residual of a point mass is that point or empty
    if (dist.support != nullptr) {
        const uint32_t* ids = dist.support;
        const size_t m = dist.support_size;
        float* vals = ws.vals.data();
        double mass = 0.0;
        for (size_t j = 0; j < m; ++j) {
            const uint32_t id = ids[j];
            float r;
            if (q_row != nullptr) {
                r = p[id] - q_row[id];
                if (!(r > 0.0f)) r = 0.0f;
            } else {
                r = static_cast<int64_t>(id) == x ? 0.0f : p[id];
            }
            vals[j] = r;
            mass += r;
        }
        if (mass <= kEmptyResidual) {
            for (size_t j = 0; j < m; ++j) vals[j] = p[ids[j]];
        }
        return sample_compact(vals, ids, m, u);
    }
    float* r = ws.r.data();
    double mass;
    if (q_row != nullptr) {
        mass = kernels().residual(p, q_row, n, r);
    } else {
        std::memcpy(r, p, n * sizeof(float));
        r[x] = 0.0f;
        mass = 1.0 - static_cast<double>(p[x]);
    }
    if (mass <= kEmptyResidual) return sample_weights(p, n, u, ws);
    const int64_t t = sample_weights(r, n, u, ws);
    return t >= 0 ? t : sample_weights(p, n, u, ws);
}

}  // namespace

double acceptance_rate(const float* p, const float* q, size_t n) { return kernels().sum_min(p, q, n); }

void verify_step(const float* logits, size_t k, size_t n_vocab, const int64_t* tokens, const float* draft_probs,
                 const DistParams& params, Rng& rng, VerifyOutcome* out, const RowAdjust* adjust) {
    const size_t gamma = k - 1;
    validate_drafts(tokens, gamma, n_vocab, draft_probs);
    out->alphas.clear();
    out->alphas.reserve(gamma);
    Workspace& ws = thread_workspace();
    ws.reserve(n_vocab);
    const bool greedy = params.greedy();

    for (size_t i = 0; i < gamma; ++i) {
        const float* row = adjusted_row(logits + i * n_vocab, n_vocab, adjust != nullptr ? adjust + i : nullptr, ws.adj,
                                        "target_logits", static_cast<int64_t>(i));
        const float* q_row = draft_probs != nullptr ? draft_probs + i * n_vocab : nullptr;
        const int64_t x = tokens[i];
        const double qx = q_row != nullptr ? static_cast<double>(q_row[x]) : 1.0;

        if (greedy) {
            // p is the point mass at the argmax a: p(x) = [x == a],
            // sum(min(p, q)) = min(1, q(a)), and any rejection emits a.
            const float max = checked_row_max(row, n_vocab, "target_logits", static_cast<int64_t>(i));
            const int64_t a = argmax_of(row, n_vocab, max);
            const double px = x == a ? 1.0 : 0.0;
            double alpha = px;
            if (q_row != nullptr) alpha = q_row[a] < 1.0f ? static_cast<double>(q_row[a]) : 1.0;
            out->alphas.push_back(alpha);
            const double u = rng.uniform();
            if (u * qx < px) continue;
            (void)rng.uniform();  // the residual draw
            out->n_accepted = static_cast<int64_t>(i);
            out->token = a;
            return;
        }

        float* p = ws.p.data();
        const DistResult dist =
            compute_distribution(row, n_vocab, params, p, ws, "target_logits", static_cast<int64_t>(i));
        const double px = static_cast<double>(p[x]);
        double alpha;
        if (q_row == nullptr) {
            alpha = px;
        } else if (dist.support != nullptr) {
            alpha = 0.0;
            for (size_t j = 0; j < dist.support_size; ++j) {
                const uint32_t id = dist.support[j];
                alpha += p[id] < q_row[id] ? p[id] : q_row[id];
            }
        } else {
            alpha = kernels().sum_min(p, q_row, n_vocab);
        }
        out->alphas.push_back(alpha);
        const double u = rng.uniform();
        if (u * qx < px) continue;
        const double u2 = rng.uniform();
        out->n_accepted = static_cast<int64_t>(i);
        out->token = sample_residual(p, q_row, x, n_vocab, dist, u2, ws);
        return;
    }

    // Every draft accepted: the bonus token from row gamma.
    const float* row = adjusted_row(logits + gamma * n_vocab, n_vocab, adjust != nullptr ? adjust + gamma : nullptr,
                                    ws.adj, "target_logits", static_cast<int64_t>(gamma));
    out->n_accepted = static_cast<int64_t>(gamma);
    if (greedy) {
        const float max = checked_row_max(row, n_vocab, "target_logits", static_cast<int64_t>(gamma));
        (void)rng.uniform();
        out->token = argmax_of(row, n_vocab, max);
        return;
    }
    float* p = ws.p.data();
    const DistResult dist =
        compute_distribution(row, n_vocab, params, p, ws, "target_logits", static_cast<int64_t>(gamma));
    out->token = sample_distribution(p, n_vocab, dist, rng, ws);
}

}  // namespace specdec
