// Tuning files (JSON entries naming a conv problem and its algorithm).
#include "engine/tuning.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = fuzz::scratch() / "tuning.json";
  fuzz::write(path, data, size);
  fuzz::expect_success_or_error([&] { ditto::TuningTable::load(path.string()); });
  return 0;
}
