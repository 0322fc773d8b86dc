// Tensors over memory another library owns (NumPy, PyTorch, CuPy or JAX arrays handed over by
// DLPack), shared without a copy. ditto never frees that memory: `owner` (the other library's
// handle: a DLPack capsule, a Python reference) stays alive while any tensor shares the storage,
// and is released, on the thread that drops the last tensor, when none does.
#pragma once
#include <memory>

#include "engine/context.h"

namespace ditto {

// A tensor of `shape` and `dtype` over `data` (contiguous, row-major, on ctx's device). Throws
// ShapeError for a negative dimension and Error for a null `data` with elements. The caller
// promises that the memory holds the elements and that nothing else frees it while `owner` lives.
Tensor wrap_external(Context& ctx, void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner);

}  // namespace ditto
