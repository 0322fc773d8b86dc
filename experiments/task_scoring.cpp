#include "experiments/task_scoring.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "engine/context.h"
#include "engine/error.h"
#include "kernels/ctc.h"
#include "kernels/loss.h"
#include "kernels/pixel_xent.h"
#include "kernels/reduction.h"
#include "nets/module.h"

namespace ditto {
namespace {

constexpr const char* kSymbols = ".0123456789abcdefghijklmnopqrstuvwxyz";

int class_of_symbol(char ch) {
  const char* p = std::strchr(kSymbols, ch);
  return ch != '\0' && p ? static_cast<int>(p - kSymbols) : -1;
}

std::vector<int32_t> target_symbols(const Dataset& d, int64_t i) {
  return std::vector<int32_t>(d.target(i), d.target(i) + d.sequence_length(i));
}

std::vector<std::string> split_commas(const std::string& line) {
  std::vector<std::string> out;
  std::string field;
  std::istringstream s(line);
  while (std::getline(s, field, ',')) out.push_back(field);
  if (!line.empty() && line.back() == ',') out.push_back("");  // an empty last field
  return out;
}

std::string pixel_text(const int32_t* classes, int64_t count) {
  std::string s(static_cast<std::size_t>(count), '.');
  for (int64_t p = 0; p < count; ++p) s[static_cast<std::size_t>(p)] = class_symbol(classes[p]);
  return s;
}

std::string shape_of(const Tensor& t) { return t.defined() ? shape_str(t.shape()) : "(none)"; }

}  // namespace

Var task_loss(Context& ctx, Task task, const Var& out, const Tensor& labels, const TaskTargets& t,
              const Tensor& input_lengths) {
  const auto layers = task_loss_layers(task);
  const Shape& s = out.shape();
  switch (task) {
    case Task::Classification:
      return softmax_cross_entropy(ctx, layers[0].first, out, labels);
    case Task::Segmentation:
      if (s.size() != 4 || !t.targets.defined() || t.targets.shape() != Shape{s[0], s[2], s[3]})
        throw ShapeError(fmt::format("segmentation loss: the net's output {} needs pixel targets {{N, H, W}} of its "
                                     "batch and size; the batch has {}",
                                     shape_str(s), shape_of(t.targets)));
      return pixel_cross_entropy(ctx, layers[0].first, out, t.targets);
    case Task::Sequence: {
      if (s.size() != 3 || !t.targets.defined() || t.targets.ndim() != 2 || t.targets.shape()[0] != s[1] ||
          !t.lengths.defined() || t.lengths.shape() != Shape{s[1]} || !input_lengths.defined() ||
          input_lengths.shape() != Shape{s[1]})
        throw ShapeError(fmt::format("sequence loss: the net's output {} (time-major {{T, N, A}}) needs label sequences "
                                     "{{N, S}}, their lengths and input lengths {{N}}; the batch has {}, {} and {}",
                                     shape_str(s), shape_of(t.targets), shape_of(t.lengths), shape_of(input_lengths)));
      Var costs = ctc_loss(ctx, layers[0].first, out, t.targets, t.lengths, input_lengths);
      return reduce_mean(ctx, layers[1].first, costs);
    }
  }
  throw Error("task_loss: unknown task");
}

Tensor ctc_input_lengths(Context& ctx, int64_t n, int64_t steps) {
  if (steps < 1 || steps > INT_MAX) throw ShapeError(fmt::format("ctc input lengths: {} steps", steps));
  return ctx.from_host(std::vector<int32_t>(static_cast<std::size_t>(n), static_cast<int32_t>(steps)), {n});
}

void check_net_fits_data(const Net& net, const Dataset& train, const std::string& model, const std::string& dataset) {
  if (net.task() != train.task)
    throw Error(fmt::format("--model {} is a {} network, but --dataset {} has {} targets (classification: synthetic, "
                            "cifar10, cifar100, imagefolder, celeba, mnist, mnist-rt, synthetic-rt; segmentation: "
                            "mnist-seg, synthetic-seg; sequence: mnist-strings, synthetic-strings; categorical "
                            "classification: celeba-attrs, synthetic-attrs)",
                            model, task_name(net.task()), dataset, task_name(train.task)));
  if (net.categorical_input() != (train.categories > 0))
    throw Error(fmt::format("--model {} takes {}, but --dataset {} holds {}", model,
                            net.categorical_input() ? "category ids" : "images", dataset,
                            train.categories > 0 ? "category ids (celeba-attrs, synthetic-attrs: the embedding-bag model)"
                                                 : "images"));
}

const char* unit_name(Task task) {
  return task == Task::Segmentation ? "pixel" : task == Task::Sequence ? "sequence" : "example";
}
const char* primary_score(Task task) {
  return task == Task::Segmentation ? "pixel_accuracy" : task == Task::Sequence ? "sequence_accuracy" : "top1";
}
const char* secondary_score(Task task) {
  return task == Task::Segmentation ? "mean_iou" : task == Task::Sequence ? "cer" : "top5";
}

// ---- sequences -------------------------------------------------------------------------------

int max_code_length(int num_classes) {
  if (num_classes < 2) throw Error(fmt::format("sequence codes: {} classes; need the blank and a symbol", num_classes));
  const int64_t base = num_classes - 1;
  if (base == 1) return INT_MAX - 1;  // the code is 1 + the length
  // The largest code of length L, "1" then L digits base - 1, is 2 base^L - 1.
  int len = 0;
  for (int64_t power = 1; 2 * power * base - 1 <= INT32_MAX; power *= base) ++len;
  return len;
}

int32_t sequence_code(const int32_t* symbols, int length, int num_classes) {
  if (length < 0 || length > max_code_length(num_classes))
    throw Error(fmt::format("sequence code: a string of {} symbols over {} classes has no int32 code (at most {} "
                            "symbols)",
                            length, num_classes, max_code_length(num_classes)));
  const int64_t base = num_classes - 1;
  int64_t code = 1;
  for (int k = 0; k < length; ++k) {
    if (symbols[k] < 1 || symbols[k] >= num_classes)
      throw Error(fmt::format("sequence code: symbol {} at position {} is outside [1, {})", symbols[k], k, num_classes));
    code = base == 1 ? code + 1 : code * base + (symbols[k] - 1);
  }
  return static_cast<int32_t>(code);
}

std::vector<int32_t> sequence_symbols(int32_t code, int num_classes) {
  const int64_t base = num_classes - 1;
  if (code < 1 || base < 1) throw Error(fmt::format("sequence code {} over {} classes is not a code", code, num_classes));
  std::vector<int32_t> s;
  if (base == 1) return std::vector<int32_t>(static_cast<std::size_t>(code - 1), 1);
  int64_t c = code;
  while (c > 1) {
    if (c < base) throw Error(fmt::format("sequence code {} over {} classes is not a code", code, num_classes));
    s.push_back(static_cast<int32_t>(c % base) + 1);
    c /= base;
  }
  std::reverse(s.begin(), s.end());
  return s;
}

int64_t edit_distance(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  std::vector<int64_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = static_cast<int64_t>(j);
  for (std::size_t i = 1; i <= a.size(); ++i) {
    int64_t diag = row[0];
    row[0] = static_cast<int64_t>(i);
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const int64_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

char class_symbol(int c) {
  if (c < 0 || c > 36) throw Error(fmt::format("predictions.csv: class {} has no symbol (0..36)", c));
  return kSymbols[c];
}

std::string symbols_text(const std::vector<int32_t>& symbols) {
  std::string s;
  for (int32_t v : symbols) s += class_symbol(v);
  return s;
}

// ---- units -----------------------------------------------------------------------------------

std::vector<int32_t> unit_labels(const Dataset& test) {
  switch (test.task) {
    case Task::Segmentation: return test.targets;
    case Task::Sequence: {
      std::vector<int32_t> codes(static_cast<std::size_t>(test.n));
      for (int64_t i = 0; i < test.n; ++i) codes[i] = sequence_code(test.target(i), test.sequence_length(i), test.num_classes);
      return codes;
    }
    case Task::Classification: break;
  }
  return test.labels;
}

int64_t units_per_example(const Dataset& test) {
  return test.task == Task::Segmentation ? int64_t(test.height) * test.width : 1;
}

std::vector<int32_t> predict_units(Task task, const Tensor& out) {
  const std::vector<float> v = out.to_host_f32();
  const Shape& s = out.shape();
  std::vector<int32_t> units;
  if (task == Task::Segmentation) {
    if (s.size() != 4) throw ShapeError(fmt::format("pixel predictions: output {} is not {{N, C, H, W}}", shape_str(s)));
    const int64_t n = s[0], c = s[1], hw = s[2] * s[3];
    units.resize(static_cast<std::size_t>(n * hw));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t p = 0; p < hw; ++p) {
        int32_t best = 0;
        for (int64_t k = 1; k < c; ++k)
          if (v[(i * c + k) * hw + p] > v[(i * c + best) * hw + p]) best = static_cast<int32_t>(k);
        units[i * hw + p] = best;
      }
    return units;
  }
  if (task == Task::Sequence) {
    if (s.size() != 3) throw ShapeError(fmt::format("greedy decoding: output {} is not {{T, N, A}}", shape_str(s)));
    const int64_t steps = s[0], n = s[1], a = s[2];
    units.resize(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      std::vector<int32_t> decoded;
      int32_t prev = 0;
      for (int64_t t = 0; t < steps; ++t) {
        const float* row = v.data() + (t * n + i) * a;
        int32_t best = 0;
        for (int64_t k = 1; k < a; ++k)
          if (row[k] > row[best]) best = static_cast<int32_t>(k);
        if (best != 0 && best != prev) decoded.push_back(best);
        prev = best;
      }
      units[i] = sequence_code(decoded.data(), static_cast<int>(decoded.size()), static_cast<int>(a));
    }
    return units;
  }
  throw Error("predict_units: classification predictions are top-k classes (kernels/metrics.h topk)");
}

TaskScores score_units(const Dataset& test, const std::vector<int32_t>& predictions) {
  const std::vector<int32_t> labels = unit_labels(test);
  if (predictions.size() != labels.size())
    throw Error(fmt::format("score_units: {} predictions for {} {}s", predictions.size(), labels.size(),
                            unit_name(test.task)));
  TaskScores out;
  using json = nlohmann::json;
  if (test.task == Task::Segmentation) {
    const int c = test.num_classes;
    std::vector<int64_t> hit(c, 0), predicted(c, 0), actual(c, 0);
    int64_t correct = 0;
    for (std::size_t p = 0; p < labels.size(); ++p) {
      ++predicted[predictions[p]];
      ++actual[labels[p]];
      if (predictions[p] == labels[p]) ++hit[labels[p]], ++correct;
    }
    json iou = json::object(), acc = json::object();
    double iou_sum = 0;
    int present = 0;
    for (int k = 0; k < c; ++k) {
      const int64_t uni = predicted[k] + actual[k] - hit[k];
      if (uni == 0) continue;  // a class in neither: no IoU
      const double v = double(hit[k]) / double(uni);
      iou[test.class_names[k]] = v;
      iou_sum += v;
      ++present;
      if (actual[k]) acc[test.class_names[k]] = double(hit[k]) / double(actual[k]);
    }
    out.primary = labels.empty() ? 0.0 : double(correct) / double(labels.size());
    out.secondary = present ? iou_sum / present : 0.0;
    out.metrics = json{{"pixel_accuracy", out.primary}, {"mean_iou", out.secondary}, {"per_class_iou", iou},
                       {"per_class_accuracy", acc}, {"pixels", labels.size()}};
    return out;
  }
  if (test.task == Task::Sequence) {
    int64_t exact = 0, distance = 0, length = 0;
    std::map<int, std::pair<int64_t, int64_t>> by_length;  // length -> (exact, count)
    for (std::size_t i = 0; i < labels.size(); ++i) {
      const auto truth = sequence_symbols(labels[i], test.num_classes);
      const auto guess = sequence_symbols(predictions[i], test.num_classes);
      const bool same = labels[i] == predictions[i];
      exact += same;
      distance += edit_distance(guess, truth);
      length += static_cast<int64_t>(truth.size());
      auto& b = by_length[static_cast<int>(truth.size())];
      b.first += same;
      ++b.second;
    }
    json per_length = json::object();
    for (const auto& [len, b] : by_length)
      per_length[std::to_string(len)] = {{"accuracy", double(b.first) / double(b.second)}, {"count", b.second}};
    const double n = std::max<double>(1, double(labels.size()));
    out.primary = double(exact) / n;
    out.secondary = double(distance) / double(std::max<int64_t>(1, length));
    out.metrics = json{{"sequence_accuracy", out.primary}, {"cer", out.secondary},
                       {"mean_edit_distance", double(distance) / n}, {"per_length_accuracy", per_length}};
    return out;
  }
  throw Error("score_units: classification is scored from top-k predictions (experiments/train.cpp)");
}

// ---- predictions.csv -------------------------------------------------------------------------

namespace {
const char* csv_header(Task task) {
  return task == Task::Segmentation ? "index,label,correct_pixels,target,predicted"
                                    : "index,label,target,predicted,edit_distance";
}
}  // namespace

std::string task_predictions_csv(const Dataset& test, const std::vector<int32_t>& predictions) {
  const int64_t per = units_per_example(test);
  if (test.task == Task::Classification || static_cast<int64_t>(predictions.size()) != test.n * per)
    throw Error(fmt::format("task_predictions_csv: {} predictions for '{}' ({} task, {} examples)", predictions.size(),
                            test.name, task_name(test.task), test.n));
  std::string csv = std::string(csv_header(test.task)) + "\n";
  for (int64_t i = 0; i < test.n; ++i) {
    if (test.task == Task::Segmentation) {
      const int32_t* pred = predictions.data() + i * per;
      int64_t correct = 0;
      for (int64_t p = 0; p < per; ++p) correct += pred[p] == test.target(i)[p];
      csv += fmt::format("{},{},{},{},{}\n", i, test.labels[i], correct, pixel_text(test.target(i), per),
                         pixel_text(pred, per));
    } else {
      const auto truth = target_symbols(test, i);
      const auto guess = sequence_symbols(predictions[i], test.num_classes);
      csv += fmt::format("{},{},{},{},{}\n", i, test.labels[i], symbols_text(truth), symbols_text(guess),
                         edit_distance(guess, truth));
    }
  }
  return csv;
}

std::vector<int32_t> read_task_predictions_csv(const std::string& path, const Dataset& test) {
  std::ifstream in(path);
  if (!in) throw DataError(fmt::format("{}: cannot open the run's predictions", path));
  const int64_t per = units_per_example(test);
  std::vector<int32_t> units(static_cast<std::size_t>(test.n * per), -1);
  std::vector<char> seen(static_cast<std::size_t>(test.n), 0);
  std::string line;
  if (!std::getline(in, line) || line != csv_header(test.task))
    throw DataError(fmt::format("{}:1: header '{}' is not the {} predictions header '{}'", path,
                                line.substr(0, 80), task_name(test.task), csv_header(test.task)));
  int lineno = 1;
  while (std::getline(in, line)) {
    ++lineno;
    const auto f = split_commas(line);
    auto bad = [&](const std::string& why) {
      return DataError(fmt::format("{}:{}: {}, or not a run on this test set", path, lineno, why));
    };
    if (f.size() != 5) throw bad(fmt::format("{} fields, not 5", f.size()));
    int64_t index = -1;
    int label = -1;
    try {
      std::size_t used = 0;
      index = std::stoll(f[0], &used);
      if (used != f[0].size()) index = -1;
      label = std::stoi(f[1], &used);
      if (used != f[1].size()) label = -1;
    } catch (const std::exception&) {
      index = -1;
    }
    if (index < 0 || index >= test.n || seen[index] || label != test.labels[index])
      throw bad("a malformed or repeated index, or a label not the test set's");
    seen[index] = 1;
    if (test.task == Task::Segmentation) {
      if (f[3] != pixel_text(test.target(index), per)) throw bad("the target mask is not the test set's");
      if (static_cast<int64_t>(f[4].size()) != per) throw bad(fmt::format("the predicted mask is not {} symbols", per));
      for (int64_t p = 0; p < per; ++p) {
        const int c = class_of_symbol(f[4][static_cast<std::size_t>(p)]);
        if (c < 0 || c >= test.num_classes) throw bad(fmt::format("predicted symbol {} is not a class", p));
        units[index * per + p] = c;
      }
    } else {
      if (f[2] != symbols_text(target_symbols(test, index))) throw bad("the target string is not the test set's");
      std::vector<int32_t> guess;
      for (char ch : f[3]) {
        const int c = class_of_symbol(ch);
        if (c < 1 || c >= test.num_classes) throw bad(fmt::format("predicted symbol '{}' is not a class", ch));
        guess.push_back(c);
      }
      if (static_cast<int>(guess.size()) > max_code_length(test.num_classes)) throw bad("the predicted string is too long");
      units[index] = sequence_code(guess.data(), static_cast<int>(guess.size()), test.num_classes);
    }
  }
  for (int64_t i = 0; i < test.n; ++i)
    if (!seen[i]) throw DataError(fmt::format("{}: no prediction for test example {}", path, i));
  return units;
}

}  // namespace ditto
