#include "kernels/softmax.h"

#include <cfloat>
#include <cmath>

#include "kernels/dispatch.h"

namespace specdec {

namespace {

std::string row_label(const char* what, int64_t row) {
    std::string label(what);
    if (row >= 0) label += " row " + std::to_string(row);
    return label;
}

}  // namespace

float checked_row_max(const float* x, size_t n, const char* what, int64_t row) {
    int64_t bad = -1;
    const float max = kernels().max_checked(x, n, &bad);
    if (bad >= 0) {
        const char* kind = std::isnan(x[bad]) ? "NaN" : "+inf";
        throw InvalidLogits(row_label(what, row) + " contains " + kind + " at token " + std::to_string(bad));
    }
    if (!(max > -HUGE_VALF)) {
        throw InvalidLogits(row_label(what, row) + " is entirely -inf: every token is masked");
    }
    return max;
}

int64_t argmax_of(const float* x, size_t n, float max) { return kernels().first_equal(x, n, max); }

double tempered_exp(const float* x, size_t n, float max, double temperature, float* out) {
    double inv = 1.0 / temperature;
    if (!(inv <= static_cast<double>(FLT_MAX))) inv = static_cast<double>(FLT_MAX);
    return kernels().exp_shift(x, n, max, static_cast<float>(inv), out);
}

}  // namespace specdec
