// What a network's output means, and so how a trainer turns it into a loss, predictions and
// scores (experiments/task_scoring.h does that):
//   classification  logits {N, classes}: softmax cross-entropy; the prediction unit is the example
//                   (its top-1 class); top-1 / top-5 accuracy
//   segmentation    logits {N, classes, H, W}: pixel-wise cross-entropy; the unit is the pixel
//                   (its arg-max class); pixel accuracy and mean intersection over union
//   sequence        logits {T, N, symbols}, time-major, symbol 0 the CTC blank: CTC loss; the unit
//                   is the sequence (its greedy decoding); sequence accuracy and character error rate
// A Net says which it is (Net::task) and a Dataset which one its targets serve (Dataset::task).
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace ditto {

enum class Task { Classification, Segmentation, Sequence };

inline const char* task_name(Task t) {
  switch (t) {
    case Task::Classification: return "classification";
    case Task::Segmentation: return "segmentation";
    case Task::Sequence: return "sequence";
  }
  return "?";
}

}  // namespace ditto
