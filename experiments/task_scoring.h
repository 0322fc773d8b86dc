// What the trainer does per task kind (engine/task_kind.h): the loss a training step applies to the
// net's output, what one prediction is (the "unit" that churn and stability count), how units are
// predicted, scored and written to predictions.csv, and read back.
//
//   task            unit      prediction                       scores (EpochLog test_top1 / test_top5)
//   classification  example   top-1 class                      top-1 / top-5 accuracy
//   segmentation    pixel     arg-max class                    pixel accuracy / mean IoU
//   sequence        sequence  greedy CTC decoding, as a code   sequence accuracy / character error rate
//
// Every unit is one int32, so churn (the fraction of units on which two replicas differ), the
// not-all-agree fraction, stability and the plurality vote mean the same for every task: per-pixel
// prediction churn for segmentation, per-sequence decoded-string churn for sequences. A decoded
// string is coded exactly (sequence_code): equal codes are equal strings.
//
// Training accuracy is measured on the device for classification only (kernels/metrics.h); the
// others would need a host copy of every step's output, so their EpochLog::train_acc is NaN (not
// measured) and the test scores stand for them.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "datasets/dataset.h"
#include "engine/tape.h"
#include "engine/task_kind.h"

namespace ditto {

class Context;
class Net;

// One batch's targets beside its labels (datasets/loader.h Batch); undefined for classification.
struct TaskTargets {
  Tensor targets;  // segmentation {N, H, W}; sequence {N, S}, 0-padded
  Tensor lengths;  // sequence {N}
};

// The training loss of one batch, through the knob layers task_loss_layers names:
//   classification  softmax_cross_entropy("loss", out {N, C}, labels)
//   segmentation    pixel_cross_entropy("loss", out {N, C, H, W}, targets {N, H, W})
//   sequence        reduce_mean("loss_mean", ctc_loss("loss", out {T, N, A}, targets, lengths,
//                   input_lengths)): the batch mean of the per-sequence costs
// input_lengths (sequence only): {N} i32, every entry T; the caller keeps it so that a captured
// graph replays the same buffer (ctc_input_lengths makes one). ShapeError for targets that do not
// fit the output.
Var task_loss(Context& ctx, Task task, const Var& out, const Tensor& labels, const TaskTargets& targets,
              const Tensor& input_lengths = Tensor());
Tensor ctc_input_lengths(Context& ctx, int64_t n, int64_t steps);

// ShapeError / Error naming --model and --dataset unless the net can train on the data: the same
// task kind, categorical ids for a net that takes them (and pixels for one that does not).
void check_net_fits_data(const Net& net, const Dataset& train, const std::string& model, const std::string& dataset);

const char* unit_name(Task task);             // "example", "pixel", "sequence"
// The two test scores as log.csv and the reports name them: "top1" / "top5", "pixel_accuracy" /
// "mean_iou", "sequence_accuracy" / "cer".
const char* primary_score(Task task);
const char* secondary_score(Task task);

// ---- sequences -------------------------------------------------------------------------------

// The exact code of a string of symbols in [1, num_classes): 1, then code = code * (num_classes - 1)
// + (symbol - 1) per symbol, so distinct strings have distinct codes (for the 11 classes of digit
// strings the code is "1" followed by the digits, read as a decimal number: "307" is 1307). Error
// for a symbol out of range or a string longer than max_code_length.
int32_t sequence_code(const int32_t* symbols, int length, int num_classes);
std::vector<int32_t> sequence_symbols(int32_t code, int num_classes);  // the inverse; Error for a bad code
int max_code_length(int num_classes);  // the longest string with an int32 code (9 for 11 classes)
// Levenshtein distance (unit costs) between two symbol strings.
int64_t edit_distance(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

// The character of class c in predictions.csv: '.' for class 0 (background, the blank), then
// '0'-'9' and 'a'-'z' for classes 1..36 (the digits' classes 1..10 print as their digits). Error
// past 36.
char class_symbol(int c);
std::string symbols_text(const std::vector<int32_t>& symbols);

// ---- units -----------------------------------------------------------------------------------

// The test set's unit labels: its labels (classification), its pixel targets (segmentation), the
// codes of its target strings (sequence).
std::vector<int32_t> unit_labels(const Dataset& test);
// Units per example: 1, or height * width for segmentation.
int64_t units_per_example(const Dataset& test);

// The unit predictions of one evaluation batch, on the host (one copy of the output), in row
// order: segmentation {N, C, H, W} -> N * H * W arg-max classes (ties to the lower class, as topk);
// sequence {T, N, A} -> N codes of the greedy decodings (arg-max per step, ties to the lower
// symbol, repeats merged, blanks dropped). Error for a decoding too long to code.
std::vector<int32_t> predict_units(Task task, const Tensor& out);

// The test scores of unit predictions against unit_labels(test): primary and secondary (EpochLog's
// test_top1 / test_top5) and metrics.json's body. Segmentation: pixel accuracy, mean IoU (over
// the classes present in the labels or the predictions), per-class IoU and accuracy. Sequence:
// sequence accuracy, character error rate (summed edit distance over summed label length), mean
// edit distance, accuracy per label length.
struct TaskScores {
  double primary = 0, secondary = 0;
  nlohmann::json metrics = nlohmann::json::object();
};
TaskScores score_units(const Dataset& test, const std::vector<int32_t>& predictions);

// predictions.csv of the other tasks, one row per test example:
//   segmentation  index,label,correct_pixels,target,predicted   (masks as H*W class_symbol characters)
//   sequence      index,label,target,predicted,edit_distance     (strings of class_symbol characters;
//                                                                 label is the length)
std::string task_predictions_csv(const Dataset& test, const std::vector<int32_t>& predictions);
// Reads it back as unit predictions; DataError naming the file and line for a malformed row or
// one whose label or target is not the test set's.
std::vector<int32_t> read_task_predictions_csv(const std::string& path, const Dataset& test);

}  // namespace ditto
