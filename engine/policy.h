// Policy: which kernel variant each layer uses for every choice that can change bits.
//
// A policy is a list of rules "LAYER.KNOB=VALUE". LAYER is a layer name or '*'; KNOB is a knob
// name or '*' (written "LAYER=VALUE" or "*=VALUE"); VALUE is a variant of that knob or one of
// the four mode words that every knob understands:
//   heuristic        what frameworks do by default (cuDNN's own pick, cuDNN pooling, atomics in
//                    the bias and loss reductions of linear layers and the loss)
//   deterministic    conv: the algorithm cuDNN's heuristic ranks first among those it labels
//                    deterministic (a function of shape, so two runs choose alike); every
//                    reduction in a fixed order; max-pool backward by gather
//   nondeterministic conv: the atomics algorithm where one exists (bwd_data ALGO_0, bwd_filter
//                    ALGO_0); every reduction by atomicAdd; max-pool backward by atomic scatter
//   fastest          conv: autotune among all algorithms; other knobs as heuristic
// A convolution knob may also be qualified by the layer's input shape, "LAYER.KNOB@NxCxHxW=VALUE"
// (e.g. conv1.bwd_filter@80x3x32x32=algo1): cuDNN's choices depend on the shape, so a final
// partial batch may run another algorithm than the full ones, and an exact replay pins each.
// The most specific rule wins (LAYER.KNOB@SHAPE > LAYER.KNOB > LAYER=* > *.KNOB > *=*); among
// equals the last.
// Knobs and their variants (see knobs() for the authoritative table):
//   conv2d:    fwd, bwd_data, bwd_filter (cuDNN algorithm names; the backward knobs also
//              ditto-gemm and ditto-direct, ditto's own), math (fma|tf32),
//              bias_bwd (atomic|deterministic|cudnn)
//   linear:    math (fma|tf32), bias_bwd (atomic|deterministic), cublas_atomics (off|on)
//   maxpool2d: bwd (cudnn|cudnn-deterministic|atomic-scatter|gather)
//   batchnorm: bwd (cudnn|atomic|deterministic)
//   softmax_xent: reduce (atomic|deterministic)
//   scatter_add, embedding: scatter (atomic|sorted)
//   upsample:  bwd (atomic|gather)
//   pixel_xent, reduce: reduce (atomic|deterministic)
//   -- issue 18, part B --
//   grid_sample: bwd (cudnn|atomic|deterministic)           input and grid gradients of bilinear sampling
//   affine_grid: bwd (cudnn|atomic|deterministic)           theta gradient of the affine grid
//   roi_align:   bwd (atomic|deterministic)                 image gradient of ROI align
//   ctc_loss:    algo (ditto|cudnn-deterministic|cudnn-nondeterministic)
//   spmm:        fwd (ditto|cusparse-default|cusparse-alg1|cusparse-alg2|cusparse-alg3),
//                bwd (atomic|deterministic|cusparse)        dense operand's gradient
//   -- issue 19: data parallelism (engine/collective.h). The "layers" are the gradient buckets of a
//   data-parallel run, bucket0, bucket1, ... --
//   allreduce:   algo (fixed-order|ring|nccl-default|nccl-ring-simple|nccl-ring-ll|nccl-ring-ll128|
//                      nccl-tree-simple|nccl-tree-ll|nccl-tree-ll128),
//                channels (auto|1|2|4|8|16|32)           NCCL's channels (CTAs) for a pinned nccl-*
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ditto {

enum class OpKind {
  Conv2d, Linear, MaxPool2d, BatchNorm, SoftmaxXent,
  // ---- issue 18 part A: scatter-add / segment sums, embeddings, upsampling, pixel-wise loss, reductions
  ScatterAdd, Embedding, Upsample, PixelXent, Reduce,
  // ---- end of issue 18 part A
  // -- issue 18, part B: spatial transformer, ROI align, CTC loss, sparse x dense matmul --
  GridSample, AffineGrid, RoiAlign, CtcLoss, Spmm,
  // -- issue 19: one gradient bucket's all-reduce in a data-parallel run --
  AllReduce,
};
const char* op_kind_name(OpKind k);

enum class SelectMode { Pinned, Heuristic, Deterministic, Nondeterministic, Fastest };
const char* select_mode_name(SelectMode m);

enum class ConvFwdAlgo { ImplicitGemm, ImplicitPrecompGemm, Gemm, Direct, Fft, FftTiling, Winograd, WinogradNonfused };
// Backward algorithms: cuDNN's (numbered as cuDNN numbers them), then ditto's own (after them):
//   ditto-gemm    explicit GEMM on cuBLAS with a shape-fixed reduction order (kernels/detail/conv2d_own.h)
//   ditto-direct  depthwise convolutions by ditto's own gather / fixed-tree kernels
enum class ConvBwdDataAlgo { Algo0, Algo1, Fft, FftTiling, Winograd, WinogradNonfused, DittoGemm, DittoDirect };
enum class ConvBwdFilterAlgo { Algo0, Algo1, Fft, Algo3, Winograd, WinogradNonfused, FftTiling, DittoGemm, DittoDirect };
enum class MathMode { Fma, Tf32 };
enum class BiasBwd { Atomic, Deterministic, Cudnn };
enum class PoolBwd { Cudnn, CudnnDeterministic, AtomicScatter, Gather };
enum class BnBwd { Cudnn, Atomic, Deterministic };
enum class Reduction { Atomic, Deterministic };
enum class CublasAtomics { Off, On };
// ---- issue 18 part A
// How a scatter-add runs (knob `scatter` of scatter_add and embedding layers; kernels/scatter.h):
// atomicAdd per element, or a stable radix sort by destination row and fixed-order segment sums.
enum class ScatterAlgo { Atomic, Sorted };
// Upsampling backward (knob `bwd` of upsample layers; kernels/upsample.h): atomicAdd scatter from
// every output gradient, or a gather per input pixel in a fixed order.
enum class UpsampleBwd { Atomic, Gather };
// ---- end of issue 18 part A
// -- issue 18, part B (kernels/grid_sample.h, roi_align.h, ctc.h, spmm.h say what each does) --
enum class GridSampleBwd { Cudnn, Atomic, Deterministic };
enum class AffineGridBwd { Cudnn, Atomic, Deterministic };
enum class RoiAlignBwd { Atomic, Deterministic };
enum class CtcAlgo { Ditto, CudnnDeterministic, CudnnNondeterministic };
enum class SpmmFwd { Ditto, CusparseDefault, CusparseAlg1, CusparseAlg2, CusparseAlg3 };
enum class SpmmBwd { Atomic, Deterministic, Cusparse };
// -- issue 19 (engine/collective.h says what each does) --
// fixed-order: ditto's reduce over fixed example groups, the same bits for any rank count; ring:
// ditto's own ring order (chunk c summed from rank c+1 round to rank c), reproducible but
// following the rank count, as NCCL's ring does;
// nccl-default: ncclAllReduce with NCCL's own algorithm, protocol and channel choice (what
// frameworks do); nccl-ALGO-PROTO: ncclAllReduce on a communicator made with that algorithm and
// protocol pinned (NCCL_ALGO / NCCL_PROTO at its creation).
enum class AllReduceAlgo { FixedOrder, Ring, NcclDefault, NcclRingSimple, NcclRingLl, NcclRingLl128, NcclTreeSimple,
                           NcclTreeLl, NcclTreeLl128 };

// Names as used in policy strings and manifests ("algo0", "implicit_precomp_gemm", ...).
// The numeric value of each cuDNN conv algorithm equals the cuDNN enum value it stands for.
const char* name_of(ConvFwdAlgo a);
const char* name_of(ConvBwdDataAlgo a);
const char* name_of(ConvBwdFilterAlgo a);
const char* name_of(MathMode m);
const char* name_of(BiasBwd b);
const char* name_of(PoolBwd p);
const char* name_of(BnBwd b);
const char* name_of(Reduction r);
const char* name_of(CublasAtomics c);
// ---- issue 18 part A
const char* name_of(ScatterAlgo s);
const char* name_of(UpsampleBwd u);
// ---- end of issue 18 part A
// -- issue 18, part B --
const char* name_of(GridSampleBwd v);
const char* name_of(AffineGridBwd v);
const char* name_of(RoiAlignBwd v);
const char* name_of(CtcAlgo v);
const char* name_of(SpmmFwd v);
const char* name_of(SpmmBwd v);
const char* name_of(AllReduceAlgo v);

// A convolution algorithm choice: a selection mode, and the algorithm when pinned.
template <class Algo>
struct AlgoChoice {
  SelectMode mode = SelectMode::Heuristic;
  Algo algo{};
  std::string str() const { return mode == SelectMode::Pinned ? name_of(algo) : select_mode_name(mode); }
};

struct KnobSpec {
  std::string name;
  OpKind op;                            // the op kind that has this knob
  std::vector<std::string> variants;    // accepted values besides the four mode words
  // Variants that are not guaranteed to give the same bits on every call: atomics, or a cuDNN
  // path cuDNN labels nondeterministic or leaves undocumented. The noise lab's candidates.
  std::vector<std::string> nondeterministic = {};
};
// The table every policy string is checked against: one row per (knob, op kind).
const std::vector<KnobSpec>& knobs();

// "NxCxHxW": how shapes are written in @SHAPE rules and manifest entries.
std::string shape_key(const std::vector<int64_t>& shape);

class Policy {
 public:
  Policy() = default;
  // Parses rules; throws PolicyError naming the bad rule and listing valid knobs/variants.
  static Policy parse(const std::vector<std::string>& rules);
  Policy& set(const std::string& rule);  // "conv2.bwd_filter=algo0", "*=deterministic", ...

  Policy& pin(const std::string& layer, ConvFwdAlgo a);
  Policy& pin(const std::string& layer, ConvBwdDataAlgo a);
  Policy& pin(const std::string& layer, ConvBwdFilterAlgo a);
  Policy& pin(const std::string& layer, MathMode m);
  Policy& pin(const std::string& layer, BiasBwd b);
  Policy& pin(const std::string& layer, PoolBwd p);
  Policy& pin(const std::string& layer, BnBwd b);
  Policy& pin(const std::string& layer, Reduction r);
  Policy& pin(const std::string& layer, CublasAtomics c);
  // ---- issue 18 part A
  Policy& pin(const std::string& layer, ScatterAlgo s);   // LAYER.scatter=...
  Policy& pin(const std::string& layer, UpsampleBwd u);   // LAYER.bwd=...
  // ---- end of issue 18 part A
  // -- issue 18, part B --
  Policy& pin(const std::string& layer, GridSampleBwd v);
  Policy& pin(const std::string& layer, AffineGridBwd v);
  Policy& pin(const std::string& layer, RoiAlignBwd v);
  Policy& pin(const std::string& layer, CtcAlgo v);
  Policy& pin(const std::string& layer, SpmmFwd v);
  Policy& pin(const std::string& layer, SpmmBwd v);
  Policy& pin(const std::string& layer, AllReduceAlgo v);  // BUCKET.algo=...

  // Resolution for one layer. Throws PolicyError if a rule naming this layer uses a knob that
  // its op kind lacks.
  // shape: the convolution's input shape as shape_key() writes it ("" matches no @SHAPE rule).
  AlgoChoice<ConvFwdAlgo> conv_fwd(const std::string& layer, const std::string& shape = "") const;
  AlgoChoice<ConvBwdDataAlgo> conv_bwd_data(const std::string& layer, const std::string& shape = "") const;
  AlgoChoice<ConvBwdFilterAlgo> conv_bwd_filter(const std::string& layer, const std::string& shape = "") const;
  MathMode math(const std::string& layer, OpKind kind) const;
  BiasBwd bias_bwd(const std::string& layer, OpKind kind) const;
  PoolBwd pool_bwd(const std::string& layer) const;
  BnBwd bn_bwd(const std::string& layer) const;
  Reduction loss_reduce(const std::string& layer) const;
  CublasAtomics cublas_atomics(const std::string& layer) const;
  // ---- issue 18 part A
  // kind: OpKind::ScatterAdd or OpKind::Embedding (any other is an Error). deterministic: sorted;
  // heuristic, nondeterministic, fastest: atomic (TensorFlow's and JAX's scatter-add, PyTorch's
  // index_add_ / scatter_add_).
  ScatterAlgo scatter(const std::string& layer, OpKind kind) const;
  // deterministic: gather; heuristic, nondeterministic, fastest: atomic (PyTorch's bilinear).
  UpsampleBwd upsample_bwd(const std::string& layer) const;
  // kind: OpKind::PixelXent or OpKind::Reduce. deterministic: deterministic; other modes: atomic.
  Reduction reduction(const std::string& layer, OpKind kind) const;
  // ---- end of issue 18 part A
  // -- issue 18, part B. Mode words: deterministic -> ditto's fixed-order variant;
  // nondeterministic -> the atomics (or library-nondeterministic) variant; heuristic and fastest ->
  // what frameworks do: grid_sample atomic (PyTorch's native kernel; its cuDNN path needs
  // align_corners), affine_grid deterministic (PyTorch's is a batched GEMM), roi_align atomic
  // (torchvision), spmm fwd cusparse-default and bwd cusparse, ctc algo cudnn-nondeterministic
  // (the op runs ditto's own where cuDNN cannot take the shape, and records it).
  GridSampleBwd grid_sample_bwd(const std::string& layer) const;
  AffineGridBwd affine_grid_bwd(const std::string& layer) const;
  RoiAlignBwd roi_align_bwd(const std::string& layer) const;
  CtcAlgo ctc_algo(const std::string& layer) const;
  SpmmFwd spmm_fwd(const std::string& layer) const;
  SpmmBwd spmm_bwd(const std::string& layer) const;
  // -- issue 19. layer: a gradient bucket ("bucket0"). deterministic -> fixed-order; heuristic,
  // nondeterministic, fastest -> nccl-default (what frameworks do).
  AllReduceAlgo allreduce_algo(const std::string& layer) const;
  // NCCL channels for a pinned nccl-* algorithm: 1..32, or 0 ("auto", and every mode word):
  // NCCL picks per call from its tuning model.
  int allreduce_channels(const std::string& layer) const;

  // What the policy asked for one knob of one layer, as manifests record it: the mode word that
  // resolved it ("heuristic", "deterministic", "nondeterministic", "fastest") or "pinned" where
  // the winning rule names a variant. For knobs whose resolvers return only the variant.
  std::string requested(const std::string& layer, const std::string& knob, OpKind kind) const;

  // Checks every layer-specific rule against the layers a network actually has: an unknown
  // layer, or a knob its op kind lacks, throws PolicyError listing the valid ones.
  void check_layers(const std::vector<std::pair<std::string, OpKind>>& layers) const;

  const std::vector<std::string>& rules() const { return rule_text_; }

 private:
  struct Rule { std::string layer, knob, value, shape; };
  std::string lookup(const std::string& layer, const std::string& knob, OpKind kind,
                     const std::string& shape = "") const;
  std::vector<Rule> rules_;
  std::vector<std::string> rule_text_;
};

}  // namespace ditto
