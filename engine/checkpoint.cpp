#include "engine/checkpoint.h"

#include <fmt/format.h>

#include <cstring>
#include <fstream>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "engine/error.h"

namespace ditto {

void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::size_t offset = 0;
  for (const auto& t : tensors) {
    if (header.contains(t.name)) throw Error(fmt::format("{}: duplicate tensor name '{}'", path, t.name));
    header[t.name] = {{"dtype", t.tensor.dtype() == DType::F32 ? "F32" : "I32"},
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
    } else {
      auto v = t.tensor.to_host_i32();
      std::memcpy(&out[at], v.data(), t.tensor.nbytes());
    }
  }
  write_file_atomic(path, out);
}

SafetensorsFile load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("{}: cannot open", path));
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  if (bytes.size() < 8) throw DataError(fmt::format("{}: truncated at offset {}: no header length", path, bytes.size()));
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
  if (n > bytes.size() - 8)
    throw DataError(fmt::format("{}: header of {} bytes at offset 8 runs past the end of the file ({} bytes)", path, n,
                                bytes.size()));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  } catch (const nlohmann::json::parse_error& e) {
    throw DataError(fmt::format("{}: malformed header at offset {}: {}", path, 8 + e.byte, e.what()));
  }
  const std::size_t data_start = 8 + n;
  const std::size_t data_size = bytes.size() - data_start;
  // Every field is checked for its JSON type and range before use: a header is input like any
  // other (fuzz_safetensors found a missing key escaping as nlohmann's exception).
  if (!header.is_object())
    throw DataError(fmt::format("{}: the header at offset 8 is not a JSON object", path));
  SafetensorsFile f;
  for (auto it = header.begin(); it != header.end(); ++it) {
    try {
      if (it.key() == "__metadata__") {
        if (!it->is_object()) throw DataError(fmt::format("{}: __metadata__ in the header is not an object", path));
        for (auto m = it->begin(); m != it->end(); ++m) {
          if (!m->is_string())
            throw DataError(fmt::format("{}: metadata '{}' in the header is not a string", path, m.key()));
          f.metadata[m.key()] = m->get<std::string>();
        }
        continue;
      }
      const auto& d = *it;
      if (!d.is_object()) throw DataError(fmt::format("{}: tensor '{}' in the header is not an object", path, it.key()));
      std::string dtype = d.value("dtype", "");
      if (dtype != "F32" && dtype != "I32")
        throw DataError(fmt::format("{}: tensor '{}' has dtype '{}'; ditto reads F32 and I32", path, it.key(), dtype));
      Shape shape = d.at("shape").get<Shape>();
      auto off = d.at("data_offsets").get<std::vector<std::size_t>>();
      DType dt = dtype == "F32" ? DType::F32 : DType::I32;
      // No negative extents and no overflow; the offsets checks below then bound the size by
      // the file's, before anything is allocated.
      std::size_t need = dtype_size(dt);
      for (int64_t e : shape) {
        if (e < 0 || (e > 0 && need > SIZE_MAX / static_cast<std::size_t>(e)))
          throw DataError(fmt::format("{}: tensor '{}' has an impossible shape {}", path, it.key(), shape_str(shape)));
        need *= static_cast<std::size_t>(e);
      }
      if (off.size() != 2 || off[1] < off[0] || off[1] - off[0] != need)
        throw DataError(fmt::format("{}: tensor '{}' data_offsets do not match shape {}", path, it.key(), shape_str(shape)));
      if (off[1] > data_size)
        throw DataError(fmt::format("{}: truncated: tensor '{}' needs bytes up to offset {}, file ends at {}", path,
                                    it.key(), data_start + off[1], bytes.size()));
      Context cpu;
      Tensor t = cpu.empty(shape, dt);
      if (need) std::memcpy(t.raw(), bytes.data() + data_start + off[0], need);
      f.tensors[it.key()] = std::move(t);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(fmt::format("{}: tensor '{}' in the header (offsets 8 to {}): {}", path, it.key(), 8 + n, e.what()));
    }
  }
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
