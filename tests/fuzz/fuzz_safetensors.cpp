// safetensors checkpoints: 8-byte header length, JSON header, tensor bytes.
#include "engine/checkpoint.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = fuzz::scratch() / "checkpoint.safetensors";
  fuzz::write(path, data, size);
  fuzz::expect_success_or_error([&] { ditto::load_safetensors(path.string()); });
  return 0;
}
