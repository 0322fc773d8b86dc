#include "engine/external.h"

#include <fmt/format.h>

#include "engine/detail/cuda_state.h"
#include "engine/error.h"

namespace ditto {

Tensor wrap_external(Context& ctx, void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner) {
  for (int64_t d : shape)
    if (d < 0) throw ShapeError(fmt::format("wrap_external: shape {} has a negative dimension", shape_str(shape)));
  const std::size_t bytes = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
  if (!data && bytes) throw Error(fmt::format("wrap_external: null data for a {} tensor of {}", dtype_name(dtype), shape_str(shape)));
  // The storage forgets the pointer before it is destroyed, so neither the arena nor free() sees
  // memory ditto did not allocate; the deleter holds the owner until then.
  std::shared_ptr<detail::Storage> st(new detail::Storage, [keep = std::move(owner)](detail::Storage* s) {
    s->ptr = nullptr;
    delete s;
  });
  st->device = ctx.device();
  st->bytes = bytes;
  st->ptr = data;
  // A CUDA tensor keeps its context's CUDA state (stream, pool) alive, as allocated ones do: the
  // context hands it out only with a tensor, so an empty one lends it.
  if (ctx.is_cuda()) st->cuda = detail::storage_of(ctx.empty({0}))->cuda;
  return Tensor(std::move(st), shape, dtype);
}

}  // namespace ditto
