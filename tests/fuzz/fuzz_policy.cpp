// Policy rule strings ("conv2.bwd_filter@128x16x32x32=algo0", "*=deterministic", ...), one per
// line, then every registered knob resolved for a few layers, as the ops ask.
#include <sstream>

#include "engine/policy.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> rules;
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  for (std::string line; std::getline(in, line);) rules.push_back(line);
  fuzz::expect_success_or_error([&] {
    ditto::Policy p = ditto::Policy::parse(rules);
    for (const char* layer : {"conv1", "conv2", "fc", "pool1", "bn1", "loss"})
      for (const ditto::KnobSpec& k : ditto::knobs()) {
        p.pick(layer, k.op, k.name, k.selected_at_run_time ? "128x3x32x32" : "");
        p.requested(layer, k.name, k.op);
      }
  });
  return 0;
}
