// CelebA: aligned face JPEGs with the 40 binary attributes and the train/val/test partition.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "datasets/dataset.h"
#include "datasets/detail/image_io.h"
#include "engine/error.h"

namespace ditto {
namespace fs = std::filesystem;

namespace {

std::ifstream open_text(const fs::path& p) {
  std::ifstream in(p);
  if (!in) throw IoError(fmt::format("cannot open '{}'", p.string()));
  return in;
}

std::vector<std::string> split_ws(const std::string& line) {
  std::istringstream s(line);
  std::vector<std::string> out;
  std::string tok;
  while (s >> tok) out.push_back(tok);
  return out;
}

struct AttrTable {
  std::vector<std::string> names;             // attribute names
  std::vector<std::string> files;             // in file order
  std::vector<std::vector<int8_t>> values;    // per file, +1 / -1
};

AttrTable read_attributes(const fs::path& p) {
  std::ifstream in = open_text(p);
  const std::string file = p.string();
  AttrTable t;
  std::string line;
  int64_t line_no = 0;
  if (!std::getline(in, line)) throw DataError(fmt::format("'{}' line 1: missing the count line", file));
  ++line_no;
  auto count_tok = split_ws(line);
  int64_t count = -1;
  try {
    // A blank count line has no token 0 (found by tests/fuzz/fuzz_celeba).
    std::size_t used = 0;
    if (count_tok.size() == 1) count = std::stoll(count_tok[0], &used);
    if (count_tok.size() != 1 || used != count_tok[0].size() || count < 0) count = -1;
  } catch (const std::exception&) {
    count = -1;
  }
  if (count < 0) throw DataError(fmt::format("'{}' line 1: expected the number of images, got '{}'", file, line));
  if (!std::getline(in, line)) throw DataError(fmt::format("'{}' line 2: missing the attribute-name line", file));
  ++line_no;
  t.names = split_ws(line);
  if (t.names.empty()) throw DataError(fmt::format("'{}' line 2: no attribute names", file));
  while (std::getline(in, line)) {
    ++line_no;
    auto tok = split_ws(line);
    if (tok.empty()) continue;
    if (tok.size() != t.names.size() + 1)
      throw DataError(fmt::format("'{}' line {}: {} fields, expected a file name and {} attribute values", file, line_no,
                                  tok.size(), t.names.size()));
    std::vector<int8_t> v(t.names.size());
    for (std::size_t a = 0; a < t.names.size(); ++a) {
      if (tok[a + 1] == "1")
        v[a] = 1;
      else if (tok[a + 1] == "-1")
        v[a] = -1;
      else
        throw DataError(fmt::format("'{}' line {}: attribute {} ({}) is '{}', expected 1 or -1", file, line_no, a + 1,
                                    t.names[a], tok[a + 1]));
    }
    t.files.push_back(tok[0]);
    t.values.push_back(std::move(v));
  }
  if (static_cast<int64_t>(t.files.size()) != count)
    throw DataError(fmt::format("'{}' line 1 announces {} images but the file lists {}", file, count, t.files.size()));
  return t;
}

std::unordered_map<std::string, int> read_partition(const fs::path& p) {
  std::ifstream in = open_text(p);
  std::unordered_map<std::string, int> part;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    auto tok = split_ws(line);
    if (tok.empty()) continue;
    if (tok.size() != 2 || (tok[1] != "0" && tok[1] != "1" && tok[1] != "2"))
      throw DataError(fmt::format("'{}' line {}: expected 'file 0|1|2', got '{}'", p.string(), line_no, line));
    if (!part.emplace(tok[0], tok[1][0] - '0').second)
      throw DataError(fmt::format("'{}' line {}: '{}' is listed twice", p.string(), line_no, tok[0]));
  }
  return part;
}

int attribute_index(const AttrTable& t, const std::string& name, const fs::path& p) {
  auto it = std::find(t.names.begin(), t.names.end(), name);
  if (it == t.names.end()) {
    std::string known;
    for (const auto& n : t.names) known += (known.empty() ? "" : " ") + n;
    throw Error(fmt::format("CelebA attribute '{}' is not in '{}'; it has: {}", name, p.string(), known));
  }
  return static_cast<int>(it - t.names.begin());
}

}  // namespace

namespace {

// What load_celeba and load_celeba_attributes share: the two text files read and checked, the
// split's rows in the attribute file's order with their labels and subgroups. The dataset's images
// are left to the caller.
struct CelebASplit {
  AttrTable attrs;
  int label_attr = 0;
  std::vector<std::size_t> rows;  // indices into attrs.files
  Dataset ds;
};

CelebASplit read_celeba_split(const std::string& root, Split split, const CelebAOptions& options) {
  const fs::path base(root);
  const fs::path attr_path = base / "list_attr_celeba.txt", part_path = base / "list_eval_partition.txt";
  CelebASplit out;
  out.attrs = read_attributes(attr_path);
  const AttrTable& attrs = out.attrs;
  const auto partition = read_partition(part_path);
  out.label_attr = attribute_index(attrs, options.label_attribute, attr_path);
  std::vector<int> group_attrs;
  for (const auto& g : options.subgroup_attributes) group_attrs.push_back(attribute_index(attrs, g, attr_path));
  if (group_attrs.size() > 16) throw Error("CelebA: at most 16 subgroup attributes");

  Dataset& ds = out.ds;
  ds.num_classes = 2;
  ds.class_names = {options.label_attribute + "=0", options.label_attribute + "=1"};
  if (!group_attrs.empty()) {
    for (int id = 0; id < (1 << group_attrs.size()); ++id) {
      std::string name;
      for (std::size_t k = 0; k < group_attrs.size(); ++k)
        name += fmt::format("{}{}={}", k ? "," : "", options.subgroup_attributes[k], (id >> k) & 1);
      ds.subgroup_names.push_back(name);
    }
  }
  const int want = split == Split::Train ? 0 : split == Split::Val ? 1 : 2;
  for (std::size_t i = 0; i < attrs.files.size(); ++i) {
    auto it = partition.find(attrs.files[i]);
    if (it == partition.end())
      throw DataError(fmt::format("'{}' has no entry for '{}' (listed in '{}')", part_path.string(), attrs.files[i],
                                  attr_path.string()));
    if (it->second != want) continue;
    const auto& v = attrs.values[i];
    ds.labels.push_back(v[out.label_attr] > 0 ? 1 : 0);
    if (!group_attrs.empty()) {
      int32_t id = 0;
      for (std::size_t k = 0; k < group_attrs.size(); ++k) id |= (v[group_attrs[k]] > 0 ? 1 : 0) << k;
      ds.subgroups.push_back(id);
    }
    out.rows.push_back(i);
  }
  if (out.rows.empty())
    throw DataError(fmt::format("'{}' assigns no image to the {} split", part_path.string(), split_name(split)));
  return out;
}

}  // namespace

Dataset load_celeba(const std::string& root, Split split, const CelebAOptions& options) {
  CelebASplit s = read_celeba_split(root, split, options);
  Dataset& ds = s.ds;
  ds.name = fmt::format("celeba-{}/{}", options.label_attribute, split_name(split));
  std::vector<std::string> paths;
  for (std::size_t i : s.rows) paths.push_back((fs::path(root) / "img_align_celeba" / s.attrs.files[i]).string());
  detail::decode_into(ds, paths, options.geometry);
  ds.validate();
  return std::move(ds);
}

Dataset load_celeba_attributes(const std::string& root, Split split, const CelebAOptions& options) {
  CelebASplit s = read_celeba_split(root, split, options);
  Dataset& ds = s.ds;
  const std::size_t fields = s.attrs.names.size() - 1;
  if (fields < 1 || fields > 128)
    throw DataError(fmt::format("'{}': {} attributes; the categorical view needs 2..129",
                                (fs::path(root) / "list_attr_celeba.txt").string(), s.attrs.names.size()));
  ds.name = fmt::format("celeba-attrs-{}/{}", options.label_attribute, split_name(split));
  ds.n = static_cast<int64_t>(s.rows.size());
  ds.channels = ds.height = 1;
  ds.width = static_cast<int>(fields);
  ds.categories = static_cast<int>(2 * fields);
  ds.images.reserve(s.rows.size() * fields);
  for (std::size_t i : s.rows) {
    const auto& v = s.attrs.values[i];
    int j = 0;
    for (std::size_t a = 0; a < v.size(); ++a) {
      if (static_cast<int>(a) == s.label_attr) continue;
      ds.images.push_back(static_cast<uint8_t>(2 * j + (v[a] > 0 ? 1 : 0)));
      ++j;
    }
  }
  ds.validate();
  return std::move(ds);
}

}  // namespace ditto
