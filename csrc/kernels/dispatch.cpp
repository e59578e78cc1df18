#include "kernels/dispatch.h"

#include <atomic>
#include <cstdlib>

#if defined(SPECDEC_HAVE_NEON) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace specdec {

namespace {

std::atomic<const KernelTable*> g_active{nullptr};

bool cpu_has_avx2() {
#if defined(SPECDEC_HAVE_X86_SIMD) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return false;
#endif
}

bool cpu_has_avx512() {
#if defined(SPECDEC_HAVE_X86_SIMD) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#else
    return false;
#endif
}

// Advanced SIMD is part of the AArch64 base architecture (and of the Linux
// AArch64 ABI); the hardware capability bit is checked anyway where the OS
// reports it.
bool cpu_has_neon() {
#if defined(SPECDEC_HAVE_NEON) && defined(__linux__) && defined(HWCAP_ASIMD)
    return (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0;
#elif defined(SPECDEC_HAVE_NEON)
    return true;
#else
    return false;
#endif
}

const KernelTable* table_for(const std::string& name) {
    if (name == "scalar") return kernel_table_scalar();
    if (name == "avx2") return cpu_has_avx2() ? kernel_table_avx2() : nullptr;
    if (name == "avx512") return cpu_has_avx512() ? kernel_table_avx512() : nullptr;
    if (name == "neon") return cpu_has_neon() ? kernel_table_neon() : nullptr;
    return nullptr;
}

const KernelTable* best_table() {
    const std::vector<std::string> names = supported_isas();
    return table_for(names.back());
}

std::string supported_list() {
    std::string out;
    for (const std::string& name : supported_isas()) {
        if (!out.empty()) out += ", ";
        out += name;
    }
    return out;
}

bool is_known(const std::string& name) {
    return name == "scalar" || name == "avx2" || name == "avx512" || name == "neon";
}

}  // namespace

#if !defined(SPECDEC_HAVE_X86_SIMD)
const KernelTable* kernel_table_avx2() { return nullptr; }
const KernelTable* kernel_table_avx512() { return nullptr; }
#endif
#if !defined(SPECDEC_HAVE_NEON)
const KernelTable* kernel_table_neon() { return nullptr; }
#endif

std::vector<std::string> supported_isas() {
    std::vector<std::string> names{"scalar"};
    if (kernel_table_avx2() != nullptr && cpu_has_avx2()) names.emplace_back("avx2");
    if (kernel_table_avx512() != nullptr && cpu_has_avx512()) names.emplace_back("avx512");
    if (kernel_table_neon() != nullptr && cpu_has_neon()) names.emplace_back("neon");
    return names;
}

const KernelTable& kernels() {
    const KernelTable* table = g_active.load(std::memory_order_acquire);
    if (table == nullptr) {
        table = best_table();
        g_active.store(table, std::memory_order_release);
    }
    return *table;
}

const char* active_isa_name() { return kernels().name; }

bool set_isa(const std::string& name, std::string* error) {
    const KernelTable* table = table_for(name);
    if (table == nullptr) {
        if (error != nullptr) {
            *error = is_known(name) ? "instruction set '" + name + "' is not supported by this CPU"
                                    : "unknown instruction set '" + name + "'";
            *error += " (supported here: " + supported_list() + ")";
        }
        return false;
    }
    g_active.store(table, std::memory_order_release);
    return true;
}

bool init_isa_from_environment(std::string* error) {
    const char* value = std::getenv("SPECDEC_ISA");
    if (value == nullptr || value[0] == '\0' || std::string(value) == "auto") {
        g_active.store(best_table(), std::memory_order_release);
        return true;
    }
    std::string reason;
    if (!set_isa(value, &reason)) {
        if (error != nullptr) {
            *error = std::string("SPECDEC_ISA=") + value + " cannot be used: " + reason +
                     "; unset it or choose one of: auto, " + supported_list();
        }
        return false;
    }
    return true;
}

}  // namespace specdec
