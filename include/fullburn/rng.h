// Rng: the pipeline's deterministic randomness: a small generator, and the
// epoch's order of the samples, both functions of their seeds only.
//
// Contract
// - Values: SplitMix is a plain value (its state is the caller's); a
//   permutation is returned to the caller.
// - Threads: no shared state: each thread draws from its own SplitMix, seeded
//   from (seed, epoch, sample), so what a sample becomes never depends on the
//   thread that made it.
// - Errors: none.
#pragma once

#include <cstdint>
#include <vector>

namespace fullburn {

// Deterministic 64-bit generator (splitmix64), so crops depend only on
// (seed, epoch, sample) and not on which thread did the work.
struct SplitMix {
  uint64_t state;
  uint64_t Next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double Uniform() { return (Next() >> 11) * (1.0 / 9007199254740992.0); }
};
// The epoch's order: a full permutation of 0..n-1 from (seed, epoch); the
// identity without `shuffle`.
std::vector<int64_t> EpochPermutation(int64_t n, uint64_t seed, int epoch, bool shuffle = true);

}  // namespace fullburn
