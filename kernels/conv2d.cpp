// conv2d: operand checks, algorithm selection through one traits-driven path for the three
// cuDNN directions, manifest records, CPU/CUDA dispatch and the tape entry.
//
// Selection (per direction, shape, precision and policy ask; cached in ctx.op_state("conv2d")):
//   pinned            that algorithm, or PolicyError listing what cuDNN supports for the shape
//   heuristic         cuDNN's pick: first successful result of cudnnGetConvolution*Algorithm_v7
//                     (skipping results whose math type the layer's precision forbids)
//   deterministic     bf16/fp16: the engine variant (cuDNN's backend API, heuristic mode A's first
//                     reproducible configuration) where it has one and its workspace can be
//                     allocated; otherwise the first algorithm in cuDNN's heuristic ranking
//                     (cudnnGetConvolution*Algorithm_v7) that cuDNN labels CUDNN_DETERMINISTIC and
//                     whose workspace can be allocated; with a tuning table on the context
//                     (engine/tuning.h): the table's algorithm for the problem (pinned path, no
//                     Find), or, while tuning, the fastest deterministic one among cudnnFind*,
//                     ditto's own and the engine, written into the table
//   nondeterministic  the atomics algorithm (bwd_data algo0, bwd_filter algo0); forward has
//                     none and resolves like heuristic (the manifest says what ran)
//   fastest           fastest successful result of cudnnFind*, ditto's own and the engine
// Find runs the candidates (it allocates and synchronizes): it belongs to selection, which
// runs once per shape. The steady-state path only sets up host descriptors, takes its
// workspace from the stream-ordered pool and queues the cuDNN call. Never a fallback: a
// workspace that cannot be allocated is a PolicyError naming the layer and algorithm.
#include "kernels/conv2d.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
#include <memory>
#include <optional>

#include "engine/detail/capture_gate.h"
#include "engine/detail/cuda_state.h"
#include "engine/detail/cudnn_desc.h"
#include "engine/error.h"
#include "engine/profiler.h"
#include "engine/timer.h"
#include "engine/tuning.h"
#include "engine/operand_check.h"
#include "engine/tensor_ops.h"
#include "kernels/conv2d_ref.h"
#include "kernels/detail/conv2d_own.h"
#include "kernels/detail/cudnn_engine.h"

namespace ditto {

// Our enums are cuDNN's numbering: the traits below cast between them.
static_assert(int(ConvFwdAlgo::ImplicitGemm) == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM);
static_assert(int(ConvFwdAlgo::ImplicitPrecompGemm) == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM);
static_assert(int(ConvFwdAlgo::Gemm) == CUDNN_CONVOLUTION_FWD_ALGO_GEMM);
static_assert(int(ConvFwdAlgo::Direct) == CUDNN_CONVOLUTION_FWD_ALGO_DIRECT);
static_assert(int(ConvFwdAlgo::Fft) == CUDNN_CONVOLUTION_FWD_ALGO_FFT);
static_assert(int(ConvFwdAlgo::FftTiling) == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING);
static_assert(int(ConvFwdAlgo::Winograd) == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD);
static_assert(int(ConvFwdAlgo::WinogradNonfused) == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED);
static_assert(int(ConvFwdAlgo::WinogradNonfused) + 1 == CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
static_assert(int(ConvBwdDataAlgo::Algo0) == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0);
static_assert(int(ConvBwdDataAlgo::Algo1) == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1);
static_assert(int(ConvBwdDataAlgo::Fft) == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT);
static_assert(int(ConvBwdDataAlgo::FftTiling) == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING);
static_assert(int(ConvBwdDataAlgo::Winograd) == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD);
static_assert(int(ConvBwdDataAlgo::WinogradNonfused) == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED);
static_assert(int(ConvBwdDataAlgo::WinogradNonfused) + 1 == CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT);
static_assert(int(ConvBwdFilterAlgo::Algo0) == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0);
static_assert(int(ConvBwdFilterAlgo::Algo1) == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1);
static_assert(int(ConvBwdFilterAlgo::Fft) == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT);
static_assert(int(ConvBwdFilterAlgo::Algo3) == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3);
static_assert(int(ConvBwdFilterAlgo::Winograd) == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD);
static_assert(int(ConvBwdFilterAlgo::WinogradNonfused) == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED);
static_assert(int(ConvBwdFilterAlgo::FftTiling) == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING);
static_assert(int(ConvBwdFilterAlgo::FftTiling) + 1 == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT);

// ---- the family's knobs ------------------------------------------------------------------------
// cuDNN's forward algorithms are all documented deterministic; ALGO_0 (both backward directions)
// and bwd_filter ALGO_3 add partial sums with atomics. A cuDNN deterministic algorithm is
// reproducible on one GPU model (run_to_run). ditto-gemm's order is fixed by the shape but its
// GEMMs are cuBLAS's (run_to_run); ditto-direct uses no library (gpu_to_gpu).
namespace {
constexpr Guarantee kNot = Guarantee::NotGuaranteed, kRun = Guarantee::RunToRun, kGpu = Guarantee::GpuToGpu,
                    kUnk = Guarantee::Unknown;
constexpr Impl kLib = Impl::Library, kOwn = Impl::Ditto;
// The backend-API variants, last in every direction (conv2d.h).
const VariantSpec kEngineVariant{"engine", kRun, kLib,
                                 "cuDNN backend API: heuristic mode A's first configuration its notes allow"};
const VariantSpec kEngineFirstVariant{"engine-first", kUnk, kLib,
                                      "cuDNN backend API: heuristic mode A's first configuration, nondeterministic "
                                      "ones included (PyTorch's default)",
                                      false, false, /*per_shape_guarantee=*/true};
}  // namespace

DITTO_KNOB(conv_fwd_knob, {op::conv2d, "fwd",
                           {{"implicit_gemm", kRun, kLib, "cuDNN IMPLICIT_GEMM"},
                            {"implicit_precomp_gemm", kRun, kLib, "cuDNN IMPLICIT_PRECOMP_GEMM"},
                            {"gemm", kRun, kLib, "cuDNN GEMM"},
                            {"direct", kRun, kLib, "cuDNN DIRECT"},
                            {"fft", kRun, kLib, "cuDNN FFT"},
                            {"fft_tiling", kRun, kLib, "cuDNN FFT_TILING"},
                            {"winograd", kRun, kLib, "cuDNN WINOGRAD"},
                            {"winograd_nonfused", kRun, kLib, "cuDNN WINOGRAD_NONFUSED"},
                            {"ditto-direct", kGpu, kOwn,
                             "fixed-order implicit GEMM, no library: batch-invariant (fp32 NCHW)"},
                            {"ditto-winograd", kRun, kOwn, "Winograd F(2x2, 3x3) transforms, GEMMs on cuBLAS"},
                            kEngineVariant, kEngineFirstVariant},
                           "", true, "the forward algorithm"})
DITTO_KNOB(conv_bwd_data_knob, {op::conv2d, "bwd_data",
                                {{"algo0", kNot, kLib, "cuDNN ALGO_0: atomics"},
                                 {"algo1", kRun, kLib, "cuDNN ALGO_1"},
                                 {"fft", kRun, kLib, "cuDNN FFT"},
                                 {"fft_tiling", kRun, kLib, "cuDNN FFT_TILING"},
                                 {"winograd", kRun, kLib, "cuDNN WINOGRAD"},
                                 {"winograd_nonfused", kRun, kLib, "cuDNN WINOGRAD_NONFUSED"},
                                 {"ditto-gemm", kRun, kOwn, "explicit GEMM on cuBLAS, gather-form col2im"},
                                 {"ditto-direct", kGpu, kOwn, "depthwise gather, no library"},
                                 {"ditto-winograd", kRun, kOwn,
                                  "Winograd F(2x2, 3x3) of dY with the turned filter, GEMMs on cuBLAS"},
                                 kEngineVariant, kEngineFirstVariant},
                                "", true, "the input-gradient algorithm"})
DITTO_KNOB(conv_bwd_filter_knob, {op::conv2d, "bwd_filter",
                                  {{"algo0", kNot, kLib, "cuDNN ALGO_0: atomics"},
                                   {"algo1", kRun, kLib, "cuDNN ALGO_1"},
                                   {"fft", kRun, kLib, "cuDNN FFT"},
                                   {"algo3", kNot, kLib, "cuDNN ALGO_3: atomics"},
                                   {"winograd", kRun, kLib, "cuDNN WINOGRAD"},
                                   {"winograd_nonfused", kRun, kLib, "cuDNN WINOGRAD_NONFUSED"},
                                   {"fft_tiling", kRun, kLib, "cuDNN FFT_TILING"},
                                   {"ditto-gemm", kRun, kOwn, "per-item GEMMs on cuBLAS, folded in item order"},
                                   {"ditto-direct", kGpu, kOwn, "fixed-tree partial sums, no library"},
                                   {"ditto-winograd", kRun, kOwn,
                                    "Winograd F(3x3, 2x2) transforms, GEMMs on cuBLAS over parts folded in order"},
                                   kEngineVariant, kEngineFirstVariant},
                                  "", true, "the weight-gradient algorithm"})
DITTO_KNOB(conv_precision_knob, {op::conv2d, "precision", precision_variants(), "fp32", false,
                                 "where the convolution rounds: fp32, tf32, bf16, fp16 (PyTorch's cuDNN default is "
                                 "tf32; ditto's modes never change precision)"})

DITTO_KNOB(conv_layout_knob, {op::conv2d, "layout",
                              {{"nchw", kRun, kLib, "cuDNN reads ditto's NCHW tensors"},
                               {"nhwc", kRun, kLib,
                                "channels-last copies made in the rounding pass, results transposed back"}},
                              "nchw", false, "the memory layout cuDNN computes in"})

DITTO_KNOB(conv_output_knob, {op::conv2d, "output",
                              {{"fp32", kRun, kOwn, "results widened to fp32 NCHW for the next op"},
                               {"native", kRun, kOwn,
                                "results handed on in the precision's dtype and the layer's layout, as cuDNN wrote them"}},
                              "fp32", false, "the form a convolution hands its results on in"})

const char* name_of(ConvFwdAlgo a) { return variant_name(conv_fwd_knob(), a); }
const char* name_of(ConvOutput o) { return variant_name(conv_output_knob(), o); }
const char* name_of(ConvLayout l) { return variant_name(conv_layout_knob(), l); }
const char* name_of(ConvBwdDataAlgo a) { return variant_name(conv_bwd_data_knob(), a); }
const char* name_of(ConvBwdFilterAlgo a) { return variant_name(conv_bwd_filter_knob(), a); }

namespace {

std::string params_str(const Conv2dParams& p) {
  return fmt::format("stride {}x{}, pad {}x{}, dilation {}x{}, groups {}", p.stride_h, p.stride_w, p.pad_h,
                     p.pad_w, p.dilation_h, p.dilation_w, p.groups);
}

std::string op_name(const std::string& layer) { return fmt::format("conv2d layer '{}'", layer); }

// ---- cuDNN descriptors (RAII) -------------------------------------------------------------

using TensorDesc = detail::CudnnTensorDesc;

class FilterDesc {
 public:
  FilterDesc() { DITTO_CUDNN_CHECK(cudnnCreateFilterDescriptor(&d_)); }
  ~FilterDesc() { cudnnDestroyFilterDescriptor(d_); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
  // Dimensions K, C, R, S; channels_last says the memory is K, R, S, C.
  void set(const Shape& s, DType t, bool channels_last) {
    DITTO_CUDNN_CHECK(cudnnSetFilter4dDescriptor(d_, detail::cudnn_type(t),
                                                 channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, int(s[0]),
                                                 int(s[1]), int(s[2]), int(s[3])));
  }
  cudnnFilterDescriptor_t get() const { return d_; }

 private:
  cudnnFilterDescriptor_t d_ = nullptr;
};

cudnnMathType_t cudnn_math(Precision p) {
  // FMA_MATH keeps tensor cores out entirely; DEFAULT_MATH lets cuDNN use TF32 tensor cores
  // for float data on Ampere and later; bf16/f16 data ask for tensor cores outright.
  if (p == Precision::Fp32) return CUDNN_FMA_MATH;
  return p == Precision::Tf32 ? CUDNN_DEFAULT_MATH : CUDNN_TENSOR_OP_MATH;
}

class ConvDesc {
 public:
  ConvDesc() { DITTO_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d_)); }
  ~ConvDesc() { cudnnDestroyConvolutionDescriptor(d_); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
  // The compute type is float under every precision: bf16/f16 data with float compute is cuDNN's
  // PSEUDO_BFLOAT16 / PSEUDO_HALF configuration (fp32 accumulation), never TRUE_HALF.
  void set(const Conv2dParams& p, Precision precision) {
    DITTO_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(d_, p.pad_h, p.pad_w, p.stride_h, p.stride_w, p.dilation_h,
                                                      p.dilation_w, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    DITTO_CUDNN_CHECK(cudnnSetConvolutionGroupCount(d_, p.groups));
    DITTO_CUDNN_CHECK(cudnnSetConvolutionMathType(d_, cudnn_math(precision)));
  }
  cudnnConvolutionDescriptor_t get() const { return d_; }

 private:
  cudnnConvolutionDescriptor_t d_ = nullptr;
};

// How a layer's operands reach cuDNN: rounded to the precision's dtype, in NCHW or channels-last.
struct ConvForm {
  Precision precision = Precision::Fp32;
  ConvLayout layout = ConvLayout::Nchw;
  ConvOutput output = ConvOutput::Fp32;
  DType dtype() const { return precision_dtype(precision); }
  bool nhwc() const { return layout == ConvLayout::Nhwc; }
  Layout memory() const { return nhwc() ? Layout::Nhwc : Layout::Nchw; }
  std::string key() const { return nhwc() ? std::string(name_of(precision)) + "+nhwc" : name_of(precision); }
};

// One convolution problem: shapes (checked) and parameters.
struct ConvSpec {
  Shape x, w, y;
  Conv2dParams p;
  std::string key() const {
    return fmt::format("x{}w{}s{},{}p{},{}d{},{}g{}", shape_str(x), shape_str(w), p.stride_h, p.stride_w, p.pad_h,
                       p.pad_w, p.dilation_h, p.dilation_w, p.groups);
  }
  std::string str() const {
    return fmt::format("x {}, w {}, y {}, {}", shape_str(x), shape_str(w), shape_str(y), params_str(p));
  }
  own::ConvGeom geom() const {
    own::ConvGeom g;
    g.N = x[0], g.C = x[1], g.H = x[2], g.W = x[3], g.K = w[0], g.R = w[2], g.S = w[3], g.Ho = y[2], g.Wo = y[3];
    g.sh = p.stride_h, g.sw = p.stride_w, g.ph = p.pad_h, g.pw = p.pad_w, g.dh = p.dilation_h, g.dw = p.dilation_w;
    g.G = p.groups;
    return g;
  }
};

// All descriptors of one problem; the three directions share them (y doubles as dy, x as dx,
// w as dw).
struct ConvDescs {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
  ConvDescs(const ConvSpec& s, const ConvForm& f) {
    x.set(s.x, f.dtype(), f.nhwc());
    y.set(s.y, f.dtype(), f.nhwc());
    w.set(s.w, f.dtype(), f.nhwc());
    conv.set(s.p, f.precision);
  }
};

// Device pointers of one call: inputs, and `out` for the direction's result.
struct ConvOperands {
  const void* x = nullptr;
  const void* w = nullptr;
  const void* dy = nullptr;
  void* out = nullptr;
};

// ---- the traits table: everything that differs between the three directions ---------------

// ditto's own backward algorithms read and write float NCHW: under bf16/fp16 they would not round
// where the layer's precision says, so they are not offered (pinned, an error listing the rest).
bool own_form_supported(const ConvForm& f, std::string* why) {
  if (is_reduced(f.precision)) {
    *why = fmt::format("ditto's own algorithms compute in fp32 or tf32, not {}", name_of(f.precision));
    return false;
  }
  if (f.nhwc()) {
    *why = "ditto's own algorithms read NCHW, not the nhwc layout";
    return false;
  }
  return true;
}

struct FwdTraits {
  using Algo = ConvFwdAlgo;
  using CudnnAlgo = cudnnConvolutionFwdAlgo_t;
  using Perf = cudnnConvolutionFwdAlgoPerf_t;
  static constexpr int kCount = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
  static constexpr int kEngine = int(ConvFwdAlgo::Engine), kEngineFirst = int(ConvFwdAlgo::EngineFirst);
  static constexpr int kVariants = kEngineFirst + 1;
  static constexpr detail::ConvDirection kDirection = detail::ConvDirection::Fwd;
  static const Shape& result_shape(const ConvSpec& s) { return s.y; }
  static constexpr const char* kKnob = "fwd";
  static constexpr ProfileKind kProfile = ProfileKind::ConvFwd;
  static constexpr int kAtomicsAlgo = -1;  // no forward algorithm is labelled as using atomics
  static Determinism documented(int) { return Determinism::Yes; }
  static AlgoChoice<Algo> choice(const Policy& p, const std::string& layer, const std::string& shape) {
    return conv_choice<Algo>(p, layer, shape);
  }
  static cudnnStatus_t heuristic(cudnnHandle_t h, const ConvDescs& d, int n, int* got, Perf* r) {
    return cudnnGetConvolutionForwardAlgorithm_v7(h, d.x.get(), d.w.get(), d.conv.get(), d.y.get(), n, got, r);
  }
  static cudnnStatus_t find(cudnnHandle_t h, const ConvDescs& d, int n, int* got, Perf* r) {
    return cudnnFindConvolutionForwardAlgorithm(h, d.x.get(), d.w.get(), d.conv.get(), d.y.get(), n, got, r);
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const ConvDescs& d, CudnnAlgo a, std::size_t* bytes) {
    return cudnnGetConvolutionForwardWorkspaceSize(h, d.x.get(), d.w.get(), d.conv.get(), d.y.get(), a, bytes);
  }
  static bool own_supports(int a, const own::ConvGeom& g, const ConvForm& f, std::string* why) {
    if (!own_form_supported(f, why)) return false;
    return a == int(ConvFwdAlgo::DittoWinograd) ? own::winograd_conv_supports(g, why) : own::direct_fwd_supports(g, why);
  }
  static std::size_t own_workspace(int a, const own::ConvGeom& g) {
    return a == int(ConvFwdAlgo::DittoWinograd)
               ? own::plan_winograd_conv(own::winograd_conv_of(g, false)).workspace_bytes()
               : 0;
  }
  static Impl own_impl(int a) { return a == int(ConvFwdAlgo::DittoWinograd) ? Impl::Library : Impl::Ditto; }
  // ditto-direct: fp32 fmaf either way, it has no tensor-core path (tf32 layers get fp32's bits).
  static void run_own(Context& ctx, int a, const own::ConvGeom& g, const ConvOperands& o, void* ws, bool tf32) {
    const auto* x = static_cast<const float*>(o.x);
    const auto* w = static_cast<const float*>(o.w);
    auto* y = static_cast<float*>(o.out);
    if (a == int(ConvFwdAlgo::DittoWinograd)) cuda::conv_winograd(ctx, g, false, x, w, y, ws, tf32);
    else cuda::conv_fwd_direct(ctx, g, x, w, y);
  }
  static cudnnStatus_t compute(cudnnHandle_t h, const ConvDescs& d, CudnnAlgo a, const ConvOperands& o, void* ws,
                               std::size_t ws_bytes) {
    const float one = 1.f, zero = 0.f;
    return cudnnConvolutionForward(h, &one, d.x.get(), o.x, d.w.get(), o.w, d.conv.get(), a, ws, ws_bytes, &zero,
                                   d.y.get(), o.out);
  }
  static cudnnStatus_t engine(cudnnHandle_t h, const detail::EnginePlan& plan, const ConvOperands& o, void* ws) {
    return detail::engine_execute(h, plan, o.x, o.w, o.out, ws);
  }
};

struct BwdDataTraits {
  using Algo = ConvBwdDataAlgo;
  using CudnnAlgo = cudnnConvolutionBwdDataAlgo_t;
  using Perf = cudnnConvolutionBwdDataAlgoPerf_t;
  static constexpr int kCount = CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
  static constexpr int kEngine = int(ConvBwdDataAlgo::Engine), kEngineFirst = int(ConvBwdDataAlgo::EngineFirst);
  static constexpr int kVariants = kEngineFirst + 1;
  static constexpr detail::ConvDirection kDirection = detail::ConvDirection::BwdData;
  static const Shape& result_shape(const ConvSpec& s) { return s.x; }
  static constexpr const char* kKnob = "bwd_data";
  static constexpr ProfileKind kProfile = ProfileKind::ConvBwdData;
  static constexpr int kAtomicsAlgo = CUDNN_CONVOLUTION_BWD_DATA_ALGO_0;
  static Determinism documented(int a) {
    return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 ? Determinism::No : Determinism::Yes;
  }
  static AlgoChoice<Algo> choice(const Policy& p, const std::string& layer, const std::string& shape) {
    return conv_choice<Algo>(p, layer, shape);
  }
  static cudnnStatus_t heuristic(cudnnHandle_t h, const ConvDescs& d, int n, int* got, Perf* r) {
    return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w.get(), d.y.get(), d.conv.get(), d.x.get(), n, got, r);
  }
  static cudnnStatus_t find(cudnnHandle_t h, const ConvDescs& d, int n, int* got, Perf* r) {
    return cudnnFindConvolutionBackwardDataAlgorithm(h, d.w.get(), d.y.get(), d.conv.get(), d.x.get(), n, got, r);
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const ConvDescs& d, CudnnAlgo a, std::size_t* bytes) {
    return cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w.get(), d.y.get(), d.conv.get(), d.x.get(), a, bytes);
  }
  static bool own_supports(int a, const own::ConvGeom& g, const ConvForm& f, std::string* why) {
    if (!own_form_supported(f, why)) return false;
    if (a == int(ConvBwdDataAlgo::DittoWinograd)) return own::winograd_conv_supports(g, why);
    return a == int(ConvBwdDataAlgo::DittoGemm) ? own::gemm_supports(g, why) : own::direct_supports(g, false, why);
  }
  static std::size_t own_workspace(int a, const own::ConvGeom& g) {
    if (a == int(ConvBwdDataAlgo::DittoWinograd))
      return own::plan_winograd_conv(own::winograd_conv_of(g, true)).workspace_bytes();
    return a == int(ConvBwdDataAlgo::DittoGemm) ? own::plan_gemm(g, false).workspace_bytes() : 0;
  }
  // ditto-gemm and ditto-winograd sum on cuBLAS; ditto-direct uses no library.
  static Impl own_impl(int a) { return a == int(ConvBwdDataAlgo::DittoDirect) ? Impl::Ditto : Impl::Library; }
  static void run_own(Context& ctx, int a, const own::ConvGeom& g, const ConvOperands& o, void* ws, bool tf32) {
    const auto* w = static_cast<const float*>(o.w);
    const auto* dy = static_cast<const float*>(o.dy);
    auto* dx = static_cast<float*>(o.out);
    if (a == int(ConvBwdDataAlgo::DittoGemm)) cuda::conv_bwd_data_gemm(ctx, g, w, dy, dx, ws, tf32);
    else if (a == int(ConvBwdDataAlgo::DittoWinograd)) cuda::conv_winograd(ctx, g, true, dy, w, dx, ws, tf32);
    else cuda::conv_bwd_data_direct(ctx, g, w, dy, dx);
  }
  static cudnnStatus_t compute(cudnnHandle_t h, const ConvDescs& d, CudnnAlgo a, const ConvOperands& o, void* ws,
                               std::size_t ws_bytes) {
    const float one = 1.f, zero = 0.f;
    return cudnnConvolutionBackwardData(h, &one, d.w.get(), o.w, d.y.get(), o.dy, d.conv.get(), a, ws, ws_bytes,
                                        &zero, d.x.get(), o.out);
  }
  static cudnnStatus_t engine(cudnnHandle_t h, const detail::EnginePlan& plan, const ConvOperands& o, void* ws) {
    return detail::engine_execute(h, plan, o.out, o.w, o.dy, ws);
  }
};

struct BwdFilterTraits {
  using Algo = ConvBwdFilterAlgo;
  using CudnnAlgo = cudnnConvolutionBwdFilterAlgo_t;
  using Perf = cudnnConvolutionBwdFilterAlgoPerf_t;
  static constexpr int kCount = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  static constexpr int kEngine = int(ConvBwdFilterAlgo::Engine), kEngineFirst = int(ConvBwdFilterAlgo::EngineFirst);
  static constexpr int kVariants = kEngineFirst + 1;
  static constexpr detail::ConvDirection kDirection = detail::ConvDirection::BwdFilter;
  static const Shape& result_shape(const ConvSpec& s) { return s.w; }
  static constexpr const char* kKnob = "bwd_filter";
  static constexpr ProfileKind kProfile = ProfileKind::ConvBwdFilter;
  static constexpr int kAtomicsAlgo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0;
  static Determinism documented(int a) {
    return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3 ? Determinism::No
                                                                                                 : Determinism::Yes;
  }
  static AlgoChoice<Algo> choice(const Policy& p, const std::string& layer, const std::string& shape) {
    return conv_choice<Algo>(p, layer, shape);
  }
  static cudnnStatus_t heuristic(cudnnHandle_t h, const ConvDescs& d, int n, int* got, Perf* r) {
    return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x.get(), d.y.get(), d.conv.get(), d.w.get(), n, got,
                                                         r);
  }
  static cudnnStatus_t find(cudnnHandle_t h, const ConvDescs& d, int n, int* got, Perf* r) {
    return cudnnFindConvolutionBackwardFilterAlgorithm(h, d.x.get(), d.y.get(), d.conv.get(), d.w.get(), n, got, r);
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const ConvDescs& d, CudnnAlgo a, std::size_t* bytes) {
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x.get(), d.y.get(), d.conv.get(), d.w.get(), a,
                                                          bytes);
  }
  static bool own_supports(int a, const own::ConvGeom& g, const ConvForm& f, std::string* why) {
    if (!own_form_supported(f, why)) return false;
    if (a == int(ConvBwdFilterAlgo::DittoWinograd)) return own::winograd_supports(g, why);
    return a == int(ConvBwdFilterAlgo::DittoGemm) ? own::gemm_supports(g, why) : own::direct_supports(g, true, why);
  }
  static std::size_t own_workspace(int a, const own::ConvGeom& g) {
    if (a == int(ConvBwdFilterAlgo::DittoWinograd)) return own::plan_winograd(g).workspace_bytes();
    return a == int(ConvBwdFilterAlgo::DittoGemm) ? own::plan_gemm(g, true).workspace_bytes()
                                                  : own::direct_filter_workspace_bytes(g);
  }
  // ditto-gemm and ditto-winograd sum on cuBLAS; ditto-direct uses no library.
  static Impl own_impl(int a) { return a == int(ConvBwdFilterAlgo::DittoDirect) ? Impl::Ditto : Impl::Library; }
  static void run_own(Context& ctx, int a, const own::ConvGeom& g, const ConvOperands& o, void* ws, bool tf32) {
    const auto* x = static_cast<const float*>(o.x);
    const auto* dy = static_cast<const float*>(o.dy);
    auto* dw = static_cast<float*>(o.out);
    if (a == int(ConvBwdFilterAlgo::DittoGemm)) cuda::conv_bwd_filter_gemm(ctx, g, x, dy, dw, ws, tf32);
    else if (a == int(ConvBwdFilterAlgo::DittoWinograd)) cuda::conv_bwd_filter_winograd(ctx, g, x, dy, dw, ws, tf32);
    else cuda::conv_bwd_filter_direct(ctx, g, x, dy, dw, ws);
  }
  static cudnnStatus_t compute(cudnnHandle_t h, const ConvDescs& d, CudnnAlgo a, const ConvOperands& o, void* ws,
                               std::size_t ws_bytes) {
    const float one = 1.f, zero = 0.f;
    return cudnnConvolutionBackwardFilter(h, &one, d.x.get(), o.x, d.y.get(), o.dy, d.conv.get(), a, ws, ws_bytes,
                                          &zero, d.w.get(), o.out);
  }
  static cudnnStatus_t engine(cudnnHandle_t h, const detail::EnginePlan& plan, const ConvOperands& o, void* ws) {
    return detail::engine_execute(h, plan, o.x, o.out, o.dy, ws);
  }
};

// ---- the one selection path ---------------------------------------------------------------

// One row of a cuDNN perf list, read without trusting fields cuDNN may have left unset.
struct AlgoPerf {
  int algo = 0;
  int status = 0;       // cudnnStatus_t
  float time_ms = 0;
  int math = 0;         // cudnnMathType_t
  Determinism det = Determinism::Unknown;
  bool ok() const { return status == CUDNN_STATUS_SUCCESS; }
};

struct Selection {
  int algo = 0;
  std::size_t workspace = 0;
  Determinism det = Determinism::Unknown;
};

// The engine variant of one direction and problem: the plan of the configuration it runs, or why
// there is none.
struct EngineChoice {
  std::shared_ptr<detail::EngineGraph> graph;  // kept alive with the plan
  detail::EnginePlan plan;
  std::string why;  // empty: plan is usable
  bool ok() const { return why.empty(); }
  std::string algorithm() const {  // the manifest's `algorithm`: configuration and notes
    std::string s = plan.config.name();
    for (const std::string& n : plan.config.note_names()) s += " " + n;
    return s;
  }
};

// Whether the layer's precision allows an engine configuration with these notes (conv2d.h's
// `engine`): reproducible, fp32 accumulation, and tensor cores only where the precision says.
// `engine-first` (first = true) takes what PyTorch's filter takes: anything but inputs
// down-converted, and under fp32 no tensor cores.
bool engine_notes_allowed(const detail::EngineConfig& c, Precision precision, bool first) {
  if (first)
    return !c.has(CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) &&
           !(precision == Precision::Fp32 && c.has(CUDNN_NUMERICAL_NOTE_TENSOR_CORE));
  if (c.has(CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) || c.has(CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION))
    return false;
  if (precision == Precision::Fp32)
    return !c.has(CUDNN_NUMERICAL_NOTE_TENSOR_CORE) && !c.has(CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS);
  if (precision == Precision::Tf32) return !c.has(CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS);
  return true;
}

// Per-context cache (ctx.op_state("conv2d")). Keys: problem = shapes+params+precision;
// list = direction+problem; selection = list+policy ask.
struct ConvState {
  std::map<std::string, std::unique_ptr<ConvDescs>> descs;
  std::map<std::string, std::vector<AlgoPerf>> heuristics, finds;
  std::map<std::string, Selection> selections;
  std::map<std::string, EngineChoice> engines;  // key: direction + problem
};

ConvState& conv_state(Context& ctx) {
  std::shared_ptr<void>& slot = ctx.op_state("conv2d");
  if (!slot) slot = std::make_shared<ConvState>();
  return *static_cast<ConvState*>(slot.get());
}

const ConvDescs& descs_for(ConvState& st, const ConvSpec& spec, const ConvForm& form) {
  std::string key = spec.key() + "|" + form.key();
  auto it = st.descs.find(key);
  if (it == st.descs.end()) it = st.descs.emplace(key, std::make_unique<ConvDescs>(spec, form)).first;
  return *it->second;
}

// An algorithm whose math cuDNN reports as tensor-op is not one fp32 allows; one that converts
// float inputs to half rounds where no precision of ditto's says (not even tf32's).
bool math_allowed(int perf_math, Precision precision) {
  if (perf_math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return false;
  return precision != Precision::Fp32 || perf_math != CUDNN_TENSOR_OP_MATH;
}

// Runs a perf query (v7 heuristic or Find). The array is pre-filled with 0xff bytes, so a
// determinism field cuDNN did not write reads as neither label and becomes Unknown.
template <class T, class Query>
std::vector<AlgoPerf> perf_query(Query&& query) {
  static_assert(sizeof(cudnnDeterminism_t) == sizeof(int) && sizeof(cudnnStatus_t) == sizeof(int) &&
                sizeof(cudnnMathType_t) == sizeof(int) && sizeof(typename T::CudnnAlgo) == sizeof(int));
  typename T::Perf perf[T::kCount];
  std::memset(static_cast<void*>(perf), 0xff, sizeof(perf));
  int got = 0;
  DITTO_CUDNN_CHECK(query(T::kCount, &got, perf));
  std::vector<AlgoPerf> out;
  for (int i = 0; i < std::min(got, T::kCount); ++i) {
    AlgoPerf r;
    int det = -1;
    std::memcpy(&r.algo, &perf[i].algo, sizeof(int));
    std::memcpy(&r.status, &perf[i].status, sizeof(int));
    std::memcpy(&r.math, &perf[i].mathType, sizeof(int));
    std::memcpy(&det, &perf[i].determinism, sizeof(int));
    r.time_ms = perf[i].time;
    r.det = det == CUDNN_DETERMINISTIC ? Determinism::Yes
            : det == CUDNN_NON_DETERMINISTIC ? Determinism::No
                                             : Determinism::Unknown;
    if (r.algo < 0 || r.algo >= T::kCount) continue;
    out.push_back(r);
  }
  return out;
}

// The direction's view of one problem: handles, descriptors, cache keys, names for messages.
template <class T>
struct Problem {
  Context& ctx;
  ConvState& st;
  const ConvSpec& spec;
  const ConvDescs& d;
  ConvForm form;
  Precision precision;
  std::string list_key;  // direction + problem

  Problem(Context& c, const ConvSpec& s, const ConvForm& f)
      : ctx(c), st(conv_state(c)), spec(s), d(descs_for(st, s, f)), form(f), precision(f.precision),
        list_key(fmt::format("{}|{}|{}", T::kKnob, s.key(), f.key())) {}

  cudnnHandle_t handle() const { return detail::cuda_state(ctx).cudnn; }
  static const char* name(int algo) { return name_of(static_cast<typename T::Algo>(algo)); }

  // ditto's own variants come after cuDNN's algorithms in the enum, the engines last.
  static bool is_engine(int algo) { return algo == T::kEngine || algo == T::kEngineFirst; }
  static bool is_own(int algo) { return algo >= T::kCount && !is_engine(algo); }

  // An engine variant's configuration for this problem (built once: graph, heuristic mode A's
  // list, the first allowed configuration whose plan cuDNN builds); `first`: engine-first's.
  const EngineChoice& engine(bool first) const {
    const std::string key = list_key + (first ? "|first" : "");
    auto it = st.engines.find(key);
    if (it != st.engines.end()) return it->second;
    EngineChoice c;
    detail::EngineConvSpec es;
    es.direction = T::kDirection;
    es.x = spec.x, es.w = spec.w, es.y = spec.y;
    es.stride[0] = spec.p.stride_h, es.stride[1] = spec.p.stride_w;
    es.pad[0] = spec.p.pad_h, es.pad[1] = spec.p.pad_w;
    es.dilation[0] = spec.p.dilation_h, es.dilation[1] = spec.p.dilation_w;
    es.dtype = form.dtype();
    es.nhwc = form.nhwc();
    try {
      // One operation graph and heuristic list per problem: the other engine variant's, when built.
      const auto other = st.engines.find(first ? list_key : list_key + "|first");
      c.graph = other != st.engines.end() && other->second.graph
                    ? other->second.graph
                    : std::make_shared<detail::EngineGraph>(detail::engine_graph(handle(), es));
      std::string refused;
      for (const detail::EngineConfig& cfg : c.graph->configs) {
        if (!engine_notes_allowed(cfg, precision, first)) continue;
        const cudnnStatus_t status = detail::engine_plan(handle(), cfg, &c.plan);
        if (status == CUDNN_STATUS_SUCCESS) break;
        refused += fmt::format("{}{}: {}", refused.empty() ? "" : ", ", cfg.name(), cudnnGetErrorString(status));
      }
      if (!c.plan.plan)
        c.why = fmt::format("cuDNN's backend heuristics list no configuration that is {}allowed under "
                            "{} and builds a plan ({} listed{}{})",
                            first ? "" : "reproducible and ", name_of(precision), c.graph->configs.size(),
                            refused.empty() ? "" : "; refused: ", refused);
    } catch (const CudnnError& e) {
      c.why = fmt::format("cuDNN's backend API cannot describe this problem: {}", e.what());
    }
    return st.engines.emplace(key, std::move(c)).first->second;
  }

  // cuDNN supports `algo` for this problem when its workspace-size query succeeds; ditto's own
  // variants when the problem is of the kind they take (why says otherwise).
  bool workspace_of(int algo, std::size_t* bytes, std::string* why = nullptr) const {
    *bytes = 0;
    std::string reason;
    if (is_own(algo)) {
      const own::ConvGeom g = spec.geom();
      if (!T::own_supports(algo, g, form, why ? why : &reason)) return false;
      *bytes = T::own_workspace(algo, g);
      return true;
    }
    if (is_engine(algo)) {
      const EngineChoice& e = engine(algo == T::kEngineFirst);
      if (!e.ok()) {
        if (why) *why = e.why;
        return false;
      }
      *bytes = std::size_t(e.plan.workspace_bytes);
      return true;
    }
    if (T::workspace(handle(), d, static_cast<typename T::CudnnAlgo>(algo), bytes) == CUDNN_STATUS_SUCCESS) return true;
    if (why) *why = "cuDNN does not support it for this shape";
    return false;
  }

  // Times ditto's own variants and the engine as Find times cuDNN's: on scratch operands in the
  // layer's form, once to warm up, then the median of three runs (selection only: it synchronizes).
  std::vector<AlgoPerf> time_own() {
    std::vector<AlgoPerf> out;
    detail::CudaState& cs = detail::cuda_state(ctx);
    const own::ConvGeom g = spec.geom();
    for (int a = T::kCount; a < T::kVariants; ++a) {
      std::size_t ws_bytes = 0;
      if (!workspace_of(a, &ws_bytes)) continue;
      const DType dt = form.dtype();
      const Layout lay = form.memory();
      Tensor x = ctx.zeros(spec.x, dt, lay), w = ctx.zeros(spec.w, dt, lay), y = ctx.zeros(spec.y, dt, lay);
      Tensor out_t = ctx.empty(T::result_shape(spec), dt, lay);
      detail::Workspace ws(cs, ws_bytes);
      if (!ws.ok()) continue;
      ConvOperands ops;
      ops.x = x.raw(), ops.w = w.raw(), ops.dy = y.raw(), ops.out = out_t.raw();
      IntervalTimer timer(ctx);
      bool ran = true;
      for (int rep = 0; rep < 4 && ran; ++rep) {
        if (rep) timer.start();
        if (is_engine(a)) ran = T::engine(handle(), engine(a == T::kEngineFirst).plan, ops, ws.get()) == CUDNN_STATUS_SUCCESS;
        else T::run_own(ctx, a, g, ops, ws.get(), precision == Precision::Tf32);
        if (rep) timer.stop();
      }
      if (!ran) continue;
      std::vector<double> ms = timer.milliseconds();
      std::sort(ms.begin(), ms.end());
      AlgoPerf r;
      r.algo = a;
      r.status = CUDNN_STATUS_SUCCESS;
      r.time_ms = float(ms[ms.size() / 2]);
      r.math = precision == Precision::Fp32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
      r.det = label(a, false);
      out.push_back(r);
    }
    return out;
  }

  const std::vector<AlgoPerf>& heuristics() {
    auto it = st.heuristics.find(list_key);
    if (it != st.heuristics.end()) return it->second;
    auto list = perf_query<T>([&](int n, int* got, typename T::Perf* r) { return T::heuristic(handle(), d, n, got, r); });
    return st.heuristics.emplace(list_key, std::move(list)).first->second;
  }
  // Runs every algorithm once (cuDNN allocates its own buffers and synchronizes): selection only.
  const std::vector<AlgoPerf>& finds() {
    auto it = st.finds.find(list_key);
    if (it != st.finds.end()) return it->second;
    // cudnnFind* allocates and times with device-wide synchronization: not during another
    // replica's capture on this GPU.
    detail::DeviceSyncScope sync(ctx.device().index);
    auto list = perf_query<T>([&](int n, int* got, typename T::Perf* r) { return T::find(handle(), d, n, got, r); });
    for (const AlgoPerf& r : time_own()) list.push_back(r);
    std::stable_sort(list.begin(), list.end(), [](const AlgoPerf& a, const AlgoPerf& b) {
      if (a.ok() != b.ok()) return a.ok();
      return a.ok() && a.time_ms < b.time_ms;
    });
    return st.finds.emplace(list_key, std::move(list)).first->second;
  }

  // cuDNN's determinism label for `algo`: from the heuristic list where it reports the
  // algorithm as usable, else from Find (only when allowed: it runs the algorithms).
  Determinism label(int algo, bool allow_find) {
    if (is_own(algo)) return Determinism::Yes;  // fixed order by construction (kernels/detail/conv2d_own.h)
    // engine takes no configuration noted NONDETERMINISTIC; engine-first's label is its configuration's.
    if (algo == T::kEngine) return Determinism::Yes;
    if (algo == T::kEngineFirst) {
      const EngineChoice& e = engine(true);
      return e.ok() && e.plan.config.has(CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) ? Determinism::No : Determinism::Yes;
    }
    for (const auto& r : heuristics())
      if (r.algo == algo && r.ok() && r.det != Determinism::Unknown) return r.det;
    if (allow_find)
      for (const auto& r : finds())
        if (r.algo == algo && r.ok() && r.det != Determinism::Unknown) return r.det;
    return Determinism::Unknown;
  }

  std::vector<ConvAlgoInfo> supported(bool allow_find) {
    std::vector<ConvAlgoInfo> out;
    for (int a = 0; a < T::kVariants; ++a) {
      std::size_t bytes = 0;
      if (workspace_of(a, &bytes)) out.push_back({name(a), label(a, allow_find), bytes});
    }
    return out;
  }
  // For error messages: names, labels as far as the cheap heuristic query knows them, workspaces.
  std::string supported_str() {
    std::string s;
    for (const auto& i : supported(false))
      s += fmt::format("{}{} (deterministic: {}, workspace {} bytes)", s.empty() ? "" : ", ", i.name,
                       determinism_name(i.deterministic), i.workspace_bytes);
    return s.empty() ? "none" : s;
  }
  std::string where(const std::string& layer) const {
    return fmt::format("{} {}: {}, precision {}{}", op_name(layer), T::kKnob, spec.str(), name_of(precision),
                       form.nhwc() ? ", layout nhwc" : "");
  }

  // A pinned algorithm is checked and labelled without running cuDNN's Find: Find autotunes
  // inside an algorithm too, and cuDNN keeps what it found, so a Find call would change which
  // kernel a later call of the same algorithm runs — and its bits. A pin must run what a
  // heuristic-selected (e.g. `deterministic`) run ran, so that replaying a manifest's pins gives
  // the same bits. The label comes from cuDNN's heuristic report, else from cuDNN's
  // documentation of the algorithm enums (only bwd_data ALGO_0 and bwd_filter ALGO_0 / ALGO_3
  // are documented as nondeterministic).
  Selection pinned(const std::string& layer, int algo, const char* why) {
    Selection sel;
    std::string reason;
    if (!workspace_of(algo, &sel.workspace, &reason))
      throw PolicyError(fmt::format("{}: {} algorithm '{}' cannot run this problem: {}; supported: {}", where(layer),
                                    why, name(algo), reason, supported_str()));
    sel.algo = algo;
    sel.det = label(algo, false);
    if (sel.det == Determinism::Unknown) sel.det = T::documented(algo);
    return sel;
  }

  // `deterministic` with a tuning table: read the problem's entry, or (while tuning) time the
  // deterministic algorithms with Find and write the fastest down.
  Selection tuned(const std::string& layer, TuningTable& table) {
    TuningEntry e;
    e.direction = T::kKnob;
    e.x = spec.x;
    e.w = spec.w;
    e.stride_h = spec.p.stride_h, e.stride_w = spec.p.stride_w, e.pad_h = spec.p.pad_h, e.pad_w = spec.p.pad_w;
    e.dilation_h = spec.p.dilation_h, e.dilation_w = spec.p.dilation_w, e.groups = spec.p.groups;
    e.precision = name_of(precision);
    e.layout = form.nhwc() ? "nhwc" : "";
    if (const TuningEntry* have = table.find(e.key())) {
      int algo = -1;
      for (int a = 0; a < T::kVariants; ++a)
        if (have->algo == name(a)) algo = a;
      Selection sel = pinned(layer, algo, "tuning-file");
      if (table.workspace_budget && sel.workspace > table.workspace_budget)
        throw PolicyError(fmt::format("{}: tuning file {} names '{}' for this problem ({}), whose workspace of {} bytes "
                                      "is over the file's budget of {} bytes",
                                      where(layer), table.path(), have->algo, e.key(), sel.workspace,
                                      table.workspace_budget));
      if (sel.det == Determinism::No)
        throw PolicyError(fmt::format("{}: tuning file {} names '{}' for this problem ({}), which cuDNN labels "
                                      "nondeterministic; a tuning file holds deterministic algorithms only",
                                      where(layer), table.path(), have->algo, e.key()));
      return sel;
    }
    if (table.reading())
      throw PolicyError(fmt::format("{}: tuning file {} has no entry for this problem ({}); tune again (run without "
                                    "the file) or add the entry",
                                    where(layer), table.path(), e.key()));
    for (const auto& r : finds()) {  // fastest first
      if (!r.ok() || !math_allowed(r.math, precision) || r.det != Determinism::Yes) continue;
      std::size_t bytes = 0;
      if (!workspace_of(r.algo, &bytes)) continue;
      if (table.workspace_budget && bytes > table.workspace_budget) continue;
      detail::Workspace probe(detail::cuda_state(ctx), bytes);
      if (!probe.ok()) continue;
      e.algo = name(r.algo);
      e.time_ms = r.time_ms;
      e.workspace_bytes = bytes;
      e.layer = layer;
      table.add(e);
      return {r.algo, bytes, r.det};
    }
    throw PolicyError(fmt::format("{}: no algorithm labelled deterministic in cuDNN's Find with an allocatable "
                                  "workspace{}; supported: {}",
                                  where(layer),
                                  table.workspace_budget ? fmt::format(" within the tuning budget of {} bytes",
                                                                       table.workspace_budget)
                                                         : "",
                                  supported_str()));
  }

  // An engine variant as a mode's pick: when it has a configuration for this problem and its
  // workspace can be allocated.
  std::optional<Selection> engine_pick(int algo) {
    std::size_t bytes = 0;
    if (!workspace_of(algo, &bytes)) return std::nullopt;
    detail::Workspace probe(detail::cuda_state(ctx), bytes);
    if (!probe.ok()) return std::nullopt;
    return Selection{algo, bytes, label(algo, false)};
  }

  Selection select(const std::string& layer, const AlgoChoice<typename T::Algo>& choice) {
    const std::string key = list_key + "|" + choice.str();
    if (auto it = st.selections.find(key); it != st.selections.end()) return it->second;
    // pytorch: the configuration PyTorch's cuDNN path runs by default; cuDNN's legacy ranking only
    // where the backend API builds none (the manifest records which ran).
    if (choice.mode == SelectMode::Pytorch)
      if (const auto sel = engine_pick(T::kEngineFirst)) return st.selections.emplace(key, *sel).first->second;
    if (choice.mode == SelectMode::Deterministic && ctx.tuning()) {
      Selection sel = tuned(layer, *ctx.tuning());
      st.selections.emplace(key, sel);
      return sel;
    }
    Selection sel;
    SelectMode mode = choice.mode;
    if (mode == SelectMode::Nondeterministic && T::kAtomicsAlgo < 0) mode = SelectMode::Heuristic;
    if (mode == SelectMode::Pytorch) mode = SelectMode::Heuristic;  // no engine-first configuration
    // bf16/fp16: `deterministic` runs the engine variant, the backend API's reproducible pick and
    // the kind of engine frameworks run for tensor-core convolutions (the legacy API's
    // deterministic ranking made channels-last ResNet-50, MobileNet-v2 and EfficientNet-B0 steps
    // 1.5-3x slower); the legacy ranking only where the backend API offers no such configuration.
    if (mode == SelectMode::Deterministic && is_reduced(precision))
      if (const auto pick = engine_pick(T::kEngine)) return st.selections.emplace(key, *pick).first->second;
    switch (mode) {
      case SelectMode::Pinned:
        sel = pinned(layer, static_cast<int>(choice.algo), "pinned");
        break;
      case SelectMode::Nondeterministic:
        sel = pinned(layer, T::kAtomicsAlgo, "nondeterministic asks for the atomics");
        break;
      case SelectMode::Pytorch:  // turned into Heuristic above: no engine-first configuration
      case SelectMode::Heuristic: {
        const auto& list = heuristics();
        auto it = std::find_if(list.begin(), list.end(), [&](const AlgoPerf& r) { return r.ok() && math_allowed(r.math, precision); });
        if (it == list.end())
          throw PolicyError(fmt::format("{}: cuDNN's heuristic returned no usable algorithm; supported: {}",
                                        where(layer), supported_str()));
        sel.algo = it->algo;
        sel.det = it->det;
        DITTO_CUDNN_CHECK(T::workspace(handle(), d, static_cast<typename T::CudnnAlgo>(sel.algo), &sel.workspace));
        break;
      }
      case SelectMode::Deterministic:
      case SelectMode::Fastest: {
        // `deterministic` ranks by cuDNN's heuristic (its performance model: a pure function of
        // shape, device and library), not by Find's timings: two runs must pick the same
        // algorithm, or "deterministic" runs would differ by timing noise in the choice itself.
        // `fastest` autotunes with Find and is recorded in the manifest like every choice.
        bool found = false;
        const auto& ranked = mode == SelectMode::Deterministic ? heuristics() : finds();
        for (const auto& r : ranked) {  // best first
          if (!r.ok() || !math_allowed(r.math, precision)) continue;
          if (mode == SelectMode::Deterministic && r.det != Determinism::Yes) continue;
          std::size_t bytes = 0;
          if (!workspace_of(r.algo, &bytes)) continue;
          detail::Workspace probe(detail::cuda_state(ctx), bytes);
          if (!probe.ok()) continue;
          sel = {r.algo, bytes, r.det};
          found = true;
          break;
        }
        if (!found)
          throw PolicyError(fmt::format("{}: no algorithm {}usable in cuDNN's {} with an allocatable workspace; "
                                        "supported: {}",
                                        where(layer), mode == SelectMode::Deterministic ? "labelled deterministic " : "",
                                        mode == SelectMode::Deterministic ? "heuristic ranking" : "Find", supported_str()));
        break;
      }
    }
    st.selections.emplace(key, sel);
    return sel;
  }
};

// Resolves the layer's policy for direction T, runs it, records what ran.
// The operands are in the precision's dtype (ConvDescs says so to cuDNN).
template <class T>
void run_direction(Context& ctx, const std::string& layer, const ConvForm& form, const ConvSpec& spec,
                   const ConvOperands& ops) {
  const Precision precision = form.precision;
  const std::string shape = shape_key(spec.x);
  const AlgoChoice<typename T::Algo> choice = T::choice(ctx.policy(), layer, shape);
  Problem<T> prob(ctx, spec, form);
  const Selection sel = prob.select(layer, choice);
  // Timed after selection: a first call's heuristic queries and Find are not the op's cost.
  ProfileScope timed(ctx, T::kProfile, Problem<T>::name(sel.algo));
  detail::Workspace ws(detail::cuda_state(ctx), sel.workspace);
  if (!ws.ok())
    throw PolicyError(fmt::format("{}: the workspace of algorithm '{}' ({} bytes) cannot be allocated; supported: {}",
                                  prob.where(layer), Problem<T>::name(sel.algo), sel.workspace, prob.supported_str()));
  // ditto-gemm's order is fixed by the shape but its GEMMs are cuBLAS's (run_to_run, as cuDNN's
  // deterministic algorithms are); ditto-direct uses no library (gpu_to_gpu).
  Impl impl = Impl::Library;
  std::string algorithm;
  if (Problem<T>::is_own(sel.algo)) {
    T::run_own(ctx, sel.algo, spec.geom(), ops, ws.get(), precision == Precision::Tf32);
    impl = T::own_impl(sel.algo);
  } else if (Problem<T>::is_engine(sel.algo)) {
    const EngineChoice& e = prob.engine(sel.algo == T::kEngineFirst);
    const cudnnStatus_t status = T::engine(detail::cuda_state(ctx).cudnn, e.plan, ops, ws.get());
    if (status == CUDNN_STATUS_NOT_SUPPORTED)
      throw PolicyError(fmt::format("{}: cuDNN refused to run engine configuration {} ({}) for this shape; supported: {}",
                                    prob.where(layer), e.plan.config.name(), select_mode_name(choice.mode),
                                    prob.supported_str()));
    DITTO_CUDNN_CHECK(status);
    algorithm = e.algorithm();
  } else {
    const cudnnStatus_t status =
        T::compute(detail::cuda_state(ctx).cudnn, prob.d, static_cast<typename T::CudnnAlgo>(sel.algo), ops, ws.get(), ws.bytes());
    // Its workspace query accepted the algorithm; should the call itself refuse it, that is still
    // the policy's ask failing for this shape, not a fault.
    if (status == CUDNN_STATUS_NOT_SUPPORTED)
      throw PolicyError(fmt::format("{}: cuDNN refused to run algorithm '{}' ({}) for this shape; supported: {}",
                                    prob.where(layer), Problem<T>::name(sel.algo), select_mode_name(choice.mode),
                                    prob.supported_str()));
    DITTO_CUDNN_CHECK(status);
  }
  ctx.manifest().record({layer, "conv2d", T::kKnob, Problem<T>::name(sel.algo), select_mode_name(choice.mode), sel.det,
                         name_of(precision), sel.workspace, ctx.device().str(), shape, guarantee_of(sel.det, impl),
                         algorithm});
}

void record_cpu(Context& ctx, const std::string& layer, const char* knob, SelectMode requested, Precision precision) {
  // The CPU has one path, whatever the policy asks: the deterministic double-accumulating
  // reference, rounding where bf16/fp16 round (tf32's rounding it does not emulate).
  ctx.manifest().record({layer, "conv2d", knob, "cpu-reference", select_mode_name(requested), Determinism::Yes,
                         is_reduced(precision) ? name_of(precision) : "", 0, ctx.device().str(), "",
                         guarantee_of(Determinism::Yes, Impl::CpuReference)});
}

// The layer's form under the policy. The CPU reference reads NCHW whatever the layout knob says.
ConvForm layer_form(const Context& ctx, const std::string& layer) {
  return {ctx.policy().variant<Precision>(layer, op::conv2d),
          ctx.is_cuda() ? ctx.policy().variant<ConvLayout>(layer, op::conv2d) : ConvLayout::Nchw,
          ctx.policy().variant<ConvOutput>(layer, op::conv2d)};
}

// An operand (any float dtype, either layout) in the form cuDNN reads: one pass, or none when it
// is already (a native result of the layer before).
Tensor prepare(Context& ctx, const Tensor& t, const ConvForm& f) { return to_form(ctx, t, f.dtype(), f.memory()); }
// A result in the form cuDNN wrote, handed on as the output knob says: fp32 NCHW, or as it is.
Tensor finish(Context& ctx, const Tensor& t, const ConvForm& f) {
  return f.output == ConvOutput::Native ? t : to_form(ctx, t, DType::F32, Layout::Nchw);
}

// The CPU reference reads fp32 NCHW (prepared operands are already rounded; widening is exact).
Tensor as_f32_nchw(Context& ctx, const Tensor& t) { return to_form(ctx, t, DType::F32, Layout::Nchw); }

// One direction on prepared operands (prepare()): the CPU's rounded reference, or cuDNN; the
// result (out_shape, logical NCHW / KCRS) rounded where the precision says, handed on by finish().
template <class T, class Ref>
Tensor direction_prepared(Context& ctx, const std::string& layer, const ConvForm& f, const ConvSpec& spec,
                          const Shape& out_shape, ConvOperands ops, Ref&& reference) {
  if (!ctx.is_cuda()) {
    ProfileScope timed(ctx, T::kProfile, "cpu-reference");
    const Tensor out = rounded_reference(ctx, f.dtype(), out_shape, reference);
    record_cpu(ctx, layer, T::kKnob, conv_choice<typename T::Algo>(ctx.policy(), layer).mode, f.precision);
    return finish(ctx, out, f);
  }
  const Tensor out = ctx.empty(out_shape, f.dtype(), f.memory());
  ops.out = out.raw();
  run_direction<T>(ctx, layer, f, spec, ops);
  return finish(ctx, out, f);
}

// The three directions on prepared operands; xs, ws are the logical NCHW / KCRS shapes.
Tensor forward_prepared(Context& ctx, const std::string& layer, const ConvForm& f, const Tensor& x, const Tensor& w,
                        const Shape& xs, const Shape& ws, const Conv2dParams& p) {
  const ConvSpec spec{xs, ws, conv2d_output_shape(layer, xs, ws, p), p};
  ConvOperands ops;
  ops.x = x.raw();
  ops.w = w.raw();
  Tensor y = direction_prepared<FwdTraits>(ctx, layer, f, spec, spec.y, ops, [&](float* out) {
    ref::conv2d_fwd(ref::conv2d_geom(xs, ws, p), as_f32_nchw(ctx, x).f32(), as_f32_nchw(ctx, w).f32(), out);
  });
  if (ctx.is_cuda())
    ctx.manifest().record({layer, "conv2d", "layout", name_of(f.layout),
                           ctx.policy().requested(layer, "layout", op::conv2d), Determinism::Yes, name_of(f.precision),
                           0, ctx.device().str(), "", Guarantee::RunToRun});
  if (f.output == ConvOutput::Native)
    ctx.manifest().record({layer, "conv2d", "output", name_of(f.output),
                           ctx.policy().requested(layer, "output", op::conv2d), Determinism::Yes, name_of(f.precision),
                           0, ctx.device().str(), "",
                           ctx.is_cuda() ? Guarantee::RunToRun : guarantee_of(Determinism::Yes, Impl::CpuReference)});
  return y;
}

Tensor backward_data_prepared(Context& ctx, const std::string& layer, const ConvForm& f, const Tensor& dy,
                              const Tensor& w, const Shape& xs, const Shape& ws, const Conv2dParams& p) {
  const ConvSpec spec{xs, ws, conv2d_output_shape(layer, xs, ws, p), p};
  ConvOperands ops;
  ops.w = w.raw();
  ops.dy = dy.raw();
  return direction_prepared<BwdDataTraits>(ctx, layer, f, spec, xs, ops, [&](float* out) {
    ref::conv2d_bwd_data(ref::conv2d_geom(xs, ws, p), as_f32_nchw(ctx, dy).f32(), as_f32_nchw(ctx, w).f32(), out);
  });
}

Tensor backward_filter_prepared(Context& ctx, const std::string& layer, const ConvForm& f, const Tensor& x,
                                const Tensor& dy, const Shape& xs, const Shape& ws, const Conv2dParams& p) {
  const ConvSpec spec{xs, ws, conv2d_output_shape(layer, xs, ws, p), p};
  ConvOperands ops;
  ops.x = x.raw();
  ops.dy = dy.raw();
  return direction_prepared<BwdFilterTraits>(ctx, layer, f, spec, ws, ops, [&](float* out) {
    ref::conv2d_bwd_filter(ref::conv2d_geom(xs, ws, p), as_f32_nchw(ctx, x).f32(), as_f32_nchw(ctx, dy).f32(), out);
  });
}

template <class Fn>
std::vector<ConvAlgoInfo> with_direction(const std::string& direction, Fn&& fn) {
  if (direction == "fwd") return fn(FwdTraits{});
  if (direction == "bwd_data") return fn(BwdDataTraits{});
  if (direction == "bwd_filter") return fn(BwdFilterTraits{});
  throw PolicyError(fmt::format("conv2d: unknown direction '{}'; directions are fwd, bwd_data, bwd_filter", direction));
}

}  // namespace

Shape conv2d_output_shape(const std::string& layer, const Shape& x, const Shape& w, const Conv2dParams& p) {
  auto fail = [&](const std::string& why) {
    throw ShapeError(fmt::format("{}: {} (x {}, w {}, {})", op_name(layer), why, shape_str(x), shape_str(w),
                                 params_str(p)));
  };
  if (x.size() != 4) fail("x must be 4-D (N,C,H,W)");
  if (w.size() != 4) fail("w must be 4-D (K,C/groups,R,S)");
  for (int64_t d : x)
    if (d < 1 || d > INT_MAX) fail("every dimension of x must be in [1, 2^31)");
  for (int64_t d : w)
    if (d < 1 || d > INT_MAX) fail("every dimension of w must be in [1, 2^31)");
  if (p.stride_h < 1 || p.stride_w < 1 || p.dilation_h < 1 || p.dilation_w < 1 || p.groups < 1 || p.pad_h < 0 ||
      p.pad_w < 0)
    fail("strides, dilations and groups must be positive and padding non-negative");
  if (x[1] % p.groups) fail(fmt::format("C = {} is not divisible by groups = {}", x[1], p.groups));
  if (w[0] % p.groups) fail(fmt::format("K = {} is not divisible by groups = {}", w[0], p.groups));
  if (w[1] != x[1] / p.groups)
    fail(fmt::format("w has {} input channels per group, x has C/groups = {}", w[1], x[1] / p.groups));
  const int64_t span_h = int64_t(p.dilation_h) * (w[2] - 1) + 1, span_w = int64_t(p.dilation_w) * (w[3] - 1) + 1;
  const int64_t in_h = x[2] + 2 * int64_t(p.pad_h), in_w = x[3] + 2 * int64_t(p.pad_w);
  if (in_h < span_h || in_w < span_w)
    fail(fmt::format("the dilated kernel ({}x{}) is larger than the padded input ({}x{})", span_h, span_w, in_h, in_w));
  return {x[0], w[0], (in_h - span_h) / p.stride_h + 1, (in_w - span_w) / p.stride_w + 1};
}

Tensor conv2d_forward(Context& ctx, const std::string& layer, const Tensor& x, const Tensor& w, const Conv2dParams& p) {
  check_float_any_layout_on(ctx, x, op_name(layer), "x");
  check_float_on(ctx, w, op_name(layer), "w");
  conv2d_output_shape(layer, x.shape(), w.shape(), p);
  const ConvForm f = layer_form(ctx, layer);
  return forward_prepared(ctx, layer, f, prepare(ctx, x, f), prepare(ctx, w, f), x.shape(), w.shape(), p);
}

namespace {
void check_dy(const std::string& layer, const Tensor& dy, const Shape& want) {
  if (dy.shape() != want)
    throw ShapeError(fmt::format("{}: dy has shape {} but the convolution's output shape is {}", op_name(layer),
                                 shape_str(dy.shape()), shape_str(want)));
}
}  // namespace

Tensor conv2d_backward_data(Context& ctx, const std::string& layer, const Tensor& dy, const Tensor& w,
                            const Shape& x_shape, const Conv2dParams& p) {
  check_float_any_layout_on(ctx, dy, op_name(layer), "dy");
  check_float_on(ctx, w, op_name(layer), "w");
  check_dy(layer, dy, conv2d_output_shape(layer, x_shape, w.shape(), p));
  const ConvForm f = layer_form(ctx, layer);
  return backward_data_prepared(ctx, layer, f, prepare(ctx, dy, f), prepare(ctx, w, f), x_shape, w.shape(), p);
}

Tensor conv2d_backward_filter(Context& ctx, const std::string& layer, const Tensor& x, const Tensor& dy,
                              const Shape& w_shape, const Conv2dParams& p) {
  check_float_any_layout_on(ctx, x, op_name(layer), "x");
  check_float_any_layout_on(ctx, dy, op_name(layer), "dy");
  check_dy(layer, dy, conv2d_output_shape(layer, x.shape(), w_shape, p));
  const ConvForm f = layer_form(ctx, layer);
  return backward_filter_prepared(ctx, layer, f, prepare(ctx, x, f), prepare(ctx, dy, f), x.shape(), w_shape, p);
}

Var conv2d(Context& ctx, const std::string& layer, const Var& x, const Var& w, const Conv2dParams& p) {
  check_float_any_layout_on(ctx, x.value(), op_name(layer), "x");
  check_float_on(ctx, w.value(), op_name(layer), "w");
  conv2d_output_shape(layer, x.shape(), w.shape(), p);
  // Prepared once: the forward reads these, and backward reads the same rounded (and, for nhwc,
  // transposed) tensors; in bf16/fp16 they also take half the memory of the float values.
  const ConvForm f = layer_form(ctx, layer);
  const Tensor xp = prepare(ctx, x.value(), f), wp = prepare(ctx, w.value(), f);
  Tensor y = forward_prepared(ctx, layer, f, xp, wp, x.shape(), w.shape(), p);
  const bool grad = needs_grad(ctx, {&x, &w});
  Var out(std::move(y), grad);
  if (grad) {
    // dW reads x, dX reads w: each is kept only when that gradient is wanted.
    Tensor saved_x = w.requires_grad() ? xp : Tensor();
    Tensor saved_w = x.requires_grad() ? wp : Tensor();
    ctx.tape().record("conv2d", layer, {{"x", x}, {"w", w}}, out,
                      [saved_x, saved_w, xs = x.shape(), ws = w.shape(), xr = x.grad_ref(), wr = w.grad_ref(),
                       outr = out.grad_ref(), p, layer, f, x_dtype = x.value().dtype(), x_layout = x.value().layout(),
                       w_dtype = w.value().dtype()](Context& c) {
      if (!outr.grad().defined()) return;
      const Tensor dy = prepare(c, outr.grad(), f);
      // Only the gradients someone asked for: dx costs as much as the forward pass. Each gradient
      // in its variable's form (a native dx is already in it: no pass).
      if (xr.requires_grad())
        accumulate_grad(c, xr, to_form(c, backward_data_prepared(c, layer, f, dy, saved_w, xs, ws, p), x_dtype, x_layout));
      if (wr.requires_grad())
        accumulate_grad(c, wr,
                        to_form(c, backward_filter_prepared(c, layer, f, saved_x, dy, xs, ws, p), w_dtype, Layout::Nchw));
    });
  }
  return out;
}

namespace {
// allow_find: also take determinism labels from cuDNN's Find where the heuristic query does
// not report the algorithm as usable (Find runs the algorithms; the names alone do not need it).
std::vector<ConvAlgoInfo> algos_impl(Context& ctx, const std::string& direction, const Shape& x, const Shape& w,
                                     const Conv2dParams& p, const ConvForm& form, bool allow_find) {
  const Shape ys = conv2d_output_shape("conv_algos", x, w, p);
  if (!ctx.is_cuda())
    throw Error(fmt::format("conv_algos: cuDNN algorithms need a CUDA context; this one is on {}", ctx.device().str()));
  const ConvSpec spec{x, w, ys, p};
  return with_direction(direction, [&](auto traits) {
    using T = decltype(traits);
    return Problem<T>(ctx, spec, form).supported(allow_find);
  });
}
}  // namespace

std::vector<ConvAlgoInfo> conv_algos(Context& ctx, const std::string& direction, const Shape& x, const Shape& w,
                                     const Conv2dParams& p, Precision precision, ConvLayout layout) {
  return algos_impl(ctx, direction, x, w, p, ConvForm{precision, layout}, true);
}

std::vector<std::string> conv_supported_algos(Context& ctx, const std::string& direction, const Shape& x,
                                              const Shape& w, const Conv2dParams& p, Precision precision,
                                              ConvLayout layout) {
  std::vector<std::string> names;
  for (const auto& i : algos_impl(ctx, direction, x, w, p, ConvForm{precision, layout}, false))
    names.push_back(i.name);
  return names;
}

std::string conv_winograd_refusal(const Shape& x, const Shape& w, const Conv2dParams& p) {
  const ConvSpec spec{x, w, conv2d_output_shape("conv2d", x, w, p), p};
  std::string why;
  return own::winograd_conv_supports(spec.geom(), &why) ? std::string() : why;
}

}  // namespace ditto
