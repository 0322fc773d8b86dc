// CIFAR-10 / CIFAR-100 binary releases.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "datasets/dataset.h"
#include "datasets/detail/image_io.h"
#include "engine/error.h"

namespace ditto {
namespace {

constexpr int kPixels = 3 * 32 * 32;

// Appends the records of one file. label_bytes = 1 (CIFAR-10) or 2 (CIFAR-100: coarse, fine);
// label_pick selects which of them is the label.
void append_records(Dataset& ds, const std::string& path, int label_bytes, int label_pick, int num_classes) {
  std::vector<uint8_t> bytes = detail::read_file_bytes(path);
  const std::size_t record = static_cast<std::size_t>(label_bytes) + kPixels;
  const std::size_t whole = bytes.size() / record;
  if (bytes.size() % record != 0)
    throw DataError(fmt::format("truncated CIFAR file '{}': {} bytes is not a multiple of the {}-byte record; "
                                "the partial record {} starts at byte offset {}",
                                path, bytes.size(), record, whole, whole * record));
  if (whole == 0) throw DataError(fmt::format("CIFAR file '{}' holds no records", path));
  for (std::size_t r = 0; r < whole; ++r) {
    const uint8_t* rec = bytes.data() + r * record;
    for (int b = 0; b < label_bytes; ++b) {
      // Both labels of a CIFAR-100 record are checked (coarse < 20, fine < 100), not just the one used.
      const int limit = label_bytes == 1 ? num_classes : (b == 0 ? 20 : 100);
      if (rec[b] >= limit)
        throw DataError(fmt::format("CIFAR file '{}': label {} of record {} at byte offset {} is outside [0, {})",
                                    path, rec[b], r, r * record + b, limit));
    }
    ds.labels.push_back(rec[label_pick]);
    ds.images.insert(ds.images.end(), rec + label_bytes, rec + record);
  }
  ds.n += static_cast<int64_t>(whole);
}

std::vector<std::string> names_file_or(const std::filesystem::path& file, int count, const std::string& prefix) {
  std::vector<std::string> names;
  std::ifstream in(file);
  if (in) {
    std::string line;
    while (std::getline(in, line)) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (!line.empty()) names.push_back(line);
    }
    if (static_cast<int>(names.size()) != count)
      throw DataError(fmt::format("'{}' lists {} class names, expected {}", file.string(), names.size(), count));
    return names;
  }
  for (int k = 0; k < count; ++k) names.push_back(prefix + std::to_string(k));
  return names;
}

Dataset empty_cifar(const std::string& name, int num_classes) {
  Dataset ds;
  ds.name = name;
  ds.channels = 3;
  ds.height = ds.width = 32;
  ds.num_classes = num_classes;
  return ds;
}

}  // namespace

Dataset load_cifar10(const std::string& dir, Split split) {
  if (split == Split::Val) throw Error("CIFAR-10 has no validation split (use take_first or a split of train)");
  Dataset ds = empty_cifar(fmt::format("cifar10/{}", split_name(split)), 10);
  ds.class_names = {"airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"};
  const std::filesystem::path root(dir);
  if (split == Split::Train)
    for (int b = 1; b <= 5; ++b) append_records(ds, (root / fmt::format("data_batch_{}.bin", b)).string(), 1, 0, 10);
  else
    append_records(ds, (root / "test_batch.bin").string(), 1, 0, 10);
  ds.validate();
  return ds;
}

Dataset load_cifar100(const std::string& dir, Split split, Cifar100Labels which) {
  if (split == Split::Val) throw Error("CIFAR-100 has no validation split (use take_first or a split of train)");
  const bool fine = which == Cifar100Labels::Fine;
  Dataset ds = empty_cifar(fmt::format("cifar100-{}/{}", fine ? "fine" : "coarse", split_name(split)), fine ? 100 : 20);
  const std::filesystem::path root(dir);
  ds.class_names = fine ? names_file_or(root / "fine_label_names.txt", 100, "fine_")
                        : names_file_or(root / "coarse_label_names.txt", 20, "coarse_");
  append_records(ds, (root / (split == Split::Train ? "train.bin" : "test.bin")).string(), 2, fine ? 1 : 0,
                 ds.num_classes);
  ds.validate();
  return ds;
}

}  // namespace ditto
