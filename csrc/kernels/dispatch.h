// Runtime selection of the SIMD kernel set.
//
// Every vocabulary-wide primitive exists once per instruction set (scalar,
// AVX2+FMA and AVX-512 on x86-64, NEON on AArch64); each ISA translation unit
// fills one KernelTable and the code above this header calls through the
// active table only, so it never depends on the instruction set it runs on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace specdec {

// Extra room compress_ge may scribble past the last index it reports.
constexpr size_t kCompressSlack = 64;

struct KernelTable {
    const char* name;

    // Largest value of x[0..n). When some entry is NaN or +inf, *bad receives
    // the lowest such index (else -1). -inf entries are allowed (masked).
    float (*max_checked)(const float* x, size_t n, int64_t* bad);

    // Lowest index i with x[i] == value, or -1.
    int64_t (*first_equal)(const float* x, size_t n, float value);

    // out[i] = exp((x[i] - shift) * scale); returns the sum of out in double.
    double (*exp_shift)(const float* x, size_t n, float shift, float scale, float* out);

    // Elementwise exp of x into out (exposed for accuracy tests).
    void (*exp_array)(const float* x, size_t n, float* out);

    // x[i] *= s.
    void (*scale)(float* x, size_t n, float s);

    // Sum of x in double.
    double (*sum)(const float* x, size_t n);

    // Sum over i of min(p[i], q[i]) in double.
    double (*sum_min)(const float* p, const float* q, size_t n);

    // out[i] = max(0, p[i] - q[i]); returns the sum of out in double.
    double (*residual)(const float* p, const float* q, size_t n, float* out);

    // Writes the indices i (ascending) with x[i] >= threshold to idx; returns
    // their count. idx must have room for n + kCompressSlack entries.
    size_t (*compress_ge)(const float* x, size_t n, float threshold, uint32_t* idx);

    // Zeroes every x[i] < threshold (x[i] <= threshold when strict); returns
    // the sum of what is kept in double.
    double (*keep_above)(float* x, size_t n, float threshold, bool strict);

    // Sums of consecutive blocks of `block` entries (block a multiple of 64);
    // sums[b] gets block b. Returns the total in double.
    double (*block_sums)(const float* x, size_t n, size_t block, double* sums);
};

// Tables compiled for each instruction set (nullptr when not built: the x86
// tables exist in x86-64 builds only, the NEON table in AArch64 builds only).
const KernelTable* kernel_table_scalar();
const KernelTable* kernel_table_avx2();
const KernelTable* kernel_table_avx512();
const KernelTable* kernel_table_neon();

// The table in use.
const KernelTable& kernels();

// Name of the active instruction set.
const char* active_isa_name();

// Instruction sets this CPU (and this build) can run, slowest first:
// "scalar", then "avx2" and "avx512" (x86-64) or "neon" (AArch64).
std::vector<std::string> supported_isas();

// Selects an instruction set by name; returns false (and fills *error) when it
// is unknown or unsupported here.
bool set_isa(const std::string& name, std::string* error);

// Chooses the instruction set at load time: the SPECDEC_ISA environment
// variable when set (non-empty and not "auto"), else the best supported.
// Returns false (and fills *error) when the variable names an unusable ISA.
bool init_isa_from_environment(std::string* error);

}  // namespace specdec
