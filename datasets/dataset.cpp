#include "datasets/dataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "datasets/stream.h"
#include "engine/error.h"
#include "engine/tensor.h"

namespace ditto {

const char* split_name(Split s) {
  switch (s) {
    case Split::Train: return "train";
    case Split::Val: return "val";
    case Split::Test: return "test";
  }
  return "?";
}

ChannelStats Dataset::channel_stats() const {
  if (source) return source->stats();
  ChannelStats st;
  const int64_t plane = int64_t(height) * width;
  for (int c = 0; c < channels; ++c) {
    // Exact integer sums (a uint64 holds 255^2 * 2^40), so the result does not depend on order.
    uint64_t sum = 0, sum_sq = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* p = image(i) + c * plane;
      for (int64_t k = 0; k < plane; ++k) {
        sum += p[k];
        sum_sq += uint64_t(p[k]) * p[k];
      }
    }
    const double count = double(n) * plane;
    const double mean = count > 0 ? double(sum) / count : 0.0;
    const double var = count > 0 ? std::max(0.0, double(sum_sq) / count - mean * mean) : 0.0;
    st.mean.push_back(static_cast<float>(mean / 255.0));
    st.std.push_back(static_cast<float>(std::sqrt(var) / 255.0));
  }
  return st;
}

std::vector<int64_t> Dataset::class_counts() const {
  std::vector<int64_t> counts(static_cast<std::size_t>(std::max(num_classes, 0)), 0);
  for (int32_t l : labels)
    if (l >= 0 && l < num_classes) ++counts[l];
  return counts;
}

std::vector<int64_t> Dataset::subgroup_counts() const {
  std::vector<int64_t> counts(subgroups.empty() ? 0 : subgroup_names.size(), 0);
  for (int32_t g : subgroups)
    if (g >= 0 && static_cast<std::size_t>(g) < counts.size()) ++counts[g];
  return counts;
}

int Dataset::sequence_length(int64_t i) const {
  const int32_t* t = target(i);
  int len = 0;
  while (len < target_length && t[len] != 0) ++len;
  return len;
}

const uint8_t* Dataset::image(int64_t i) const {
  if (source)
    throw Error(fmt::format("dataset '{}' is streamed: its images are decoded on the fly (ImageSource::eval_image)",
                            name));
  return images.data() + i * image_numel();
}

Fingerprint Dataset::fingerprint() const {
  Hasher h;
  if (source)
    h.add(source->fingerprint());
  else
    h.sized(images.data(), images.size());
  h.sized(labels.data(), labels.size() * sizeof(int32_t)).sized(subgroups.data(), subgroups.size() * sizeof(int32_t));
  const int32_t meta[3] = {static_cast<int32_t>(task), target_length, categories};
  h.bytes(meta, sizeof meta).sized(targets.data(), targets.size() * sizeof(int32_t));
  return h.digest();
}

std::string Dataset::summary() const {
  std::string s = fmt::format("{}: {} examples, {}x{}x{}, {} classes (", name, n, channels, height, width, num_classes);
  auto counts = class_counts();
  // A sequence's label is its length: count lengths, not classes.
  const bool lengths = task == Task::Sequence;
  if (lengths) s += "examples per length: ";
  for (std::size_t k = 0, shown = 0; k < counts.size(); ++k) {
    if (lengths && counts[k] == 0) continue;
    s += fmt::format("{}{}:{}", shown++ ? " " : "",
                     lengths || k >= class_names.size() ? std::to_string(k) : class_names[k], counts[k]);
  }
  s += ")";
  if (task != Task::Classification)
    s += fmt::format(", {} targets ({} per example{})", task_name(task), target_length,
                     task == Task::Sequence ? ", labels count symbols" : "");
  if (categories > 0) s += fmt::format(", categorical ({} fields, {} category ids)", width, categories);
  if (has_subgroups()) {
    auto g = subgroup_counts();
    s += ", subgroups (";
    for (std::size_t k = 0; k < g.size(); ++k) s += fmt::format("{}{}: {}", k ? "; " : "", subgroup_names[k], g[k]);
    s += ")";
  }
  return s + ", fingerprint " + fingerprint().hex();
}

void Dataset::validate() const {
  if (n < 0 || channels <= 0 || height <= 0 || width <= 0)
    throw DataError(fmt::format("dataset '{}': bad shape n={} c={} h={} w={}", name, n, channels, height, width));
  if (source && source->size() != n)
    throw DataError(fmt::format("dataset '{}': a source of {} images for {} examples", name, source->size(), n));
  if (!source && static_cast<int64_t>(images.size()) != n * image_numel())
    throw DataError(fmt::format("dataset '{}': {} image bytes for {} examples of {}x{}x{}", name, images.size(), n,
                                channels, height, width));
  if (static_cast<int64_t>(labels.size()) != n)
    throw DataError(fmt::format("dataset '{}': {} labels for {} examples", name, labels.size(), n));
  if (static_cast<int>(class_names.size()) != num_classes)
    throw DataError(fmt::format("dataset '{}': {} class names for {} classes", name, class_names.size(), num_classes));
  for (int64_t i = 0; i < n; ++i)
    if (labels[i] < 0 || labels[i] >= num_classes)
      throw DataError(fmt::format("dataset '{}': label {} of example {} is outside [0, {})", name, labels[i], i,
                                  num_classes));
  if (!subgroups.empty()) {
    if (static_cast<int64_t>(subgroups.size()) != n)
      throw DataError(fmt::format("dataset '{}': {} subgroup ids for {} examples", name, subgroups.size(), n));
    for (int64_t i = 0; i < n; ++i)
      if (subgroups[i] < 0 || static_cast<std::size_t>(subgroups[i]) >= subgroup_names.size())
        throw DataError(fmt::format("dataset '{}': subgroup {} of example {} is outside [0, {})", name, subgroups[i],
                                    i, subgroup_names.size()));
  }
  if (categories < 0 || (categories > 0 && (channels != 1 || height != 1 || categories > 256)))
    throw DataError(fmt::format("dataset '{}': {} categories over {}x{}x{}; a categorical dataset is 1x1xfields with at "
                                "most 256 category ids",
                                name, categories, channels, height, width));
  if (categories > 0)
    for (std::size_t k = 0; k < images.size(); ++k)
      if (images[k] >= categories)
        throw DataError(fmt::format("dataset '{}': field {} of example {} holds category {}, outside [0, {})", name,
                                    k % static_cast<std::size_t>(width), k / static_cast<std::size_t>(width), images[k],
                                    categories));
  if (task == Task::Classification) {
    if (target_length != 0 || !targets.empty())
      throw DataError(fmt::format("dataset '{}': a classification dataset has no targets besides its labels", name));
    return;
  }
  const int64_t want = task == Task::Segmentation ? int64_t(height) * width : target_length;
  if (target_length < 1 || target_length != want || static_cast<int64_t>(targets.size()) != n * target_length)
    throw DataError(fmt::format("dataset '{}': {} {} targets of {} per example for {} examples of {}x{}", name,
                                targets.size(), task_name(task), target_length, n, height, width));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t* t = target(i);
    bool ended = false;
    for (int k = 0; k < target_length; ++k) {
      const int32_t v = t[k];
      const bool bad = task == Task::Segmentation ? (v < 0 || v >= num_classes)
                                                  : (v < 0 || v >= num_classes || (ended && v != 0));
      if (bad)
        throw DataError(fmt::format("dataset '{}': target {} of example {} is {}; {}", name, k, i, v,
                                    task == Task::Segmentation
                                        ? fmt::format("pixel classes are in [0, {})", num_classes)
                                        : fmt::format("symbols are in [1, {}), then only 0 (padding)", num_classes)));
      ended = ended || v == 0;
    }
    if (task == Task::Sequence && labels[i] != sequence_length(i))
      throw DataError(fmt::format("dataset '{}': example {} has {} symbols but label {} (a sequence's label is its "
                                  "length)",
                                  name, i, sequence_length(i), labels[i]));
  }
}

Dataset take_first(const Dataset& ds, int64_t n) {
  if (n < 0 || n > ds.n)
    throw Error(fmt::format("take_first: {} examples requested from '{}', which has {}", n, ds.name, ds.n));
  Dataset out;
  out.name = n == ds.n ? ds.name : fmt::format("{}[:{}]", ds.name, n);
  out.n = n;
  out.channels = ds.channels;
  out.height = ds.height;
  out.width = ds.width;
  if (ds.source)
    out.source = ds.source->first(n);
  else
    out.images.assign(ds.images.begin(), ds.images.begin() + n * ds.image_numel());
  out.labels.assign(ds.labels.begin(), ds.labels.begin() + n);
  out.num_classes = ds.num_classes;
  out.class_names = ds.class_names;
  if (ds.has_subgroups()) out.subgroups.assign(ds.subgroups.begin(), ds.subgroups.begin() + n);
  out.subgroup_names = ds.subgroup_names;
  out.task = ds.task;
  out.target_length = ds.target_length;
  out.targets.assign(ds.targets.begin(), ds.targets.begin() + n * ds.target_length);
  out.categories = ds.categories;
  return out;
}

}  // namespace ditto
