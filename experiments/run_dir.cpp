#include "experiments/run_dir.h"
#include "experiments/task_scoring.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "engine/detail/json_error.h"
#include "engine/error.h"
#include "engine/optim.h"
#include "engine/tensor.h"
#include "experiments/data_parallel.h"

namespace ditto {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Kind = DefiningFlag::Kind;
using Form = DefiningFlag::Form;

constexpr const char* kLockName = ".lock";
constexpr const char* kRendezvousName = ".rendezvous";  // where the ranks of --dp-launch meet
constexpr const char* kGenerationPrefix = ".gen-";
}  // namespace

const std::vector<std::string>& run_files() {
  static const std::vector<std::string> files = {"manifest.json", "log.csv",      "predictions.csv",
                                                 "metrics.json",  "checkpoint.safetensors", "loss_scale.csv"};
  return files;
}

namespace {

// A value from a file, fit for an error message: printable and short.
std::string shown(const std::string& text) {
  std::string out;
  for (char c : text.substr(0, 48)) out += std::isprint(static_cast<unsigned char>(c)) ? c : '?';
  return text.size() > 48 ? out + "..." : out;
}


template <typename T>
std::string joined(const std::vector<T>& items) {
  std::string out;
  for (const auto& v : items) out += (out.empty() ? "" : " ") + fmt::format("{}", v);
  return out;
}

std::vector<std::string> words(const std::string& s) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i < s.size()) {
    std::size_t j = s.find(' ', i);
    if (j == std::string::npos) j = s.size();
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

// A whole number written as ditto writes one: optional '-', digits, nothing else.
template <typename T>
std::optional<T> whole_number(const std::string& text) {
  T v{};
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  return v;
}


// Reads fields of a parsed JSON document by dotted path, each checked for its type; every
// complaint names the file, the field and the value found.
struct JsonFields {
  const std::string& path;
  const json& root;

  [[noreturn]] void fail(const std::string& field, const json* value, const std::string& expected) const {
    throw DataError(fmt::format("{}: field {} is {}; expected {}", path, field,
                                value ? shown(value->dump()) : std::string("missing"), expected));
  }
  const json* find(const std::string& field) const {
    const json* at = &root;
    std::size_t from = 0;
    while (from <= field.size()) {
      std::size_t dot = field.find('.', from);
      if (dot == std::string::npos) dot = field.size();
      if (!at->is_object()) return nullptr;
      auto it = at->find(field.substr(from, dot - from));
      if (it == at->end()) return nullptr;
      at = &*it;
      from = dot + 1;
    }
    return at;
  }
  std::string string(const std::string& field) const {
    const json* v = find(field);
    if (!v || !v->is_string()) fail(field, v, "a string");
    return v->get<std::string>();
  }
  uint64_t unsigned64(const std::string& field) const {
    const json* v = find(field);
    if (!v || !v->is_number_unsigned()) fail(field, v, "a whole number, 0 or more");
    return v->get<uint64_t>();
  }
  int count(const std::string& field, int minimum) const {
    const json* v = find(field);
    if (!v || !v->is_number_integer() || v->get<int64_t>() < minimum || v->get<int64_t>() > INT_MAX)
      fail(field, v, fmt::format("a whole number, at least {}", minimum));
    return static_cast<int>(v->get<int64_t>());
  }
  Fingerprint fingerprint(const std::string& field) const {
    const json* v = find(field);
    std::optional<Fingerprint> h;
    if (v && v->is_string()) {
      h = parse_fingerprint(v->get<std::string>());
      if (!h && is_legacy_fingerprint(v->get<std::string>()))
        throw DataError(legacy_fingerprint_message(fmt::format("{}: {}", path, field), v->get<std::string>()));
    }
    if (!h) fail(field, v, "a fingerprint of 32 lowercase hex digits");
    return *h;
  }
};

json parse_json_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("{}: cannot open {}", path, what));
  std::string text((std::istreambuf_iterator<char>(in)), {});
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    throw DataError(fmt::format("{}: malformed JSON at byte {}: {}", path, e.byte > 0 ? e.byte - 1 : 0,
                                detail::json_syntax_problem(e)));
  }
}

// The "ops" list of a manifest, each field checked for its type.
std::vector<ManifestEntry> parse_ops(const json& m, const std::string& path) {
  auto it = m.is_object() ? m.find("ops") : m.end();
  if (!m.is_object() || it == m.end() || !it->is_array())
    throw DataError(fmt::format("{}: no \"ops\" list (is this a ditto run's manifest.json?)", path));
  std::vector<ManifestEntry> ops;
  for (std::size_t i = 0; i < it->size(); ++i) {
    const json& op = (*it)[i];
    const std::string where = fmt::format("ops[{}]", i);
    if (!op.is_object())
      throw DataError(fmt::format("{}: {} is {}; expected an object", path, where, shown(op.dump())));
    auto text = [&](const char* key, bool required) {
      auto f = op.find(key);
      if (f == op.end()) {
        if (required) throw DataError(fmt::format("{}: {}.{} is missing; expected a string", path, where, key));
        return std::string();
      }
      if (!f->is_string())
        throw DataError(fmt::format("{}: {}.{} is {}; expected a string", path, where, key, shown(f->dump())));
      return f->get<std::string>();
    };
    ManifestEntry e;
    e.layer = text("layer", true);
    e.knob = text("knob", true);
    e.variant = text("variant", true);
    e.op = text("op", false);
    e.requested = text("requested", false);
    // Manifests written before the precision knob say "math" (and linear layers had a math knob).
    e.precision = op.contains("precision") ? text("precision", false) : legacy_precision(text("math", false));
    if (e.knob == "math") {
      e.knob = "precision";
      e.variant = legacy_precision(e.variant);
    }
    e.device = text("device", false);
    e.shape = text("shape", false);
    e.algorithm = text("algorithm", false);
    if (const std::string g = text("guarantee", false); !g.empty()) {
      bool known = false;
      for (Guarantee c : {Guarantee::NotGuaranteed, Guarantee::RunToRun, Guarantee::GpuToGpu, Guarantee::Unknown})
        if (g == guarantee_name(c)) e.guarantee = c, known = true;
      if (!known)
        throw DataError(fmt::format("{}: {}.guarantee is \"{}\"; expected not_guaranteed, run_to_run, gpu_to_gpu or "
                                    "unknown",
                                    path, where, g));
    }
    ops.push_back(std::move(e));
  }
  return ops;
}

// path becomes a symbolic link to target in one step (a new link renamed over it).
void atomic_symlink(const fs::path& target, const fs::path& path) {
  const fs::path tmp = path.string() + fmt::format(".link.{}", ::getpid());
  std::error_code ec;
  fs::remove(tmp, ec);
  fs::create_symlink(target, tmp, ec);
  if (!ec) fs::rename(tmp, path, ec);
  if (ec) throw IoError(fmt::format("{}: cannot link to {}: {}", path.string(), target.string(), ec.message()));
}

std::string describe_state(const RunFolderState& s) {
  if (s.epochs_done < 0) return "a run whose manifest cannot be read";
  if (s.epochs_planned > 0 && s.epochs_done >= s.epochs_planned)
    return fmt::format("a finished run, {} of {} epochs", s.epochs_done, s.epochs_planned);
  return s.epochs_planned > 0 ? fmt::format("a run stopped after epoch {} of {}", s.epochs_done, s.epochs_planned)
                              : fmt::format("a run stopped after epoch {}", s.epochs_done);
}

// A loss-scaled run's record of its steps, which the resumed run continues: one row per finished
// step, or the scale schedule of the steps to come would not be the one the record explains.
void read_resumed_loss_scale(ResumePoint& r) {
  if (!r.manifest.flags.count("--loss-scale")) return;
  const std::string path = (fs::path(r.dir) / "loss_scale.csv").string();
  r.loss_scale = read_loss_scale_csv(path);
  if (static_cast<int64_t>(r.loss_scale.size()) != r.meta.steps)
    throw DataError(fmt::format("{}: {} rows, but {} holds {} finished steps", path, r.loss_scale.size(),
                                r.checkpoint_path, r.meta.steps));
}

// A link a run made: it points into state/.
bool is_run_link(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_symlink(fs::symlink_status(p, ec))) return false;
  return fs::read_symlink(p, ec).string().rfind("state/", 0) == 0;
}

std::string listed(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < 5; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 5) out += fmt::format(" and {} more", names.size() - 5);
  return out;
}

void refuse_foreign(const std::string& out, const RunFolderState& s, OutIntent intent) {
  if (intent == OutIntent::Fresh)
    throw Error(fmt::format("--out: '{}' is not empty and {} (it holds {}); a run writes into a new or empty folder "
                            "or its own: choose another folder, or pass --overwrite to write the run beside those "
                            "files, which are then left as they are",
                            out, s.published ? "holds files besides its run" : "holds no ditto run", listed(s.foreign)));
  std::vector<std::string> clashing;
  for (const auto& name : s.foreign)
    if (std::find(run_files().begin(), run_files().end(), name) != run_files().end()) clashing.push_back(name);
  if (!clashing.empty())
    throw Error(fmt::format("--overwrite: '{}' holds {}, which {} not a run's and would be written over; ditto never "
                            "replaces a file it did not write: move {} away, or choose another folder",
                            out, listed(clashing), clashing.size() == 1 ? "is" : "are",
                            clashing.size() == 1 ? "it" : "them"));
}

void require_resumable(const std::string& dir, const RunFolderState& s) {
  if (!s.is_folder) throw Error(fmt::format("--resume: '{}' is not a folder", dir));
  if (s.published) return;
  if (s.unpublished)
    throw Error(fmt::format("--resume: '{}' holds no finished epoch: its run was stopped before its first epoch ended, "
                            "so there is nothing to continue; start it again without --resume (the same --out is fine)",
                            dir));
  throw Error(fmt::format("--resume: '{}' holds no run (no manifest.json)", dir));
}

}  // namespace

std::string shell_word(const std::string& s) {
  const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("-_./:=@,+%", c);
  });
  if (plain) return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// ---- defining flags -----------------------------------------------------------------------------

std::vector<DefiningFlag> defining_flags(const TrainConfig& c) {
  std::vector<DefiningFlag> f;
  auto add = [&](const char* flag, std::string value, Kind kind = Kind::Training, Form form = Form::Value) {
    f.push_back({flag, std::move(value), kind, form});
  };
  auto on_off = [](bool b) { return std::string(b ? "on" : "off"); };
  add("--model", c.model);
  add("--dataset", c.dataset);
  if (!c.data.empty()) add("--data", c.data, Kind::Location);
  if (c.dataset == "synthetic") {
    // The synthetic class count has no flag: a run with another count is not replayable.
    add("--synthetic-train", fmt::format("{}", c.synthetic_train));
    add("--synthetic-test", fmt::format("{}", c.synthetic_test));
    add("--synthetic-size", fmt::format("{}", c.synthetic_size));
  } else if (c.dataset.rfind("synthetic-", 0) == 0) {
    // The task variants take the counts; their size is fixed.
    add("--synthetic-train", fmt::format("{}", c.synthetic_train));
    add("--synthetic-test", fmt::format("{}", c.synthetic_test));
  }
  if (c.dataset == "stream-folder") {
    add("--image-size", fmt::format("{}", c.image_size));
    add("--resize", fmt::format("{}", c.resize));
  }
  if (c.dataset == "celeba" || c.dataset == "celeba-attrs") {
    add("--label-attr", c.celeba_label);
    add("--subgroup-attrs", joined(c.celeba_subgroups), Kind::Training, Form::List);
  }
  add("--train-size", fmt::format("{}", c.train_size));
  add("--test-size", fmt::format("{}", c.test_size));
  add("--epochs", fmt::format("{}", c.epochs), Kind::Length);
  if (c.max_steps) add("--steps", fmt::format("{}", c.max_steps), Kind::Length);
  add("--batch-size", fmt::format("{}", c.batch_size));
  add("--lr", fmt::format("{}", c.lr));
  add("--optimizer", c.optimizer);
  add("--momentum", fmt::format("{}", c.momentum));
  add("--nesterov", on_off(c.nesterov), Kind::Training, Form::Switch);
  add("--weight-decay", fmt::format("{}", c.weight_decay));
  add("--lr-schedule", c.lr_schedule);
  add("--milestones", joined(c.milestones), Kind::Training, Form::List);
  add("--warmup-epochs", fmt::format("{}", c.warmup_epochs));
  add("--augment", on_off(c.augment), Kind::Training, Form::Switch);
  add("--standardize", on_off(c.standardize), Kind::Training, Form::Switch);
  add("--device", c.device, Kind::Kernels);
  add("--kernels", c.kernels, Kind::Kernels);
  // Only where it is not the default, so replay lines of fp32 runs read as they always have.
  if (c.precision != "fp32") add("--precision", c.precision, Kind::Kernels);
  if (c.channels_last) add("--channels-last", "on", Kind::Kernels, Form::Switch);
  if (c.native_activations) add("--native-activations", "on", Kind::Kernels, Form::Switch);
  // Only when set: the evaluation's kernels decide the predictions' last bits, not the training.
  if (c.eval_kernels != "same") add("--eval-kernels", c.eval_kernels, Kind::Kernels);
  add("--pin", joined(c.pins), Kind::Kernels, Form::Repeated);
  if (!c.tuning.empty()) add("--tuning", c.tuning, Kind::Location);
  // Only when set: a budget decides which algorithms the tuning run may write down.
  if (c.tuning_workspace_mb) add("--tuning-workspace-mb", fmt::format("{}", c.tuning_workspace_mb), Kind::Kernels);
  add("--graph", on_off(c.graph), Kind::Location, Form::Switch);
  // Recorded only when on, so the flags and replay lines of unscaled runs stay as they were.
  if (c.loss_scale != "off") add("--loss-scale", loss_scaling_name(parse_loss_scaling(c.loss_scale)));
  if (c.data_parallel()) {
    // The rank count and the buckets decide how the gradient sum is computed, as the device and
    // the kernels do (a trace comparison across rank counts is what finds an all-reduce that
    // changes bits); the groups and batch norm's mode define the training itself.
    add("--gpus", fmt::format("{}", c.gpus), Kind::Kernels);
    add("--dp-groups", fmt::format("{}", DataParallelOptions{c.gpus, c.dp_groups}.group_count()));
    add("--batchnorm", c.batchnorm);
    add("--bucket-mb", fmt::format("{}", c.bucket_mb), Kind::Kernels);
    // Recorded only when used: the ranks are processes (the bits are those of the same ranks as
    // threads; where they ran is in the manifest's data_parallel section).
    if (!c.dp_launch.empty()) add("--dp-launch", c.dp_launch, Kind::Location);
  }
  return f;
}

std::string replay_line(const TrainConfig& c, uint64_t seed_init, uint64_t seed_order, uint64_t seed_augment) {
  std::string s = "ditto-train";
  for (const auto& f : defining_flags(c)) {
    switch (f.form) {
      case Form::Value: s += " " + f.flag + " " + shell_word(f.value); break;
      case Form::Switch: if (f.value == "on") s += " " + f.flag; break;
      case Form::List:
        if (!f.value.empty()) {
          s += " " + f.flag;
          for (const auto& w : words(f.value)) s += " " + shell_word(w);
        }
        break;
      case Form::Repeated:
        for (const auto& w : words(f.value)) s += " " + f.flag + " " + shell_word(w);
        break;
    }
  }
  return s + fmt::format(" --seed-init {} --seed-order {} --seed-augment {}", seed_init, seed_order, seed_augment);
}

// ---- rules --------------------------------------------------------------------------------------

RunFolderState inspect_run_folder(const std::string& dir) {
  RunFolderState s;
  std::error_code ec;
  const fs::path root(dir);
  s.exists = fs::exists(fs::symlink_status(root, ec));
  s.is_folder = fs::is_directory(root, ec);
  if (!s.is_folder) return s;
  s.published = fs::exists(root / "manifest.json", ec) || fs::is_symlink(fs::symlink_status(root / "state", ec));
  const std::string current = fs::is_symlink(fs::symlink_status(root / "state", ec)) ? fs::read_symlink(root / "state", ec).string() : "";
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kGenerationPrefix, 0) == 0) {
      if (name != current) s.unpublished = true;
    } else if (name != kLockName && name != kRendezvousName && name != "state" && !is_run_link(entry.path())) {
      s.foreign.push_back(name);
    }
  }
  std::sort(s.foreign.begin(), s.foreign.end());
  if (s.published) {
    try {
      const std::string mpath = (root / "manifest.json").string();
      json m = parse_json_file(mpath, "the run's manifest");
      JsonFields f{mpath, m};
      s.epochs_done = f.count("results.epochs_done", 0);
      s.epochs_planned = f.count("config.epochs", 0);
    } catch (const Error& e) {
      s.epochs_done = s.epochs_planned = -1;
      s.manifest_problem = e.what();
    }
  }
  return s;
}

void check_out_allowed(const std::string& out, OutIntent intent) {
  const RunFolderState s = inspect_run_folder(out);
  if (s.exists && !s.is_folder) throw Error(fmt::format("--out: '{}' exists and is not a folder", out));
  if (intent == OutIntent::Fresh && s.published && s.epochs_done < 0)
    throw Error(fmt::format("--out: '{}' already holds a run whose manifest cannot be read ({}), so it cannot be "
                            "continued; pass --overwrite to replace it (the old run stays whole until the new one has "
                            "finished its first epoch), or choose another folder",
                            out, s.manifest_problem));
  if (intent == OutIntent::Fresh && s.published)
    throw Error(fmt::format("--out: '{}' already holds {}; pass --overwrite to replace it (the old run stays whole until "
                            "the new one has finished its first epoch), --resume {} to continue it, or choose another "
                            "folder",
                            out, describe_state(s), out));
  if (intent == OutIntent::Continue) require_resumable(out, s);
  if (!s.foreign.empty() && intent != OutIntent::Continue) refuse_foreign(out, s, intent);
  // Fail early where the folder cannot be written, before data are loaded and a net is built.
  fs::path probe = s.exists ? fs::path(out) : fs::path(out).parent_path();
  std::error_code ec;
  while (!probe.empty() && !fs::exists(probe, ec)) probe = probe.parent_path();
  if (probe.empty()) probe = ".";
  if (!fs::is_directory(probe, ec) || ::access(probe.c_str(), W_OK | X_OK) != 0)
    throw IoError(fmt::format("--out: cannot write folder '{}': '{}' is {}", out, probe.string(),
                              fs::is_directory(probe, ec) ? "not writable" : "not a folder"));
}

std::string output_path_problem(const std::string& path) {
  if (path.empty()) return "must name a file or folder, got an empty path";
  try {
    (void)json(path).dump();  // the JSON writer checks UTF-8
  } catch (const json::type_error& e) {
    return fmt::format("must be valid UTF-8 (runs record it in JSON): {}", e.what());
  }
  return "";
}

void check_output_file(const std::string& path, bool overwrite, const std::string& flag) {
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec))
    throw Error(fmt::format("{}: '{}' is a folder; name the file to write", flag, path));
  if (fs::exists(fs::symlink_status(p, ec)) && !overwrite)
    throw Error(fmt::format("{}: '{}' exists; pass --overwrite to replace it, or name another file", flag, path));
  const fs::path parent = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (!fs::is_directory(parent, ec))
    throw IoError(fmt::format("{}: cannot write '{}': folder '{}' does not exist", flag, path, parent.string()));
  if (::access(parent.c_str(), W_OK | X_OK) != 0)
    throw IoError(fmt::format("{}: cannot write '{}': folder '{}' is not writable", flag, path, parent.string()));
}

void make_output_folder(const std::string& dir, const std::string& flag) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) throw IoError(fmt::format("{}: cannot create folder '{}': {}", flag, dir, ec.message()));
}

RunDir::RunDir(const std::string& dir, OutIntent intent) : dir_(dir) {
  std::error_code ec;
  const fs::path root(dir);
  if (root.has_parent_path()) fs::create_directories(root.parent_path(), ec);
  // Only the folder this call made is removed on failure: a process that lost a race to create
  // it must not remove the winner's.
  created_ = fs::create_directory(root, ec);
  if (ec || !fs::is_directory(root))
    throw IoError(fmt::format("--out: cannot create folder '{}': {}", dir, ec ? ec.message() : "not a folder"));
  try {
    const std::string lock_path = (root / kLockName).string();
    lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock_fd_ < 0)
      throw IoError(fmt::format("--out: folder '{}' is not writable: cannot create {}: {}", dir, lock_path,
                                std::strerror(errno)));
    if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
      char buf[64] = {};
      const ssize_t n = ::pread(lock_fd_, buf, sizeof buf - 1, 0);
      std::string holder = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : "";
      while (!holder.empty() && std::isspace(static_cast<unsigned char>(holder.back()))) holder.pop_back();
      ::close(lock_fd_);
      lock_fd_ = -1;
      throw Error(fmt::format("--out: '{}' is in use by another ditto run ({}, lock file {}); wait for it to end or "
                              "choose another folder",
                              dir, holder.empty() ? "process unknown" : shown(holder), lock_path));
    }
    const std::string me = fmt::format("pid {}\n", ::getpid());
    if (::ftruncate(lock_fd_, 0) != 0 || ::pwrite(lock_fd_, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size()))
      throw IoError(fmt::format("--out: cannot write the lock file {}: {}", lock_path, std::strerror(errno)));
    // Again under the lock: another process may have published a run since the first check.
    check_out_allowed(dir, intent);
  } catch (...) {
    if (created_) fs::remove_all(root, ec);
    if (lock_fd_ >= 0) ::close(lock_fd_);
    throw;
  }
}

RunDir::~RunDir() {
  std::error_code ec;
  // What this object made and never published goes: the whole folder when it made the folder and
  // published nothing, else its unpublished generations (one a failed write left half-written,
  // after an earlier epoch was published, included).
  if (!published_ && created_) fs::remove_all(dir_, ec);
  else
    for (const auto& g : generations_) fs::remove_all(g, ec);
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

std::string RunDir::begin_generation(int epoch) {
  std::random_device rd;
  const fs::path root(dir_);
  for (;;) {
    // A name no earlier run used: the published generation of the run being replaced (the
    // same epoch number, under --overwrite) must stay whole until this one replaces it.
    const fs::path gen = root / fmt::format("{}{}-{:08x}", kGenerationPrefix, epoch, rd());
    std::error_code ec;
    if (fs::exists(fs::symlink_status(gen, ec))) continue;
    if (!fs::create_directory(gen, ec) || ec)
      throw IoError(fmt::format("--out: cannot create folder '{}': {}", gen.string(), ec.message()));
    generations_.push_back(gen.string());
    return gen.string();
  }
}

void RunDir::publish(const std::string& generation) {
  const fs::path root(dir_);
  const std::string gen_name = fs::path(generation).filename().string();
  std::set<std::string> files;
  for (const auto& entry : fs::directory_iterator(generation)) {
    const std::string name = entry.path().filename().string();
    files.insert(name);
    const fs::path link = root / name;
    if (fs::is_symlink(fs::symlink_status(link))) continue;
    if (fs::exists(fs::symlink_status(link)))  // check_out_allowed refused this; a file that came since
      throw IoError(fmt::format("{}: a file that is not this run's stands where the run publishes its {}; it is "
                                "left as it is, and the epoch's files stay in {}",
                                link.string(), name, generation));
    atomic_symlink(fs::path("state") / name, link);
  }
  atomic_symlink(gen_name, root / "state");
  published_ = true;
  generations_.erase(std::remove(generations_.begin(), generations_.end(), generation), generations_.end());
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kGenerationPrefix, 0) == 0 && name != gen_name) {
      fs::remove_all(entry.path(), ec);  // older generations, and any a killed run left
    } else if (name != "state" && !files.count(name) && fs::is_symlink(entry.symlink_status(ec))) {
      // A link to a file this generation lacks (the replaced run's checkpoint, when this run
      // writes none) would dangle, or worse, outlive its run.
      const std::string target = fs::read_symlink(entry.path(), ec).string();
      if (target.rfind("state/", 0) == 0) fs::remove(entry.path(), ec);
    }
  }
}

// ---- files --------------------------------------------------------------------------------------

std::string log_csv_text(const std::vector<EpochLog>& log, Task task) {
  std::string csv = fmt::format("epoch,lr,loss,train_acc,test_{},test_{},seconds\n", primary_score(task),
                                secondary_score(task));
  for (const auto& r : log)
    // Loss and scores as the shortest text that reads back to the same double: a run read back from its
    // folder (--resume, ditto-experiment --collect) reports exactly what the run computed.
    csv += fmt::format("{},{:.8g},{},{},{},{},{:.3f}\n", r.epoch, r.lr, r.loss, r.train_acc, r.test_top1,
                       r.test_top5, r.seconds);
  return csv;
}

std::vector<EpochLog> read_log_csv(const std::string& path) {
  std::vector<EpochLog> rows;
  std::ifstream in(path);
  if (!in) return rows;
  std::string line;
  std::getline(in, line);  // header
  int lineno = 1;
  while (std::getline(in, line)) {
    ++lineno;
    EpochLog r;
    char extra = 0;
    if (std::sscanf(line.c_str(), "%d,%lf,%lf,%lf,%lf,%lf,%lf%c", &r.epoch, &r.lr, &r.loss, &r.train_acc, &r.test_top1,
                    &r.test_top5, &r.seconds, &extra) != 7)
      throw DataError(fmt::format("{}:{}: malformed log row '{}'; expected {}", path, lineno, shown(line),
                                  "epoch,lr,loss,train_acc,test_top1,test_top5,seconds"));
    rows.push_back(r);
  }
  return rows;
}

std::string loss_scale_csv_text(const std::vector<LossScaleStep>& record) {
  std::string csv = "step,scale,overflow\n";
  for (std::size_t i = 0; i < record.size(); ++i)
    csv += fmt::format("{},{},{}\n", i + 1, record[i].scale, record[i].overflow ? 1 : 0);
  return csv;
}

std::vector<LossScaleStep> read_loss_scale_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw IoError(fmt::format("{}: cannot open the loss-scaling record", path));
  std::vector<LossScaleStep> rows;
  std::string line;
  std::getline(in, line);  // header
  for (int lineno = 2; std::getline(in, line); ++lineno) {
    long long step = 0;
    float scale = 0;
    int overflow = -1;
    char extra = 0;
    if (std::sscanf(line.c_str(), "%lld,%g,%d%c", &step, &scale, &overflow, &extra) != 3 ||
        step != static_cast<long long>(rows.size()) + 1 || (overflow != 0 && overflow != 1))
      throw DataError(fmt::format("{}:{}: malformed row '{}'; expected step {},scale,overflow (0 or 1)", path, lineno,
                                  shown(line), rows.size() + 1));
    rows.push_back({scale, overflow == 1});
  }
  return rows;
}

std::string predictions_csv_text(const Dataset& test, const std::vector<int32_t>& topk, int k) {
  std::string pred = "index,label,predicted";
  for (int j = 0; j < k; ++j) pred += fmt::format(",top{}", j + 1);
  if (test.has_subgroups()) pred += ",subgroup";
  pred += "\n";
  for (int64_t i = 0; i < test.n; ++i) {
    pred += fmt::format("{},{},{}", i, test.labels[i], topk[i * k]);
    for (int j = 0; j < k; ++j) pred += fmt::format(",{}", topk[i * k + j]);
    if (test.has_subgroups()) pred += fmt::format(",{}", test.subgroups[i]);
    pred += "\n";
  }
  return pred;
}

std::map<std::string, std::string> checkpoint_metadata(const CheckpointMeta& m) {
  std::map<std::string, std::string> out = {{"model", m.model},
                                            {"optimizer", m.optimizer},
                                            {"epoch", std::to_string(m.epoch)},
                                            {"steps", std::to_string(m.steps)},
                                            {"seed_init", std::to_string(m.seed_init)},
                                            {"seed_order", std::to_string(m.seed_order)},
                                            {"seed_augment", std::to_string(m.seed_augment)},
                                            {"weights_fingerprint", m.weights_fingerprint.hex()}};
  if (m.state_fingerprint) out["state_fingerprint"] = m.state_fingerprint->hex();
  return out;
}

CheckpointMeta parse_checkpoint_meta(const std::map<std::string, std::string>& metadata, const std::string& path) {
  auto get = [&](const char* key) -> const std::string& {
    auto it = metadata.find(key);
    if (it == metadata.end()) throw DataError(fmt::format("{}: metadata {} is missing", path, key));
    return it->second;
  };
  auto bad = [&](const char* key, const std::string& expected) {
    return DataError(fmt::format("{}: metadata {} is '{}'; expected {}", path, key, shown(get(key)), expected));
  };
  CheckpointMeta m;
  m.model = get("model");
  m.optimizer = get("optimizer");
  if (m.model.empty()) throw bad("model", "a model name");
  if (m.optimizer.empty()) throw bad("optimizer", "an optimizer name");
  auto epoch = whole_number<int>(get("epoch"));
  if (!epoch || *epoch < 1) throw bad("epoch", "the number of finished epochs, a whole number of at least 1");
  m.epoch = *epoch;
  auto steps = whole_number<int64_t>(get("steps"));
  if (!steps || *steps < 0) throw bad("steps", "the number of optimizer steps taken, a whole number of 0 or more");
  m.steps = *steps;
  for (auto [key, seed] : {std::pair{"seed_init", &m.seed_init}, std::pair{"seed_order", &m.seed_order},
                           std::pair{"seed_augment", &m.seed_augment}}) {
    auto v = whole_number<uint64_t>(get(key));
    if (!v) throw bad(key, "a seed, a whole number from 0 to 18446744073709551615");
    *seed = *v;
  }
  auto fingerprint = [&](const char* key) {
    const std::string& text = get(key);
    if (is_legacy_fingerprint(text))
      throw DataError(legacy_fingerprint_message(fmt::format("{}: metadata {}", path, key), text));
    auto fp = parse_fingerprint(text);
    if (!fp) throw bad(key, "32 lowercase hex digits");
    return *fp;
  };
  m.weights_fingerprint = fingerprint("weights_fingerprint");
  if (metadata.count("state_fingerprint")) m.state_fingerprint = fingerprint("state_fingerprint");
  return m;
}

RunManifest read_run_manifest(const std::string& path) {
  const json m = parse_json_file(path, "the run's manifest");
  if (!m.is_object()) throw DataError(fmt::format("{}: not a JSON object (is this a ditto run's manifest.json?)", path));
  JsonFields f{path, m};
  RunManifest r;
  const json* flags = f.find("flags");
  if (!flags || !flags->is_object())
    f.fail("flags", flags, "an object of the run's defining flags (a manifest written by an older ditto lacks it)");
  for (const auto& [flag, value] : flags->items()) {
    if (!value.is_string()) f.fail("flags." + flag, &value, "a string");
    r.flags[flag] = value.get<std::string>();
  }
  r.seed_init = f.unsigned64("seeds.init.value");
  r.seed_order = f.unsigned64("seeds.order.value");
  r.seed_augment = f.unsigned64("seeds.augment.value");
  r.epochs_done = f.count("results.epochs_done", 1);
  r.weights_fingerprint = f.fingerprint("results.weights_fingerprint");
  r.train_fingerprint = f.fingerprint("data.train_fingerprint");
  r.test_fingerprint = f.fingerprint("data.test_fingerprint");
  r.ops = parse_ops(m, path);
  if (const json* rt = f.find("runtime")) {
    if (!rt->is_object()) f.fail("runtime", rt, "an object (gpu, driver, cudnn, ...)");
    for (const auto& [key, value] : rt->items()) r.runtime[key] = value.is_string() ? value.get<std::string>() : value.dump();
  }
  return r;
}

std::vector<std::string> pins_from_manifest(const std::string& path) {
  return pins_from_ops(parse_ops(parse_json_file(path, "the manifest"), path));
}

std::vector<std::string> pins_from_ops(const std::vector<ManifestEntry>& ops) {
  std::vector<std::string> pins;
  for (const auto& op : ops) {
    // Convolution entries carry their precision rather than a knob entry of its own (on the CPU
    // too, whose reference rounds where bf16/fp16 say).
    const bool reference = op.variant == "cpu-reference" || op.variant == "reference";
    if (!op.variant.empty() && !reference)
      pins.push_back(fmt::format("{}.{}{}={}", op.layer, op.knob, op.shape.empty() ? "" : "@" + op.shape, op.variant));
    if (!op.precision.empty() && op.knob != "precision")
      pins.push_back(fmt::format("{}.precision={}", op.layer, op.precision));
  }
  return pins;
}

ResumePoint read_resume_point(const std::string& run_dir) {
  const fs::path dir(run_dir);
  const RunFolderState s = inspect_run_folder(run_dir);
  require_resumable(run_dir, s);
  ResumePoint r;
  r.dir = run_dir;
  r.manifest_path = (dir / "manifest.json").string();
  r.checkpoint_path = (dir / "checkpoint.safetensors").string();
  r.manifest = read_run_manifest(r.manifest_path);
  std::error_code ec;
  if (!fs::exists(r.checkpoint_path, ec))
    throw Error(fmt::format("--resume: '{}' has no checkpoint.safetensors (its run was written without checkpoints), "
                            "so it cannot be continued",
                            run_dir));
  r.checkpoint = load_safetensors(r.checkpoint_path);
  r.meta = parse_checkpoint_meta(r.checkpoint.metadata, r.checkpoint_path);
  // The three files are published together; disagreement means they were edited or mixed.
  const RunManifest& m = r.manifest;
  if (r.meta.epoch != m.epochs_done)
    throw DataError(fmt::format("{}: metadata epoch is {}, but {} has results.epochs_done {}: the files come from "
                                "different epochs",
                                r.checkpoint_path, r.meta.epoch, r.manifest_path, m.epochs_done));
  if (r.meta.weights_fingerprint != m.weights_fingerprint)
    throw DataError(fmt::format("{}: metadata weights_fingerprint is {}, but {} records {}: the files come from "
                                "different runs",
                                r.checkpoint_path, r.meta.weights_fingerprint.hex(), r.manifest_path,
                                m.weights_fingerprint.hex()));
  if (r.meta.seed_init != m.seed_init || r.meta.seed_order != m.seed_order || r.meta.seed_augment != m.seed_augment)
    throw DataError(fmt::format("{}: metadata seeds {}/{}/{} differ from {}'s {}/{}/{} (init/order/augment)",
                                r.checkpoint_path, r.meta.seed_init, r.meta.seed_order, r.meta.seed_augment,
                                r.manifest_path, m.seed_init, m.seed_order, m.seed_augment));
  const std::string log_path = (dir / "log.csv").string();
  r.log = read_log_csv(log_path);
  if (r.log.size() < static_cast<std::size_t>(r.meta.epoch))
    throw DataError(fmt::format("{}: {} rows for {} finished epochs", log_path, r.log.size(), r.meta.epoch));
  r.log.resize(static_cast<std::size_t>(r.meta.epoch));
  for (std::size_t i = 0; i < r.log.size(); ++i)
    if (r.log[i].epoch != static_cast<int>(i + 1))
      throw DataError(fmt::format("{}:{}: epoch {}; expected {}", log_path, i + 2, r.log[i].epoch, i + 1));
  read_resumed_loss_scale(r);
  return r;
}

namespace {

// The run in `dir`, whose manifest recorded `recorded`, against `cfg`'s defining flags of the
// kinds `length` adds to Training and Kernels. `action` says what was asked ("go on", "reuse it").
void check_recorded_flags(const std::string& dir, const std::map<std::string, std::string>& recorded_flags,
                          const TrainConfig& cfg, bool length, const char* action) {
  auto as_given = [](const DefiningFlag& f, const std::string& value) {
    if (f.form == Form::Switch) return (value == "on" ? "with " : "without ") + f.flag;
    return "with " + f.flag + " " + (value.empty() ? "(none)" : value);
  };
  for (const auto& f : defining_flags(cfg)) {
    if (f.kind != Kind::Training && f.kind != Kind::Kernels && !(length && f.kind == Kind::Length)) continue;
    auto it = recorded_flags.find(f.flag);
    const std::string recorded = it == recorded_flags.end() ? "(not recorded)" : it->second;
    bool same = recorded == f.value;
    // Another GPU of the same kind is the same device for the bits; CPU and GPU are not.
    if (f.flag == "--device") same = (recorded.rfind("cuda", 0) == 0) == (f.value.rfind("cuda", 0) == 0);
    if (!same)
      throw Error(fmt::format("{}: '{}' was trained {}, this run asks to {} {}. A resumed or reused run keeps every "
                              "setting that defines it, or its manifest's replay line would not reproduce it: resume "
                              "{}, or start a new run",
                              f.flag, dir, as_given(f, recorded), action, as_given(f, f.value), as_given(f, recorded)));
  }
  // Flags a run records only when it uses them: one recorded that this run lacks is a change too.
  const auto current = defining_flags(cfg);
  for (const char* flag :
       {"--gpus", "--dp-groups", "--batchnorm", "--bucket-mb", "--image-size", "--resize", "--loss-scale"}) {
    auto it = recorded_flags.find(flag);
    const bool here = std::any_of(current.begin(), current.end(), [&](const DefiningFlag& f) { return f.flag == flag; });
    if (it != recorded_flags.end() && !here)
      throw Error(fmt::format("{}: '{}' was trained with {} {}, this run asks to {} without it; resume with {} {}, or "
                              "start a new run",
                              flag, dir, flag, it->second, action, flag, it->second));
  }
}

// Seeds given by flag or fixed by a switch must be the run's own.
void check_recorded_seeds(const std::string& dir, const TrainConfig& cfg, uint64_t seed_init, uint64_t seed_order,
                          uint64_t seed_augment) {
  struct SeedCheck {
    const char* flag;
    const std::optional<uint64_t>& given;
    bool fixed;
    const char* switch_flag;
    uint64_t recorded;
  };
  for (const SeedCheck& s : {SeedCheck{"--seed-init", cfg.seed_init, cfg.deterministic_init, "--deterministic-init",
                                       seed_init},
                             SeedCheck{"--seed-order", cfg.seed_order, cfg.deterministic_input, "--deterministic-input",
                                       seed_order},
                             SeedCheck{"--seed-augment", cfg.seed_augment, cfg.deterministic_input,
                                       "--deterministic-input", seed_augment}}) {
    if (!s.given && !s.fixed) continue;  // the checkpoint's seed is taken
    const uint64_t asked = s.given ? *s.given : 0;
    if (asked != s.recorded)
      throw Error(fmt::format("{}: '{}' ran with seed {}; this run asks for {} ({}). Resume without seed flags to "
                              "continue with the run's own seeds",
                              s.given ? s.flag : s.switch_flag, dir, s.recorded, asked,
                              s.given ? std::string("by ") + s.flag : std::string("by ") + s.switch_flag));
  }
}

}  // namespace

void check_resume_flags(const ResumePoint& r, const TrainConfig& cfg) {
  check_recorded_flags(r.dir, r.manifest.flags, cfg, false, "go on");
  check_recorded_seeds(r.dir, cfg, r.meta.seed_init, r.meta.seed_order, r.meta.seed_augment);
}

void check_reused_run(const std::string& dir, const RunManifest& m, const TrainConfig& cfg) {
  check_recorded_flags(dir, m.flags, cfg, true, "reuse it");
  check_recorded_seeds(dir, cfg, m.seed_init, m.seed_order, m.seed_augment);
}

void check_resume_schedule(const ResumePoint& r, const TrainConfig& cfg, int64_t batches_per_epoch) {
  const int done = r.meta.epoch;
  if (cfg.epochs <= done)
    throw Error(fmt::format("--epochs: '{}' has finished {} epochs, and --epochs {} asks for no more: nothing to "
                            "continue; pass a larger --epochs to train on",
                            r.dir, done, cfg.epochs));
  auto it = r.manifest.flags.find("--epochs");
  const auto planned = it == r.manifest.flags.end() ? std::nullopt : whole_number<int>(it->second);
  if (!planned || *planned < 1)
    throw DataError(fmt::format("{}: field flags.--epochs is {}; expected a whole number of at least 1", r.manifest_path,
                                it == r.manifest.flags.end() ? "missing" : "'" + shown(it->second) + "'"));
  if (*planned == cfg.epochs) return;
  // Every learning rate the finished steps used must come out of the new schedule bit for bit,
  // or a replay with the new --epochs would train another run.
  const LrSchedule schedule = parse_lr_schedule(cfg.lr_schedule);
  const int64_t nb = batches_per_epoch;
  for (int e = 0; e < done; ++e)
    for (int64_t i = 0; i < nb; ++i) {
      const double at = e + double(i) / double(nb);
      const float was = lr_at(schedule, cfg.lr, at, *planned, cfg.milestones, cfg.warmup_epochs);
      const float now = lr_at(schedule, cfg.lr, at, cfg.epochs, cfg.milestones, cfg.warmup_epochs);
      if (std::memcmp(&was, &now, sizeof was) != 0)
        throw Error(fmt::format("--epochs: '{}' ran its {} epochs on a {} schedule over --epochs {}; over --epochs {} "
                                "its step {} would have had learning rate {} instead of {}, so no replay line could "
                                "reproduce the run. Resume with --epochs {}, or start a new run",
                                r.dir, done, cfg.lr_schedule, *planned, cfg.epochs, e * nb + i + 1, now, was, *planned));
    }
}

std::vector<float> flatten_weights_by_name(std::vector<std::pair<std::string, const Tensor*>> named) {
  std::sort(named.begin(), named.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<float> all;
  for (const auto& [name, t] : named) {
    if (name.rfind("optim.", 0) == 0 || t->dtype() != DType::F32) continue;
    auto v = t->to_host_f32();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

std::vector<float> load_checkpoint_weights(const std::string& run_dir) {
  auto f = load_safetensors((fs::path(run_dir) / "checkpoint.safetensors").string());
  std::vector<std::pair<std::string, const Tensor*>> named;
  for (const auto& [name, t] : f.tensors) named.push_back({name, &t});
  return flatten_weights_by_name(named);
}

TrainResult read_run_result(const std::string& run_dir, const TrainData& data, int* epochs_done) {
  const fs::path dir(run_dir);
  const RunManifest m = read_run_manifest((dir / "manifest.json").string());
  TrainResult r;
  r.seed_init = m.seed_init;
  r.seed_order = m.seed_order;
  r.seed_augment = m.seed_augment;
  r.weights_fingerprint = m.weights_fingerprint;
  r.ops = m.ops;
  if (epochs_done) *epochs_done = m.epochs_done;
  r.log = read_log_csv((dir / "log.csv").string());
  if (!r.log.empty()) r.test_top1 = r.log.back().test_top1;
  if (m.flags.count("--loss-scale")) r.loss_scale = read_loss_scale_csv((dir / "loss_scale.csv").string());
  const std::string ppath = (dir / "predictions.csv").string();
  r.task = data.test.task;
  r.class_names = data.test.class_names;
  if (r.task != Task::Classification) {
    r.units_per_example = units_per_example(data.test);
    r.predictions = read_task_predictions_csv(ppath, data.test);
    r.test_labels = unit_labels(data.test);
    if (fs::exists(dir / "checkpoint.safetensors")) r.weights = load_checkpoint_weights(run_dir);
    return r;
  }
  std::ifstream pin(ppath);
  if (!pin) throw DataError(fmt::format("{}: cannot open the run's predictions", ppath));
  std::string line;
  std::getline(pin, line);  // header
  r.predictions.assign(static_cast<std::size_t>(data.test.n), -1);
  int lineno = 1;
  while (std::getline(pin, line)) {
    ++lineno;
    long long index = 0;
    int label = 0, predicted = 0;
    if (std::sscanf(line.c_str(), "%lld,%d,%d", &index, &label, &predicted) != 3 || index < 0 || index >= data.test.n ||
        label != data.test.labels[static_cast<std::size_t>(index)])
      throw DataError(fmt::format("{}:{}: malformed row, or not a run on this test set", ppath, lineno));
    r.predictions[static_cast<std::size_t>(index)] = predicted;
  }
  for (std::size_t i = 0; i < r.predictions.size(); ++i)
    if (r.predictions[i] < 0) throw DataError(fmt::format("{}: no prediction for test example {}", ppath, i));
  if (fs::exists(dir / "checkpoint.safetensors")) r.weights = load_checkpoint_weights(run_dir);
  r.test_labels = data.test.labels;
  r.test_subgroups = data.test.subgroups;
  r.class_names = data.test.class_names;
  r.subgroup_names = data.test.subgroup_names;
  return r;
}

// ---- The ranks' meeting place ----------------------------------------------------------------

Rendezvous::Rendezvous(const std::string& run_dir, const std::string& step, bool make, double timeout_s)
    : made_(make) {
  const fs::path root = fs::path(run_dir) / kRendezvousName;
  path_ = (root / step).string();
  std::error_code ec;
  if (make) {
    if (fs::exists(path_, ec))
      throw Error(fmt::format("--dp-launch: the rendezvous folder {} exists already: another run of the same job "
                              "step met there, or one that was killed; remove it if no rank of that run is alive",
                              path_));
    fs::create_directories(path_, ec);
    if (ec) throw IoError(fmt::format("--dp-launch: cannot make the rendezvous folder {}: {}", path_, ec.message()));
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  while (!fs::is_directory(path_, ec)) {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > timeout_s)
      throw Error(fmt::format("--dp-launch: waited {:.0f} s for rank 0 to open the run folder and make {}: rank 0 "
                              "did not start, refused the run (its output says why), or cannot be seen from here "
                              "(the run folder must be on a filesystem every node shares); --dp-timeout sets the wait",
                              waited, path_));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Rendezvous::~Rendezvous() {
  if (!made_) return;
  std::error_code ec;
  fs::remove_all(path_, ec);
  const fs::path root = fs::path(path_).parent_path();
  if (fs::is_empty(root, ec)) fs::remove(root, ec);
}

}  // namespace ditto
