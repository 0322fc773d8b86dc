// Philox4x32-10 counter-based RNG (Salmon et al., SC'11), usable on host and device.
// Every random draw in ditto is a pure function of (key, counter): dropout masks, data order,
// augmentation and initial weights replay exactly and do not depend on threads or timing.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define DITTO_HD __host__ __device__ __forceinline__
#else
#define DITTO_HD inline
#endif

namespace ditto {

struct Philox4x32 {
  uint32_t v[4];
};

DITTO_HD uint32_t philox_mulhi(uint32_t a, uint32_t b, uint32_t* lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  *lo = static_cast<uint32_t>(p);
  return static_cast<uint32_t>(p >> 32);
}

// One block of four 32-bit random words for a 128-bit counter and a 64-bit key.
DITTO_HD Philox4x32 philox4x32(uint64_t counter_lo, uint64_t counter_hi, uint64_t key) {
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t lo0, lo1;
    uint32_t hi0 = philox_mulhi(0xD2511F53u, c0, &lo0);
    uint32_t hi1 = philox_mulhi(0xCD9E8D57u, c2, &lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// A uniform float in [0, 1) from 24 random bits (exactly representable).
DITTO_HD float philox_uniform(uint32_t bits) { return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f); }

// Mixes several 64-bit values into one key (splitmix64 finalizer), e.g. (seed, epoch, layer).
DITTO_HD uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
DITTO_HD uint64_t mix_key(uint64_t a, uint64_t b) { return mix64(a ^ mix64(b)); }

}  // namespace ditto

#ifndef DITTO_HASH_STRING_DEFINED
#define DITTO_HASH_STRING_DEFINED
#include <string>
namespace ditto {
// Stable 64-bit hash of a name (layer names key the RNG streams): FNV-1a over the bytes.
inline uint64_t hash_name(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}
}  // namespace ditto
#endif
