#include "engine/manifest.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "engine/error.h"

namespace ditto {

const char* determinism_name(Determinism d) {
  switch (d) {
    case Determinism::Yes: return "yes";
    case Determinism::No: return "no";
    case Determinism::Unknown: return "unknown";
  }
  return "?";
}

const char* guarantee_name(Guarantee g) {
  switch (g) {
    case Guarantee::NotGuaranteed: return "not_guaranteed";
    case Guarantee::RunToRun: return "run_to_run";
    case Guarantee::GpuToGpu: return "gpu_to_gpu";
    case Guarantee::Unknown: return "unknown";
  }
  return "?";
}

std::string legacy_precision(const std::string& math) { return math == "fma" ? "fp32" : math; }

Guarantee guarantee_of(Determinism d, Impl impl) {
  switch (d) {
    case Determinism::No: return Guarantee::NotGuaranteed;
    case Determinism::Unknown: return Guarantee::Unknown;
    case Determinism::Yes: return impl == Impl::Ditto ? Guarantee::GpuToGpu : Guarantee::RunToRun;
  }
  return Guarantee::Unknown;
}

void Manifest::record(ManifestEntry e) {
  auto key = std::make_tuple(e.layer, e.knob, e.shape);
  auto it = index_.find(key);
  if (it != index_.end()) {
    entries_[it->second] = std::move(e);
    seq_[it->second] = ++next_seq_;
  } else {
    index_[key] = entries_.size();
    entries_.push_back(std::move(e));
    seq_.push_back(++next_seq_);
  }
}

const ManifestEntry* Manifest::find(const std::string& layer, const std::string& knob, const std::string& shape) const {
  if (!shape.empty()) {
    auto it = index_.find({layer, knob, shape});
    return it == index_.end() ? nullptr : &entries_[it->second];
  }
  const ManifestEntry* latest = nullptr;
  uint64_t latest_seq = 0;
  for (std::size_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].layer == layer && entries_[i].knob == knob && (!latest || seq_[i] > latest_seq)) {
      latest = &entries_[i];
      latest_seq = seq_[i];
    }
  return latest;
}

std::vector<ManifestEntry> Manifest::entries() const { return entries_; }

void Manifest::clear() {
  entries_.clear();
  seq_.clear();
  index_.clear();
}

std::string Manifest::to_json(int indent) const {
  nlohmann::json ops = nlohmann::json::array();
  for (const auto& e : entries_) {
    ops.push_back({{"layer", e.layer},
                   {"op", e.op},
                   {"knob", e.knob},
                   {"variant", e.variant},
                   {"requested", e.requested},
                   {"deterministic", determinism_name(e.deterministic)},
                   {"guarantee", guarantee_name(e.guarantee)},
                   {"precision", e.precision},
                   {"workspace_bytes", e.workspace_bytes},
                   {"device", e.device}});
    if (!e.shape.empty()) ops.back()["shape"] = e.shape;
    if (!e.algorithm.empty()) ops.back()["algorithm"] = e.algorithm;
  }
  return nlohmann::json{{"ops", ops}}.dump(indent);
}

void write_file_atomic(const std::string& path, const std::string& text) {
  std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw IoError(fmt::format("{}: cannot open for writing: {}", tmp, std::strerror(errno)));
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = (std::fflush(f) == 0) && ok;
  ok = (::fsync(::fileno(f)) == 0) && ok;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    int err = errno;
    std::remove(tmp.c_str());
    throw IoError(fmt::format("{}: write failed: {}", tmp, std::strerror(err)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    throw IoError(fmt::format("{}: cannot rename into place: {}", path, std::strerror(err)));
  }
}

}  // namespace ditto
