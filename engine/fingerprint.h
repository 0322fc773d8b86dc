// Fingerprints: the 128-bit hashes behind every bitwise claim ditto makes — a checkpoint's
// verification, CONTROL's bit-identity, the "distinct fingerprints" counts, traces, the data a run
// saw, tuning files.
//
// XXH3-128 (libxxhash) over the bytes, in the order they are added. It is not the sum of
// anything: unlike the 64-bit FNV-1a over 64-bit words that ditto used before, which XORed each
// word in, flipping the sign bits of two floats at odd positions cannot cancel out, and single- and
// double-bit changes anywhere always change the digest (tests/cpu_fingerprint.cpp tries both).
// It is no cryptographic hash: it detects damage and mistakes, not a forger who knows it.
//
// Written as 32 lowercase hex digits, high word first (the canonical order of XXH128). Files
// that hold 16-digit fingerprints were written by the FNV-1a versions; readers refuse them with
// legacy_fingerprint_message(), since their checks could be fooled.
#pragma once
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>

namespace ditto {

struct Fingerprint {
  uint64_t high = 0, low = 0;

  // Not an aggregate: a record holding a Fingerprint cannot take two loose integers for it.
  constexpr Fingerprint() = default;
  constexpr Fingerprint(uint64_t high_word, uint64_t low_word) : high(high_word), low(low_word) {}

  std::string hex() const;  // 32 lowercase hex digits
  friend bool operator==(const Fingerprint& a, const Fingerprint& b) { return a.high == b.high && a.low == b.low; }
  friend bool operator!=(const Fingerprint& a, const Fingerprint& b) { return !(a == b); }
  friend bool operator<(const Fingerprint& a, const Fingerprint& b) {
    return a.high != b.high ? a.high < b.high : a.low < b.low;
  }
};

std::ostream& operator<<(std::ostream& os, const Fingerprint& f);  // its hex (test messages)

// The fingerprint a hex string spells: exactly 32 lowercase hex digits, else nothing.
std::optional<Fingerprint> parse_fingerprint(const std::string& hex);
// True for 16 lowercase hex digits: a fingerprint written by the FNV-1a versions of ditto.
bool is_legacy_fingerprint(const std::string& text);
// What a reader says when `what` (a file and field) holds such a fingerprint.
std::string legacy_fingerprint_message(const std::string& what, const std::string& value);

// XXH3-128 over everything added, in order. Sized values are added with their sizes, so
// ("ab", "c") and ("a", "bc") differ.
class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  Hasher& bytes(const void* data, std::size_t n);         // raw bytes, no length
  Hasher& sized(const void* data, std::size_t n);         // the length (8 bytes), then the bytes
  Hasher& add(const std::string& s) { return sized(s.data(), s.size()); }
  Hasher& add(const Fingerprint& f);
  Hasher& add(uint64_t v) { return bytes(&v, sizeof v); }
  Fingerprint digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// XXH3-128 of the bytes alone (no length prefix): a file's contents, say.
Fingerprint fingerprint_bytes(const void* data, std::size_t n);

}  // namespace ditto
