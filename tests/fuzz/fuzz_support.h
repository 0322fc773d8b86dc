// Shared by the fuzz targets: each target turns libFuzzer's bytes into the files a ditto parser
// reads, calls the parser, and accepts exactly one outcome besides success: a ditto::Error (the
// parser named the file and the problem). Anything else — a crash, a sanitizer report, another
// exception type escaping (std::terminate), a huge allocation (libFuzzer's -rss_limit_mb /
// -malloc_limit_mb), a hang (-timeout) — is a finding.
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/error.h"

namespace fuzz {

// This process's scratch folder (fresh per process; files are overwritten each input).
inline const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("ditto_fuzz_" + std::to_string(::getpid()));
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

inline void write(const std::filesystem::path& p, const uint8_t* data, std::size_t n) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n));
}
inline void write(const std::filesystem::path& p, const std::string& s) {
  write(p, reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

// Splits the input into `parts` pieces at the first parts-1 occurrences of the separator line
// "\n--ditto-fuzz--\n" (missing pieces are empty), so one input can describe several files and
// seed corpora stay readable.
inline std::vector<std::string> split(const uint8_t* data, std::size_t n, std::size_t parts) {
  static const std::string sep = "\n--ditto-fuzz--\n";
  std::string s(reinterpret_cast<const char*>(data), n);
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (out.size() + 1 < parts) {
    std::size_t at = s.find(sep, pos);
    if (at == std::string::npos) break;
    out.push_back(s.substr(pos, at - pos));
    pos = at + sep.size();
  }
  out.push_back(s.substr(std::min(pos, s.size())));
  while (out.size() < parts) out.emplace_back();
  return out;
}

// Runs fn; a ditto::Error is the parser refusing bad input, which is what it should do.
template <class F>
void expect_success_or_error(F&& fn) {
  try {
    fn();
  } catch (const ditto::Error&) {
  }
}

}  // namespace fuzz
