#include "engine/tensor.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

#include "engine/detail/cuda_state.h"
#include "engine/detail/half_bits.h"
#include "engine/error.h"

namespace ditto {

std::size_t dtype_size(DType t) { return t == DType::BF16 || t == DType::F16 ? 2 : 4; }
const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::I32: return "i32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
  }
  return "?";
}
bool is_float(DType t) { return t != DType::I32; }
const char* layout_name(Layout l) { return l == Layout::Nhwc ? "nhwc" : "nchw"; }

Device Device::parse(const std::string& s) {
  if (s == "cpu") return cpu();
  if (s == "cuda") return cuda(0);
  if (s.rfind("cuda:", 0) == 0 && s.size() > 5) {
    char* end = nullptr;
    long i = std::strtol(s.c_str() + 5, &end, 10);
    if (*end == '\0' && i >= 0 && i < 1024) return cuda(static_cast<int>(i));
  }
  throw Error(fmt::format("unknown device '{}': expected cpu, cuda or cuda:N", s));
}

std::string Device::str() const { return is_cuda() ? fmt::format("cuda:{}", index) : "cpu"; }

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

namespace detail {
Storage::~Storage() {
  if (!ptr) return;
  if (cuda)
    cuda->free(ptr);
  else
    std::free(ptr);
}
const std::shared_ptr<Storage>& storage_of(const Tensor& t) { return t.storage_; }

}  // namespace detail

Tensor::Tensor(std::shared_ptr<detail::Storage> storage, Shape shape, DType dtype, Layout layout)
    : storage_(std::move(storage)), shape_(std::move(shape)), dtype_(dtype), layout_(layout) {
  if (layout_ == Layout::Nhwc && shape_.size() != 4)
    throw ShapeError(fmt::format("a channels-last (nhwc) tensor is 4-D; got shape {}", shape_str(shape_)));
  for (auto d : shape_)
    if (d < 0) throw ShapeError(fmt::format("negative dimension in shape {}", shape_str(shape_)));
  if (storage_ && storage_->bytes < nbytes())
    throw ShapeError(fmt::format("shape {} needs {} bytes, storage has {}", shape_str(shape_), nbytes(),
                                 storage_->bytes));
}

int64_t Tensor::dim(int i) const {
  int n = ndim();
  if (i < 0) i += n;
  if (i < 0 || i >= n) throw ShapeError(fmt::format("dim {} out of range for shape {}", i, shape_str(shape_)));
  return shape_[i];
}

Device Tensor::device() const { return storage_ ? storage_->device : Device::cpu(); }

void* Tensor::raw() const {
  if (!storage_) throw Error("access to an undefined tensor");
  return storage_->ptr;
}

float* Tensor::f32() {
  if (dtype_ != DType::F32) throw ShapeError(fmt::format("tensor is {}, f32 access requested", dtype_name(dtype_)));
  return static_cast<float*>(raw());
}
const float* Tensor::f32() const { return const_cast<Tensor*>(this)->f32(); }
int32_t* Tensor::i32() {
  if (dtype_ != DType::I32) throw ShapeError(fmt::format("tensor is {}, i32 access requested", dtype_name(dtype_)));
  return static_cast<int32_t*>(raw());
}
const int32_t* Tensor::i32() const { return const_cast<Tensor*>(this)->i32(); }

Tensor Tensor::reshape(Shape s) const {
  if (shape_numel(s) != numel())
    throw ShapeError(fmt::format("cannot reshape {} to {}", shape_str(shape_), shape_str(s)));
  if (layout_ == Layout::Nhwc)
    throw ShapeError(fmt::format("cannot reshape the channels-last tensor {} to {}: its memory is N, H, W, C; "
                                 "convert it to NCHW first (from_channels_last)",
                                 shape_str(shape_), shape_str(s)));
  return Tensor(storage_, std::move(s), dtype_);
}

namespace {
void copy_to_host(const Tensor& t, void* dst) {
  if (t.nbytes() == 0) return;
  const auto& st = detail::storage_of(t);
  if (st->cuda) {
    DITTO_CUDA_CHECK(cudaSetDevice(st->cuda->device));
    DITTO_CUDA_CHECK(cudaMemcpyAsync(dst, st->ptr, t.nbytes(), cudaMemcpyDeviceToHost, st->cuda->stream));
    DITTO_CUDA_CHECK(cudaStreamSynchronize(st->cuda->stream));
  } else {
    std::memcpy(dst, st->ptr, t.nbytes());
  }
}
}  // namespace

std::vector<float> Tensor::to_host_f32() const {
  if (dtype_ == DType::I32) throw ShapeError("to_host_f32 on an i32 tensor");
  std::vector<float> out(static_cast<std::size_t>(numel()));
  if (dtype_ == DType::F32) {
    copy_to_host(*this, out.data());
    return out;
  }
  std::vector<uint16_t> bits(out.size());
  copy_to_host(*this, bits.data());
  for (std::size_t i = 0; i < bits.size(); ++i) out[i] = detail::half_bits_to_float(dtype_, bits[i]);
  return out;
}

std::vector<int32_t> Tensor::to_host_i32() const {
  if (dtype_ != DType::I32) throw ShapeError(fmt::format("to_host_i32 on an {} tensor", dtype_name(dtype_)));
  std::vector<int32_t> out(static_cast<std::size_t>(numel()));
  copy_to_host(*this, out.data());
  return out;
}

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

std::string type_tag(DType t, Layout l) {
  return l == Layout::Nhwc ? std::string(dtype_name(t)) + "-nhwc" : std::string(dtype_name(t));
}

std::string Tensor::type_tag() const { return ditto::type_tag(dtype_, layout_); }

Fingerprint Tensor::fingerprint() const {
  if (!defined()) return {};
  std::vector<unsigned char> bytes(nbytes());
  copy_to_host(*this, bytes.data());
  Hasher h;
  h.add(type_tag()).sized(shape_.data(), shape_.size() * sizeof(int64_t));
  return h.sized(bytes.data(), bytes.size()).digest();
}

}  // namespace ditto
