#include "experiments/train.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "datasets/dataset.h"
#include "datasets/loader.h"
#include "datasets/stream.h"
#include "engine/checkpoint.h"
#include "engine/context.h"
#include "engine/error.h"
#include "engine/optim.h"
#include "engine/tracer.h"
#include "engine/tuning.h"
#include "experiments/data_parallel.h"
#include "experiments/kernel_choices.h"
#include "experiments/run_dir.h"
#include "experiments/step.h"
#include "experiments/task_scoring.h"
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

// Test labels index the test set's class list, training labels the training set's: the two
// lists must be the same, or every test label means another class than it says.
void require_same_classes(const TrainData& d, const std::string& root) {
  if (d.train.class_names == d.test.class_names) return;
  std::set<std::string> train(d.train.class_names.begin(), d.train.class_names.end());
  std::set<std::string> test(d.test.class_names.begin(), d.test.class_names.end());
  std::vector<std::string> only_train, only_test;
  std::set_difference(train.begin(), train.end(), test.begin(), test.end(), std::back_inserter(only_train));
  std::set_difference(test.begin(), test.end(), train.begin(), train.end(), std::back_inserter(only_test));
  throw DataError(fmt::format("--data: the class folders of '{}/test' differ from those of '{}/train', so test labels "
                              "would name other classes than training labels; in train/ only: {}; in test/ only: {}",
                              root, root, only_train.empty() ? "none" : fmt::format("{}", fmt::join(only_train, ", ")),
                              only_test.empty() ? "none" : fmt::format("{}", fmt::join(only_test, ", "))));
}

// The digit datasets of the other tasks: -seg (segmentation), -strings (sequence) and -rt (the
// spatial transformer's rotated and translated digits, classification) of mnist and synthetic.
std::optional<Task> derived_digit_task(const std::string& dataset) {
  for (const char* base : {"mnist-", "synthetic-"}) {
    if (dataset.rfind(base, 0) != 0) continue;
    const std::string kind = dataset.substr(std::string(base).size());
    if (kind == "seg") return Task::Segmentation;
    if (kind == "strings") return Task::Sequence;
    if (kind == "rt") return Task::Classification;
  }
  return std::nullopt;
}

// The datasets read from disk need --data to name a folder.
void require_data_folder(const TrainConfig& c) {
  if (c.data.empty()) throw Error(fmt::format("--data: dataset '{}' needs a data folder", c.dataset));
  if (!fs::is_directory(c.data)) throw IoError(fmt::format("--data: '{}' is not a folder", c.data));
}

// <root>/train/<class>/*.jpg and <root>/test/<class>/*.jpg, with one class list.
TrainData load_image_folders(const std::string& root) {
  TrainData d;
  d.train = load_image_folder(root, "train");
  d.test = load_image_folder(root, "test");
  require_same_classes(d, root);
  return d;
}

// CIFAR-10's binary version, or image folders of it.
TrainData load_cifar10_data(const TrainConfig& c) {
  require_data_folder(c);
  if (fs::exists(fs::path(c.data) / "data_batch_1.bin"))
    return {load_cifar10(c.data, Split::Train), load_cifar10(c.data, Split::Test)};
  if (fs::is_directory(fs::path(c.data) / "train")) return load_image_folders(c.data);
  throw IoError(fmt::format(
      "--data: '{}' holds neither CIFAR-10's binary version (expected {}, data_batch_2..5.bin and test_batch.bin) "
      "nor image folders ({}/train/<class>/*.jpg and {}/test/<class>/*.jpg)",
      c.data, (fs::path(c.data) / "data_batch_1.bin").string(), c.data, c.data));
}

// JPEGs of any size, decoded as batches are drawn (datasets/stream.h).
TrainData load_stream_folder(const TrainConfig& c) {
  require_data_folder(c);
  StreamTransform t;
  t.size = c.image_size;
  t.resize = c.resize;
  // ImageNet's layout names the evaluation split val/.
  const std::string eval = fs::is_directory(fs::path(c.data) / "test") ? "test" : "val";
  TrainData d;
  d.train = stream_image_folder(c.data, "train", t);
  d.test = stream_image_folder(c.data, eval, t);
  require_same_classes(d, c.data);
  return d;
}

TrainData load_celeba_data(const TrainConfig& c) {
  require_data_folder(c);
  CelebAOptions o;
  o.label_attribute = c.celeba_label;
  o.subgroup_attributes = c.celeba_subgroups;
  // celeba-attrs: the attributes alone, as categorical fields (no images are read)
  auto load = c.dataset == "celeba" ? load_celeba : load_celeba_attributes;
  TrainData d;
  d.train = load(c.data, Split::Train, o);
  d.test = load(c.data, Split::Test, o);
  return d;
}

// The digits (MNIST's, or the procedural stand-ins with the data fixed by seeds 1 and 2), then the
// task's data derived from them, deterministically (seeds 1 and 2 again).
TrainData load_digit_task(const TrainConfig& c, Task derived) {
  Dataset digits[2];
  if (c.dataset.rfind("mnist-", 0) == 0) {
    require_data_folder(c);
    digits[0] = load_mnist(c.data, Split::Train);
    digits[1] = load_mnist(c.data, Split::Test);
  } else {
    digits[0] = make_synthetic_digits(c.synthetic_train, 1);
    digits[1] = make_synthetic_digits(c.synthetic_test, 2);
  }
  TrainData d;
  Dataset* out[2] = {&d.train, &d.test};
  for (int k = 0; k < 2; ++k) {
    const uint64_t seed = 1 + k;
    if (derived == Task::Segmentation) *out[k] = make_digit_segmentation(digits[k]);
    else if (derived == Task::Sequence) *out[k] = make_digit_strings(digits[k], digits[k].n, kStringMaxLength, seed);
    else *out[k] = make_rotated_translated(digits[k], kStnCanvas, kStnMaxDegrees, seed);
  }
  return d;
}

// Keeps the first --train-size / --test-size examples (0: all), checked against what the data hold.
void take_sizes(TrainData& d, const TrainConfig& c) {
  if (c.train_size < 0 || c.train_size > d.train.n)
    throw Error(fmt::format("--train-size: {} is outside 0..{}", c.train_size, d.train.n));
  if (c.test_size < 0 || c.test_size > d.test.n)
    throw Error(fmt::format("--test-size: {} is outside 0..{}", c.test_size, d.test.n));
  if (c.train_size) d.train = take_first(d.train, c.train_size);
  if (c.test_size) d.test = take_first(d.test, c.test_size);
}

TrainData load_data(const TrainConfig& c) {
  TrainData d;
  if (c.dataset == "synthetic") {
    // The data are fixed (seeds 1 and 2): only the training run's own randomness varies.
    d.train = make_synthetic(c.synthetic_train, c.synthetic_classes, 3, c.synthetic_size, c.synthetic_size, 1);
    d.test = make_synthetic(c.synthetic_test, c.synthetic_classes, 3, c.synthetic_size, c.synthetic_size, 2);
  } else if (c.dataset == "cifar10") {
    d = load_cifar10_data(c);
  } else if (c.dataset == "cifar100") {
    require_data_folder(c);
    d.train = load_cifar100(c.data, Split::Train);
    d.test = load_cifar100(c.data, Split::Test);
  } else if (c.dataset == "imagefolder") {
    require_data_folder(c);
    d = load_image_folders(c.data);
  } else if (c.dataset == "stream-folder") {
    d = load_stream_folder(c);
  } else if (c.dataset == "celeba" || c.dataset == "celeba-attrs") {
    d = load_celeba_data(c);
  } else if (c.dataset == "mnist") {
    require_data_folder(c);
    d.train = load_mnist(c.data, Split::Train);
    d.test = load_mnist(c.data, Split::Test);
  } else if (c.dataset == "synthetic-attrs") {
    d.train = make_synthetic_attributes(c.synthetic_train, kCelebAFields, 1);
    d.test = make_synthetic_attributes(c.synthetic_test, kCelebAFields, 2);
  } else if (auto derived = derived_digit_task(c.dataset)) {
    d = load_digit_task(c, *derived);
  } else {
    throw Error(fmt::format("--dataset: unknown dataset '{}'; known: {}", c.dataset, fmt::join(known_datasets(), ", ")));
  }
  take_sizes(d, c);
  return d;
}

// Every number a run takes, checked before anything is loaded: a NaN or infinite learning rate
// trains a run of NaNs that looks like any other; a size past what memory can hold wraps.
void validate_numbers(const TrainConfig& c) {
  auto whole = [](const char* flag, int64_t v, int64_t low, int64_t high) {
    if (v < low || v > high) throw Error(fmt::format("--{}: must be from {} to {}, got {}", flag, low, high, v));
  };
  auto real = [](const char* flag, double v, double low, bool low_open, double high) {
    if (!std::isfinite(v) || v < low || (low_open && v == low) || v > high)
      throw Error(fmt::format("--{}: must be a finite number {} {}{}, got {}", flag, low_open ? "above" : "of at least",
                              low, std::isinf(high) ? "" : fmt::format(" and at most {}", high), v));
  };
  whole("epochs", c.epochs, 1, 1000000);
  if (c.max_steps < 0) throw Error(fmt::format("{}: must be at least 1, got {}", c.max_steps_flag, c.max_steps));
  if (c.max_steps && !c.resume.empty())
    throw Error(fmt::format("{}: a screening run (a fixed number of steps) cannot be combined with --resume",
                            c.max_steps_flag));
  // The training set bounds the batch (set_up); this bound keeps byte counts from wrapping first.
  whole("batch-size", c.batch_size, 1, int64_t(1) << 31);
  real("lr", c.lr, 0, true, INFINITY);
  real("momentum", c.momentum, 0, false, 1);
  real("weight-decay", c.weight_decay, 0, false, INFINITY);
  real("warmup-epochs", c.warmup_epochs, 0, false, INFINITY);
  if (!(c.warmup_epochs < c.epochs))
    throw Error(fmt::format("--warmup-epochs: {} must be below --epochs ({})", c.warmup_epochs, c.epochs));
  if (c.optimizer != "adam" && c.optimizer != "sgd")
    throw Error(fmt::format("--optimizer: unknown optimizer '{}'; valid: adam, sgd", c.optimizer));
  if (c.nesterov && c.optimizer != "sgd")
    throw Error(fmt::format("--nesterov: Nesterov momentum is sgd's; this run's --optimizer is {}", c.optimizer));
  for (int m : c.milestones) whole("milestones", m, 1, 1000000);
  whole("train-size", c.train_size, 0, INT64_MAX);
  whole("test-size", c.test_size, 0, INT64_MAX);
  whole("loader-threads", c.loader_threads, 0, 64);
  whole("gpus", c.gpus, 1, 64);
  whole("dp-groups", c.dp_groups, 0, 4096);
  whole("tuning-workspace-mb", c.tuning_workspace_mb, 0, int64_t(1) << 30);
  if (c.tuning_workspace_mb && c.tuning.empty())
    throw Error("--tuning-workspace-mb: a workspace budget is a tuning file's; give --tuning FILE");
  whole("bucket-mb", c.bucket_mb, 1, 65536);
  const KnobSpec* precision = &knob_spec(OpKind{"conv2d"}, "precision");  // a pointer: see DITTO_KNOB
  if (precision->index_of(c.precision) == KnobPick::kNone)
    throw Error(fmt::format("--precision: unknown precision '{}'; valid: {}", c.precision,
                            fmt::join(precision->variant_names(), ", ")));
  if (bn_stats_knob().index_of(c.batchnorm) == KnobPick::kNone)
    throw Error(fmt::format("--batchnorm: unknown mode '{}'; valid: {}", c.batchnorm,
                            fmt::join(bn_stats_knob().variant_names(), ", ")));
  if (c.eval_kernels != "same" && c.eval_kernels != "batch-invariant")
    throw Error(fmt::format("--eval-kernels: unknown value '{}'; valid: same, batch-invariant", c.eval_kernels));
  if (c.eval_kernels == "batch-invariant" && c.precision != "fp32")
    throw Error(fmt::format("--eval-kernels batch-invariant: its kernels (conv2d fwd ditto-direct, linear gemm ditto) "
                            "compute in fp32, but --precision is {}; evaluate an fp32 run, or use --eval-kernels same",
                            c.precision));
  const LossScaling scaling = parse_loss_scaling(c.loss_scale);  // an Error naming --loss-scale
  if (c.data_parallel() && scaling.enabled())
    throw Error("--loss-scale: the data-parallel step (--gpus, --dp-groups, --batchnorm sync, --dp-launch) does not "
                "scale its loss; train it with --loss-scale off");
  if (c.data_parallel() && c.graph)
    throw Error("--graph: the data-parallel step (--gpus, --dp-groups, --batchnorm sync, --dp-launch) meets the other "
                "ranks on the host between its passes, which a CUDA graph cannot replay; train it without --graph");
  if (c.dataset == "stream-folder") {
    whole("image-size", c.image_size, 1, 8192);
    whole("resize", c.resize, c.image_size, 65535);
  }
  if (c.dataset == "synthetic") {
    // Synthetic images are made in memory: 3 x size x size floats each.
    whole("synthetic-size", c.synthetic_size, 8, 4096);
    const int64_t image_bytes = int64_t(3) * c.synthetic_size * c.synthetic_size * 4;
    const int64_t most = (int64_t(1) << 40) / image_bytes;
    whole("synthetic-train", c.synthetic_train, 1, most);
    whole("synthetic-test", c.synthetic_test, 1, most);
  } else if (c.dataset.rfind("synthetic-", 0) == 0) {
    // The task variants' examples are at most 40x40 bytes (and their int32 targets at most 28x28).
    const int64_t most = (int64_t(1) << 40) / (40 * 40 + 28 * 28 * 4);
    whole("synthetic-train", c.synthetic_train, 1, most);
    whole("synthetic-test", c.synthetic_test, 1, most);
  }
}

std::string now_utc() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
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

// One training run, in the stages train() calls in order. Each stage leaves what the next needs
// in members; nothing is written before open_run_dir, so a run refused by any check of the first
// two stages leaves no trace on disk.
class Run {
 public:
  // task: --dp-launch slurm's place of this process among the ranks (nullptr: one process).
  Run(const TrainConfig& cfg, const TrainHooks& hooks, std::shared_ptr<const TrainData> data, const SlurmTask* task)
      : cfg_(cfg), hooks_(hooks), held_(std::move(data)) {
    if (task) slurm_ = *task;
  }
  ~Run() {
    // The ranks first (their threads joined, or across processes: the others told this one
    // stopped, or that it left), then their meeting place, then the run folder's lock.
    if (dp_ && std::uncaught_exceptions() > 0) dp_->fail();
    dp_.reset();
    rendezvous_.reset();
  }
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  TrainResult go() {
    validate();
    set_up();
    open_run_dir();
    if (slurm_) join_ranks();
    resume();
    epochs();
    return finish();
  }

 private:
  // ---- Stage 1: the flags, the output folder's rules, the resumed run's files, the policy ----
  void validate() {
    validate_numbers(cfg_);
    schedule_ = parse_lr_schedule(cfg_.lr_schedule);
    device_ = Device::parse(cfg_.device);
    // Without --out, a resumed run goes on in its own folder rather than nowhere.
    out_ = cfg_.out.empty() ? cfg_.resume : cfg_.out;
    const bool in_place = !cfg_.resume.empty() && !out_.empty() && same_folder(out_, cfg_.resume);
    if (cfg_.overwrite && out_.empty()) throw Error("--overwrite: there is no --out folder to overwrite");
    if (cfg_.overwrite && in_place)
      throw Error(fmt::format("--overwrite: --resume {} continues that run in its own folder; overwriting it would "
                              "destroy what is resumed (give --out another folder, or drop --overwrite)",
                              cfg_.resume));
    intent_ = in_place ? OutIntent::Continue : cfg_.overwrite ? OutIntent::Overwrite : OutIntent::Fresh;
    if (slurm_) {
      if (out_.empty())
        throw Error("--dp-launch slurm: the ranks meet in the run folder, and rank 0 writes it; give --out (a folder "
                    "every node sees)");
      // A task given every GPU of its node takes the one of its index there (SLURM_LOCALID);
      // --device cuda:N, or a task that sees one GPU (--gpus-per-task), keeps what it names.
      if (cfg_.device == "cuda") device_ = Device::cuda(slurm_->local_id % std::max(1, cuda_device_count()));
    }
    // Only rank 0 writes the run folder; the other ranks of --dp-launch write nothing there.
    if (!out_.empty() && !follower()) check_out_allowed(out_, intent_);

    seed_init_ = pick_seed(cfg_.seed_init, cfg_.deterministic_init);
    seed_order_ = pick_seed(cfg_.seed_order, cfg_.deterministic_input);
    seed_augment_ = pick_seed(cfg_.seed_augment, cfg_.deterministic_input);
    policy_ = Policy::parse({"*=" + cfg_.kernels});
    if (!cfg_.resume.empty()) {
      resumed_ = read_resume_point(cfg_.resume);
      check_resume_flags(*resumed_, cfg_);
      if (resumed_->meta.model != cfg_.model || resumed_->meta.optimizer != cfg_.optimizer)
        throw Error(fmt::format("--resume: {} holds a {} / {} run, this run is {} / {}", resumed_->checkpoint_path,
                                resumed_->meta.model, resumed_->meta.optimizer, cfg_.model, cfg_.optimizer));
      seed_init_ = {resumed_->meta.seed_init, "checkpoint"};
      seed_order_ = {resumed_->meta.seed_order, "checkpoint"};
      seed_augment_ = {resumed_->meta.seed_augment, "checkpoint"};
      // The resumed run keeps the kernels its first part ran, so choices made by timing or by a
      // heuristic cannot change half-way; explicit pins (the same, by check_resume_flags) follow.
      // A pinned variant whose configuration cuDNN or cuBLASLt picks (the engine variant) may still
      // differ on another GPU model or library version: checked after the first step.
      for (const auto& p : pins_from_ops(resumed_->manifest.ops)) policy_.set(p);
      replayed_ops_ = resumed_->manifest.ops;
      replayed_runtime_ = resumed_->manifest.runtime;
      replayed_from_ = "--resume " + cfg_.resume;
    } else if (!cfg_.pins_from.empty()) {
      const RunManifest recorded = read_run_manifest(cfg_.pins_from);
      replayed_ops_ = recorded.ops;
      replayed_runtime_ = recorded.runtime;
      replayed_from_ = "--pins-from " + cfg_.pins_from;
    }
    // --batchnorm VALUE is the rule *.stats=VALUE (kernels/batchnorm.h); a pin for one layer is
    // more specific and wins. local is every mode's pick already, so only sync adds a rule.
    if (cfg_.batchnorm != "local") policy_.set("*.stats=" + cfg_.batchnorm);
    // --precision VALUE is the rule *.precision=VALUE likewise (fp32 is every mode's pick).
    if (cfg_.precision != "fp32") policy_.set("*.precision=" + cfg_.precision);
    if (cfg_.channels_last) policy_.set("*.layout=nhwc");
    if (cfg_.native_activations) policy_.set("*.output=native");
    for (const auto& p : cfg_.pins) policy_.set(p);
  }

  // ---- Stage 2: data, network, optimizer, loaders, tuning ----
  void set_up() {
    load_and_check_data();
    build_net();
    check_knob_layers();
    build_optimizer();
    build_loaders();
    if (cfg_.summary) print_summary();
    classes_ = held_->train.num_classes;
    k5_ = static_cast<int>(std::min<int64_t>(5, classes_));
    if (task_ != Task::Classification) unit_labels_ = unit_labels(held_->test);
    if (task_ == Task::Sequence) check_decodable(held_->train);
    if (!cfg_.tuning.empty()) set_up_tuning();
    stepper_ = std::make_unique<TrainStep>(*ctx_, *net_, *opt_, cfg_.graph, hooks_.tracer, seed_init_.value,
                                           scaler_.get());
    // The whole run's step tables at once: a graph captured at the second step then stays valid
    // to the end (growing them mid-run meant recapturing while other replicas run).
    const int64_t run_steps = int64_t(cfg_.epochs) * train_loader_->batches_per_epoch();
    if (cfg_.max_steps > run_steps)
      throw Error(fmt::format("{} {}: --epochs {} of {} batches hold only {} steps; raise --epochs, or lower {} to "
                              "at most {}",
                              cfg_.max_steps_flag, cfg_.max_steps, cfg_.epochs, train_loader_->batches_per_epoch(),
                              run_steps, cfg_.max_steps_flag, run_steps));
    opt_->reserve_steps(*ctx_, cfg_.max_steps ? std::min<int64_t>(cfg_.max_steps, run_steps) : run_steps);
    if (cfg_.data_parallel() && tuning_ && !tuning_->reading())
      throw Error(fmt::format("--tuning: '{}' does not exist yet, and tuning chooses by timing, which the ranks could "
                              "do differently; tune with one GPU first (the file is then read by every rank)",
                              cfg_.tuning));
    if (cfg_.data_parallel() && !slurm_) set_up_ranks();
  }

  // --dp-launch: a rank other than 0, which trains but neither evaluates nor writes.
  bool follower() const { return slurm_ && slurm_->rank != 0; }

  // The data (loaded unless the caller holds them), fit for the batch and, when resuming, the
  // same as the resumed run's.
  void load_and_check_data() {
    if (!held_) held_ = load_train_data(cfg_);
    const TrainData& data = *held_;
    if (cfg_.batch_size > data.train.n)
      throw Error(fmt::format("--batch-size: {} is larger than the training set ({} examples)", cfg_.batch_size,
                              data.train.n));
    if (resumed_) {
      for (auto [which, now, recorded] : {std::tuple{"training", data.train.fingerprint(), resumed_->manifest.train_fingerprint},
                                          std::tuple{"test", data.test.fingerprint(), resumed_->manifest.test_fingerprint}})
        if (now != recorded)
          throw Error(fmt::format("--resume: the {} data differ from those '{}' was trained on (fingerprint {}, the run "
                                  "recorded {}): --data, --train-size/--test-size or the data files changed",
                                  which, cfg_.resume, now.hex(), recorded.hex()));
    }
  }

  // The context and the network, checked against the data it trains on.
  void build_net() {
    const TrainData& data = *held_;
    ctx_ = std::make_unique<Context>(device_, policy_);
    // The one model that reads category ids, named in the flags' words before the net's own check.
    if (cfg_.model == "embedding-bag" && data.train.categories < 1)
      throw Error(fmt::format("--model embedding-bag reads category ids; --dataset {} holds images: train it on "
                              "--dataset celeba-attrs or synthetic-attrs",
                              cfg_.dataset));
    net_ = make_net(*ctx_, NetConfig{cfg_.model, data.train.num_classes, data.train.channels, data.train.categories});
    check_net_fits_data(*net_, data.train, cfg_.model, cfg_.dataset);
    task_ = net_->task();
    if (cfg_.augment && (task_ != Task::Classification || data.train.categories > 0))
      throw Error(fmt::format("--augment: --dataset {} has {}; a random crop and flip would move the pixels but not "
                              "their labels",
                              cfg_.dataset, data.train.categories > 0 ? "category ids, not pixels" : "per-pixel or per-column targets"));
    if (cfg_.standardize && data.train.categories > 0)
      throw Error(fmt::format("--standardize: --dataset {} holds category ids, not pixels", cfg_.dataset));
  }

  // Every layer a --pin names exists (the net's, and the data-parallel step's buckets); pins that
  // cannot choose anything on the CPU are warned about.
  void check_knob_layers() {
    const TrainData& data = *held_;
    Context& ctx = *ctx_;
    params_ = net_->params();
    auto knob_layers = net_->knob_layers();
    if (cfg_.data_parallel()) {
      // The data-parallel step (experiments/data_parallel.h) takes images and class labels.
      if (task_ != Task::Classification || data.train.categories > 0)
        throw Error(fmt::format("--gpus {}: data parallelism trains image classifiers; --model {} on --dataset {} {}",
                                cfg_.gpus, cfg_.model, cfg_.dataset,
                                data.train.categories > 0 ? "reads category ids"
                                                          : fmt::format("is a {} task", task_name(task_))));
      dp_opts_ = DataParallelOptions{cfg_.gpus, cfg_.dp_groups, int64_t(cfg_.bucket_mb) << 20};
      check_data_parallel(dp_opts_, batch_norm_stats(ctx.policy(), knob_layers), data.train.n, cfg_.batch_size, false);
      // The buckets are layers of the policy (BUCKET.algo, BUCKET.channels), checked with the net's.
      for (const auto& l : bucket_layers(make_buckets(params_, dp_opts_.bucket_bytes))) knob_layers.push_back(l);
    }
    ctx.policy().check_layers(knob_layers);
    // The CPU runs one reference implementation per op, so a pin cannot choose anything there.
    // A warning, not an error: replaying a GPU run's pins (--pins-from) on the CPU reference is
    // how one compares the two, and what ran is in the manifest either way.
    // Variants the CPU runs itself (VariantSpec::on_cpu: the all-reduce's orders on simulated
    // ranks, batch norm's statistics) do take effect there.
    for (const auto& p : cfg_.pins) {
      // "LAYER.KNOB[@SHAPE]=VALUE"; the policy has checked its form.
      const std::string lhs = p.substr(0, p.find('=')), value = p.substr(p.find('=') + 1);
      const std::string knob = lhs.substr(lhs.rfind('.') + 1, lhs.find('@') == std::string::npos
                                                                  ? std::string::npos
                                                                  : lhs.find('@') - lhs.rfind('.') - 1);
      if (!device_.is_cuda() && !runs_on_cpu(knob, value)) pins_not_applied_.push_back(p);
    }
    if (!pins_not_applied_.empty())
      warn(fmt::format("--pin: {} {} no effect on the CPU, which runs one reference implementation per op "
                       "(recorded in the manifest as policy.pins_not_applied)",
                       fmt::join(pins_not_applied_, ", "), pins_not_applied_.size() == 1 ? "has" : "have"));
  }

  // The optimizer, and everything a checkpoint holds: parameters, buffers, optimizer state
  // ("optim.<param>.<slot>").
  void build_optimizer() {
    buffers_ = net_->buffers();
    opt_ = make_optimizer(*ctx_, params_);
    const LossScaling scaling = parse_loss_scaling(cfg_.loss_scale);
    // The skip flag before state(): under it, Adam keeps its count of updates applied there.
    if (scaling.enabled()) scaler_ = std::make_unique<LossScaler>(*ctx_, scaling);
    if (scaler_) opt_->set_skip_flag(*ctx_, scaler_->found_inf());
    ostate_ = opt_->state();
    if (scaler_)
      for (auto& s : scaler_->state()) ostate_.push_back({"loss_scale." + s.name, s.tensor});
    for (auto& p : params_) state_.push_back({p.name, &p.var.value()});
    for (auto& b : buffers_) state_.push_back({b.name, b.tensor});
    for (auto& s : ostate_) state_.push_back({"optim." + s.name, s.tensor});
  }

  // The training and test loaders (rank 0's shard of each global batch when data parallel).
  void build_loaders() {
    const TrainData& data = *held_;
    stats_ = data.train.channel_stats();
    LoaderOptions train_opts;
    train_opts.batch_size = cfg_.batch_size;
    train_opts.seed_order = seed_order_.value;
    train_opts.seed_augment = seed_augment_.value;
    train_opts.augment = cfg_.augment;
    train_opts.standardize = cfg_.standardize;
    if (!cfg_.standardize && data.train.categories == 0) {
      train_opts.mean = stats_.mean;
      train_opts.std = stats_.std;
    }
    train_opts.threads = cfg_.loader_threads;
    LoaderOptions test_opts = train_opts;
    test_opts.shuffle = false;
    test_opts.augment = false;
    // Data parallel: every rank's loader keeps its rows of each global batch (rank 0's here).
    train_opts.shards = cfg_.data_parallel() ? cfg_.gpus : 1;
    if (slurm_) train_opts.shard = slurm_->rank;
    train_opts_ = train_opts;
    train_loader_ = std::make_unique<Loader>(*ctx_, data.train, train_opts);
    test_loader_ = std::make_unique<Loader>(*ctx_, data.test, test_opts);
  }

  // --summary: each layer's name, op, output shape and parameters, from one forward pass.
  void print_summary() {
    const TrainData& data = *held_;
    Context& ctx = *ctx_;
    SummaryTrace trace;
    NoGradGuard ng(ctx);
    Tensor probe = data.train.categories > 0 ? ctx.zeros({1, data.train.width}, DType::I32)
                                             : ctx.zeros({1, data.train.channels, data.train.height, data.train.width});
    net_->forward(ctx, Var(probe), false, &trace);
    ctx.manifest().clear();
    std::printf("%s", format_summary(trace, net_->param_count()).c_str());
  }

  // A tuning file is read when it exists (every deterministic conv takes its entry), else filled
  // while the run meets each problem and written at each epoch's end.
  void set_up_tuning() {
    Context& ctx = *ctx_;
    if (!ctx.is_cuda())
      throw Error(fmt::format("--tuning: a tuning file chooses cuDNN algorithms; this run is on {}", cfg_.device));
    if (cfg_.kernels != "deterministic")
      throw Error(fmt::format("--tuning: applies to --kernels deterministic; this run asks for {}", cfg_.kernels));
    const RuntimeInfo info = ctx.runtime_info();
    const std::size_t budget = std::size_t(cfg_.tuning_workspace_mb) << 20;
    if (fs::exists(cfg_.tuning)) {
      tuning_ = std::make_shared<TuningTable>(TuningTable::load(cfg_.tuning, info.gpu_name, info.cudnn));
      tuning_hash_ = tuning_->file_hash();
      // A file's entries were chosen under its own budget: another one asked for is a different
      // run, not this file silently read.
      if (cfg_.tuning_workspace_mb && tuning_->workspace_budget != budget)
        throw Error(fmt::format("--tuning-workspace-mb {}: {} was tuned with a workspace budget of {} bytes{}; tune "
                                "again into another file",
                                cfg_.tuning_workspace_mb, cfg_.tuning, tuning_->workspace_budget,
                                tuning_->workspace_budget ? "" : " (none)"));
    } else {
      tuning_ = std::make_shared<TuningTable>();
      tuning_->gpu = info.gpu_name;
      tuning_->cudnn = info.cudnn;
      tuning_->workspace_budget = budget;
    }
    ctx.set_tuning(tuning_);
  }

  std::unique_ptr<Optimizer> make_optimizer(Context& ctx, const std::vector<Param>& params) const {
    if (cfg_.optimizer == "adam")
      return std::make_unique<Adam>(ctx, params, AdamOptions{0.9f, 0.999f, 1e-8f, cfg_.weight_decay});
    return std::make_unique<Sgd>(ctx, params, SgdOptions{cfg_.momentum, cfg_.nesterov, cfg_.weight_decay});
  }

  // The other ranks of a data-parallel run: a context, network, optimizer and sharded loader each,
  // on the devices after rank 0's (or simulated CPU ranks), with rank 0's policy and tuning.
  void set_up_ranks() {
    const TrainData& data = *held_;
    if (device_.is_cuda() && device_.index + cfg_.gpus > cuda_device_count())
      throw Error(fmt::format("--gpus: {} ranks from {} need GPUs up to cuda:{}, but {} are visible", cfg_.gpus,
                              device_.str(), device_.index + cfg_.gpus - 1, cuda_device_count()));
    std::vector<RankParts> parts;
    parts.push_back({ctx_.get(), net_.get(), opt_.get(), train_loader_.get(), own_state(params_, buffers_, ostate_)});
    for (int r = 1; r < cfg_.gpus; ++r) {
      auto rank = std::make_unique<Rank>();
      const Device dev = device_.is_cuda() ? Device::cuda(device_.index + r) : Device::cpu();
      rank->ctx = std::make_unique<Context>(dev, ctx_->policy());
      if (tuning_) rank->ctx->set_tuning(tuning_);
      rank->net = make_net(*rank->ctx, NetConfig{cfg_.model, data.train.num_classes, data.train.channels});
      rank->params = rank->net->params();
      rank->buffers = rank->net->buffers();
      rank->opt = make_optimizer(*rank->ctx, rank->params);
      rank->ostate = rank->opt->state();
      LoaderOptions o = train_opts_;
      o.shard = r;
      rank->loader = std::make_unique<Loader>(*rank->ctx, data.train, o);
      parts.push_back({rank->ctx.get(), rank->net.get(), rank->opt.get(), rank->loader.get(),
                       own_state(rank->params, rank->buffers, rank->ostate)});
      ranks_.push_back(std::move(rank));
    }
    dp_ = std::make_unique<DataParallel>(parts, dp_opts_, seed_init_.value, hooks_.tracer);
  }

  // Every tensor a rank's checkpoint holds, in one order for all ranks.
  static std::vector<Tensor*> own_state(std::vector<Param>& ps, std::vector<Buffer>& bs, std::vector<Buffer>& os) {
    std::vector<Tensor*> st;
    for (auto& p : ps) st.push_back(&p.var.value());
    for (auto& b : bs) st.push_back(b.tensor);
    for (auto& o : os) st.push_back(o.tensor);
    return st;
  }

  // --dp-launch: this process's rank meets the others in the run folder's rendezvous (rank 0 makes
  // it, now that the folder is open; the others wait for it) and the data-parallel step over them
  // is built: every rank constructs it, which is their first meeting.
  void join_ranks() {
    rendezvous_ = std::make_unique<Rendezvous>(out_, slurm_->step, slurm_->rank == 0, cfg_.dp_timeout);
    std::vector<RankParts> parts{
        {ctx_.get(), net_.get(), opt_.get(), train_loader_.get(), own_state(params_, buffers_, ostate_)}};
    const ProcessRank me{slurm_->rank, slurm_->world, rendezvous_->path(), cfg_.dp_timeout};
    dp_ = std::make_unique<DataParallel>(parts, dp_opts_, seed_init_.value, hooks_.tracer, &me);
  }

  // ---- Stage 3: the output folder, locked; made only now that every check has passed ----
  void open_run_dir() {
    if (!out_.empty() && !follower()) run_dir_ = std::make_unique<RunDir>(out_, intent_);
  }

  // ---- Stage 4: the resumed run's state, verified, or a fresh initialization ----
  void resume() {
    restore_or_init();
    if (dp_) dp_->broadcast_state();  // every rank starts from rank 0's state
  }

  void restore_or_init() {
    if (!resumed_) {
      net_->init(*ctx_, seed_init_.value);
      return;
    }
    const ResumePoint& r = *resumed_;
    restore_tensors(*ctx_, r.checkpoint, r.checkpoint_path, state_);
    // The checkpoint carries the fingerprints of what was saved: a flipped bit, a NaN written into
    // a weight, or tensors from another file would otherwise train on silently.
    const Fingerprint weights = state_fingerprint(false);
    if (weights != r.meta.weights_fingerprint)
      throw DataError(fmt::format("{}: fingerprint mismatch: the weights in the file hash to {}, but its metadata "
                                  "weights_fingerprint is {}: the file was changed or damaged after it was written",
                                  r.checkpoint_path, weights.hex(), r.meta.weights_fingerprint.hex()));
    if (r.meta.state_fingerprint && state_fingerprint(true) != *r.meta.state_fingerprint)
      throw DataError(fmt::format("{}: fingerprint mismatch: the optimizer state in the file hashes to {}, but its "
                                  "metadata state_fingerprint is {}: the file was changed or damaged after it was written",
                                  r.checkpoint_path, state_fingerprint(true).hex(), r.meta.state_fingerprint->hex()));
    const int64_t nb = train_loader_->batches_per_epoch();
    if (r.meta.steps != r.meta.epoch * nb)
      throw DataError(fmt::format("{}: metadata steps is {}, but {} finished epochs of {} batches make {}",
                                  r.checkpoint_path, r.meta.steps, r.meta.epoch, nb, r.meta.epoch * nb));
    check_resume_schedule(r, cfg_, nb);
    opt_->set_steps(r.meta.steps);
    first_epoch_ = r.meta.epoch + 1;
    log_ = r.log;
    result_.loss_scale = r.loss_scale;
    result_.weights_fingerprint = weights;
  }

  // ---- Stage 5: the epochs, each published as a whole ----
  void epochs() {
    ctx_->set_tracer(hooks_.tracer);
    result_.seed_init = seed_init_.value;
    result_.seed_order = seed_order_.value;
    result_.seed_augment = seed_augment_.value;
    progress_ = std::make_unique<Progress>(cfg_.progress && !follower(), cfg_.epochs);
    loss_sum_ = ctx_->zeros({1});
    correct_ = ctx_->zeros({2}, DType::I32);
    bool steps_done = false;
    for (int epoch = first_epoch_; epoch <= cfg_.epochs && !steps_done; ++epoch) {
      steps_done = run_epoch(epoch);
      if (tuning_ && !tuning_->reading()) tuning_hash_ = tuning_->save(cfg_.tuning);
      publish(epoch);
    }
    ctx_->set_tracer(nullptr);
  }

  // Trains one epoch (or up to --steps), evaluates, logs. True when --steps ended the run.
  bool run_epoch(int epoch) {
    Context& ctx = *ctx_;
    const float lr = lr_at(schedule_, cfg_.lr, epoch - 1, cfg_.epochs, cfg_.milestones, cfg_.warmup_epochs);
    auto t0 = Clock::now();
    fill(ctx, loss_sum_, 0.0f);
    ctx.copy(correct_, Context().zeros({2}, DType::I32));
    const EpochSteps steps = train_steps(epoch, t0);
    ctx.synchronize();
    result_.train_seconds += std::chrono::duration<double>(Clock::now() - t0).count() - steps.hook_seconds;
    take_loss_scale_record();
    const auto [loss_mean, train_acc] = training_scores(steps.seen);
    double top1 = 0, top5 = 0;
    if (!follower()) score_test(epoch, top1, top5);  // rank 0 evaluates the weights every rank holds
    ctx.synchronize();
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count() - steps.hook_seconds;
    epoch_seconds_total_ += seconds;
    ++epochs_timed_;
    EpochLog row{epoch, lr, loss_mean, train_acc, top1, top5, seconds};
    log_.push_back(row);
    result_.test_top1 = row.test_top1;
    result_.weights_fingerprint = state_fingerprint(false);
    print_epoch(row, steps.seen);
    return steps.steps_done;
  }

  // The epoch's loss-scaling record, read from the device once (the steps never read it), after the
  // run's earlier steps.
  void take_loss_scale_record() {
    if (!scaler_) return;
    for (const LossScaleStep& s : scaler_->take_record(*ctx_)) result_.loss_scale.push_back(s);
  }

  // What an epoch's training steps leave for its log.
  struct EpochSteps {
    int64_t seen = 0;           // training examples (global rows) stepped on
    double hook_seconds = 0;    // time in the after_step hook, left out of the timings
    bool steps_done = false;    // --steps ended the run
  };

  // The learning rate of each of an epoch's nb steps.
  std::vector<float> step_lrs(int epoch, int64_t nb) const {
    std::vector<float> lrs;
    for (int64_t i = 0; i < nb; ++i)
      lrs.push_back(lr_at(schedule_, cfg_.lr, epoch - 1 + double(i) / double(nb), cfg_.epochs, cfg_.milestones,
                          cfg_.warmup_epochs));
    return lrs;
  }

  // One epoch's training steps (or up to --steps), each followed by the after_step hook and the
  // progress line.
  EpochSteps train_steps(int epoch, Clock::time_point t0) {
    Context& ctx = *ctx_;
    // Loader epochs are 0-based: epoch e of the run draws order and augmentation for e-1.
    train_loader_->start_epoch(epoch - 1);
    if (dp_) dp_->start_epoch(epoch - 1);
    Batch batch;
    int64_t b = 0;
    EpochSteps out;
    const int64_t nb = train_loader_->batches_per_epoch();
    const double mean_epoch = epochs_timed_ ? epoch_seconds_total_ / epochs_timed_ : 0;
    const std::vector<float> lrs = step_lrs(epoch, nb);
    if (!dp_) stepper_->plan(lrs);
    int64_t step = opt_->steps();
    auto predict = [&] { return task_ == Task::Classification ? evaluate_topk(1) : evaluate_units(); };
    while (train_loader_->next(batch)) {
      const float step_lr = lrs[static_cast<std::size_t>(b)];
      ++step;
      if (hooks_.tracer) hooks_.tracer->begin_step(step);
      if (dp_)
        dp_->step(batch.images, batch.labels, batch.global_rows, step_lr, loss_sum_, correct_);
      else
        stepper_->run(batch.images, batch.labels, step_lr, loss_sum_, correct_, {batch.targets, batch.target_lengths});
      out.seen += batch.global_rows;
      ++result_.steps;
      if (!replay_checked_) check_replayed_kernels();
      if (hooks_.after_step) {
        auto h0 = Clock::now();
        hooks_.after_step(StepView{step, epoch, ctx, params_, predict});
        out.hook_seconds += std::chrono::duration<double>(Clock::now() - h0).count();
      }
      progress_->update(epoch, ++b, nb, out.seen, t0, mean_epoch);
      if (cfg_.max_steps && result_.steps >= cfg_.max_steps) {
        out.steps_done = true;
        break;
      }
    }
    return out;
  }

  // The epoch's mean training loss and training accuracy (NaN where the task has none) over the
  // `seen` examples of every rank.
  std::pair<double, double> training_scores(int64_t seen) {
    // Data parallel: the other ranks' sums join rank 0's (for the log; they train nothing).
    const auto [other_loss, other_correct] =
        dp_ ? dp_->take_other_sums(loss_sum_, correct_) : std::pair<double, int64_t>{0, 0};
    if (dp_) dp_->check_replicas();
    const double loss_mean = (loss_sum_.to_host_f32()[0] + other_loss) / std::max<int64_t>(1, seen);
    // Training accuracy is counted on the device for classification only (experiments/task_scoring.h).
    const double train_acc = task_ == Task::Classification
                                 ? (correct_.to_host_i32()[0] + other_correct) / double(std::max<int64_t>(1, seen))
                                 : std::numeric_limits<double>::quiet_NaN();
    return {loss_mean, train_acc};
  }

  // The test set's two scores (experiments/task_scoring.h), with the metrics and predictions behind them.
  void score_test(int epoch, double& top1, double& top5) {
    if (task_ == Task::Classification) {
      score_classification(epoch, top1, top5);
      return;
    }
    unit_preds_ = evaluate_units();
    TaskScores scores = score_units(held_->test, unit_preds_);
    top1 = scores.primary;
    top5 = scores.secondary;
    metrics_ = std::move(scores.metrics);
    metrics_["epoch"] = epoch;
    result_.predictions = unit_preds_;
  }

  // The epoch's summary line under the progress bar.
  void print_epoch(const EpochLog& row, int64_t seen) {
    const std::string scores =
        task_ == Task::Classification
            ? fmt::format("train {:.4f}  test top1 {:.4f} top5 {:.4f}", row.train_acc, row.test_top1, row.test_top5)
            : fmt::format("test {} {:.4f} {} {:.4f}", primary_score(task_), row.test_top1, secondary_score(task_),
                          row.test_top5);
    progress_->line(fmt::format("epoch {}/{}  loss {:.4f}  {}  {:.1f}s  {:.0f} img/s", row.epoch, cfg_.epochs, row.loss,
                                scores, row.seconds, seen / std::max(1e-9, row.seconds)));
  }

  // Classification's test scores: top-1 / top-5 accuracy, per class and per subgroup, into
  // metrics_; the top-1 predictions into the result.
  void score_classification(int epoch, double& top1, double& top5) {
    const TrainData& data = *held_;
    top5_host_ = evaluate_topk(k5_);
    int64_t hit1 = 0, hit5 = 0;
    std::vector<int64_t> class_hit(classes_, 0), class_n(classes_, 0);
    const std::size_t groups = data.test.subgroup_names.size();
    std::vector<int64_t> group_hit(groups, 0), group_n(groups, 0);
    result_.predictions.assign(static_cast<std::size_t>(data.test.n), 0);
    for (int64_t i = 0; i < data.test.n; ++i) {
      const int32_t y = data.test.labels[i];
      const int32_t* top = &top5_host_[i * k5_];
      const bool h1 = top[0] == y;
      const bool h5 = std::find(top, top + k5_, y) != top + k5_;
      hit1 += h1;
      hit5 += h5;
      class_hit[y] += h1;
      class_n[y]++;
      if (groups) {
        group_hit[data.test.subgroups[i]] += h1;
        group_n[data.test.subgroups[i]]++;
      }
      result_.predictions[i] = top[0];
    }
    top1 = hit1 / double(data.test.n);
    top5 = hit5 / double(data.test.n);
    metrics_ = json{{"epoch", epoch}, {"test_top1", top1}, {"test_top5", top5}};
    json per_class = json::object(), per_group = json::object();
    for (int64_t c = 0; c < classes_; ++c)
      per_class[data.test.class_names.at(c)] = class_n[c] ? class_hit[c] / double(class_n[c]) : 0.0;
    for (std::size_t g = 0; g < groups; ++g)
      per_group[data.test.subgroup_names[g]] = {{"accuracy", group_n[g] ? group_hit[g] / double(group_n[g]) : 0.0},
                                                {"count", group_n[g]}};
    metrics_["per_class_accuracy"] = per_class;
    if (groups) metrics_["per_subgroup_accuracy"] = per_group;
  }

  // The evaluation's kernels for one pass (--eval-kernels): under batch-invariant, the run's policy
  // with batch_invariant_rules() laid over it and a manifest of the evaluation's own (the run's
  // manifest keeps what training ran; the evaluation's goes under "evaluation"). Restores both.
  class EvalKernels {
   public:
    EvalKernels(Context& ctx, bool on, Manifest& eval_ops) : ctx_(ctx), on_(on), eval_ops_(eval_ops) {
      if (!on_) return;
      saved_policy_ = ctx_.policy();
      for (const std::string& r : batch_invariant_rules()) ctx_.policy().set(r);
      saved_ops_ = std::move(ctx_.manifest());
      ctx_.manifest() = std::move(eval_ops_);
    }
    ~EvalKernels() {
      if (!on_) return;
      eval_ops_ = std::move(ctx_.manifest());
      ctx_.manifest() = std::move(saved_ops_);
      ctx_.policy() = std::move(saved_policy_);
    }
    EvalKernels(const EvalKernels&) = delete;
    EvalKernels& operator=(const EvalKernels&) = delete;

   private:
    Context& ctx_;
    bool on_;
    Manifest& eval_ops_;
    Policy saved_policy_;
    Manifest saved_ops_;
  };

  // The other tasks' evaluation: unit predictions (experiments/task_scoring.h) of the test set in dataset
  // order, as evaluate_topk runs it.
  std::vector<int32_t> evaluate_units() {
    const int64_t per = units_per_example(held_->test);
    std::vector<int32_t> out(static_cast<std::size_t>(held_->test.n * per), 0);
    NoGradGuard ng(*ctx_);
    EvalKernels kernels(*ctx_, cfg_.eval_kernels == "batch-invariant", eval_ops_);
    Batch eb;
    test_loader_->start_epoch(0);
    while (test_loader_->next(eb)) {
      Var y = net_->forward(*ctx_, Var(eb.images), false);
      const std::vector<int32_t> u = predict_units(task_, y.value());
      for (std::size_t r = 0; r < eb.indices.size(); ++r)
        std::copy(u.begin() + r * per, u.begin() + (r + 1) * per, out.begin() + eb.indices[r] * per);
    }
    return out;
  }

  // A sequence net's decodings must have exact codes (experiments/task_scoring.h): its output steps on an
  // input of the data's size may not exceed what a code can hold. One forward pass of zeros.
  void check_decodable(const Dataset& train) {
    NoGradGuard ng(*ctx_);
    Var y = net_->forward(*ctx_, Var(ctx_->zeros({1, train.channels, train.height, train.width})), false);
    ctx_->manifest().clear();
    const int64_t steps = y.shape().at(0), most = max_code_length(train.num_classes);
    if (steps > most)
      throw Error(fmt::format("--model {} reads {}x{} images of --dataset {} in {} steps, but a decoded string of more "
                              "than {} symbols over {} classes has no exact code; use narrower images",
                              cfg_.model, train.height, train.width, cfg_.dataset, steps, most, train.num_classes));
  }

  // Evaluation: no tape, running batch-norm statistics, dataset order. Returns k labels per
  // test example. It reads the weights and touches no training state.
  std::vector<int32_t> evaluate_topk(int k) {
    std::vector<int32_t> out(static_cast<std::size_t>(held_->test.n * k), 0);
    NoGradGuard ng(*ctx_);
    EvalKernels kernels(*ctx_, cfg_.eval_kernels == "batch-invariant", eval_ops_);
    Batch eb;
    test_loader_->start_epoch(0);
    while (test_loader_->next(eb)) {
      Var logits = net_->forward(*ctx_, Var(eb.images), false);
      auto t = topk(*ctx_, logits.value(), k).to_host_i32();
      for (std::size_t r = 0; r < eb.indices.size(); ++r)
        std::copy(t.begin() + r * k, t.begin() + (r + 1) * k, out.begin() + eb.indices[r] * k);
    }
    return out;
  }

  // ---- Stage 6: one epoch's outputs, written to a fresh generation and published at once ----
  void publish(int epoch) {
    if (!run_dir_) return;
    const TrainData& data = *held_;
    const fs::path gen = run_dir_->begin_generation(epoch);
    write_file_atomic((gen / "log.csv").string(), log_csv_text(log_, task_));
    if (scaler_) write_file_atomic((gen / "loss_scale.csv").string(), loss_scale_csv_text(result_.loss_scale));
    write_file_atomic((gen / "predictions.csv").string(), task_ == Task::Classification
                                                              ? predictions_csv_text(data.test, top5_host_, k5_)
                                                              : task_predictions_csv(data.test, unit_preds_));
    if (cfg_.checkpoint) {
      std::vector<NamedTensor> tensors;
      for (const auto& [name, t] : state_) tensors.push_back({name, *t});
      CheckpointMeta meta;
      meta.model = cfg_.model;
      meta.optimizer = cfg_.optimizer;
      meta.epoch = epoch;
      meta.steps = opt_->steps();
      meta.seed_init = seed_init_.value;
      meta.seed_order = seed_order_.value;
      meta.seed_augment = seed_augment_.value;
      meta.weights_fingerprint = result_.weights_fingerprint;
      meta.state_fingerprint = state_fingerprint(true);
      save_safetensors((gen / "checkpoint.safetensors").string(), tensors, checkpoint_metadata(meta));
    }
    write_file_atomic((gen / "manifest.json").string(), manifest(epoch).dump(2));
    write_file_atomic((gen / "metrics.json").string(), metrics_.dump(2));
    run_dir_->publish(gen.string());
  }

  json manifest(int epoch) const {
    const TrainData& data = *held_;
    const TrainConfig& c = cfg_;
    RuntimeInfo info = ctx_->runtime_info();
    json m;
    m["ditto"] = {{"git_commit", info.git_commit}, {"created", now_utc()}};
    m["command_line"] = c.command_line;
    m["replay"] = replay_line(c, seed_init_.value, seed_order_.value, seed_augment_.value);
    json flags = json::object();
    for (const auto& f : defining_flags(c)) flags[f.flag] = f.value;
    m["flags"] = flags;
    m["config"] = {{"model", c.model}, {"dataset", c.dataset}, {"data", c.data}, {"epochs", c.epochs},
                   {"max_steps", c.max_steps}, {"batch_size", c.batch_size}, {"lr", c.lr}, {"optimizer", c.optimizer},
                   {"momentum", c.momentum}, {"nesterov", c.nesterov}, {"weight_decay", c.weight_decay},
                   {"lr_schedule", c.lr_schedule}, {"warmup_epochs", c.warmup_epochs}, {"augment", c.augment},
                   {"standardize", c.standardize}, {"precision", c.precision}, {"channels_last", c.channels_last},
                   {"native_activations", c.native_activations}, {"eval_kernels", c.eval_kernels},
                   {"device", c.device}, {"train_size", data.train.n}, {"test_size", data.test.n},
                   {"resumed_from", c.resume}};
    auto seed_json = [](const Seed& s) { return json{{"value", s.value}, {"source", s.source}}; };
    m["seeds"] = {{"init", seed_json(seed_init_)}, {"order", seed_json(seed_order_)}, {"augment", seed_json(seed_augment_)}};
    m["switches"] = {{"deterministic_init", c.deterministic_init}, {"deterministic_input", c.deterministic_input},
                     {"deterministic_kernels", c.kernels == "deterministic"}};
    m["policy"] = {{"kernels", c.kernels}, {"rules", ctx_->policy().rules()}};
    if (!pins_not_applied_.empty()) m["policy"]["pins_not_applied"] = pins_not_applied_;
    if (!warnings_.empty()) m["warnings"] = warnings_;
    m["graphs"] = {{"enabled", c.graph}, {"captured", stepper_->graphs_captured()}, {"nodes", stepper_->graph_nodes()}};
    if (dp_) m["data_parallel"] = dp_->describe();
    if (scaler_) m["loss_scaling"] = loss_scaling_summary();
    if (tuning_)
      m["tuning"] = {{"file", c.tuning}, {"mode", tuning_->reading() ? "read" : "tuned by this run"},
                     {"hash", tuning_hash_.hex()}, {"entries", tuning_->entries().size()}};
    m["runtime"] = {{"device", info.device}, {"gpu", info.gpu_name}, {"driver", info.driver},
                    {"cuda_runtime", info.cuda_runtime}, {"cudnn", info.cudnn}, {"cudnn_build", info.cudnn_build},
                    {"cublas", info.cublas}};
    m["data"] = {{"train", data.train.summary()}, {"test", data.test.summary()},
                 {"streamed", data.train.streamed() ? json(data.train.source->describe()) : json(false)},
                 {"train_fingerprint", data.train.fingerprint().hex()}, {"test_fingerprint", data.test.fingerprint().hex()},
                 {"normalization", data.train.categories > 0 ? json("none: category ids")
                                   : c.standardize     ? json("per-image standardization")
                                                       : json{{"mean", stats_.mean}, {"std", stats_.std}}}};
    m["model"] = {{"name", net_->name()}, {"parameters", net_->param_count()}, {"task", task_name(task_)}};
    m["ops"] = json::parse(ctx_->manifest().to_json())["ops"];
    if (c.eval_kernels != "same")
      m["evaluation"] = {{"kernels", c.eval_kernels}, {"rules", batch_invariant_rules()},
                         {"ops", json::parse(eval_ops_.to_json())["ops"]}};
    m["results"] = {{"epochs_done", epoch}, {"weights_fingerprint", result_.weights_fingerprint.hex()},
                    {"test_top1", log_.empty() ? 0.0 : log_.back().test_top1}};
    return m;
  }

  // The manifest's account of loss scaling: the setting and what the record holds.
  json loss_scaling_summary() const {
    const LossScaling& s = scaler_->config();
    int64_t overflows = 0;
    for (const LossScaleStep& r : result_.loss_scale) overflows += r.overflow ? 1 : 0;
    return {{"setting", loss_scaling_name(s)},
            {"mode", s.mode == LossScaling::Mode::Fixed ? "fixed" : "dynamic"},
            {"init_scale", s.init_scale}, {"growth_factor", s.growth_factor}, {"backoff_factor", s.backoff_factor},
            {"growth_interval", s.growth_interval}, {"record", "loss_scale.csv"},
            {"steps", result_.loss_scale.size()}, {"overflow_steps", overflows},
            {"next_scale", scaler_->seed().to_host_f32()[0]}};
  }

  TrainResult finish() {
    std::vector<std::pair<std::string, const Tensor*>> named;
    for (const auto& [name, t] : state_) named.push_back({name, t});
    result_.weights = flatten_weights_by_name(named);
    result_.ops = ctx_->manifest().entries();
    result_.log = log_;
    result_.task = task_;
    result_.units_per_example = units_per_example(held_->test);
    result_.test_labels = task_ == Task::Classification ? held_->test.labels : unit_labels_;
    result_.test_subgroups = held_->test.subgroups;
    result_.class_names = held_->test.class_names;
    result_.subgroup_names = held_->test.subgroup_names;
    result_.warnings = warnings_;
    result_.rank = slurm_ ? slurm_->rank : 0;
    return std::move(result_);
  }

  // One fingerprint over the tensors' fingerprints in checkpoint order: parameters and buffers
  // (what TrainResult reports), or with the optimizer state too.
  Fingerprint state_fingerprint(bool with_optimizer) const {
    Hasher h;
    for (const auto& [name, t] : state_)
      if (with_optimizer || name.rfind("optim.", 0) != 0) h.add(name).add(t->fingerprint());
    return h.digest();
  }

  // After the first step every kernel of a training step is in the manifest: a replay (--resume,
  // --pins-from) whose pinned variant ran in another configuration than the recorded run's is not the
  // run it claims to continue or repeat. An error, before any epoch of it is published.
  void check_replayed_kernels() {
    replay_checked_ = true;
    if (replayed_ops_.empty()) return;
    const std::vector<std::string> differ = replay_mismatches(replayed_ops_, ctx_->manifest());
    if (differ.empty()) return;
    const RuntimeInfo now = ctx_->runtime_info();
    auto field = [&](const char* key) {
      auto it = replayed_runtime_.find(key);
      return it == replayed_runtime_.end() || it->second.empty() ? std::string("?") : it->second;
    };
    const std::size_t shown = std::min<std::size_t>(differ.size(), 6);
    throw Error(fmt::format(
        "{}: {} kernel{} ran in another configuration than the recorded run's: {}{}. The recorded run ran on {} "
        "(cuDNN {}, cuBLAS {}), this one on {} (cuDNN {}, cuBLAS {}); cuDNN's heuristic and cuBLASLt pick "
        "configurations per GPU model and library version, so this is not the recorded run: {} on the recorded "
        "GPU model and libraries (ditto-diverge kernels compares two runs' choices)",
        replayed_from_, differ.size(), differ.size() == 1 ? "" : "s",
        fmt::join(differ.begin(), differ.begin() + std::ptrdiff_t(shown), "; "),
        differ.size() > shown ? fmt::format("; and {} more", differ.size() - shown) : "", field("gpu"), field("cudnn"),
        field("cublas"), now.gpu_name, now.cudnn, now.cublas,
        resumed_ ? "resume it" : "replay it"));
  }

  void warn(const std::string& text) {
    warnings_.push_back(text);
    std::fprintf(stderr, "ditto: warning: %s\n", text.c_str());
  }

  static bool same_folder(const std::string& a, const std::string& b) {
    std::error_code ec;
    if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec);
    return fs::weakly_canonical(a, ec) == fs::weakly_canonical(b, ec);
  }

  const TrainConfig& cfg_;
  const TrainHooks& hooks_;
  std::shared_ptr<const TrainData> held_;
  // validate
  LrSchedule schedule_ = LrSchedule::Constant;
  Device device_;
  std::string out_;
  OutIntent intent_ = OutIntent::Fresh;
  Seed seed_init_, seed_order_, seed_augment_;
  Policy policy_;
  std::optional<ResumePoint> resumed_;
  std::vector<std::string> pins_not_applied_, warnings_;
  // The run this one replays kernel for kernel (--resume's first part, --pins-from's manifest), what
  // it ran on, and how the user named it; checked once, after the first step.
  std::vector<ManifestEntry> replayed_ops_;
  std::map<std::string, std::string> replayed_runtime_;
  std::string replayed_from_;
  bool replay_checked_ = false;
  // set_up
  std::unique_ptr<Context> ctx_;
  std::unique_ptr<Net> net_;
  std::vector<Param> params_;
  std::vector<Buffer> buffers_, ostate_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<LossScaler> scaler_;  // --loss-scale; null when off
  std::vector<std::pair<std::string, Tensor*>> state_;
  ChannelStats stats_;
  std::unique_ptr<Loader> train_loader_, test_loader_;
  int64_t classes_ = 0;
  int k5_ = 1;
  Task task_ = Task::Classification;
  std::vector<int32_t> unit_labels_, unit_preds_;  // the other tasks' test units (experiments/task_scoring.h)
  std::shared_ptr<TuningTable> tuning_;
  Fingerprint tuning_hash_;
  std::unique_ptr<TrainStep> stepper_;
  LoaderOptions train_opts_;
  // data parallelism: ranks 1..K-1 (rank 0 is the members above), and the step over all of them
  struct Rank {
    std::unique_ptr<Context> ctx;
    std::unique_ptr<Net> net;
    std::vector<Param> params;
    std::vector<Buffer> buffers, ostate;
    std::unique_ptr<Optimizer> opt;
    std::unique_ptr<Loader> loader;
  };
  DataParallelOptions dp_opts_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::unique_ptr<DataParallel> dp_;  // after ranks_: destroyed (its threads joined) first
  std::optional<SlurmTask> slurm_;     // --dp-launch slurm
  // open_run_dir, join_ranks
  std::unique_ptr<RunDir> run_dir_;
  std::unique_ptr<Rendezvous> rendezvous_;  // --dp-launch: where the ranks meet (~Run orders its end)
  // resume, epochs
  int first_epoch_ = 1;
  std::vector<EpochLog> log_;
  std::unique_ptr<Progress> progress_;
  Tensor loss_sum_, correct_;
  double epoch_seconds_total_ = 0;
  int epochs_timed_ = 0;
  std::vector<int32_t> top5_host_;
  json metrics_;
  Manifest eval_ops_;  // under --eval-kernels batch-invariant: what the evaluation ran
  TrainResult result_;
};

}  // namespace

std::string format_hms(double seconds) {
  long v = static_cast<long>(seconds + 0.5);
  return v >= 3600 ? fmt::format("{}:{:02}:{:02}", v / 3600, (v / 60) % 60, v % 60)
                   : fmt::format("{:02}:{:02}", v / 60, v % 60);
}

std::vector<float> params_to_host(const std::vector<Param>& params) {
  std::vector<float> all;
  for (const auto& p : params) {
    auto v = p.var.value().to_host_f32();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

Fingerprint params_fingerprint(const std::vector<Param>& params) {
  Hasher h;
  for (const auto& p : params) h.add(p.name).add(p.var.value().fingerprint());
  return h.digest();
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

const std::vector<std::string>& batch_invariant_rules() {
  // *.bwd=deterministic is the mode word: batch norm's deterministic kernels (inference applies
  // the running statistics per element), pooling's gather variant (ditto's argmax forward).
  static const std::vector<std::string> rules = {"*.fwd=ditto-direct", "*.gemm=ditto", "*.bwd=deterministic",
                                                 "*.layout=nchw", "*.output=fp32"};
  return rules;
}

const std::vector<std::string>& known_datasets() {
  static const std::vector<std::string> d = {
      "synthetic",     "cifar10",      "cifar100",      "imagefolder",   "stream-folder",     "celeba",
      "mnist",         "mnist-seg",    "mnist-rt",      "mnist-strings", "celeba-attrs",      "synthetic-seg",
      "synthetic-rt",  "synthetic-strings", "synthetic-attrs"};
  return d;
}

std::optional<Dataset> probe_examples(const TrainConfig& cfg) {
  const bool task_data = derived_digit_task(cfg.dataset) || cfg.dataset == "celeba-attrs" || cfg.dataset == "synthetic-attrs";
  if (!task_data) return std::nullopt;
  TrainConfig c = cfg;
  const std::string::size_type dash = c.dataset.find('-');
  c.dataset = "synthetic" + c.dataset.substr(dash);
  c.data.clear();
  c.synthetic_train = c.synthetic_test = 2;
  c.train_size = c.test_size = 0;
  return load_data(c).train;
}

std::shared_ptr<const TrainData> load_train_data(const TrainConfig& cfg) {
  return std::make_shared<const TrainData>(load_data(cfg));
}

TrainResult train(const TrainConfig& cfg, const TrainHooks& hooks, std::shared_ptr<const TrainData> data) {
  if (cfg.dp_launch.empty()) return Run(cfg, hooks, std::move(data), nullptr).go();
  // --dp-launch slurm: the rank count is the job step's; --gpus, when given, must agree.
  const SlurmTask task = slurm_task_from_environment();
  if (cfg.gpus != 1 && cfg.gpus != task.world)
    throw Error(fmt::format("--gpus {} with --dp-launch slurm: the ranks are the job step's {} tasks (SLURM_NTASKS); "
                            "each task is one rank on one device: leave --gpus out, or give {}",
                            cfg.gpus, task.world, task.world));
  TrainConfig c = cfg;
  c.gpus = task.world;
  return Run(c, hooks, std::move(data), &task).go();
}

}  // namespace ditto
