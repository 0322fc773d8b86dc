// Checkpoints as safetensors files (https://github.com/huggingface/safetensors): an 8-byte
// little-endian header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__":
// {string: string}}, then the raw little-endian data. Loadable by Python's `safetensors`
// package; tensor names are the parameter names ("conv1.weight"). Files are written to a
// temporary beside the target and renamed into place, so a crash never leaves half a file.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "engine/context.h"

namespace ditto {

struct NamedTensor {
  std::string name;
  Tensor tensor;  // any device; f32, i32, bf16 or f16
};

void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;  // on the CPU
  std::map<std::string, std::string> metadata;
};

// Throws DataError naming the file and byte offset for a truncated or malformed file, IoError
// when it cannot be opened.
SafetensorsFile load_safetensors(const std::string& path);

// Copies each named tensor of `file` into the matching destination (shape and dtype must
// match); every destination must be present in the file. Throws DataError naming the file and
// tensor otherwise.
void restore_tensors(Context& ctx, const SafetensorsFile& file, const std::string& path,
                     const std::vector<std::pair<std::string, Tensor*>>& destinations);

}  // namespace ditto
