// Row validation and the temperature-scaled exponentials of a logits row.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace specdec {

// A logits row that cannot define a distribution (NaN, +inf, all -inf).
struct InvalidLogits : std::invalid_argument {
    explicit InvalidLogits(const std::string& message) : std::invalid_argument(message) {}
};

// Largest logit of x[0..n) (n >= 1). Throws InvalidLogits naming `what` and
// `row` (row < 0 for a single row) on NaN, +inf or a row that is all -inf.
float checked_row_max(const float* x, size_t n, const char* what, int64_t row);

// Lowest token id whose logit equals `max` (the argmax, ties to the lower id).
int64_t argmax_of(const float* x, size_t n, float max);

// out[i] = exp((x[i] - max) / temperature) for temperature > 0; returns the sum
// in double. The entry at the argmax is exactly 1.
double tempered_exp(const float* x, size_t n, float max, double temperature, float* out);

}  // namespace specdec
