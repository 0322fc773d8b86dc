// MNIST IDX files: images (idx3) and labels (idx1), given as two pieces of one input.
#include "datasets/dataset.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto dir = fuzz::scratch() / "mnist";
  const auto parts = fuzz::split(data, size, 2);
  fuzz::write(dir / "t10k-images-idx3-ubyte", parts[0]);
  fuzz::write(dir / "t10k-labels-idx1-ubyte", parts[1]);
  fuzz::expect_success_or_error([&] { ditto::load_mnist(dir.string(), ditto::Split::Test); });
  return 0;
}
