// CelebA's attribute and partition files (two pieces of one input) over a folder holding one
// valid image, 000001.jpg, which the corpus's files refer to; read with the images and without
// (the categorical attributes).
#include "datasets/dataset.h"
#include "fuzz_support.h"
#include "tiny_jpeg.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto dir = fuzz::scratch() / "celeba";
  static const bool image = [&] {
    const auto jpg = fuzz::tiny_jpeg();
    fuzz::write(dir / "img_align_celeba" / "000001.jpg", jpg.data(), jpg.size());
    return true;
  }();
  (void)image;
  const auto parts = fuzz::split(data, size, 2);
  fuzz::write(dir / "list_attr_celeba.txt", parts[0]);
  fuzz::write(dir / "list_eval_partition.txt", parts[1]);
  fuzz::expect_success_or_error([&] { ditto::load_celeba(dir.string(), ditto::Split::Train); });
  fuzz::expect_success_or_error([&] { ditto::load_celeba_attributes(dir.string(), ditto::Split::Train); });
  return 0;
}
