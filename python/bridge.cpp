#include "python/bridge.h"

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/detail/cuda_state.h"
#include "engine/error.h"
#include "engine/external.h"

namespace ditto::py {
namespace {

using namespace nb::literals;

DType dtype_from_dlpack(nb::dlpack::dtype t) {
  using Code = nb::dlpack::dtype_code;
  if (t.lanes == 1) {
    if (t.code == uint8_t(Code::Float) && t.bits == 32) return DType::F32;
    if (t.code == uint8_t(Code::Int) && t.bits == 32) return DType::I32;
    if (t.code == uint8_t(Code::Bfloat) && t.bits == 16) return DType::BF16;
    if (t.code == uint8_t(Code::Float) && t.bits == 16) return DType::F16;
  }
  throw ShapeError(fmt::format("from_dlpack: ditto holds float32, int32, bfloat16 and float16; this array is DLPack "
                               "type code {} with {} bits and {} lanes",
                               int(t.code), int(t.bits), int(t.lanes)));
}

nb::dlpack::dtype dlpack_of(DType t) {
  using Code = nb::dlpack::dtype_code;
  switch (t) {
    case DType::F32: return {uint8_t(Code::Float), 32, 1};
    case DType::I32: return {uint8_t(Code::Int), 32, 1};
    case DType::BF16: return {uint8_t(Code::Bfloat), 16, 1};
    case DType::F16: return {uint8_t(Code::Float), 16, 1};
  }
  return {uint8_t(Code::Float), 32, 1};
}

// The work that produced a CUDA tensor is queued on its context's stream; a consumer on another
// stream must not read before it ends, and DLPack's export carries no event, so the export waits.
void wait_for_producer(const Tensor& t) {
  const auto& st = detail::storage_of(t);
  if (st && st->cuda) DITTO_CUDA_CHECK(cudaStreamSynchronize(st->cuda->stream));
}

// ditto's memory as an nb_ndarray (the array-API object, which implements __dlpack__ and the
// buffer protocol); the capsule keeps a reference to the tensor's storage for as long as any
// consumer holds the view.
nb::ndarray<nb::array_api> share(const Tensor& t) {
  if (!t.defined()) throw Error("an undefined tensor has no data to share");
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  nb::capsule owner(new Tensor(t), [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  const Device d = t.device();
  // A channels-last tensor goes out with its logical N, C, H, W shape and the strides of its memory
  // (N, H, W, C), as PyTorch's channels_last tensors are.
  const Shape& s = t.shape();
  const std::vector<int64_t> nhwc_strides =
      t.channels_last() ? std::vector<int64_t>{s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]} : std::vector<int64_t>{};
  return nb::ndarray<nb::array_api>(t.raw(), shape.size(), shape.data(), owner,
                                    t.channels_last() ? nhwc_strides.data() : nullptr, dlpack_of(t.dtype()),
                       d.is_cuda() ? nb::device::cuda::value : nb::device::cpu::value, d.is_cuda() ? d.index : 0);
}

}  // namespace

nb::ndarray<nb::array_api> as_ndarray(const Tensor& t) {
  wait_for_producer(t);
  return share(t);
}

nb::ndarray<nb::array_api> share_on_stream(const Tensor& t) { return share(t); }

// An array of another library as a ditto tensor on ctx's device, sharing its memory.
Tensor from_dlpack(Context& ctx, nb::handle obj) {
  nb::object source = nb::borrow(obj);
  // DLPack's stream contract: a producer asked for its data on our stream orders its pending work
  // before it; without a stream argument the exchange would race with a GPU producer.
  // A host array (NumPy's refuses any stream) is passed as it is, and refused below for its device.
  constexpr int kDLCUDA = 2;
  const bool producer_on_gpu =
      !nb::hasattr(obj, "__dlpack_device__") || nb::cast<int>(nb::tuple(obj.attr("__dlpack_device__")())[0]) == kDLCUDA;
  if (ctx.is_cuda() && producer_on_gpu && nb::hasattr(obj, "__dlpack__")) {
    const auto stream = reinterpret_cast<std::intptr_t>(detail::cuda_state(ctx).stream);
    source = obj.attr("__dlpack__")("stream"_a = stream);
  }
  nb::ndarray<nb::c_contig> a;
  if (!nb::try_cast(source, a, false))
    throw ShapeError("from_dlpack: the object is not a C-contiguous DLPack array (call .contiguous() or "
                     "numpy.ascontiguousarray first: ditto shares memory and never copies silently)");
  const bool cuda = a.device_type() == nb::device::cuda::value;
  if (!cuda && a.device_type() != nb::device::cpu::value)
    throw Error(fmt::format("from_dlpack: DLPack device type {} is neither the CPU nor CUDA", a.device_type()));
  const Device where = cuda ? Device::cuda(a.device_id()) : Device::cpu();
  if (where != ctx.device())
    throw Error(fmt::format("from_dlpack: the array is on {}, this context on {}; make the context on the array's "
                            "device",
                            where.str(), ctx.device().str()));
  Shape shape;
  for (size_t i = 0; i < a.ndim(); ++i) shape.push_back(static_cast<int64_t>(a.shape(i)));
  auto* keep = new nb::object(source);
  std::shared_ptr<void> owner(keep, [](void* p) {
    nb::gil_scoped_acquire gil;
    delete static_cast<nb::object*>(p);
  });
  return wrap_external(ctx, a.data(), shape, dtype_from_dlpack(a.dtype()), std::move(owner));
}

}  // namespace ditto::py
