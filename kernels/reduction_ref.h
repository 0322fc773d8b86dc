// CPU reference of kernels/reduction: the sum in double, in index order.
#pragma once
#include <cstdint>

namespace ditto::ref {

template <class T>
double sum_all(const T* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i]);
  return s;
}

}  // namespace ditto::ref
