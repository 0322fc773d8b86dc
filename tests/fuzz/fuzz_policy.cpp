// Policy rule strings ("conv2.bwd_filter@128x16x32x32=algo0", "*=deterministic", ...), one per
// line, then every resolver for a few layers, as the ops ask.
#include <sstream>

#include "engine/policy.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> rules;
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  for (std::string line; std::getline(in, line);) rules.push_back(line);
  fuzz::expect_success_or_error([&] {
    ditto::Policy p = ditto::Policy::parse(rules);
    for (const char* layer : {"conv1", "conv2", "fc", "pool1", "bn1", "loss"}) {
      p.conv_fwd(layer, "128x3x32x32");
      p.conv_bwd_data(layer);
      p.conv_bwd_filter(layer, "128x3x32x32");
      p.math(layer, ditto::OpKind::Conv2d);
      p.bias_bwd(layer, ditto::OpKind::Linear);
      p.pool_bwd(layer);
      p.bn_bwd(layer);
      p.loss_reduce(layer);
      p.cublas_atomics(layer);
      p.scatter(layer, ditto::OpKind::Embedding);
      p.scatter(layer, ditto::OpKind::ScatterAdd);
      p.upsample_bwd(layer);
      p.reduction(layer, ditto::OpKind::PixelXent);
      p.reduction(layer, ditto::OpKind::Reduce);
      p.requested(layer, "bwd_filter", ditto::OpKind::Conv2d);
    }
  });
  return 0;
}
