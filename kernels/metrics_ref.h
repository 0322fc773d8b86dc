// CPU reference of kernels/metrics: top-k by repeated selection with ties to the lower index.
#pragma once
#include <cstdint>

namespace ditto::ref {

template <class T>
void topk(const T* logits, int64_t n, int64_t c, int k, int32_t* out) {
  for (int64_t r = 0; r < n; ++r) {
    const T* row = logits + r * c;
    for (int j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t i = 0; i < c; ++i) {
        bool taken = false;
        for (int q = 0; q < j; ++q) taken = taken || out[r * k + q] == i;
        if (taken) continue;
        if (best < 0 || row[i] > row[best]) best = i;
      }
      out[r * k + j] = static_cast<int32_t>(best);
    }
  }
}

}  // namespace ditto::ref
