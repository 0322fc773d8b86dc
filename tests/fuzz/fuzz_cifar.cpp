// CIFAR-10 binary records (`test_batch.bin`: label byte + 3072 pixel bytes per record).
#include "datasets/dataset.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto dir = fuzz::scratch() / "cifar";
  fuzz::write(dir / "test_batch.bin", data, size);
  fuzz::expect_success_or_error([&] { ditto::load_cifar10(dir.string(), ditto::Split::Test); });
  return 0;
}
