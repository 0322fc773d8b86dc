#include "experiments/kernel_choices.h"

#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include "experiments/run_dir.h"

namespace ditto {
namespace {

namespace fs = std::filesystem;

std::string manifest_path_of(const std::string& run) {
  std::error_code ec;
  return fs::is_directory(run, ec) ? (fs::path(run) / "manifest.json").string() : run;
}

using Key = std::tuple<std::string, std::string, std::string>;  // layer, knob, shape: Manifest::record's key

Key key_of(const ManifestEntry& e) { return {e.layer, e.knob, e.shape}; }

// What ran, as the comparison weighs it: the kernel and its configuration, not how it was asked for.
bool same_kernel(const ManifestEntry& x, const ManifestEntry& y) {
  return x.variant == y.variant && x.algorithm == y.algorithm && x.precision == y.precision &&
         x.guarantee == y.guarantee;
}

std::string shown(const std::optional<ManifestEntry>& e) {
  if (!e) return "(not recorded)";
  std::string s = e->variant.empty() ? "(no variant)" : e->variant;
  if (!e->algorithm.empty()) s += " " + e->algorithm;
  if (!e->precision.empty()) s += " " + e->precision;
  return s + fmt::format(" [{}]", guarantee_name(e->guarantee));
}

}  // namespace

KernelChoices compare_kernel_choices(const std::string& run_a, const std::string& run_b) {
  KernelChoices c;
  c.manifest_a = manifest_path_of(run_a);
  c.manifest_b = manifest_path_of(run_b);
  const RunManifest a = read_run_manifest(c.manifest_a), b = read_run_manifest(c.manifest_b);

  std::set<std::string> fields;
  for (const auto& [k, v] : a.runtime) fields.insert(k);
  for (const auto& [k, v] : b.runtime) fields.insert(k);
  for (const std::string& f : fields) {
    auto ia = a.runtime.find(f), ib = b.runtime.find(f);
    const std::string va = ia == a.runtime.end() ? "(absent)" : ia->second;
    const std::string vb = ib == b.runtime.end() ? "(absent)" : ib->second;
    if (va != vb) c.runtime.push_back({f, va, vb});
  }

  std::map<Key, const ManifestEntry*> in_b;
  for (const ManifestEntry& e : b.ops) in_b[key_of(e)] = &e;
  std::set<Key> seen;
  for (const ManifestEntry& e : a.ops) {
    seen.insert(key_of(e));
    auto it = in_b.find(key_of(e));
    if (it != in_b.end() && same_kernel(e, *it->second)) {
      ++c.same;
      continue;
    }
    KernelChoice k{e.layer, e.op, e.knob, e.shape, e, std::nullopt};
    if (it != in_b.end()) k.b = *it->second;
    c.differing.push_back(std::move(k));
  }
  for (const ManifestEntry& e : b.ops)
    if (!seen.count(key_of(e))) c.differing.push_back({e.layer, e.op, e.knob, e.shape, std::nullopt, e});
  return c;
}

std::vector<std::string> replay_mismatches(const std::vector<ManifestEntry>& recorded, const Manifest& now) {
  auto on_gpu = [](const std::string& device) { return device.rfind("cuda", 0) == 0; };
  std::vector<std::string> out;
  for (const ManifestEntry& r : recorded) {
    if (!on_gpu(r.device)) continue;
    const ManifestEntry* e = now.find(r.layer, r.knob, r.shape);
    if (!e || !on_gpu(e->device) || e->variant != r.variant || e->algorithm == r.algorithm) continue;
    out.push_back(fmt::format("{}.{}{}: {} {} (recorded {})", r.layer, r.knob, r.shape.empty() ? "" : " @" + r.shape,
                              e->variant, e->algorithm.empty() ? "(none)" : e->algorithm,
                              r.algorithm.empty() ? "(none)" : r.algorithm));
  }
  return out;
}

std::string format_kernel_choices(const KernelChoices& c) {
  std::string out = fmt::format("kernel choices: A {}\n                B {}\n", c.manifest_a, c.manifest_b);
  if (c.runtime.empty()) {
    out += "runtime: the same (GPU, driver, libraries)\n";
  } else {
    out += "runtime differs:\n";
    for (const auto& [field, va, vb] : c.runtime) out += fmt::format("  {}: {} | {}\n", field, va, vb);
  }
  out += fmt::format("{} entries ran the same kernel in both; {} differ{}\n", c.same, c.differing.size(),
                     c.differing.empty() ? "" : " (A | B):");
  for (const KernelChoice& k : c.differing)
    out += fmt::format("  {}.{}{} ({}): {} | {}\n", k.layer, k.knob, k.shape.empty() ? "" : " @" + k.shape, k.op,
                       shown(k.a), shown(k.b));
  return out;
}

}  // namespace ditto
