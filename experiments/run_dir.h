// A run folder, and every rule about it, in one place: what a folder holds, whether a run may
// write it (fresh, --overwrite, or continuing with --resume), the lock that keeps two processes
// out of one folder, how an epoch's files are published at once, and how a run is read back
// (manifest, log, predictions, checkpoint metadata) with every field checked. Nothing else in
// ditto writes a run folder; train() goes through RunDir.
//
// Layout: `.gen-<epoch>-<token>/` holds one epoch's complete outputs; `state` links to the
// current generation; manifest.json, log.csv, predictions.csv, metrics.json and
// checkpoint.safetensors are links through `state`; `.lock` holds the writer's process id;
// `.rendezvous/<step>/` is where the ranks of a run whose data-parallel ranks are processes meet
// while it runs (Rendezvous below).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/manifest.h"
#include "experiments/train.h"

namespace ditto {

// ---- The flags that define a run --------------------------------------------------------------

// One flag of ditto-train that decides what a run computes, with its value as a command line
// gives it. The one list behind the manifest's "flags", its replay line, the --resume check and
// the configuration a trace records.
struct DefiningFlag {
  enum class Kind {
    Training,  // changes the bits of every run (--lr, --batch-size, --model, data sizes, ...)
    Length,    // how long to train (--epochs, --steps)
    Kernels,   // which kernels run (--device, --kernels, --pin): what a trace comparison studies
    Location,  // where inputs live (--data, --tuning), or a switch that keeps the bits (--graph)
  };
  enum class Form { Value, Switch, List, Repeated };
  std::string flag;   // "--lr"
  std::string value;  // "0.002"; "on"/"off" for a switch; items joined by ' ' for a list or repeated flag
  Kind kind = Kind::Training;
  Form form = Form::Value;
};
std::vector<DefiningFlag> defining_flags(const TrainConfig& c);

// s as one shell word: as it is where a shell would neither split nor expand it, else single-quoted.
std::string shell_word(const std::string& s);

// The ditto-train command line that reproduces a run: every defining flag and the seeds.
std::string replay_line(const TrainConfig& c, uint64_t seed_init, uint64_t seed_order, uint64_t seed_augment);

// ---- Rules: may a run write this folder? ------------------------------------------------------

struct RunFolderState {
  bool exists = false;       // something is at the path
  bool is_folder = false;
  bool published = false;    // an epoch was published (manifest.json reachable through `state`)
  bool unpublished = false;  // a generation that was never published: a run stopped before it ended an epoch
  int epochs_done = -1;      // from the manifest; -1 when it cannot be read
  int epochs_planned = -1;
  std::string manifest_problem;  // why the manifest cannot be read, when it cannot
  // What the folder holds besides a run's own entries (.lock, .gen-*, state, and links into
  // state/): files a person put there, sorted by name.
  std::vector<std::string> foreign;
};
RunFolderState inspect_run_folder(const std::string& dir);

enum class OutIntent {
  Fresh,      // the folder is absent, or holds nothing but an unpublished run's own entries
  Overwrite,  // --overwrite: replace the run the folder holds; the old run stays whole and visible
              // until the new run publishes its first epoch. Files of others are kept, and one a
              // run would write over (run_files()) is refused even then.
  Continue,   // --resume into the same folder: it must hold a published epoch
};
// The files a run publishes in its folder (as links into its generation).
const std::vector<std::string>& run_files();

// Throws Error naming --out, --overwrite or --resume when `intent` does not fit what `out` holds:
// a run there without --overwrite or --resume; files of others there (RunFolderState::foreign)
// without --overwrite, or with it where a run would write over them. Read-only: nothing is created.
void check_out_allowed(const std::string& out, OutIntent intent);

// What is wrong with `path` as a place a tool writes (a CLI validator's message), or "": an empty
// path (which would write nothing, silently), or one that is not UTF-8 (the manifests and reports
// that record it are JSON, and the JSON library refuses it).
std::string output_path_problem(const std::string& path);

// A file a tool is about to write (a trace, say), checked before any work is done: Error naming
// `flag` when a folder stands at the path, when a file does and `overwrite` is false (a result is
// never replaced unasked), or when the folder it goes in is missing or not writable.
void check_output_file(const std::string& path, bool overwrite, const std::string& flag);

// A folder for the results of many runs (an experiment's, an attribution's, a report's), created
// with its parents. Throws IoError naming `flag` and the folder when it cannot be made or a
// non-folder stands in its place. A run folder itself is written through RunDir, which keeps its
// rules.
void make_output_folder(const std::string& dir, const std::string& flag = "--out");

// A run folder opened for writing. The constructor creates it, takes its lock (a second writer is
// refused, naming the process that holds it; a lock left by a killed process is free again, since
// the kernel drops flock locks with their process) and checks the rules again under the lock. The
// destructor releases the lock and removes what this object made and never published: the folder
// itself when it created it and published nothing, else its unpublished generations. So a refused
// or failed run leaves no empty folder behind, and a write that failed midway (a full disk) no
// half-written generation beside the last published epoch.
class RunDir {
 public:
  RunDir(const std::string& dir, OutIntent intent);
  ~RunDir();
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;

  const std::string& path() const { return dir_; }
  // A fresh, empty generation folder for epoch `epoch`'s files (never the published one).
  std::string begin_generation(int epoch);
  // Makes `generation` (from begin_generation) the folder's state in one rename, links each of its
  // files from the folder, drops links to files it lacks and removes every other generation.
  void publish(const std::string& generation);

 private:
  std::string dir_;
  int lock_fd_ = -1;
  bool created_ = false, published_ = false;
  std::vector<std::string> generations_;  // made by this object and not yet published
};

// Where the ranks of a run whose data-parallel ranks are processes meet (--dp-launch): the folder
// `.rendezvous/<step>` of its run folder, a run's own entry (never a foreign file). Rank 0 makes
// it (`make`) once it has opened the run folder: Error when the step's folder exists already.
// The other ranks wait up to timeout_s for it to appear (Error naming it, and why rank 0 may not
// have made it). Rank 0's destructor removes it, once the ranks have left (RankGroup's destructor).
class Rendezvous {
 public:
  Rendezvous(const std::string& run_dir, const std::string& step, bool make, double timeout_s);
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  bool made_ = false;
};

// ---- Files of a run folder --------------------------------------------------------------------

// The header names the task's two scores (experiments/task_scoring.h): test_top1,test_top5 for
// classification, test_pixel_accuracy,test_mean_iou and test_sequence_accuracy,test_cer otherwise.
std::string log_csv_text(const std::vector<EpochLog>& log, Task task = Task::Classification);
// DataError "path:LINE: ..." for a malformed row; an absent file is an empty log.
std::vector<EpochLog> read_log_csv(const std::string& path);
// step,scale,overflow: one row per optimizer step of a loss-scaled run (engine/loss_scale.h), the
// scale as the shortest decimal that reads back to its float, overflow 0 or 1.
std::string loss_scale_csv_text(const std::vector<LossScaleStep>& record);
// DataError "path:LINE: ..." for a malformed row or a step out of sequence; IoError when absent.
std::vector<LossScaleStep> read_loss_scale_csv(const std::string& path);
// index,label,predicted,top1..topK[,subgroup]: topk holds k labels per test example.
std::string predictions_csv_text(const Dataset& test, const std::vector<int32_t>& topk, int k);

// A training checkpoint's metadata, every field checked.
struct CheckpointMeta {
  std::string model, optimizer;
  int epoch = 0;                      // finished epochs, at least 1
  int64_t steps = 0;                  // optimizer steps taken, at least 0
  uint64_t seed_init = 0, seed_order = 0, seed_augment = 0;
  Fingerprint weights_fingerprint;    // parameters and buffers (what TrainResult reports)
  std::optional<Fingerprint> state_fingerprint;  // everything, optimizer state included
};
std::map<std::string, std::string> checkpoint_metadata(const CheckpointMeta& m);
// Throws DataError naming the file, the field and its value for a missing or malformed field, and
// for a fingerprint of the FNV-1a versions (legacy_fingerprint_message, engine/fingerprint.h).
CheckpointMeta parse_checkpoint_meta(const std::map<std::string, std::string>& metadata, const std::string& path);

// What a run's manifest.json records, checked.
struct RunManifest {
  std::map<std::string, std::string> flags;  // defining flags: "--lr" -> "0.002"
  uint64_t seed_init = 0, seed_order = 0, seed_augment = 0;
  int epochs_done = 0;
  Fingerprint weights_fingerprint;
  Fingerprint train_fingerprint, test_fingerprint;  // the data the run saw
  std::vector<ManifestEntry> ops;
  // What it ran on, from "runtime": gpu, driver, cuda_runtime, cudnn, cublas, ... (strings as
  // written; empty for a manifest without the section).
  std::map<std::string, std::string> runtime;
};
// Throws IoError when the file cannot be opened, DataError naming the file and the field (or the
// byte, for malformed JSON) otherwise; a manifest of the FNV-1a versions is refused by name.
RunManifest read_run_manifest(const std::string& manifest_path);

// Pins that reproduce every kernel choice a run made: one "layer.knob[@shape]=variant" per
// manifest entry (entries of the CPU reference, which has no variants, are skipped). With them a
// replay runs the same algorithms even where the original chose by timing (`fastest`) or where
// another cuDNN would rank algorithms differently. Throws like read_run_manifest.
std::vector<std::string> pins_from_manifest(const std::string& manifest_path);
std::vector<std::string> pins_from_ops(const std::vector<ManifestEntry>& ops);

// Everything --resume continues from, read and checked: the manifest, the checkpoint (tensors and
// metadata), the log of the finished epochs; they must agree with each other. Throws Error naming
// --resume for a folder with nothing to continue (no run, no finished epoch, no checkpoint),
// DataError naming the file, field and value for anything malformed or inconsistent.
struct ResumePoint {
  std::string dir, manifest_path, checkpoint_path;
  RunManifest manifest;
  SafetensorsFile checkpoint;
  CheckpointMeta meta;
  std::vector<EpochLog> log;  // rows of the finished epochs
  std::vector<LossScaleStep> loss_scale;  // a loss-scaled run's record of its finished steps
};
ResumePoint read_resume_point(const std::string& run_dir);

// A resumed run must compute what the original would have: every Training and Kernels flag as
// recorded, seeds given by flag or switch equal to the checkpoint's. Throws Error naming the flag
// and both values. (--epochs may grow: check_resume_schedule.)
void check_resume_flags(const ResumePoint& r, const TrainConfig& cfg);
// A finished run taken as it is for `cfg` (ditto-experiment --resume keeps finished replicas): the
// same rules, and the same --epochs / --steps. Throws Error naming the flag and both values.
void check_reused_run(const std::string& dir, const RunManifest& m, const TrainConfig& cfg);
// --epochs may change only where the learning rates of the finished steps stay bit-identical (not
// for a cosine schedule, which spans all epochs) and must exceed the finished epochs.
void check_resume_schedule(const ResumePoint& r, const TrainConfig& cfg, int64_t batches_per_epoch);

// Parameters and buffers (names starting "optim." and non-f32 tensors left out), flattened in name
// order: TrainResult::weights.
std::vector<float> flatten_weights_by_name(std::vector<std::pair<std::string, const Tensor*>> named);

// Every parameter and buffer of a run folder's checkpoint, flattened in name order (optimizer
// state left out), as TrainResult::weights holds them.
std::vector<float> load_checkpoint_weights(const std::string& run_dir);

// What a finished run folder holds, as train() returned it: log, seeds, weights fingerprint,
// final predictions, weights (from the checkpoint; empty without one) and the kernels that ran;
// labels, subgroups and names from data (the run's test set), whose task says how predictions.csv
// reads (experiments/task_scoring.h). epochs_done: how many epochs the
// folder's state has finished. Throws DataError naming the file for a missing or malformed one.
TrainResult read_run_result(const std::string& run_dir, const TrainData& data, int* epochs_done = nullptr);

}  // namespace ditto
