// A small, fast, portable generator (xoshiro256**, seeded through splitmix64), one per sequence,
// so a seeded request draws the same numbers whatever else runs in the batch. vLLM keeps a
// torch.Generator per seeded request for the same reason (vllm/v1/sample/ops/topk_topp_sampler.py:L311,
// random_sample). std::uniform_real_distribution is avoided: its output differs between libraries.
#pragma once

#include <cstdint>

namespace scr::engine {

class Rng {
public:
    explicit Rng(uint64_t seed = 0) { reseed(seed); }
    void reseed(uint64_t seed) {
        for (uint64_t& s : s_) {
            seed += 0x9e3779b97f4a7c15ULL;
            uint64_t z = seed;
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
            s = z ^ (z >> 31);
        }
    }
    uint64_t next() {
        const uint64_t result = rotl(s_[1] * 5, 7) * 9;
        const uint64_t t = s_[1] << 17;
        s_[2] ^= s_[0]; s_[3] ^= s_[1]; s_[1] ^= s_[2]; s_[0] ^= s_[3];
        s_[2] ^= t;
        s_[3] = rotl(s_[3], 45);
        return result;
    }
    double uniform() { return double(next() >> 11) * 0x1.0p-53; }  // [0, 1)

private:
    static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
    uint64_t s_[4];
};

}  // namespace scr::engine
