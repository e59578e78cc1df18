// Counter-based random numbers: Philox-4x32 with 10 rounds.
//
// Draw n of stream s under seed k is a pure function of (k, s, n): the 128-bit
// counter block is (n_lo, n_hi, s_lo, s_hi) and the 64-bit key is the seed.
// Different streams therefore never share blocks, and a (seed, stream) pair
// always reproduces the same sequence.
#pragma once

#include <cstdint>

namespace specdec {

namespace philox_detail {

constexpr uint32_t kMul0 = 0xD2511F53u;
constexpr uint32_t kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1

inline void mul_hi_lo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
    const uint64_t product = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
    *hi = static_cast<uint32_t>(product >> 32);
    *lo = static_cast<uint32_t>(product);
}

}  // namespace philox_detail

// One Philox-4x32-10 block: encrypts `ctr` in place under `key`.
inline void philox4x32_10(uint32_t ctr[4], const uint32_t key_in[2]) {
    using namespace philox_detail;
    uint32_t k0 = key_in[0];
    uint32_t k1 = key_in[1];
    for (int round = 0; round < 10; ++round) {
        uint32_t hi0, lo0, hi1, lo1;
        mul_hi_lo(kMul0, ctr[0], &hi0, &lo0);
        mul_hi_lo(kMul1, ctr[2], &hi1, &lo1);
        const uint32_t next0 = hi1 ^ ctr[1] ^ k0;
        const uint32_t next2 = hi0 ^ ctr[3] ^ k1;
        ctr[0] = next0;
        ctr[1] = lo1;
        ctr[2] = next2;
        ctr[3] = lo0;
        k0 += kWeyl0;
        k1 += kWeyl1;
    }
}

struct Rng {
    uint64_t seed = 0;
    uint64_t stream = 0;
    uint64_t counter = 0;  // number of draws made so far

    Rng() = default;
    Rng(uint64_t seed_, uint64_t stream_) : seed(seed_), stream(stream_), counter(0) {}

    // The 64 random bits of draw `n` (does not advance the counter).
    uint64_t bits_at(uint64_t n) const {
        uint32_t block[4] = {static_cast<uint32_t>(n), static_cast<uint32_t>(n >> 32), static_cast<uint32_t>(stream),
                             static_cast<uint32_t>(stream >> 32)};
        const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
        philox4x32_10(block, key);
        return (static_cast<uint64_t>(block[1]) << 32) | block[0];
    }

    uint64_t next_u64() { return bits_at(counter++); }

    // Uniform double in [0, 1) with 53 random bits.
    double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
};

}  // namespace specdec
