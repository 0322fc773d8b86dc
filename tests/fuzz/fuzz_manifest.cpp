// Run manifests read back as pins (`--pins-from`), and each pin through the policy parser, as a
// replay does.
#include "engine/policy.h"
#include "experiments/run_dir.h"
#include "experiments/train.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = fuzz::scratch() / "manifest.json";
  fuzz::write(path, data, size);
  fuzz::expect_success_or_error([&] {
    const auto pins = ditto::pins_from_manifest(path.string());
    ditto::Policy::parse(pins);
  });
  return 0;
}
