#include "engine/fingerprint.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <cstring>
#include <ostream>

#include "engine/error.h"

namespace ditto {

namespace {
bool all_lower_hex(const std::string& s) {
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}
}  // namespace

std::string Fingerprint::hex() const { return fmt::format("{:016x}{:016x}", high, low); }

std::ostream& operator<<(std::ostream& os, const Fingerprint& f) { return os << f.hex(); }

std::optional<Fingerprint> parse_fingerprint(const std::string& hex) {
  if (hex.size() != 32 || !all_lower_hex(hex)) return std::nullopt;
  Fingerprint f;
  f.high = std::stoull(hex.substr(0, 16), nullptr, 16);
  f.low = std::stoull(hex.substr(16), nullptr, 16);
  return f;
}

bool is_legacy_fingerprint(const std::string& text) { return text.size() == 16 && all_lower_hex(text); }

std::string legacy_fingerprint_message(const std::string& what, const std::string& value) {
  return fmt::format(
      "{} is \"{}\", a 64-bit FNV-1a fingerprint written by a ditto from before fingerprints were XXH3-128 "
      "(32 hex digits). FNV-1a over words lets paired changes cancel out, so this ditto cannot vouch for what such "
      "a fingerprint covers: run it again with this version, or read it with the ditto that wrote it",
      what, value);
}

struct Hasher::State {
  XXH3_state_t* xxh = nullptr;
  State() : xxh(XXH3_createState()) {
    if (!xxh || XXH3_128bits_reset(xxh) != XXH_OK) throw Error("fingerprint: XXH3 state could not be set up");
  }
  ~State() { XXH3_freeState(xxh); }
};

Hasher::Hasher() : state_(std::make_unique<State>()) {}
Hasher::~Hasher() = default;

Hasher& Hasher::bytes(const void* data, std::size_t n) {
  if (n > 0 && XXH3_128bits_update(state_->xxh, data, n) != XXH_OK) throw Error("fingerprint: XXH3 update failed");
  return *this;
}

Hasher& Hasher::sized(const void* data, std::size_t n) {
  const uint64_t len = n;
  bytes(&len, sizeof len);
  return bytes(data, n);
}

Hasher& Hasher::add(const Fingerprint& f) {
  add(f.high);
  return add(f.low);
}

Fingerprint Hasher::digest() const {
  const XXH128_hash_t h = XXH3_128bits_digest(state_->xxh);
  return {h.high64, h.low64};
}

Fingerprint fingerprint_bytes(const void* data, std::size_t n) {
  const XXH128_hash_t h = XXH3_128bits(data, n);
  return {h.high64, h.low64};
}

}  // namespace ditto
