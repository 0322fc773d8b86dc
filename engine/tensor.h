// Tensor: a dense array of float32 (int32 for labels; bfloat16 or float16 where a layer computes
// in reduced precision, kernels/precision.h) on the CPU or one CUDA device, row-major NCHW unless it
// is channels-last (Layout::Nhwc: a 4-D tensor whose memory is N, H, W, C).
// Device memory comes from the owning Context's stream-ordered caching arena; a tensor keeps
// that arena alive, so it may outlive the Context that made it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/fingerprint.h"

namespace ditto {

// BF16 and F16 hold the bits of CUDA's __nv_bfloat16 and __half (2 bytes each); the engine converts
// to and from them with the toolkit's own round-to-nearest-even conversions on both CPU and GPU
// (engine/tensor_ops.h, to_dtype), so a CPU run rounds exactly where and how a GPU run does.
enum class DType { F32, I32, BF16, F16 };
std::size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "f32", "i32", "bf16", "f16"
bool is_float(DType t);           // F32, BF16 or F16

// The memory order of a tensor. Shapes are always logical: a 4-D tensor's shape is N, C, H, W (a
// filter's K, C, R, S) in either layout; Nhwc says its memory is N, H, W, C (K, R, S, C), the order
// cuDNN's tensor-core kernels prefer. Ops that read only NCHW refuse an Nhwc operand
// (engine/operand_check.h), so a channels-last tensor is never read in the wrong order.
enum class Layout { Nchw, Nhwc };
const char* layout_name(Layout l);  // "nchw", "nhwc"
// A dtype and layout as one word: the dtype's name, with "-nhwc" for channels-last ("bf16-nhwc").
std::string type_tag(DType t, Layout l);

struct Device {
  enum class Kind { Cpu, Cuda };
  Kind kind = Kind::Cpu;
  int index = 0;

  static Device cpu() { return {}; }
  static Device cuda(int i = 0) { return {Kind::Cuda, i}; }
  // "cpu", "cuda", "cuda:N"; anything else throws ditto::Error naming the string.
  static Device parse(const std::string& s);
  bool is_cuda() const { return kind == Kind::Cuda; }
  std::string str() const;
  bool operator==(const Device& o) const { return kind == o.kind && (kind == Kind::Cpu || index == o.index); }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);

class Tensor;
namespace detail {
struct Storage;
// A tensor's storage (internal: the engine copies and frees through it; tests check sharing).
const std::shared_ptr<Storage>& storage_of(const Tensor& t);
}  // namespace detail

class Tensor {
 public:
  Tensor() = default;  // undefined: no storage
  // Layout::Nhwc needs a 4-D shape (throws ShapeError otherwise).
  Tensor(std::shared_ptr<detail::Storage> storage, Shape shape, DType dtype, Layout layout = Layout::Nchw);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const;  // negative i counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Layout layout() const { return layout_; }
  bool channels_last() const { return layout_ == Layout::Nhwc; }
  // The dtype's name, with "-nhwc" for a channels-last tensor: what fingerprints and digests hash,
  // so a channels-last tensor never has the fingerprint of an NCHW one with the same bytes.
  std::string type_tag() const;
  Device device() const;
  bool is_cuda() const { return device().is_cuda(); }

  // Raw element pointers (host or device memory, by device()). Throw on dtype mismatch.
  float* f32();
  const float* f32() const;
  int32_t* i32();
  const int32_t* i32() const;
  void* raw() const;

  // Same storage, new shape (numel must match). A channels-last tensor cannot be reshaped (its
  // memory is not in the order a new shape would read): ShapeError.
  Tensor reshape(Shape s) const;

  // Copies to host memory. For CUDA tensors this waits for the producing stream:
  // for inspection and tests, never called from op paths. to_host_f32 widens bf16 and f16
  // (exactly: every bf16/f16 value is a float). Values come in memory order (N, H, W, C for a
  // channels-last tensor).
  std::vector<float> to_host_f32() const;
  std::vector<int32_t> to_host_i32() const;

  // XXH3-128 of the type tag, the shape and the bytes (engine/fingerprint.h): identical on CPU and
  // GPU for identical bytes. The basis of every bitwise-determinism claim.
  Fingerprint fingerprint() const;

 private:
  friend const std::shared_ptr<detail::Storage>& detail::storage_of(const Tensor& t);

  std::shared_ptr<detail::Storage> storage_;
  Shape shape_;
  DType dtype_ = DType::F32;
  Layout layout_ = Layout::Nchw;
};

std::string hex64(uint64_t v);  // 16 lowercase hex digits (seeds, keys; fingerprints are Fingerprint::hex)

}  // namespace ditto
