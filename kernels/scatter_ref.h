// CPU reference of kernels/scatter, templated so gradient checks run in double. Sums accumulate in
// double in increasing position order and are rounded once. Indices must already be in
// [0, rows) and bags well formed (the ops check on the CPU).
#pragma once
#include <cstdint>
#include <vector>

namespace ditto::ref {

// out[index[j]] += src[j] over j = 0..m-1 (rows of d values); rows no index names are zero.
template <class T>
void scatter_add_rows(const T* src, const int32_t* index, T* out, int64_t m, int64_t d, int64_t rows) {
  std::vector<double> acc(static_cast<std::size_t>(rows * d), 0.0);
  for (int64_t j = 0; j < m; ++j)
    for (int64_t k = 0; k < d; ++k) acc[index[j] * d + k] += double(src[j * d + k]);
  for (int64_t i = 0; i < rows * d; ++i) out[i] = static_cast<T>(acc[i]);
}

// out[j] = table[index[j]].
template <class T>
void gather_rows(const T* table, const int32_t* index, T* out, int64_t m, int64_t d) {
  for (int64_t j = 0; j < m; ++j)
    for (int64_t k = 0; k < d; ++k) out[j * d + k] = table[index[j] * d + k];
}

// Row-major offsets of a scatter along dim (kernels/scatter.h, scatter_dim_keys): key[e] for each of the
// n elements of an index of shape ishape, -1 where the value is outside [0, oshape[dim]). value(e) gives
// element e's value as int64 (already widened from one or two words).
template <class Value>
void scatter_dim_keys(const std::vector<int64_t>& ishape, const std::vector<int64_t>& oshape, int dim, Value value,
                      int32_t* key) {
  const int nd = static_cast<int>(ishape.size());
  std::vector<int64_t> ostride(static_cast<std::size_t>(nd), 1), c(static_cast<std::size_t>(nd), 0);
  for (int d = nd - 2; d >= 0; --d) ostride[d] = ostride[d + 1] * oshape[d + 1];
  int64_t n = 1;
  for (int64_t s : ishape) n *= s;
  for (int64_t e = 0; e < n; ++e) {
    int64_t rest = e, off = 0;
    for (int d = nd - 1; d >= 0; --d) {
      c[d] = rest % ishape[d];
      rest /= ishape[d];
      if (d != dim) off += c[d] * ostride[d];
    }
    const int64_t v = value(e);
    key[e] = v >= 0 && v < oshape[dim] ? static_cast<int32_t>(off + v * ostride[dim]) : -1;
  }
}

// Bags of an embedding_bag: bag b holds positions [begin(b), end(b)). With offsets (PyTorch's 1-D
// form, include_last_offset=False) begin(b) = offsets[b] and end(b) = offsets[b+1], the last bag
// ending at m; without (offsets null) every bag holds bag_size positions.
struct Bags {
  int64_t m = 0, count = 0, bag_size = 0;
  const int32_t* offsets = nullptr;
  int64_t begin(int64_t b) const { return offsets ? offsets[b] : b * bag_size; }
  int64_t end(int64_t b) const { return offsets ? (b + 1 < count ? offsets[b + 1] : m) : (b + 1) * bag_size; }
};

// y[b] = sum of table[index[j]] over the bag's positions, divided by the bag's size when mean
// (an empty bag gives zeros).
template <class T>
void embedding_bag_fwd(const T* table, const int32_t* index, T* y, int64_t d, const Bags& bags, bool mean) {
  for (int64_t b = 0; b < bags.count; ++b) {
    const int64_t j0 = bags.begin(b), j1 = bags.end(b);
    for (int64_t k = 0; k < d; ++k) {
      double s = 0;
      for (int64_t j = j0; j < j1; ++j) s += double(table[index[j] * d + k]);
      y[b * d + k] = static_cast<T>(mean && j1 > j0 ? s / double(j1 - j0) : s);
    }
  }
}

// dtable[index[j]] += dy[bag(j)] (divided by the bag's size when mean); dtable is overwritten.
template <class T>
void embedding_bag_bwd(const T* dy, const int32_t* index, T* dtable, int64_t d, int64_t rows, const Bags& bags,
                       bool mean) {
  std::vector<double> acc(static_cast<std::size_t>(rows * d), 0.0);
  for (int64_t b = 0; b < bags.count; ++b) {
    const int64_t j0 = bags.begin(b), j1 = bags.end(b);
    for (int64_t j = j0; j < j1; ++j)
      for (int64_t k = 0; k < d; ++k)
        acc[index[j] * d + k] += mean ? double(dy[b * d + k]) / double(j1 - j0) : double(dy[b * d + k]);
  }
  for (int64_t i = 0; i < rows * d; ++i) dtable[i] = static_cast<T>(acc[i]);
}

}  // namespace ditto::ref
