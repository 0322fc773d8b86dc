// Internal: ditto's own convolutions (kernels/conv2d_own.cu): the variants `ditto-gemm` and
// `ditto-direct` of the bwd_data / bwd_filter knobs, and `ditto-direct` of fwd, beside cuDNN's
// algorithms.
//
// ditto-direct fwd (any convolution, fp32 NCHW): an implicit GEMM (kernels/detail/fixed_gemm.cuh)
//   over output positions x the group's output channels; each output is one thread's fmaf chain
//   over (c, r, s) in ascending order from +0. Its bits depend on the output's own inputs and the
//   filter alone: the same for any batch size and any position of the example in the batch
//   (batch-invariant), and on any GPU. cuDNN gives no such promise: its kernels are picked per
//   problem size, batch included.
// ditto-gemm (any convolution whose groups are few): an explicit GEMM on cuBLAS.
//   bwd_data:   cols = W_g^T . dY_g per item, then dX by a gather-form col2im: every dX element is
//               written by one thread that adds its (r, s) taps in a fixed order. No atomics.
//   bwd_filter: P_i = dY_g . cols_g^T per item (an item is `images_per_gemm` consecutive images,
//               whose positions one GEMM reduces over), then dW = ((P_0 + P_1) + P_2) + ... in item
//               order by one thread per element. The chunking of items into batched calls only
//               bounds the workspace: the fold is the same left-to-right sum whatever the chunk.
//   A 1x1 convolution with stride 1 and no padding needs no im2col when one image is one item: the
//   GEMM reads x (and writes dx) in place.
//   Its bits depend on cuBLAS's kernel for each GEMM shape, which cuBLAS picks per GPU model and
//   SM count (atomics off): run_to_run, as cuBLAS documents it.
// ditto-direct: kernels of ditto's own with no library.
//   bwd_data (depthwise only: one input channel per group): one thread per dX element adds its
//               (multiplier, r, s) taps in a fixed order.
//   bwd_filter, depthwise: grid (K, parts): block (k, p) reduces its share of images with a CUB
//               block reduction (fixed order), then one thread per weight adds the parts in order.
//   bwd_filter, otherwise: an implicit GEMM (no im2col buffer) over 64x64 tiles of (k, c*r*s),
//               the positions (n, ho, wo) split into parts of a shape-fixed length; each thread owns
//               4x4 weights of its block's tile and adds the part's positions in order, and one
//               thread per weight adds the parts in order. Meant for the problems cuBLAS GEMMs serve
//               badly: few weights and a long reduction (a 3-channel stem).
//   Grids and part counts are functions of the shape alone: gpu_to_gpu.
// ditto-winograd (bwd_filter; 3x3 filters, stride 1, dilation 1, one group): Winograd's F(3x3, 2x2).
//   dW[k][c] is the 3x3 correlation of x[c] with dY[k], summed over images: dY is cut into 2x2 tiles
//   (zero past its edge), each tile's 4x4 window of x (zero outside, the padding) transformed as
//   V = Bt d B and the tile of dY as U = G g Gt, so that dW[k][c] = At (sum over tiles of U[k] * V[c]) A.
//   The sum over tiles is 16 GEMMs (one per element of the 4x4 transformed tile) of [K x positions] by
//   [positions x C], about 2.25x fewer products than ditto-gemm's. The images are cut into parts of a
//   shape-fixed size (the last padded with zero images); one cuBLAS GEMM per (element, part), the parts'
//   products folded in part order by one thread per element, then one thread per (k, c) applies At . A.
//   Bits: cuBLAS's per GEMM shape (run_to_run, as ditto-gemm); every other step a fixed-order map.
//   Its rounding differs from a direct sum's (the transforms add and scale): within float32 accuracy
//   of the direct result, not its bits.
// ditto-winograd (fwd and bwd_data; the same problems): Winograd's F(2x2, 3x3). The result is cut into
//   2x2 tiles; each tile's 4x4 window of the input (zero outside: the padding) is transformed as
//   V = Bt d B and each 3x3 filter as U = G w Gt, so a tile of output channel o is
//   At (sum over input channels i of U[o][i] * V[i]) A. The sum over input channels is 16 GEMMs (one per
//   element of the transformed tile) of [out channels x in channels] by [in channels x positions]:
//   2.25x fewer products than a direct convolution's. Nothing is summed over images: they are cut into
//   chunks of a shape-fixed size only to bound the workspace. bwd_data is the same forward convolution
//   with dY as the input, the filter turned 180 degrees with its channels swapped, and padding 2 - p
//   (the full correlation that takes dY back to x's size).
//   Bits: cuBLAS's per GEMM shape (run_to_run); the transforms are fixed-order maps. Within float32
//   accuracy of the direct result, not its bits.
// Everything here is deterministic by construction; kernels/conv2d.cpp selects, records and checks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#ifdef __CUDACC__
#define DITTO_HD __host__ __device__ __forceinline__
#else
#define DITTO_HD inline
#endif

namespace ditto { class Context; }

namespace ditto::own {

// One convolution problem (x N,C,H,W; w K,C/G,R,S; y N,K,Ho,Wo), all contiguous row-major.
struct ConvGeom {
  int64_t N = 0, C = 0, H = 0, W = 0, K = 0, R = 0, S = 0, Ho = 0, Wo = 0;
  int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1, G = 1;
  DITTO_HD int64_t Cg() const { return C / G; }
  DITTO_HD int64_t Kg() const { return K / G; }
  DITTO_HD int64_t CRSg() const { return C / G * R * S; }
  DITTO_HD int64_t HW() const { return H * W; }
  DITTO_HD int64_t HoWo() const { return Ho * Wo; }
  // 1x1, stride 1, no padding: im2col of one image is the image itself.
  DITTO_HD bool pointwise() const { return R == 1 && S == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0; }
  DITTO_HD bool depthwise() const { return C / G == 1; }
};

// How ditto-gemm splits one problem. Every field is a function of the geometry alone, so a shape
// always runs the same sequence of GEMMs and folds.
struct GemmPlan {
  int64_t images_per_item = 1;    // images one GEMM item spans (bwd_filter: reduces over)
  int64_t items_per_chunk = 1;    // items per batched cuBLAS call (the last chunk may hold fewer)
  bool in_place = false;          // pointwise and one image per item: no im2col / col2im buffers
  bool transpose_dy = false;      // dY rearranged to [K][images*HoWo] per item (images_per_item > 1)
  std::size_t cols_floats = 0;    // per chunk: im2col (bwd_filter) or GEMM output (bwd_data)
  std::size_t dy_floats = 0;      // per chunk: rearranged dY
  std::size_t partial_floats = 0; // per chunk: bwd_filter's per-item products
  std::size_t workspace_bytes() const { return (cols_floats + dy_floats + partial_floats) * sizeof(float); }
};

// Groups above this run as separate GEMMs per group; more than kMaxGemmGroups is not a
// ditto-gemm problem (depthwise and wide grouped convolutions are ditto-direct's).
constexpr int64_t kMaxGemmGroups = 64;
// The positions (images x HoWo) one GEMM item should reach before items span several images
// (bwd_filter: the reduction's length per item; bwd_data, which has no reduction over images and
// pays a rearrangement of dY for every extra image: the GEMM's rows), and the workspace a chunk
// may take.
constexpr int64_t kItemPositions = 2048, kItemPositionsData = 512;
constexpr std::size_t kChunkBytes = std::size_t(256) << 20;

// Whether each variant can run the problem; on false, why (for the error that lists what is
// supported).
bool gemm_supports(const ConvGeom& g, std::string* why);
bool direct_supports(const ConvGeom& g, bool bwd_filter, std::string* why);
bool direct_fwd_supports(const ConvGeom& g, std::string* why);
GemmPlan plan_gemm(const ConvGeom& g, bool bwd_filter);

// How ditto-winograd splits one problem (a function of the geometry alone): 2x2 tiles of dY, images per
// part (the GEMMs' reduction: about kWinogradPositions tile positions), parts (the last padded with zero
// images), parts per batched call (chunks bound the workspace; the fold is the same whatever the chunk).
struct WinogradPlan {
  int64_t tiles_h = 0, tiles_w = 0, images_per_part = 1, parts = 1, parts_per_chunk = 1;
  DITTO_HD int64_t tiles() const { return tiles_h * tiles_w; }
  DITTO_HD int64_t part_positions() const { return images_per_part * tiles(); }
  std::size_t u_floats = 0, v_floats = 0, m_floats = 0, acc_floats = 0;  // per chunk, but acc: 16 * K * C
  std::size_t workspace_bytes() const { return (u_floats + v_floats + m_floats + acc_floats) * sizeof(float); }
};
constexpr int64_t kWinogradPositions = 2048;
bool winograd_supports(const ConvGeom& g, std::string* why);
WinogradPlan plan_winograd(const ConvGeom& g);
// The same algorithm on the CPU, with each GEMM's sum in position order (the plan's parts, folded in
// order): the tests' check of the transforms and index maps against a direct correlation.
void winograd_filter_cpu(const ConvGeom& g, const float* x, const float* dy, float* dw);

// The forward convolution that ditto-winograd's fwd or bwd_data runs: `in` [N][Ci][H][W] by a 3x3 filter
// into `out` [N][Co][Ho][Wo], Ho = H + 2 ph - 2. fwd: in = x, out = y, the filter w[o][i]. bwd_data:
// in = dY, out = dX, the filter w[i][o] turned 180 degrees (`flip`), padding 2 - p.
struct WinogradConv {
  int64_t N = 0, Ci = 0, H = 0, W = 0, Co = 0, Ho = 0, Wo = 0, ph = 0, pw = 0;
  bool flip = false;
  DITTO_HD int64_t tiles_h() const { return (Ho + 1) / 2; }
  DITTO_HD int64_t tiles_w() const { return (Wo + 1) / 2; }
  DITTO_HD int64_t tiles() const { return tiles_h() * tiles_w(); }
  // Filter tap (r, s) of output channel o, input channel i, in w's own layout.
  DITTO_HD int64_t tap(int64_t o, int64_t i, int r, int s) const {
    return flip ? (i * Co + o) * 9 + (2 - r) * 3 + (2 - s) : (o * Ci + i) * 9 + r * 3 + s;
  }
};
WinogradConv winograd_conv_of(const ConvGeom& g, bool bwd_data);
// Images per chunk (a function of the problem alone: each chunk's transformed input and products
// stay within kChunkBytes), and the workspace: the transformed filters, then per chunk the
// transformed input [16][Ci][positions] and the products [16][Co][positions].
struct WinogradConvPlan {
  int64_t images_per_chunk = 1, chunks = 1;
  std::size_t u_floats = 0, v_floats = 0, m_floats = 0;
  std::size_t workspace_bytes() const { return (u_floats + v_floats + m_floats) * sizeof(float); }
};
WinogradConvPlan plan_winograd_conv(const WinogradConv& c);
bool winograd_conv_supports(const ConvGeom& g, std::string* why);
// The same algorithm on the CPU, each GEMM's sum in input-channel order: the tests' check of the
// transforms and index maps against a direct convolution.
void winograd_conv_cpu(const WinogradConv& c, const float* in, const float* w, float* out);

// The input transform's operand, for every direction on both sides: the 4x4 window of a plane [H][W]
// whose top-left corner is (h0, w0), row-major, zero outside the plane (padding) and all zero for a
// null plane (a padding image). On the device through the read-only cache.
template <class I>
DITTO_HD void winograd_window(const float* plane, I h0, I w0, I H, I W, float d[16]) {
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 4; ++b) {
      const I h = h0 + a, w = w0 + b;
      const bool in = plane != nullptr && h >= 0 && h < H && w >= 0 && w < W;
#ifdef __CUDA_ARCH__
      d[a * 4 + b] = in ? __ldg(plane + h * W + w) : 0.f;
#else
      d[a * 4 + b] = in ? plane[h * W + w] : 0.f;
#endif
    }
}

// The transforms, shared by the kernels and winograd_filter_cpu / winograd_conv_cpu. F(3x3, 2x2) (the
// weight gradient) and F(2x2, 3x3) (fwd, bwd_data) share Bt. d: a 4x4 window of x (row-major);
// t: its Bt d B. gt: a 2x2 tile of dY; u: G gt Gt. m: 16 sums; y: At m A (3x3, row-major).
DITTO_HD void winograd_input_tile(const float d[16], float t[16]) {
  float e[16];  // Bt d, Bt = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 -1 0 1]
  for (int j = 0; j < 4; ++j) {
    e[0 * 4 + j] = d[0 * 4 + j] - d[2 * 4 + j];
    e[1 * 4 + j] = d[1 * 4 + j] + d[2 * 4 + j];
    e[2 * 4 + j] = d[2 * 4 + j] - d[1 * 4 + j];
    e[3 * 4 + j] = d[3 * 4 + j] - d[1 * 4 + j];
  }
  for (int i = 0; i < 4; ++i) {  // (Bt d) B: the same combination of columns
    t[i * 4 + 0] = e[i * 4 + 0] - e[i * 4 + 2];
    t[i * 4 + 1] = e[i * 4 + 1] + e[i * 4 + 2];
    t[i * 4 + 2] = e[i * 4 + 2] - e[i * 4 + 1];
    t[i * 4 + 3] = e[i * 4 + 3] - e[i * 4 + 1];
  }
}
DITTO_HD void winograd_grad_tile(const float gt[4], float u[16]) {
  float e[8];  // G gt, G = [1 0; .5 .5; .5 -.5; 0 1]
  for (int j = 0; j < 2; ++j) {
    e[0 * 2 + j] = gt[0 * 2 + j];
    e[1 * 2 + j] = 0.5f * (gt[0 * 2 + j] + gt[1 * 2 + j]);
    e[2 * 2 + j] = 0.5f * (gt[0 * 2 + j] - gt[1 * 2 + j]);
    e[3 * 2 + j] = gt[1 * 2 + j];
  }
  for (int i = 0; i < 4; ++i) {  // (G gt) Gt
    u[i * 4 + 0] = e[i * 2 + 0];
    u[i * 4 + 1] = 0.5f * (e[i * 2 + 0] + e[i * 2 + 1]);
    u[i * 4 + 2] = 0.5f * (e[i * 2 + 0] - e[i * 2 + 1]);
    u[i * 4 + 3] = e[i * 2 + 1];
  }
}
DITTO_HD void winograd_output_tile(const float m[16], float y[9]) {
  float e[12];  // At m, At = [1 1 1 0; 0 1 -1 0; 0 1 1 1]
  for (int j = 0; j < 4; ++j) {
    e[0 * 4 + j] = m[0 * 4 + j] + m[1 * 4 + j] + m[2 * 4 + j];
    e[1 * 4 + j] = m[1 * 4 + j] - m[2 * 4 + j];
    e[2 * 4 + j] = m[1 * 4 + j] + m[2 * 4 + j] + m[3 * 4 + j];
  }
  for (int i = 0; i < 3; ++i) {  // (At m) A
    y[i * 3 + 0] = e[i * 4 + 0] + e[i * 4 + 1] + e[i * 4 + 2];
    y[i * 3 + 1] = e[i * 4 + 1] - e[i * 4 + 2];
    y[i * 3 + 2] = e[i * 4 + 1] + e[i * 4 + 2] + e[i * 4 + 3];
  }
}

// F(2x2, 3x3): w, a 3x3 filter (row-major); u = G w Gt, G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1].
DITTO_HD void winograd_filter_tile(const float w[9], float u[16]) {
  float e[12];  // G w
  for (int j = 0; j < 3; ++j) {
    e[0 * 3 + j] = w[0 * 3 + j];
    e[1 * 3 + j] = 0.5f * (w[0 * 3 + j] + w[1 * 3 + j] + w[2 * 3 + j]);
    e[2 * 3 + j] = 0.5f * (w[0 * 3 + j] - w[1 * 3 + j] + w[2 * 3 + j]);
    e[3 * 3 + j] = w[2 * 3 + j];
  }
  for (int i = 0; i < 4; ++i) {  // (G w) Gt
    u[i * 4 + 0] = e[i * 3 + 0];
    u[i * 4 + 1] = 0.5f * (e[i * 3 + 0] + e[i * 3 + 1] + e[i * 3 + 2]);
    u[i * 4 + 2] = 0.5f * (e[i * 3 + 0] - e[i * 3 + 1] + e[i * 3 + 2]);
    u[i * 4 + 3] = e[i * 3 + 2];
  }
}
// F(2x2, 3x3): m, 16 sums; y = At m A (2x2, row-major), At = [1 1 1 0; 0 1 -1 1] (the last column's sign
// follows Bt's last row, which is [0 -1 0 1]).
DITTO_HD void winograd_result_tile(const float m[16], float y[4]) {
  float e[8];  // At m
  for (int j = 0; j < 4; ++j) {
    e[0 * 4 + j] = m[0 * 4 + j] + m[1 * 4 + j] + m[2 * 4 + j];
    e[1 * 4 + j] = m[1 * 4 + j] - m[2 * 4 + j] + m[3 * 4 + j];
  }
  for (int i = 0; i < 2; ++i) {  // (At m) A
    y[i * 2 + 0] = e[i * 4 + 0] + e[i * 4 + 1] + e[i * 4 + 2];
    y[i * 2 + 1] = e[i * 4 + 1] - e[i * 4 + 2] + e[i * 4 + 3];
  }
}

// ditto-direct bwd_filter: parts per weight, and its workspace (parts * K * C/G * R * S floats).
// Depthwise: parts split the images. Otherwise parts split the positions (n, ho, wo) into runs of
// implicit_part_length(g) (a multiple of kImplicitStage); the last may be shorter.
int64_t direct_filter_parts(const ConvGeom& g);
std::size_t direct_filter_workspace_bytes(const ConvGeom& g);
constexpr int64_t kImplicitTile = 64, kImplicitStage = 32;
int64_t implicit_part_length(const ConvGeom& g);

// ---- index maps shared by the CUDA kernels and the CPU tests ----------------------------------

// Row crs = (c, r, s) of conv group grp's im2col: its input channel, and the offsets that take an
// output position (ho, wo) to the input pixel it reads, (ho*sh + hoff, wo*sw + woff). The im2col
// kernel works this out once per row and steps the positions.
template <class I>
struct Im2colRow {
  I c, hoff, woff;
};
template <class I>
DITTO_HD Im2colRow<I> im2col_row(const ConvGeom& g, I grp, I crs) {
  const I S = I(g.S), RS = I(g.R) * S;
  const I rs = crs % RS, r = rs / S, s = rs - r * S;
  return {grp * I(g.Cg()) + crs / RS, r * I(g.dh) - I(g.ph), s * I(g.dw) - I(g.pw)};
}

// im2col: row crs of conv group grp (im2col_row), column pos = ho*Wo + wo of image n.
// Returns the flat x index, or -1 for a padding tap (value 0). I: the index type (32-bit in kernels
// whose tensors allow it, 64-bit in the CPU tests).
template <class I>
DITTO_HD I im2col_source(const ConvGeom& g, I n, I grp, I crs, I pos) {
  const Im2colRow<I> row = im2col_row<I>(g, grp, crs);
  const I Wo = I(g.Wo), ho = pos / Wo, wo = pos - ho * Wo;
  const I h = ho * I(g.sh) + row.hoff, w = wo * I(g.sw) + row.woff;
  if (h < 0 || h >= I(g.H) || w < 0 || w >= I(g.W)) return -1;
  return ((n * I(g.C) + row.c) * I(g.H) + h) * I(g.W) + w;
}

// The output position (ho*Wo + wo) whose tap (r, s) lands on input pixel (h, w), or -1. UnitStride
// (sh == sw == 1, which the caller has checked) needs no division.
template <class I, bool UnitStride = false>
DITTO_HD I tap_target(const ConvGeom& g, I h, I w, I r, I s) {
  const I th = h + I(g.ph) - r * I(g.dh), tw = w + I(g.pw) - s * I(g.dw);
  if (th < 0 || tw < 0) return -1;
  const I ho = UnitStride ? th : th / I(g.sh), wo = UnitStride ? tw : tw / I(g.sw);
  if ((!UnitStride && (ho * I(g.sh) != th || wo * I(g.sw) != tw)) || ho >= I(g.Ho) || wo >= I(g.Wo)) return -1;
  return ho * I(g.Wo) + wo;
}

}  // namespace ditto::own

#ifdef __CUDACC__
#include <cublas_v2.h>
#endif

namespace ditto::cuda {
// Launchers (kernels/conv2d_own.cu). Pointers are device memory; ws holds the plan's workspace.
// tf32: cuBLAS's TF32 tensor-core compute instead of plain FMA (ditto-gemm only).
void conv_fwd_direct(Context& ctx, const own::ConvGeom& g, const float* x, const float* w, float* y);
void conv_bwd_data_gemm(Context& ctx, const own::ConvGeom& g, const float* w, const float* dy, float* dx, void* ws,
                        bool tf32);
void conv_bwd_filter_gemm(Context& ctx, const own::ConvGeom& g, const float* x, const float* dy, float* dw, void* ws,
                          bool tf32);
void conv_bwd_data_direct(Context& ctx, const own::ConvGeom& g, const float* w, const float* dy, float* dx);
void conv_bwd_filter_direct(Context& ctx, const own::ConvGeom& g, const float* x, const float* dy, float* dw,
                            void* ws);
void conv_bwd_filter_winograd(Context& ctx, const own::ConvGeom& g, const float* x, const float* dy, float* dw,
                              void* ws, bool tf32);
// ditto-winograd fwd (y from x, w) and bwd_data (dx from dy, w): the forward convolution
// own::winograd_conv_of(g, bwd_data).
void conv_winograd(Context& ctx, const own::ConvGeom& g, bool bwd_data, const float* in, const float* w, float* out,
                   void* ws, bool tf32);
}  // namespace ditto::cuda
