// The predictions.csv of a segmentation and of a sequence run (experiments/task_scoring.h), two pieces of
// one input, read back against small test sets of each task: a segmentation of two 2x3 images and
// three digit strings of up to 3 symbols.
#include "experiments/task_scoring.h"
#include "fuzz_support.h"

namespace {

ditto::Dataset segmentation() {
  ditto::Dataset d;
  d.name = "fuzz-seg";
  d.n = 2;
  d.channels = 1;
  d.height = 2;
  d.width = 3;
  d.images.assign(12, 0);
  d.labels = {1, 2};
  d.num_classes = 3;
  d.class_names = {"background", "a", "b"};
  d.task = ditto::Task::Segmentation;
  d.target_length = 6;
  d.targets = {0, 1, 1, 0, 0, 0, 2, 0, 0, 2, 2, 0};
  d.validate();
  return d;
}

ditto::Dataset sequences() {
  ditto::Dataset d;
  d.name = "fuzz-seq";
  d.n = 3;
  d.channels = 1;
  d.height = 2;
  d.width = 2;
  d.images.assign(12, 0);
  d.labels = {1, 3, 2};
  d.num_classes = 11;
  d.class_names = {"blank", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};
  d.task = ditto::Task::Sequence;
  d.target_length = 3;
  d.targets = {4, 0, 0, 1, 10, 1, 2, 2, 0};
  d.validate();
  return d;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ditto::Dataset seg = segmentation(), seq = sequences();
  const auto parts = fuzz::split(data, size, 2);
  const auto dir = fuzz::scratch();
  fuzz::write(dir / "seg.csv", parts[0]);
  fuzz::write(dir / "seq.csv", parts[1]);
  fuzz::expect_success_or_error([&] { ditto::read_task_predictions_csv((dir / "seg.csv").string(), seg); });
  fuzz::expect_success_or_error([&] { ditto::read_task_predictions_csv((dir / "seq.csv").string(), seq); });
  return 0;
}
