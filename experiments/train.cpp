#include "experiments/train.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "datasets/dataset.h"
#include "datasets/loader.h"
#include "engine/checkpoint.h"
#include "engine/context.h"
#include "engine/error.h"
#include "engine/optim.h"
#include "engine/tracer.h"
#include "engine/tuning.h"
#include "experiments/step.h"
#include "kernels/elementwise.h"
#include "kernels/metrics.h"
#include "nets/nets.h"

namespace ditto {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Seed {
  uint64_t value = 0;
  std::string source;  // "flag", "deterministic switch", "os", "checkpoint"
};

Seed pick_seed(const std::optional<uint64_t>& given, bool fixed) {
  if (given) return {*given, "flag"};
  if (fixed) return {0, "deterministic switch"};
  std::random_device rd;
  return {(uint64_t(rd()) << 32) ^ rd(), "os"};
}

TrainData load_data(const TrainConfig& c) {
  TrainData d;
  auto need_dir = [&] {
    if (c.data.empty()) throw Error(fmt::format("--data: dataset '{}' needs a data folder", c.dataset));
    if (!fs::is_directory(c.data)) throw IoError(fmt::format("--data: '{}' is not a folder", c.data));
  };
  if (c.dataset == "synthetic") {
    // The data are fixed (seeds 1 and 2): only the training run's own randomness varies.
    d.train = make_synthetic(c.synthetic_train, c.synthetic_classes, 3, c.synthetic_size, c.synthetic_size, 1);
    d.test = make_synthetic(c.synthetic_test, c.synthetic_classes, 3, c.synthetic_size, c.synthetic_size, 2);
  } else if (c.dataset == "cifar10") {
    need_dir();
    if (fs::exists(fs::path(c.data) / "data_batch_1.bin")) {
      d.train = load_cifar10(c.data, Split::Train);
      d.test = load_cifar10(c.data, Split::Test);
    } else {
      d.train = load_image_folder(c.data, "train");
      d.test = load_image_folder(c.data, "test");
    }
  } else if (c.dataset == "cifar100") {
    need_dir();
    d.train = load_cifar100(c.data, Split::Train);
    d.test = load_cifar100(c.data, Split::Test);
  } else if (c.dataset == "imagefolder") {
    need_dir();
    d.train = load_image_folder(c.data, "train");
    d.test = load_image_folder(c.data, "test");
  } else if (c.dataset == "celeba") {
    need_dir();
    CelebAOptions o;
    o.label_attribute = c.celeba_label;
    o.subgroup_attributes = c.celeba_subgroups;
    d.train = load_celeba(c.data, Split::Train, o);
    d.test = load_celeba(c.data, Split::Test, o);
  } else if (c.dataset == "mnist") {
    need_dir();
    d.train = load_mnist(c.data, Split::Train);
    d.test = load_mnist(c.data, Split::Test);
  } else {
    throw Error(fmt::format("--dataset: unknown dataset '{}'; known: synthetic, cifar10, cifar100, imagefolder, celeba, mnist",
                            c.dataset));
  }
  if (c.train_size < 0 || c.train_size > d.train.n)
    throw Error(fmt::format("--train-size: {} is outside 0..{}", c.train_size, d.train.n));
  if (c.test_size < 0 || c.test_size > d.test.n)
    throw Error(fmt::format("--test-size: {} is outside 0..{}", c.test_size, d.test.n));
  if (c.train_size) d.train = take_first(d.train, c.train_size);
  if (c.test_size) d.test = take_first(d.test, c.test_size);
  return d;
}

std::string now_utc() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// The flags that reproduce this run exactly (seeds made explicit).
std::string replay_command(const TrainConfig& c, const Seed& si, const Seed& so, const Seed& sa) {
  std::string s = fmt::format(
      "ditto-train --model {} --dataset {}{} --epochs {} --batch-size {} --lr {} --optimizer {} --momentum {}{} "
      "--weight-decay {} --lr-schedule {}{}{} --device {} --seed-init {} --seed-order {} --seed-augment {} --kernels {}",
      c.model, c.dataset, c.data.empty() ? "" : " --data " + c.data, c.epochs, c.batch_size, c.lr, c.optimizer,
      c.momentum, c.nesterov ? " --nesterov" : "", c.weight_decay, c.lr_schedule,
      c.warmup_epochs > 0 ? fmt::format(" --warmup-epochs {}", c.warmup_epochs) : "", c.augment ? " --augment" : "",
      c.device, si.value, so.value, sa.value, c.kernels);
  for (const auto& p : c.pins) s += " --pin " + p;
  if (!c.tuning.empty()) s += " --tuning " + c.tuning;
  if (c.graph) s += " --graph";
  if (c.standardize) s += " --standardize";
  if (c.train_size) s += fmt::format(" --train-size {}", c.train_size);
  if (c.test_size) s += fmt::format(" --test-size {}", c.test_size);
  if (c.max_steps) s += fmt::format(" --steps {}", c.max_steps);
  return s;
}

// Parameters and buffers (no optimizer state), flattened in name order.
std::vector<float> flatten_by_name(std::vector<std::pair<std::string, const Tensor*>> named) {
  std::sort(named.begin(), named.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<float> all;
  for (const auto& [name, t] : named) {
    if (name.rfind("optim.", 0) == 0 || t->dtype() != DType::F32) continue;
    auto v = t->to_host_f32();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

class Progress {
 public:
  // On a terminal the line redraws in place; in a log file a plain line every 30 s.
  Progress(bool on, int epochs) : on_(on), tty_(::isatty(::fileno(stderr)) == 1), epochs_(epochs), start_(Clock::now()) {}
  void update(int epoch, int64_t batch, int64_t batches, int64_t images, Clock::time_point epoch_start,
              double mean_epoch_s) {
    if (!on_) return;
    auto now = Clock::now();
    if (batch != batches && now - last_ < std::chrono::milliseconds(tty_ ? 500 : 30000)) return;
    if (!tty_ && batch == batches) return;  // the epoch summary line follows
    last_ = now;
    double el = std::chrono::duration<double>(now - epoch_start).count();
    double rate = el > 0 ? images / el : 0;
    double epoch_left = batch ? el / batch * (batches - batch) : 0;
    double eta = epoch_left + mean_epoch_s * (epochs_ - epoch);
    int filled = static_cast<int>(20.0 * batch / std::max<int64_t>(1, batches));
    std::fprintf(stderr, tty_ ? "\repoch %d/%d [%s%s] %lld/%lld  %.0f img/s  ETA %s  (elapsed %s)   "
                              : "epoch %d/%d [%s%s] %lld/%lld  %.0f img/s  ETA %s  (elapsed %s)\n",
                 epoch, epochs_,
                 std::string(filled, '#').c_str(), std::string(20 - filled, ' ').c_str(), (long long)batch,
                 (long long)batches, rate, format_hms(eta).c_str(),
                 format_hms(std::chrono::duration<double>(now - start_).count()).c_str());
    std::fflush(stderr);
  }
  void line(const std::string& s) {
    if (on_) std::fprintf(stderr, tty_ ? "\r%-110s\n" : "%s\n", s.c_str());
  }

 private:
  bool on_, tty_;
  int epochs_;
  Clock::time_point start_, last_{};
};

// Everything a checkpoint holds: parameters, buffers, optimizer state ("optim.<param>.<slot>").
std::vector<std::pair<std::string, Tensor*>> state_tensors(std::vector<Param>& params, std::vector<Buffer>& buffers,
                                                           std::vector<Buffer>& ostate) {
  std::vector<std::pair<std::string, Tensor*>> all;
  for (auto& p : params) all.push_back({p.name, &p.var.value()});
  for (auto& b : buffers) all.push_back({b.name, b.tensor});
  for (auto& s : ostate) all.push_back({"optim." + s.name, s.tensor});
  return all;
}

void ensure_out_dir(const std::string& out) {
  make_folder(out);
  std::string probe = (fs::path(out) / ".ditto-write-test").string();
  std::FILE* f = std::fopen(probe.c_str(), "wb");
  if (!f) throw IoError(fmt::format("--out: folder '{}' is not writable", out));
  std::fclose(f);
  std::remove(probe.c_str());
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

// A run folder holds generations (.gen-N, one epoch's complete outputs) and `state`, a link to
// the current one; every output file in the folder is a link through `state`. Publishing makes
// the links (dangling until the first publish), then swaps `state` in one rename: a reader, or
// a run killed at any moment, sees all of one epoch's files or all of the previous epoch's.
void publish_generation(const std::string& dir, const std::string& gen_name) {
  const fs::path root(dir);
  for (const auto& entry : fs::directory_iterator(root / gen_name)) {
    const std::string name = entry.path().filename().string();
    const fs::path link = root / name;
    if (!fs::is_symlink(link)) atomic_symlink(fs::path("state") / name, link);
  }
  atomic_symlink(gen_name, root / "state");
  for (const auto& entry : fs::directory_iterator(root)) {  // older generations
    const std::string name = entry.path().filename().string();
    if (name.rfind(".gen-", 0) == 0 && name != gen_name) {
      std::error_code ec;
      fs::remove_all(entry.path(), ec);
    }
  }
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
    if (std::sscanf(line.c_str(), "%d,%lf,%lf,%lf,%lf,%lf,%lf", &r.epoch, &r.lr, &r.loss, &r.train_acc, &r.test_top1,
                    &r.test_top5, &r.seconds) != 7)
      throw DataError(fmt::format("{}:{}: malformed log row", path, lineno));
    rows.push_back(r);
  }
  return rows;
}

}  // namespace

std::string format_hms(double seconds) {
  long v = static_cast<long>(seconds + 0.5);
  return v >= 3600 ? fmt::format("{}:{:02}:{:02}", v / 3600, (v / 60) % 60, v % 60)
                   : fmt::format("{:02}:{:02}", v / 60, v % 60);
}

void make_folder(const std::string& dir, const std::string& flag) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) throw IoError(fmt::format("{}: cannot create folder '{}': {}", flag, dir, ec.message()));
}

std::vector<float> params_to_host(const std::vector<Param>& params) {
  std::vector<float> all;
  for (const auto& p : params) {
    auto v = p.var.value().to_host_f32();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

uint64_t params_fingerprint(const std::vector<Param>& params) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const auto& p : params) {
    uint64_t fp = p.var.value().fingerprint();
    h = fingerprint_bytes(&fp, sizeof fp, h);
  }
  return h;
}

std::string resolve_device(const std::string& device) {
  if (device != "auto") return device;
  try {
    Context probe(Device::cuda(0));  // a CUDA context that cannot be made means no usable GPU
    return "cuda";
  } catch (const CudaError&) {
    return "cpu";
  }
}

std::vector<float> load_checkpoint_weights(const std::string& run_dir) {
  auto f = load_safetensors((fs::path(run_dir) / "checkpoint.safetensors").string());
  std::vector<std::pair<std::string, const Tensor*>> named;
  for (const auto& [name, t] : f.tensors) named.push_back({name, &t});
  return flatten_by_name(named);
}

std::vector<std::string> pins_from_manifest(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw IoError(fmt::format("{}: cannot open manifest", path));
  json m;
  try {
    m = json::parse(in);
  } catch (const json::parse_error& e) {
    throw DataError(fmt::format("{}: malformed JSON at byte {}: {}", path, e.byte, e.what()));
  }
  if (!m.contains("ops") || !m["ops"].is_array()) throw DataError(fmt::format("{}: no \"ops\" list", path));
  std::vector<std::string> pins;
  for (const auto& op : m["ops"]) {
    const std::string variant = op.value("variant", "");
    if (variant.empty() || variant == "cpu-reference" || variant == "reference") continue;
    const std::string shape = op.value("shape", "");
    pins.push_back(fmt::format("{}.{}{}={}", op.value("layer", ""), op.value("knob", ""), shape.empty() ? "" : "@" + shape,
                               variant));
    // Convolution entries carry their math mode rather than a knob entry of its own.
    const std::string math = op.value("math", "");
    if (!math.empty() && op.value("knob", "") != "math") pins.push_back(fmt::format("{}.math={}", op.value("layer", ""), math));
  }
  return pins;
}

TrainResult read_run_result(const std::string& run_dir, const TrainData& data, int* epochs_done) {
  const fs::path dir(run_dir);
  const std::string mpath = (dir / "manifest.json").string();
  std::ifstream in(mpath);
  if (!in) throw DataError(fmt::format("{}: cannot open the run's manifest", mpath));
  json m;
  try {
    m = json::parse(in);
  } catch (const json::parse_error& e) {
    throw DataError(fmt::format("{}: malformed JSON at byte {}: {}", mpath, e.byte, e.what()));
  }
  TrainResult r;
  try {
    r.seed_init = m.at("seeds").at("init").at("value").get<uint64_t>();
    r.seed_order = m.at("seeds").at("order").at("value").get<uint64_t>();
    r.seed_augment = m.at("seeds").at("augment").at("value").get<uint64_t>();
    r.weights_fingerprint = std::stoull(m.at("results").at("weights_fingerprint").get<std::string>(), nullptr, 16);
    if (epochs_done) *epochs_done = m.at("results").at("epochs_done").get<int>();
    for (const auto& op : m.at("ops")) {
      ManifestEntry e;
      e.layer = op.value("layer", "");
      e.op = op.value("op", "");
      e.knob = op.value("knob", "");
      e.variant = op.value("variant", "");
      e.requested = op.value("requested", "");
      e.math = op.value("math", "");
      e.device = op.value("device", "");
      e.shape = op.value("shape", "");
      r.ops.push_back(e);
    }
  } catch (const std::exception& e) {
    throw DataError(fmt::format("{}: {}", mpath, e.what()));
  }
  r.log = read_log_csv((dir / "log.csv").string());
  if (!r.log.empty()) r.test_top1 = r.log.back().test_top1;
  const std::string ppath = (dir / "predictions.csv").string();
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

std::shared_ptr<const TrainData> load_train_data(const TrainConfig& cfg) {
  return std::make_shared<const TrainData>(load_data(cfg));
}

TrainResult train(const TrainConfig& cfg, const TrainHooks& hooks, std::shared_ptr<const TrainData> given) {
  if (cfg.epochs < 1) throw Error(fmt::format("--epochs: must be at least 1, got {}", cfg.epochs));
  if (cfg.max_steps < 0) throw Error(fmt::format("--steps: must be at least 1, got {}", cfg.max_steps));
  if (cfg.max_steps && !cfg.resume.empty())
    throw Error("--steps: a screening run (a fixed number of steps) cannot be combined with --resume");
  if (cfg.batch_size < 1) throw Error(fmt::format("--batch-size: must be at least 1, got {}", cfg.batch_size));
  if (!(cfg.lr > 0)) throw Error(fmt::format("--lr: must be positive, got {}", cfg.lr));
  if (cfg.optimizer != "adam" && cfg.optimizer != "sgd")
    throw Error(fmt::format("--optimizer: unknown optimizer '{}'; valid: adam, sgd", cfg.optimizer));
  const LrSchedule schedule = parse_lr_schedule(cfg.lr_schedule);
  if (!(cfg.warmup_epochs >= 0 && cfg.warmup_epochs < cfg.epochs))
    throw Error(fmt::format("--warmup-epochs: {} must be at least 0 and below --epochs ({})", cfg.warmup_epochs,
                            cfg.epochs));
  const Device device = Device::parse(cfg.device);
  Policy policy = Policy::parse({"*=" + cfg.kernels});
  // A resumed run keeps the kernels the first part ran (recorded in its manifest), so choices
  // made by timing or by a heuristic cannot change half-way; explicit pins still override.
  if (!cfg.resume.empty())
    for (const auto& p : pins_from_manifest((fs::path(cfg.resume) / "manifest.json").string())) policy.set(p);
  for (const auto& p : cfg.pins) policy.set(p);
  if (!cfg.out.empty()) ensure_out_dir(cfg.out);

  Seed seed_init = pick_seed(cfg.seed_init, cfg.deterministic_init);
  Seed seed_order = pick_seed(cfg.seed_order, cfg.deterministic_input);
  Seed seed_augment = pick_seed(cfg.seed_augment, cfg.deterministic_input);

  std::shared_ptr<const TrainData> held = given ? given : load_train_data(cfg);
  const TrainData& data = *held;
  Context ctx(device, policy);
  NetConfig ncfg{cfg.model, data.train.num_classes, data.train.channels};
  std::unique_ptr<Net> net = make_net(ctx, ncfg);
  ctx.policy().check_layers(net->knob_layers());
  std::vector<Param> params = net->params();
  std::vector<Buffer> buffers = net->buffers();

  std::unique_ptr<Optimizer> opt;
  if (cfg.optimizer == "adam")
    opt = std::make_unique<Adam>(ctx, params, AdamOptions{0.9f, 0.999f, 1e-8f, cfg.weight_decay});
  else
    opt = std::make_unique<Sgd>(ctx, params, SgdOptions{cfg.momentum, cfg.nesterov, cfg.weight_decay});
  std::vector<Buffer> ostate = opt->state();
  auto all_state = state_tensors(params, buffers, ostate);

  // Resume: weights, buffers, optimizer state, step count, seeds and finished epochs come from
  // the checkpoint; the loop continues exactly where the earlier run stopped.
  int first_epoch = 1;
  std::vector<EpochLog> log;
  if (!cfg.resume.empty()) {
    std::string ck = (fs::path(cfg.resume) / "checkpoint.safetensors").string();
    SafetensorsFile f = load_safetensors(ck);
    auto meta = [&](const std::string& k) {
      auto it = f.metadata.find(k);
      if (it == f.metadata.end()) throw DataError(fmt::format("{}: metadata '{}' is missing", ck, k));
      return it->second;
    };
    if (meta("model") != cfg.model || meta("optimizer") != cfg.optimizer)
      throw Error(fmt::format("--resume: {} holds a {} / {} run, this run is {} / {}", ck, meta("model"),
                              meta("optimizer"), cfg.model, cfg.optimizer));
    restore_tensors(ctx, f, ck, all_state);
    opt->set_steps(std::stoll(meta("steps")));
    first_epoch = std::stoi(meta("epoch")) + 1;
    seed_init = {std::stoull(meta("seed_init")), "checkpoint"};
    seed_order = {std::stoull(meta("seed_order")), "checkpoint"};
    seed_augment = {std::stoull(meta("seed_augment")), "checkpoint"};
    log = read_log_csv((fs::path(cfg.resume) / "log.csv").string());
    log.resize(std::min<std::size_t>(log.size(), static_cast<std::size_t>(first_epoch - 1)));
  } else {
    net->init(ctx, seed_init.value);
  }

  ChannelStats stats = data.train.channel_stats();
  LoaderOptions train_opts;
  train_opts.batch_size = cfg.batch_size;
  train_opts.seed_order = seed_order.value;
  train_opts.seed_augment = seed_augment.value;
  train_opts.augment = cfg.augment;
  train_opts.standardize = cfg.standardize;
  if (!cfg.standardize) {
    train_opts.mean = stats.mean;
    train_opts.std = stats.std;
  }
  train_opts.threads = cfg.loader_threads;
  LoaderOptions test_opts = train_opts;
  test_opts.shuffle = false;
  test_opts.augment = false;
  Loader train_loader(ctx, data.train, train_opts);
  Loader test_loader(ctx, data.test, test_opts);

  if (cfg.summary) {
    SummaryTrace trace;
    NoGradGuard ng(ctx);
    Tensor probe = ctx.zeros({1, data.train.channels, data.train.height, data.train.width});
    net->forward(ctx, Var(probe), false, &trace);
    ctx.manifest().clear();
    std::printf("%s", format_summary(trace, net->param_count()).c_str());
  }

  const int64_t classes = data.train.num_classes;
  const int k5 = static_cast<int>(std::min<int64_t>(5, classes));
  ctx.set_tracer(hooks.tracer);
  // A tuning file is read when it exists (every deterministic conv takes its entry), else
  // filled while the run meets each problem and written at each epoch's end.
  std::shared_ptr<TuningTable> tuning;
  uint64_t tuning_hash = 0;
  if (!cfg.tuning.empty()) {
    if (!ctx.is_cuda())
      throw Error(fmt::format("--tuning: a tuning file chooses cuDNN algorithms; this run is on {}", cfg.device));
    if (cfg.kernels != "deterministic")
      throw Error(fmt::format("--tuning: applies to --kernels deterministic; this run asks for {}", cfg.kernels));
    const RuntimeInfo info = ctx.runtime_info();
    if (fs::exists(cfg.tuning)) {
      tuning = std::make_shared<TuningTable>(TuningTable::load(cfg.tuning, info.gpu_name, info.cudnn));
      tuning_hash = tuning->file_hash();
    } else {
      tuning = std::make_shared<TuningTable>();
      tuning->gpu = info.gpu_name;
      tuning->cudnn = info.cudnn;
    }
    ctx.set_tuning(tuning);
  }
  TrainResult result;
  result.seed_init = seed_init.value;
  result.seed_order = seed_order.value;
  result.seed_augment = seed_augment.value;
  Progress progress(cfg.progress, cfg.epochs);
  double epoch_seconds_total = 0;
  int epochs_timed = 0;
  std::vector<int32_t> top5_host;
  json metrics;

  Tracer* tracer = hooks.tracer;
  TrainStep stepper(ctx, *net, *opt, cfg.graph, tracer, seed_init.value);
  auto write_outputs = [&](int epoch) {
    if (cfg.out.empty()) return;
    // The epoch's files go to a fresh generation folder first; publish() then makes it the run
    // folder's state in one step, so nothing half-written is ever visible.
    const fs::path gen = fs::path(cfg.out) / fmt::format(".gen-{}", epoch);
    std::error_code gone;
    fs::remove_all(gen, gone);  // left by a run killed before it published this epoch
    make_folder(gen.string());
    const fs::path& out = gen;
    std::string csv = "epoch,lr,loss,train_acc,test_top1,test_top5,seconds\n";
    for (const auto& r : log)
      csv += fmt::format("{},{:.8g},{:.8g},{:.6f},{:.6f},{:.6f},{:.3f}\n", r.epoch, r.lr, r.loss, r.train_acc,
                         r.test_top1, r.test_top5, r.seconds);
    write_file_atomic((out / "log.csv").string(), csv);

    std::string pred = "index,label,predicted";
    for (int j = 0; j < k5; ++j) pred += fmt::format(",top{}", j + 1);
    if (data.test.has_subgroups()) pred += ",subgroup";
    pred += "\n";
    for (int64_t i = 0; i < data.test.n; ++i) {
      pred += fmt::format("{},{},{}", i, data.test.labels[i], top5_host[i * k5]);
      for (int j = 0; j < k5; ++j) pred += fmt::format(",{}", top5_host[i * k5 + j]);
      if (data.test.has_subgroups()) pred += fmt::format(",{}", data.test.subgroups[i]);
      pred += "\n";
    }
    write_file_atomic((out / "predictions.csv").string(), pred);

    std::vector<NamedTensor> tensors;
    for (const auto& [name, t] : all_state) tensors.push_back({name, *t});
    if (cfg.checkpoint)
      save_safetensors((out / "checkpoint.safetensors").string(), tensors,
                     {{"model", cfg.model},
                      {"optimizer", cfg.optimizer},
                      {"epoch", std::to_string(epoch)},
                      {"steps", std::to_string(opt->steps())},
                      {"seed_init", std::to_string(seed_init.value)},
                      {"seed_order", std::to_string(seed_order.value)},
                      {"seed_augment", std::to_string(seed_augment.value)},
                      {"weights_fingerprint", hex64(result.weights_fingerprint)}});

    RuntimeInfo info = ctx.runtime_info();
    json m;
    m["ditto"] = {{"git_commit", info.git_commit}, {"created", now_utc()}};
    m["command_line"] = cfg.command_line;
    m["replay"] = replay_command(cfg, seed_init, seed_order, seed_augment);
    m["config"] = {{"model", cfg.model}, {"dataset", cfg.dataset}, {"data", cfg.data}, {"epochs", cfg.epochs},
                   {"max_steps", cfg.max_steps}, {"batch_size", cfg.batch_size}, {"lr", cfg.lr}, {"optimizer", cfg.optimizer},
                   {"momentum", cfg.momentum}, {"nesterov", cfg.nesterov}, {"weight_decay", cfg.weight_decay},
                   {"lr_schedule", cfg.lr_schedule}, {"warmup_epochs", cfg.warmup_epochs}, {"augment", cfg.augment}, {"standardize", cfg.standardize},
                   {"device", cfg.device}, {"train_size", data.train.n}, {"test_size", data.test.n},
                   {"resumed_from", cfg.resume}};
    auto seed_json = [](const Seed& s) { return json{{"value", s.value}, {"source", s.source}}; };
    m["seeds"] = {{"init", seed_json(seed_init)}, {"order", seed_json(seed_order)}, {"augment", seed_json(seed_augment)}};
    m["switches"] = {{"deterministic_init", cfg.deterministic_init}, {"deterministic_input", cfg.deterministic_input},
                     {"deterministic_kernels", cfg.kernels == "deterministic"}};
    m["policy"] = {{"kernels", cfg.kernels}, {"rules", ctx.policy().rules()}};
    m["graphs"] = {{"enabled", cfg.graph}, {"captured", stepper.graphs_captured()}, {"nodes", stepper.graph_nodes()}};
    if (tuning)
      m["tuning"] = {{"file", cfg.tuning}, {"mode", tuning->reading() ? "read" : "tuned by this run"},
                     {"hash", hex64(tuning_hash)}, {"entries", tuning->entries().size()}};
    m["runtime"] = {{"device", info.device}, {"gpu", info.gpu_name}, {"driver", info.driver},
                    {"cuda_runtime", info.cuda_runtime}, {"cudnn", info.cudnn}, {"cudnn_build", info.cudnn_build},
                    {"cublas", info.cublas}};
    m["data"] = {{"train", data.train.summary()}, {"test", data.test.summary()},
                 {"train_fingerprint", hex64(data.train.fingerprint())}, {"test_fingerprint", hex64(data.test.fingerprint())},
                 {"normalization", cfg.standardize ? json("per-image standardization")
                                                   : json{{"mean", stats.mean}, {"std", stats.std}}}};
    m["model"] = {{"name", net->name()}, {"parameters", net->param_count()}};
    m["ops"] = json::parse(ctx.manifest().to_json())["ops"];
    m["results"] = {{"epochs_done", epoch}, {"weights_fingerprint", hex64(result.weights_fingerprint)},
                    {"test_top1", log.empty() ? 0.0 : log.back().test_top1}};
    write_file_atomic((out / "manifest.json").string(), m.dump(2));
    write_file_atomic((out / "metrics.json").string(), metrics.dump(2));
    publish_generation(cfg.out, gen.filename().string());
  };

  // Evaluation: no tape, running batch-norm statistics, dataset order. Returns k labels per
  // test example. It reads the weights and touches no training state.
  auto evaluate_topk = [&](int k) {
    std::vector<int32_t> out(static_cast<std::size_t>(data.test.n * k), 0);
    NoGradGuard ng(ctx);
    Batch eb;
    test_loader.start_epoch(0);
    while (test_loader.next(eb)) {
      Var logits = net->forward(ctx, Var(eb.images), false);
      auto t = topk(ctx, logits.value(), k).to_host_i32();
      for (std::size_t r = 0; r < eb.indices.size(); ++r)
        std::copy(t.begin() + r * k, t.begin() + (r + 1) * k, out.begin() + eb.indices[r] * k);
    }
    return out;
  };
  auto predict = [&] { return evaluate_topk(1); };

  int64_t step = opt->steps();
  bool steps_done = false;
  Tensor loss_sum = ctx.zeros({1});
  Tensor correct = ctx.zeros({2}, DType::I32);
  for (int epoch = first_epoch; epoch <= cfg.epochs && !steps_done; ++epoch) {
    const float lr = lr_at(schedule, cfg.lr, epoch - 1, cfg.epochs, cfg.milestones, cfg.warmup_epochs);
    auto t0 = Clock::now();
    fill(ctx, loss_sum, 0.0f);
    ctx.copy(correct, Context().zeros({2}, DType::I32));
    // Loader epochs are 0-based: epoch e of the run draws order and augmentation for e-1.
    train_loader.start_epoch(epoch - 1);
    Batch batch;
    int64_t b = 0, seen = 0;
    const int64_t nb = train_loader.batches_per_epoch();
    const double mean_epoch = epochs_timed ? epoch_seconds_total / epochs_timed : 0;
    double hook_seconds = 0;
    std::vector<float> lrs;
    for (int64_t i = 0; i < nb; ++i)
      lrs.push_back(
          lr_at(schedule, cfg.lr, epoch - 1 + double(i) / double(nb), cfg.epochs, cfg.milestones, cfg.warmup_epochs));
    stepper.plan(lrs);
    while (train_loader.next(batch)) {
      const float step_lr = lrs[static_cast<std::size_t>(b)];
      ++step;
      if (tracer) tracer->begin_step(step);
      stepper.run(batch.images, batch.labels, step_lr, loss_sum, correct);
      seen += batch.labels.numel();
      ++result.steps;
      if (hooks.after_step) {
        auto h0 = Clock::now();
        hooks.after_step(StepView{step, epoch, ctx, params, predict});
        hook_seconds += std::chrono::duration<double>(Clock::now() - h0).count();
      }
      progress.update(epoch, ++b, nb, seen, t0, mean_epoch);
      if (cfg.max_steps && result.steps >= cfg.max_steps) {
        steps_done = true;
        break;
      }
    }
    ctx.synchronize();
    result.train_seconds += std::chrono::duration<double>(Clock::now() - t0).count() - hook_seconds;
    double loss_mean = loss_sum.to_host_f32()[0] / std::max<int64_t>(1, seen);
    double train_acc = correct.to_host_i32()[0] / double(std::max<int64_t>(1, seen));

    top5_host = evaluate_topk(k5);
    int64_t hit1 = 0, hit5 = 0;
    std::vector<int64_t> class_hit(classes, 0), class_n(classes, 0);
    std::size_t groups = data.test.subgroup_names.size();
    std::vector<int64_t> group_hit(groups, 0), group_n(groups, 0);
    result.predictions.assign(static_cast<std::size_t>(data.test.n), 0);
    result.test_labels = data.test.labels;
    result.test_subgroups = data.test.subgroups;
    result.class_names = data.test.class_names;
    result.subgroup_names = data.test.subgroup_names;
    for (int64_t i = 0; i < data.test.n; ++i) {
      int32_t y = data.test.labels[i];
      bool h1 = top5_host[i * k5] == y;
      bool h5 = std::find(&top5_host[i * k5], &top5_host[i * k5] + k5, y) != &top5_host[i * k5] + k5;
      hit1 += h1;
      hit5 += h5;
      class_hit[y] += h1;
      class_n[y]++;
      if (groups) {
        group_hit[data.test.subgroups[i]] += h1;
        group_n[data.test.subgroups[i]]++;
      }
      result.predictions[i] = top5_host[i * k5];
    }
    ctx.synchronize();
    double seconds = std::chrono::duration<double>(Clock::now() - t0).count() - hook_seconds;
    epoch_seconds_total += seconds;
    ++epochs_timed;
    EpochLog row{epoch, lr, loss_mean, train_acc, hit1 / double(data.test.n), hit5 / double(data.test.n), seconds};
    log.push_back(row);
    result.test_top1 = row.test_top1;

    metrics = json{{"epoch", epoch}, {"test_top1", row.test_top1}, {"test_top5", row.test_top5}};
    json per_class = json::object(), per_group = json::object();
    for (int64_t c = 0; c < classes; ++c)
      per_class[data.test.class_names.at(c)] = class_n[c] ? class_hit[c] / double(class_n[c]) : 0.0;
    for (std::size_t g = 0; g < groups; ++g)
      per_group[data.test.subgroup_names[g]] = {{"accuracy", group_n[g] ? group_hit[g] / double(group_n[g]) : 0.0},
                                                {"count", group_n[g]}};
    metrics["per_class_accuracy"] = per_class;
    if (groups) metrics["per_subgroup_accuracy"] = per_group;

    uint64_t h = 0xcbf29ce484222325ull;
    for (const auto& [name, t] : all_state) {
      if (name.rfind("optim.", 0) == 0) continue;
      uint64_t fp = t->fingerprint();
      h = fingerprint_bytes(&fp, sizeof fp, h);
    }
    result.weights_fingerprint = h;
    progress.line(fmt::format("epoch {}/{}  loss {:.4f}  train {:.4f}  test top1 {:.4f} top5 {:.4f}  {:.1f}s  {:.0f} img/s",
                              epoch, cfg.epochs, row.loss, row.train_acc, row.test_top1, row.test_top5, seconds,
                              seen / std::max(1e-9, seconds)));
    if (tuning && !tuning->reading()) tuning_hash = tuning->save(cfg.tuning);
    write_outputs(epoch);
  }
  ctx.set_tracer(nullptr);
  std::vector<std::pair<std::string, const Tensor*>> named;
  for (const auto& [name, t] : all_state) named.push_back({name, t});
  result.weights = flatten_by_name(named);
  result.ops = ctx.manifest().entries();
  result.log = log;
  return result;
}

}  // namespace ditto
