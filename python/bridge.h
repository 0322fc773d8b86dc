// Tensors across the Python boundary by DLPack, without copies (shared by the module's parts).
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "engine/context.h"

namespace ditto::py {

namespace nb = nanobind;

// An array of another library (NumPy, PyTorch, CuPy, JAX) as a ditto tensor on ctx's device,
// sharing its memory. A GPU producer is asked for its data on ctx's stream (DLPack's stream
// contract). ShapeError for a non-contiguous array or an unsupported dtype, Error for another
// device than ctx's.
Tensor from_dlpack(Context& ctx, nb::handle obj);

// ditto's memory as an array-API object (it implements __dlpack__); the capsule keeps the tensor's
// storage alive while any consumer holds the view. A CUDA tensor's pending work ends first, since
// DLPack's export carries no event for a consumer on another stream.
nb::ndarray<nb::array_api> as_ndarray(const Tensor& t);

// The same without that wait: for a consumer that runs on the stream the tensor was made on (the
// ditto.torch ops, whose contexts borrow PyTorch's current stream).
nb::ndarray<nb::array_api> share_on_stream(const Tensor& t);

}  // namespace ditto::py
