// Optimizer update kernels: one thread per parameter element, the same float expressions in
// the same order as the CPU reference (engine/optim_ref.h). No reductions: deterministic.
// Contractions into FMA are disabled (__fmul_rn/__fadd_rn) so the GPU rounds exactly like the
// CPU reference, which makes CPU and GPU updates bit-comparable.
#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "engine/detail/optim_cuda.h"

namespace ditto::cuda {
namespace {

// One element of each update. The by-value kernels and the table kernels (CUDA graphs) share
// these, so an update gives the same bits whichever way its scalars arrive.
__device__ __forceinline__ void sgd_element(float* p, const float* grad, float* buf, int64_t i, float lr,
                                            float momentum, bool nesterov, float wd) {
  float g = __fadd_rn(grad[i], __fmul_rn(wd, p[i]));
  if (momentum != 0.f) {
    float b = __fadd_rn(__fmul_rn(momentum, buf[i]), g);
    buf[i] = b;
    g = nesterov ? __fadd_rn(g, __fmul_rn(momentum, b)) : b;
  }
  p[i] = __fsub_rn(p[i], __fmul_rn(lr, g));
}

__device__ __forceinline__ void adam_element(float* p, const float* grad, float* m, float* v, int64_t i,
                                             float step_size, float b1, float b2, float eps, float bias2_sqrt,
                                             float wd) {
  float g = __fadd_rn(grad[i], __fmul_rn(wd, p[i]));
  float mi = __fadd_rn(__fmul_rn(b1, m[i]), __fmul_rn(__fsub_rn(1.f, b1), g));
  float vi = __fadd_rn(__fmul_rn(b2, v[i]), __fmul_rn(__fmul_rn(__fsub_rn(1.f, b2), g), g));
  m[i] = mi;
  v[i] = vi;
  float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bias2_sqrt), eps);
  p[i] = __fsub_rn(p[i], __fdiv_rn(__fmul_rn(step_size, mi), denom));
}

// skip: the loss scaler's overflow flag (null: never skip); set, the update writes nothing.
__global__ void sgd_kernel(float* p, const float* grad, float* buf, int64_t n, float lr, float momentum, bool nesterov,
                           float wd, const int32_t* skip) {
  if (skip && *skip) return;
  DITTO_GRID_STRIDE(i, n) sgd_element(p, grad, buf, i, lr, momentum, nesterov, wd);
}

__global__ void sgd_table_kernel(float* p, const float* grad, float* buf, int64_t n, const float* table,
                                 const int32_t* cursor, int width, float momentum, bool nesterov, float wd,
                                 const int32_t* skip) {
  if (skip && *skip) return;
  const float lr = table[int64_t(*cursor) * width];
  DITTO_GRID_STRIDE(i, n) sgd_element(p, grad, buf, i, lr, momentum, nesterov, wd);
}

__global__ void adam_kernel(float* p, const float* grad, float* m, float* v, int64_t n, float step_size, float b1,
                            float b2, float eps, float bias2_sqrt, float wd) {
  DITTO_GRID_STRIDE(i, n) adam_element(p, grad, m, v, i, step_size, b1, b2, eps, bias2_sqrt, wd);
}

__global__ void adam_table_kernel(float* p, const float* grad, float* m, float* v, int64_t n, const float* table,
                                  const int32_t* cursor, int width, float b1, float b2, float eps, float wd) {
  const float* row = table + int64_t(*cursor) * width;
  const float step_size = row[0], bias2_sqrt = row[1];
  DITTO_GRID_STRIDE(i, n) adam_element(p, grad, m, v, i, step_size, b1, b2, eps, bias2_sqrt, wd);
}

// Adam under a skip flag: step t = updates applied + 1; step_size = lr / (1 - beta1^t) divided in
// double and rounded to float (__ddiv_rn, __double2float_rn: IEEE, so step_scalars' host bits).
// lr comes by value, or from column 2 of the plan's row *cursor when table is set.
__global__ void adam_counted_kernel(float* p, const float* grad, float* m, float* v, int64_t n, float lr,
                                    const float* table, const int32_t* cursor, int width, const double* c1,
                                    const float* bias2_sqrt, const int32_t* updates, const int32_t* skip, float b1,
                                    float b2, float eps, float wd) {
  if (*skip) return;
  const int64_t t = int64_t(*updates) + 1;
  if (table) lr = table[int64_t(*cursor) * width + 2];
  const float step_size = __double2float_rn(__ddiv_rn(double(lr), c1[t - 1]));
  DITTO_GRID_STRIDE(i, n) adam_element(p, grad, m, v, i, step_size, b1, b2, eps, bias2_sqrt[t - 1], wd);
}

__global__ void count_update_kernel(int32_t* updates, const int32_t* skip) {
  if (!*skip) *updates += 1;
}

__global__ void advance_cursor_kernel(int32_t* cursor) { *cursor += 1; }
}  // namespace

void sgd_update(Context& ctx, float* p, const float* grad, float* buf, int64_t n, float lr, float momentum,
                bool nesterov, float wd, const int32_t* skip) {
  if (n == 0) return;
  sgd_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(p, grad, buf, n, lr, momentum, nesterov, wd,
                                                                     skip);
  DITTO_CHECK_LAUNCH(ctx);
}

void sgd_update_table(Context& ctx, float* p, const float* grad, float* buf, int64_t n, const float* table,
                      const int32_t* cursor, int width, float momentum, bool nesterov, float wd,
                      const int32_t* skip) {
  if (n == 0) return;
  sgd_table_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(p, grad, buf, n, table, cursor, width,
                                                                           momentum, nesterov, wd, skip);
  DITTO_CHECK_LAUNCH(ctx);
}

void adam_update(Context& ctx, float* p, const float* grad, float* m, float* v, int64_t n, float step_size, float b1,
                 float b2, float eps, float bias2_sqrt, float wd) {
  if (n == 0) return;
  adam_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(p, grad, m, v, n, step_size, b1, b2, eps,
                                                                       bias2_sqrt, wd);
  DITTO_CHECK_LAUNCH(ctx);
}

void adam_update_table(Context& ctx, float* p, const float* grad, float* m, float* v, int64_t n, const float* table,
                       const int32_t* cursor, int width, float b1, float b2, float eps, float wd) {
  if (n == 0) return;
  adam_table_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(p, grad, m, v, n, table, cursor, width,
                                                                             b1, b2, eps, wd);
  DITTO_CHECK_LAUNCH(ctx);
}

void adam_update_counted(Context& ctx, float* p, const float* grad, float* m, float* v, int64_t n, float lr,
                         const float* table, const int32_t* cursor, int width, const double* c1,
                         const float* bias2_sqrt, const int32_t* updates, const int32_t* skip, float b1, float b2,
                         float eps, float wd) {
  if (n == 0) return;
  adam_counted_kernel<<<blocks_for(n), kThreads, 0, detail::stream_of(ctx)>>>(
      p, grad, m, v, n, lr, table, cursor, width, c1, bias2_sqrt, updates, skip, b1, b2, eps, wd);
  DITTO_CHECK_LAUNCH(ctx);
}

void count_update(Context& ctx, int32_t* updates, const int32_t* skip) {
  count_update_kernel<<<1, 1, 0, detail::stream_of(ctx)>>>(updates, skip);
  DITTO_CHECK_LAUNCH(ctx);
}

void advance_cursor(Context& ctx, int32_t* cursor) {
  advance_cursor_kernel<<<1, 1, 0, detail::stream_of(ctx)>>>(cursor);
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace ditto::cuda
