// Optimizer update kernels: one thread per parameter element, up to kParamsPerLaunch parameters per
// launch, the same float expressions in the same order as the CPU reference (engine/optim_ref.h). No
// reductions: deterministic.
// Contractions into FMA are disabled (__fmul_rn/__fadd_rn) so the GPU rounds exactly like the
// CPU reference, which makes CPU and GPU updates bit-comparable.
#include <algorithm>

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

// A launch's parameters: each takes `blocks` consecutive blocks from `first` and strides over its
// elements with them. Passed by value; the kernels read it with constant indices only (a runtime
// index into a parameter array would copy the whole struct to local memory in every thread).
constexpr int kParamsPerLaunch = 16;
constexpr int64_t kMaxBlocksPerParam = 8192;
struct ParamBatch {
  float* p[kParamsPerLaunch];
  const float* grad[kParamsPerLaunch];
  float* a[kParamsPerLaunch];
  float* b[kParamsPerLaunch];
  int64_t n[kParamsPerLaunch];
  uint32_t first[kParamsPerLaunch];
  uint32_t blocks[kParamsPerLaunch];
  int count;
};

struct Segment {
  float* p;
  const float* grad;
  float* a;
  float* b;
  int64_t n;
  uint32_t first, blocks;
};

// This block's parameter: the last whose first block is at or before it.
__device__ __forceinline__ Segment segment_of(const ParamBatch& pb) {
  Segment s{pb.p[0], pb.grad[0], pb.a[0], pb.b[0], pb.n[0], pb.first[0], pb.blocks[0]};
#pragma unroll
  for (int i = 1; i < kParamsPerLaunch; ++i)
    if (i < pb.count && blockIdx.x >= pb.first[i])
      s = Segment{pb.p[i], pb.grad[i], pb.a[i], pb.b[i], pb.n[i], pb.first[i], pb.blocks[i]};
  return s;
}

#define DITTO_SEGMENT_STRIDE(i, s)                                                                     \
  for (int64_t i = int64_t(blockIdx.x - (s).first) * blockDim.x + threadIdx.x; i < (s).n;           \
       i += int64_t((s).blocks) * blockDim.x)

// Where a step's scalars come from: by value (v0, v1), from row *cursor of a plan's table, or, for
// Adam under a skip flag (updates set), from the count of updates applied.
struct StepScalars {
  float v0 = 0.f, v1 = 0.f;
  const float* table = nullptr;
  const int32_t* cursor = nullptr;
  int width = 0;
  const double* c1 = nullptr;
  const float* bias2_sqrt = nullptr;
  const int32_t* updates = nullptr;
  const int32_t* skip = nullptr;
};

__global__ void sgd_kernel(ParamBatch pb, StepScalars sc, float momentum, bool nesterov, float wd) {
  if (sc.skip && *sc.skip) return;
  const float lr = sc.table ? sc.table[int64_t(*sc.cursor) * sc.width] : sc.v0;
  const Segment s = segment_of(pb);
  DITTO_SEGMENT_STRIDE(i, s) sgd_element(s.p, s.grad, s.a, i, lr, momentum, nesterov, wd);
}

// Under a skip flag: step t = updates applied + 1; step_size = lr / (1 - beta1^t) divided in double
// and rounded to float (__ddiv_rn, __double2float_rn: IEEE, so step_scalars' host bits), lr by value
// or from column 2 of the plan's row.
__global__ void adam_kernel(ParamBatch pb, StepScalars sc, float b1, float b2, float eps, float wd) {
  float step_size = sc.v0, bias2_sqrt = sc.v1;
  if (sc.updates) {
    if (*sc.skip) return;
    const int64_t t = int64_t(*sc.updates) + 1;
    const float lr = sc.table ? sc.table[int64_t(*sc.cursor) * sc.width + 2] : sc.v0;
    step_size = __double2float_rn(__ddiv_rn(double(lr), sc.c1[t - 1]));
    bias2_sqrt = sc.bias2_sqrt[t - 1];
  } else if (sc.table) {
    const float* row = sc.table + int64_t(*sc.cursor) * sc.width;
    step_size = row[0];
    bias2_sqrt = row[1];
  }
  const Segment s = segment_of(pb);
  DITTO_SEGMENT_STRIDE(i, s) adam_element(s.p, s.grad, s.a, s.b, i, step_size, b1, b2, eps, bias2_sqrt, wd);
}

__global__ void count_update_kernel(int32_t* updates, const int32_t* skip) {
  if (!*skip) *updates += 1;
}

__global__ void advance_cursor_kernel(int32_t* cursor) { *cursor += 1; }

// Calls launch(batch, blocks) for each group of up to kParamsPerLaunch non-empty parameters.
template <class Launch>
void in_batches(const std::vector<ParamRef>& ps, Launch launch) {
  ParamBatch pb{};
  uint32_t blocks = 0;
  for (const ParamRef& r : ps) {
    if (r.n == 0) continue;
    const int i = pb.count++;
    pb.p[i] = r.p, pb.grad[i] = r.grad, pb.a[i] = r.a, pb.b[i] = r.b, pb.n[i] = r.n;
    pb.first[i] = blocks;
    pb.blocks[i] = static_cast<uint32_t>(std::min<int64_t>((r.n + kThreads - 1) / kThreads, kMaxBlocksPerParam));
    blocks += pb.blocks[i];
    if (pb.count == kParamsPerLaunch) {
      launch(pb, blocks);
      pb = ParamBatch{};
      blocks = 0;
    }
  }
  if (pb.count) launch(pb, blocks);
}
}  // namespace

void sgd_update(Context& ctx, const std::vector<ParamRef>& ps, float lr, float momentum, bool nesterov, float wd,
                const int32_t* skip) {
  StepScalars sc;
  sc.v0 = lr, sc.skip = skip;
  in_batches(ps, [&](const ParamBatch& pb, uint32_t blocks) {
    sgd_kernel<<<blocks, kThreads, 0, detail::stream_of(ctx)>>>(pb, sc, momentum, nesterov, wd);
    DITTO_CHECK_LAUNCH(ctx);
  });
}

void sgd_update_table(Context& ctx, const std::vector<ParamRef>& ps, const float* table, const int32_t* cursor,
                      int width, float momentum, bool nesterov, float wd, const int32_t* skip) {
  StepScalars sc;
  sc.table = table, sc.cursor = cursor, sc.width = width, sc.skip = skip;
  in_batches(ps, [&](const ParamBatch& pb, uint32_t blocks) {
    sgd_kernel<<<blocks, kThreads, 0, detail::stream_of(ctx)>>>(pb, sc, momentum, nesterov, wd);
    DITTO_CHECK_LAUNCH(ctx);
  });
}

void adam_update(Context& ctx, const std::vector<ParamRef>& ps, float step_size, float b1, float b2, float eps,
                 float bias2_sqrt, float wd) {
  StepScalars sc;
  sc.v0 = step_size, sc.v1 = bias2_sqrt;
  in_batches(ps, [&](const ParamBatch& pb, uint32_t blocks) {
    adam_kernel<<<blocks, kThreads, 0, detail::stream_of(ctx)>>>(pb, sc, b1, b2, eps, wd);
    DITTO_CHECK_LAUNCH(ctx);
  });
}

void adam_update_table(Context& ctx, const std::vector<ParamRef>& ps, const float* table, const int32_t* cursor,
                       int width, float b1, float b2, float eps, float wd) {
  StepScalars sc;
  sc.table = table, sc.cursor = cursor, sc.width = width;
  in_batches(ps, [&](const ParamBatch& pb, uint32_t blocks) {
    adam_kernel<<<blocks, kThreads, 0, detail::stream_of(ctx)>>>(pb, sc, b1, b2, eps, wd);
    DITTO_CHECK_LAUNCH(ctx);
  });
}

void adam_update_counted(Context& ctx, const std::vector<ParamRef>& ps, float lr, const float* table,
                         const int32_t* cursor, int width, const double* c1, const float* bias2_sqrt,
                         const int32_t* updates, const int32_t* skip, float b1, float b2, float eps, float wd) {
  StepScalars sc;
  sc.v0 = lr, sc.table = table, sc.cursor = cursor, sc.width = width, sc.c1 = c1, sc.bias2_sqrt = bias2_sqrt;
  sc.updates = updates, sc.skip = skip;
  in_batches(ps, [&](const ParamBatch& pb, uint32_t blocks) {
    adam_kernel<<<blocks, kThreads, 0, detail::stream_of(ctx)>>>(pb, sc, b1, b2, eps, wd);
    DITTO_CHECK_LAUNCH(ctx);
  });
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
