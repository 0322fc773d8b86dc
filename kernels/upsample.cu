// Upsampling CUDA kernels; the per-element arithmetic is kernels/upsample_ref.h's, shared with the
// CPU (the gather below is exactly the function tests/cpu_upsample.cpp checks on the host).
//
// upsample_fwd_kernel: one thread per output, no reduction: deterministic.
// upsample_bwd_atomic_kernel: one thread per OUTPUT atomicAdds (wy * wx) * dy into each tap of
//   dx. Outputs share taps, so the float adds land in the order threads arrive: NOT deterministic
//   (CCCL's not_guaranteed).
// upsample_bwd_gather_kernel: one thread per INPUT sums the same contributions in a fixed order
//   (ref::upsample_gather_at): each dx is written by one thread, no atomics, and the order depends
//   on the shapes alone: deterministic on any GPU (CCCL's gpu_to_gpu). For bilinear it reads the
//   taps and each input's output range from per-axis tables that tap_tables_kernel fills first
//   (ref::fill_tap_table, one thread per entry), instead of computing tens of taps per thread.
// nearest_bwd_whole_kernel: the gather for nearest with whole scale factors (out = k * in along both
//   axes), where input i owns outputs [i * k, i * k + k) exactly as ref::nearest_first_out says: the
//   same sums in the same order (rows, then columns, ascending), so the same bits, without the
//   gather's 64-bit divisions per element (they made it 2.4x PyTorch's kernel at 64x64 -> 128x128).
// nearest_fwd_whole_kernel: the forward for nearest with whole scale factors: one thread per input
//   element writes the kh x kw outputs it owns (ref::nearest_src's copy, as float2 pairs where kw is
//   2), without the forward kernel's divisions per output.
#include <algorithm>
#include <climits>

#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "kernels/detail/upsample_cuda.h"

namespace ditto::cuda {
namespace {

// (plane, row, column) of flat index i of planes of h x w.
__device__ __forceinline__ void split_plane(int64_t i, int64_t h, int64_t w, int64_t& pl, int64_t& y, int64_t& x) {
  const int64_t q = ref::div_nonneg(i, w);
  x = i - q * w;
  pl = ref::div_nonneg(q, h);
  y = q - pl * h;
}

__global__ void upsample_fwd_kernel(const float* __restrict__ x, float* __restrict__ y, ref::UpsampleDims d) {
  const int64_t total = d.planes * d.oh * d.ow;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t pl, oh, ow;
    split_plane(i, d.oh, d.ow, pl, oh, ow);
    y[i] = ref::upsample_fwd_at<float>(x + pl * d.h * d.w, oh, ow, d);
  }
}

__global__ void upsample_bwd_atomic_kernel(const float* __restrict__ dy, float* __restrict__ dx, ref::UpsampleDims d) {
  const int64_t total = d.planes * d.oh * d.ow;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t pl, oh, ow;
    split_plane(i, d.oh, d.ow, pl, oh, ow);
    float* dxp = dx + pl * d.h * d.w;
    const float g = dy[i];
    if (!d.bilinear) {
      atomicAdd(dxp + ref::nearest_src(oh, d.h, d.oh) * d.w + ref::nearest_src(ow, d.w, d.ow), g);
      continue;
    }
    const ref::LinearTap<float> th = ref::linear_tap<float>(oh, d.h, d.oh, d.align_corners);
    const ref::LinearTap<float> tw = ref::linear_tap<float>(ow, d.w, d.ow, d.align_corners);
    atomicAdd(dxp + th.i0 * d.w + tw.i0, ref::mul_rn(ref::mul_rn(th.l0, tw.l0), g));
    atomicAdd(dxp + th.i0 * d.w + tw.i1, ref::mul_rn(ref::mul_rn(th.l0, tw.l1), g));
    atomicAdd(dxp + th.i1 * d.w + tw.i0, ref::mul_rn(ref::mul_rn(th.l1, tw.l0), g));
    atomicAdd(dxp + th.i1 * d.w + tw.i1, ref::mul_rn(ref::mul_rn(th.l1, tw.l1), g));
  }
}

__global__ void tap_tables_kernel(ref::UpsampleDims d, int64_t* row_range, int64_t* col_range,
                                  ref::LinearTap<float>* row_taps, ref::LinearTap<float>* col_taps) {
  const int64_t rows = d.h + d.oh, total = rows + d.w + d.ow;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total; k += int64_t(gridDim.x) * blockDim.x) {
    if (k < rows)
      ref::fill_tap_table(k, d.h, d.oh, d.align_corners, row_range, row_taps);
    else
      ref::fill_tap_table(k - rows, d.w, d.ow, d.align_corners, col_range, col_taps);
  }
}

__global__ void upsample_bwd_gather_kernel(const float* __restrict__ dy, float* __restrict__ dx, ref::UpsampleDims d,
                                           ref::TapTables taps) {
  const int64_t total = d.planes * d.h * d.w;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t pl, ih, iw;
    split_plane(i, d.h, d.w, pl, ih, iw);
    dx[i] = ref::upsample_gather_at<float>(dy + pl * d.oh * d.ow, ih, iw, d, taps);
  }
}

// Threads over the columns of an input row, rows (plane * h + ih) over y. Since oh = kh * h, input row r
// owns the flattened output rows r * kh .. r * kh + kh - 1.
__global__ void nearest_bwd_whole_kernel(const float* __restrict__ dy, float* __restrict__ dx, int64_t rows, int w,
                                         int kh, int kw) {
  const int iw = blockIdx.x * blockDim.x + threadIdx.x;
  if (iw >= w) return;
  const int64_t ow = int64_t(w) * kw;
  for (int64_t r = blockIdx.y * int64_t(blockDim.y) + threadIdx.y; r < rows; r += int64_t(gridDim.y) * blockDim.y) {
    const float* src = dy + r * kh * ow + int64_t(iw) * kw;
    float s = 0.f;
    for (int a = 0; a < kh; ++a)
      for (int b = 0; b < kw; ++b) s += src[a * ow + b];
    dx[r * w + iw] = s;
  }
}

// Threads over the columns of an input row, rows (plane * h + ih) over y: input (r, iw) is output rows
// r * kh .. r * kh + kh - 1 (flattened over planes), columns iw * kw .. iw * kw + kw - 1.
template <int KW>
__global__ void nearest_fwd_whole_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t rows, int w,
                                         int kh, int kw) {
  const int iw = blockIdx.x * blockDim.x + threadIdx.x;
  if (iw >= w) return;
  const int k = KW ? KW : kw;
  const int64_t ow = int64_t(w) * k;
  for (int64_t r = blockIdx.y * int64_t(blockDim.y) + threadIdx.y; r < rows; r += int64_t(gridDim.y) * blockDim.y) {
    const float v = __ldg(x + r * w + iw);
    float* dst = y + r * kh * ow + int64_t(iw) * k;
    for (int a = 0; a < kh; ++a) {
      if (KW == 2) {
        *reinterpret_cast<float2*>(dst + a * ow) = make_float2(v, v);
      } else {
        for (int b = 0; b < k; ++b) dst[a * ow + b] = v;
      }
    }
  }
}

// The whole-scale nearest kernels' launch (ref::nearest_whole): a block of (bx, by) threads, bx columns
// of a row (a multiple of 32), by rows.
struct RowsGrid {
  dim3 grid, block;
};
RowsGrid rows_grid(const ref::UpsampleDims& d) {
  const unsigned bx = static_cast<unsigned>(std::min<int64_t>((d.w + 31) / 32 * 32, kThreads));
  const unsigned by = kThreads / bx;
  const int64_t rows = d.planes * d.h;
  return {dim3(static_cast<unsigned>((d.w + bx - 1) / bx), static_cast<unsigned>(std::min<int64_t>((rows + by - 1) / by, 65535))),
          dim3(bx, by)};
}

// The tables' layout in the workspace: row ranges, column ranges, row taps, column taps.
struct TableLayout {
  std::size_t row_range = 0, col_range = 0, row_taps = 0, col_taps = 0, total = 0;
  explicit TableLayout(const ref::UpsampleDims& d) {
    auto aligned = [](std::size_t b) { return (b + 255) / 256 * 256; };
    if (!d.bilinear) return;
    col_range = row_range + aligned(sizeof(int64_t) * std::size_t(2 * d.h));
    row_taps = col_range + aligned(sizeof(int64_t) * std::size_t(2 * d.w));
    col_taps = row_taps + aligned(sizeof(ref::LinearTap<float>) * std::size_t(d.oh));
    total = col_taps + aligned(sizeof(ref::LinearTap<float>) * std::size_t(d.ow));
  }
};

}  // namespace

void upsample_fwd(Context& ctx, const float* x, float* y, const ref::UpsampleDims& d) {
  const int64_t n = d.planes * d.oh * d.ow;
  if (n == 0) return;
  cudaStream_t st = detail::stream_of(ctx);
  if (ref::nearest_whole(d)) {
    const RowsGrid g = rows_grid(d);
    const int w = static_cast<int>(d.w), kh = static_cast<int>(d.oh / d.h), kw = static_cast<int>(d.ow / d.w);
    if (kw == 2) nearest_fwd_whole_kernel<2><<<g.grid, g.block, 0, st>>>(x, y, d.planes * d.h, w, kh, kw);
    else nearest_fwd_whole_kernel<0><<<g.grid, g.block, 0, st>>>(x, y, d.planes * d.h, w, kh, kw);
    DITTO_CHECK_LAUNCH(ctx);
    return;
  }
  upsample_fwd_kernel<<<blocks_for(n), kThreads, 0, st>>>(x, y, d);
  DITTO_CHECK_LAUNCH(ctx);
}

void upsample_bwd_atomic(Context& ctx, const float* dy, float* dx, const ref::UpsampleDims& d) {
  cudaStream_t st = detail::stream_of(ctx);
  const int64_t in = d.planes * d.h * d.w, n = d.planes * d.oh * d.ow;
  if (in > 0) DITTO_CUDA_CHECK(cudaMemsetAsync(dx, 0, sizeof(float) * static_cast<std::size_t>(in), st));
  if (n == 0) return;
  upsample_bwd_atomic_kernel<<<blocks_for(n), kThreads, 0, st>>>(dy, dx, d);
  DITTO_CHECK_LAUNCH(ctx);
}

std::size_t upsample_gather_workspace(const ref::UpsampleDims& d) { return TableLayout(d).total; }

void upsample_bwd_gather(Context& ctx, const float* dy, float* dx, const ref::UpsampleDims& d, void* workspace) {
  const int64_t n = d.planes * d.h * d.w;
  if (n == 0) return;
  cudaStream_t st = detail::stream_of(ctx);
  if (ref::nearest_whole(d)) {
    const RowsGrid g = rows_grid(d);
    nearest_bwd_whole_kernel<<<g.grid, g.block, 0, st>>>(dy, dx, d.planes * d.h, static_cast<int>(d.w),
                                                         static_cast<int>(d.oh / d.h), static_cast<int>(d.ow / d.w));
    DITTO_CHECK_LAUNCH(ctx);
    return;
  }
  ref::TapTables taps;
  if (d.bilinear) {
    const TableLayout l(d);
    char* ws = static_cast<char*>(workspace);
    auto* row_range = reinterpret_cast<int64_t*>(ws + l.row_range);
    auto* col_range = reinterpret_cast<int64_t*>(ws + l.col_range);
    auto* row_taps = reinterpret_cast<ref::LinearTap<float>*>(ws + l.row_taps);
    auto* col_taps = reinterpret_cast<ref::LinearTap<float>*>(ws + l.col_taps);
    tap_tables_kernel<<<blocks_for(d.h + d.oh + d.w + d.ow), kThreads, 0, st>>>(d, row_range, col_range, row_taps,
                                                                               col_taps);
    DITTO_CHECK_LAUNCH(ctx);
    taps = {row_range, col_range, row_taps, col_taps};
  }
  upsample_bwd_gather_kernel<<<blocks_for(n), kThreads, 0, st>>>(dy, dx, d, taps);
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace ditto::cuda
