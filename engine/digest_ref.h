// The arithmetic of tensor digests and bit distances (engine/digest.h), shared by the CPU
// reference and the CUDA kernels so that both compute the same function of the bytes.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define DITTO_DIGEST_HD __host__ __device__
#else
#define DITTO_DIGEST_HD
#endif

namespace ditto::ref {

// Two bijective 64-bit mixers with unrelated constants: MurmurHash3's fmix64 and SplitMix64's
// finalizer. Bijective, so a word's term changes whenever the word does.
DITTO_DIGEST_HD inline uint64_t digest_mix_a(uint64_t z) {
  z ^= z >> 33;
  z *= 0xff51afd7ed558ccdULL;
  z ^= z >> 33;
  z *= 0xc4ceb9fe1a85ec53ULL;
  z ^= z >> 33;
  return z;
}
DITTO_DIGEST_HD inline uint64_t digest_mix_b(uint64_t z) {
  z ^= z >> 30;
  z *= 0xbf58476d1ce4e5b9ULL;
  z ^= z >> 27;
  z *= 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return z;
}

// The two lane sums over a tensor's 32-bit words (modulo 2^64, so any order of adding gives the
// same sums: the GPU adds them with atomics and is still deterministic).
struct DigestSums {
  uint64_t a = 0, b = 0;
};

// Word w at word index i contributes mix((i << 32) | w, lane key) to each lane. For a fixed i the
// argument is injective in w, so changing any one word always changes lane a (and lane b):
// single-word changes, single- and double-bit flips within a word included, are always detected;
// changes in two words cancel only when both lanes cancel at once (about 2^-128).
DITTO_DIGEST_HD inline void digest_add_word(DigestSums& s, uint64_t i, uint32_t w) {
  const uint64_t v = (i << 32) | w;
  s.a += digest_mix_a(v ^ 0x9e3779b97f4a7c15ULL);
  s.b += digest_mix_b(v ^ 0x632be59bd9b4e019ULL);
}

// Sums over bytes[0..n): little-endian 32-bit words, the last one zero-padded when n is not a
// multiple of 4 (2-byte dtypes with an odd element count).
inline DigestSums digest_sums(const unsigned char* bytes, std::size_t n) {
  DigestSums s;
  const std::size_t words = n / 4;
  for (std::size_t i = 0; i < words; ++i) {
    uint32_t w;
    std::memcpy(&w, bytes + 4 * i, 4);
    digest_add_word(s, i, w);
  }
  if (n % 4) {
    uint32_t w = 0;
    std::memcpy(&w, bytes + 4 * words, n % 4);
    digest_add_word(s, words, w);
  }
  return s;
}

// Sign-magnitude bits to integers ordered like the values they encode (-0 one below +0), for
// ULP distances in a tensor's own format; `sign` is the format's sign bit.
DITTO_DIGEST_HD inline int64_t ordered_bits(uint32_t bits, uint32_t sign) {
  const int64_t magnitude = bits & (sign - 1);
  return (bits & sign) ? -magnitude - 1 : magnitude;
}

}  // namespace ditto::ref
