#include "engine/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <fstream>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "engine/detail/half_bits.h"
#include "engine/detail/json_error.h"
#include "engine/error.h"

namespace ditto {

namespace {
// safetensors' dtype names, and ditto's dtype for each it reads.
const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::I32: return "I32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
  }
  return "?";
}
bool dtype_from_safetensors(const std::string& name, DType* out) {
  for (DType t : {DType::F32, DType::I32, DType::BF16, DType::F16})
    if (name == safetensors_dtype(t)) {
      *out = t;
      return true;
    }
  return false;
}
}  // namespace

void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::size_t offset = 0;
  for (const auto& t : tensors) {
    if (header.contains(t.name)) throw Error(fmt::format("{}: duplicate tensor name '{}'", path, t.name));
    // safetensors has no layout: its shape says row-major, which a channels-last tensor's memory is not.
    if (t.tensor.channels_last())
      throw ShapeError(fmt::format("{}: tensor '{}' {} is channels-last; safetensors stores row-major (NCHW) data, "
                                   "so convert it first (from_channels_last)",
                                   path, t.name, shape_str(t.tensor.shape())));
    header[t.name] = {{"dtype", safetensors_dtype(t.tensor.dtype())},
                      {"shape", t.tensor.shape()},
                      {"data_offsets", {offset, offset + t.tensor.nbytes()}}};
    offset += t.tensor.nbytes();
  }
  std::string h = header.dump();
  // Pad the header with spaces to an 8-byte boundary, as the reference writer does.
  while ((h.size() + 8) % 8) h.push_back(' ');
  std::string out;
  out.reserve(8 + h.size() + offset);
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += h;
  for (const auto& t : tensors) {
    if (t.tensor.nbytes() == 0) continue;
    std::size_t at = out.size();
    out.resize(at + t.tensor.nbytes());
    if (t.tensor.dtype() == DType::F32) {
      auto v = t.tensor.to_host_f32();
      std::memcpy(&out[at], v.data(), t.tensor.nbytes());
    } else if (t.tensor.dtype() != DType::I32) {
      // Widened on the way to the host, narrowed back here: exact both ways.
      const auto v = t.tensor.to_host_f32();
      for (std::size_t i = 0; i < v.size(); ++i) {
        const uint16_t bits = detail::float_to_half_bits(t.tensor.dtype(), v[i]);
        std::memcpy(&out[at + 2 * i], &bits, 2);
      }
    } else {
      auto v = t.tensor.to_host_i32();
      std::memcpy(&out[at], v.data(), t.tensor.nbytes());
    }
  }
  write_file_atomic(path, out);
}

namespace {

// A safetensors file is an 8-byte little-endian header length n, n bytes of JSON header, then the
// data, which the header's data_offsets index relative to the data's start (offset 8 + n). Every
// header field is checked for its JSON type and range before use: a header is input like any
// other (fuzz_safetensors found a missing key escaping as nlohmann's exception).

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("{}: cannot open", path));
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// The header's length n, which must fit in the file.
uint64_t read_header_length(const std::string& path, const std::string& bytes) {
  if (bytes.size() < 8) throw DataError(fmt::format("{}: truncated at offset {}: no header length", path, bytes.size()));
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
  if (n > bytes.size() - 8)
    throw DataError(fmt::format("{}: header of {} bytes at offset 8 runs past the end of the file ({} bytes)", path, n,
                                bytes.size()));
  return n;
}

// The header, bytes 8 to 8 + n: a JSON object.
nlohmann::json parse_header(const std::string& path, const std::string& bytes, uint64_t n) {
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  } catch (const nlohmann::json::parse_error& e) {
    throw DataError(fmt::format("{}: malformed JSON header at byte {}: {}", path, 8 + e.byte - (e.byte > 0),
                                detail::json_syntax_problem(e)));
  }
  if (!header.is_object())
    throw DataError(fmt::format("{}: the header at offset 8 is not a JSON object", path));
  return header;
}

// The header's __metadata__: an object whose values are strings.
void read_metadata(const std::string& path, const nlohmann::json& m, std::map<std::string, std::string>& metadata) {
  if (!m.is_object()) throw DataError(fmt::format("{}: __metadata__ in the header is not an object", path));
  for (auto it = m.begin(); it != m.end(); ++it) {
    if (!it->is_string())
      throw DataError(fmt::format("{}: metadata '{}' in the header is {}, not a string", path, it.key(), it->dump()));
    metadata[it.key()] = it->get<std::string>();
  }
}

// Field `key` of tensor `name`'s entry `d`, which must be an object holding it.
const nlohmann::json& entry_field(const std::string& path, const std::string& name, const nlohmann::json& d,
                                  const char* key) {
  if (!d.is_object()) throw DataError(fmt::format("{}: tensor '{}' in the header is not an object", path, name));
  auto f = d.find(key);
  if (f == d.end()) throw DataError(fmt::format("{}: tensor '{}' has no \"{}\" in the header", path, name, key));
  return *f;
}

// A shape: a list of whole numbers that fit in int64_t.
Shape parse_shape(const std::string& path, const std::string& name, const nlohmann::json& shape_json) {
  Shape shape;
  bool shape_ok = shape_json.is_array();
  if (shape_ok)
    for (const auto& e : shape_json) {
      if (!e.is_number_unsigned()) {
        shape_ok = false;
        break;
      }
      const uint64_t v = e.get<uint64_t>();
      if (v > static_cast<uint64_t>(INT64_MAX)) {
        shape_ok = false;
        break;
      }
      shape.push_back(static_cast<int64_t>(v));
    }
  if (!shape_ok)
    throw DataError(fmt::format("{}: tensor '{}' has shape {}; expected a list of sizes (whole numbers, 0 or more)",
                                path, name, shape_json.dump()));
  return shape;
}

// One tensor's entry in the header, checked: dtype F32 or I32, a shape, and data_offsets [begin,
// end) relative to the data's start that hold exactly the bytes dtype and shape need and lie
// inside the file.
struct TensorEntry {
  std::string name;
  DType dtype;
  Shape shape;
  std::size_t begin, end;
};

TensorEntry check_tensor_entry(const std::string& path, const std::string& name, const nlohmann::json& d,
                               std::size_t data_start, std::size_t file_size) {
  const nlohmann::json& dtype_json = entry_field(path, name, d, "dtype");
  const std::string dtype = dtype_json.is_string() ? dtype_json.get<std::string>() : dtype_json.dump();
  DType dt = DType::F32;
  if (!dtype_from_safetensors(dtype, &dt))
    throw DataError(fmt::format("{}: tensor '{}' has dtype {}; ditto reads F32, I32, BF16 and F16", path, name, dtype));
  const Shape shape = parse_shape(path, name, entry_field(path, name, d, "shape"));
  const nlohmann::json& off_json = entry_field(path, name, d, "data_offsets");
  if (!off_json.is_array() || off_json.size() != 2 || !off_json[0].is_number_unsigned() ||
      !off_json[1].is_number_unsigned())
    throw DataError(fmt::format("{}: tensor '{}' has data_offsets {}; expected [begin, end] byte offsets", path, name,
                                off_json.dump()));
  const uint64_t begin = off_json[0].get<uint64_t>(), end = off_json[1].get<uint64_t>();
  // No overflow; the offsets checks below then bound the size by the file's, before anything
  // is allocated.
  std::size_t need = dtype_size(dt);
  for (int64_t e : shape) {
    if (e > 0 && need > SIZE_MAX / static_cast<std::size_t>(e))
      throw DataError(fmt::format("{}: tensor '{}' has an impossible shape {}", path, name, shape_str(shape)));
    need *= static_cast<std::size_t>(e);
  }
  if (end < begin || end - begin != need)
    throw DataError(fmt::format("{}: tensor '{}' has data_offsets [{}, {}]: {} bytes, but {} {} needs {}", path, name,
                                begin, end, end < begin ? 0 : end - begin, dtype, shape_str(shape), need));
  if (end > file_size - data_start)
    throw DataError(fmt::format("{}: truncated: tensor '{}' needs bytes up to offset {}, file ends at {}", path, name,
                                data_start + end, file_size));
  return {name, dt, shape, static_cast<std::size_t>(begin), static_cast<std::size_t>(end)};
}

// The checked entry's bytes, copied into a CPU tensor.
Tensor read_tensor(const TensorEntry& e, const std::string& bytes, std::size_t data_start) {
  Context cpu;
  Tensor t = cpu.empty(e.shape, e.dtype);
  const std::size_t need = e.end - e.begin;
  if (need) std::memcpy(t.raw(), bytes.data() + data_start + e.begin, need);
  return t;
}

struct Extent {
  std::size_t begin, end;
  std::string name;
};

// The format indexes the data completely: tensors follow one another without overlap or gap
// (two tensors sharing bytes would silently alias one weight onto another).
void check_data_coverage(const std::string& path, std::vector<Extent> extents, std::size_t data_start,
                         std::size_t file_size) {
  const std::size_t data_size = file_size - data_start;
  std::sort(extents.begin(), extents.end(),
            [](const Extent& a, const Extent& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  std::size_t covered = 0;
  const Extent* previous = nullptr;
  for (const Extent& e : extents) {
    if (e.begin < covered)
      throw DataError(fmt::format("{}: tensor '{}' data_offsets [{}, {}] overlap tensor '{}' [{}, {}]", path, e.name,
                                  e.begin, e.end, previous->name, previous->begin, previous->end));
    if (e.begin > covered)
      throw DataError(fmt::format("{}: bytes {} to {} of the data (offsets {} to {}) belong to no tensor; tensor '{}' "
                                  "starts at {}", path, covered, e.begin, data_start + covered, data_start + e.begin,
                                  e.name, e.begin));
    covered = e.end;
    previous = &e;
  }
  if (covered != data_size)
    throw DataError(fmt::format("{}: {} bytes after the last tensor (offsets {} to {}) belong to no tensor", path,
                                data_size - covered, data_start + covered, file_size));
}

}  // namespace

SafetensorsFile load_safetensors(const std::string& path) {
  const std::string bytes = read_whole_file(path);
  const uint64_t n = read_header_length(path, bytes);
  const nlohmann::json header = parse_header(path, bytes, n);
  const std::size_t data_start = 8 + n;
  SafetensorsFile f;
  std::vector<Extent> extents;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      read_metadata(path, *it, f.metadata);
      continue;
    }
    const TensorEntry e = check_tensor_entry(path, it.key(), *it, data_start, bytes.size());
    extents.push_back({e.begin, e.end, e.name});
    f.tensors[e.name] = read_tensor(e, bytes, data_start);
  }
  check_data_coverage(path, std::move(extents), data_start, bytes.size());
  return f;
}

void restore_tensors(Context& ctx, const SafetensorsFile& file, const std::string& path,
                     const std::vector<std::pair<std::string, Tensor*>>& destinations) {
  for (const auto& [name, dst] : destinations) {
    auto it = file.tensors.find(name);
    if (it == file.tensors.end()) throw DataError(fmt::format("{}: tensor '{}' is missing", path, name));
    if (it->second.shape() != dst->shape() || it->second.dtype() != dst->dtype())
      throw DataError(fmt::format("{}: tensor '{}' is {} {}, expected {} {}", path, name,
                                  dtype_name(it->second.dtype()), shape_str(it->second.shape()),
                                  dtype_name(dst->dtype()), shape_str(dst->shape())));
    ctx.copy(*dst, it->second);
  }
}

}  // namespace ditto
