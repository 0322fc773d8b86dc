// ditto's CTC kernel and the staging kernels around cuDNN's. Which are deterministic, and why, is
// said per kernel.
#include <cub/device/device_scan.cuh>

#include "engine/detail/cuda_state.h"
#include "engine/detail/launch.cuh"
#include "kernels/detail/ctc_cuda.h"
#include "kernels/detail/segments.cuh"

namespace ditto::cuda {
namespace {

constexpr int kCtcThreads = 128;

__device__ __forceinline__ float log_add(float a, float b) {
  if (a == -INFINITY) return b;
  if (b == -INFINITY) return a;
  const float m = fmaxf(a, b);
  return m + logf(expf(a - m) + expf(b - m));
}

__device__ __forceinline__ bool sample_valid(const int32_t* labels, const int32_t* label_len, const int32_t* input_len,
                                             const ref::CtcDims& d, int64_t n) {
  const int64_t l = label_len[n], tn = input_len[n];
  if (l < 0 || l > d.s || tn < 1 || tn > d.t) return false;
  for (int64_t i = 0; i < l; ++i)
    if (labels[n * d.s + i] < 1 || labels[n * d.s + i] >= d.a) return false;
  return true;
}

struct CtcLayout {
  float *lse, *alpha, *beta;
  int32_t *head, *next;
  std::size_t bytes;
};

CtcLayout ctc_layout(void* base, const ref::CtcDims& d) {
  const int64_t states = 2 * d.s + 1;
  WorkspaceCarve carve{static_cast<char*>(base)};
  CtcLayout l;
  l.lse = carve.take<float>(d.n * d.t);
  l.alpha = carve.take<float>(d.n * d.t * states);
  l.beta = carve.take<float>(d.n * d.t * states);
  l.head = carve.take<int32_t>(d.n * d.a);
  l.next = carve.take<int32_t>(d.n * states);
  l.bytes = carve.bytes;
  return l;
}

// ---- ctc_kernel's stages. Each is run by all of the block's threads (one block per sequence n)
// and ends at a barrier, after which the next stage reads what it wrote. -------------------------

// Sequence n's slice of the inputs and of the workspace.
struct CtcSequence {
  const float* lg;            // logits[t, n, a] = lg[t * row_stride + a]
  const int32_t* lab_n;       // labels[n, :]
  float *lse, *alpha, *beta;  // alpha and beta: row stride `states`
  int64_t row_stride, tn, states;

  // The extended label sequence: blank (0) at even states, label s / 2 at odd ones.
  __device__ __forceinline__ int32_t lab(int64_t s) const { return (s & 1) ? lab_n[s / 2] : 0; }
  // log softmax(logits[t, n, :])[a].
  __device__ __forceinline__ float lp(int64_t t, int32_t a) const { return lg[t * row_stride + a] - lse[t]; }
};

// grad[t, n, a] = value for every t < T, a < A.
__device__ __forceinline__ void fill_grad_rows(float* grad, const ref::CtcDims& d, int64_t n, int64_t row_stride,
                                               float value) {
  const int64_t tid = threadIdx.x, bd = blockDim.x;
  for (int64_t i = tid; i < d.t * d.a; i += bd) grad[(i / d.a) * row_stride + n * d.a + i % d.a] = value;
}

// The log-softmax normalizer of each frame t < T_n: one thread's loop over the classes.
__device__ __forceinline__ void log_softmax_normalizers(const CtcSequence& q, int64_t classes) {
  const int64_t tid = threadIdx.x, bd = blockDim.x;
  for (int64_t t = tid; t < q.tn; t += bd) {
    const float* row = q.lg + t * q.row_stride;
    float m = row[0];
    for (int64_t a = 1; a < classes; ++a) m = fmaxf(m, row[a]);
    float s = 0.f;
    for (int64_t a = 0; a < classes; ++a) s += expf(row[a] - m);
    q.lse[t] = m + logf(s);
  }
  __syncthreads();
}

// alpha[t, s], forward in t: one thread's log-add of at most three states of row t - 1, one
// barrier per row.
__device__ __forceinline__ void alpha_recursion(const CtcSequence& q) {
  const int64_t tid = threadIdx.x, bd = blockDim.x, states = q.states;
  float* alpha = q.alpha;
  for (int64_t s = tid; s < states; s += bd) alpha[s] = s == 0 ? q.lp(0, 0) : (s == 1 ? q.lp(0, q.lab(1)) : -INFINITY);
  __syncthreads();
  for (int64_t t = 1; t < q.tn; ++t) {
    const float* prev = alpha + (t - 1) * states;
    for (int64_t s = tid; s < states; s += bd) {
      const int32_t ls = q.lab(s);
      float v = prev[s];
      if (s >= 1) v = log_add(v, prev[s - 1]);
      if (s >= 2 && ls != 0 && ls != q.lab(s - 2)) v = log_add(v, prev[s - 2]);
      alpha[t * states + s] = v == -INFINITY ? -INFINITY : v + q.lp(t, ls);
    }
    __syncthreads();
  }
}

// log p(labels | logits): the log-add of the last row's final blank and final label.
__device__ __forceinline__ float sequence_log_likelihood(const CtcSequence& q) {
  const float* last = q.alpha + (q.tn - 1) * q.states;
  return log_add(last[q.states - 1], q.states > 1 ? last[q.states - 2] : -INFINITY);
}

// beta[t, s], backward in t: one thread's log-add of at most three states of row t + 1, one
// barrier per row.
__device__ __forceinline__ void beta_recursion(const CtcSequence& q) {
  const int64_t tid = threadIdx.x, bd = blockDim.x, states = q.states, tn = q.tn;
  float* beta = q.beta;
  for (int64_t s = tid; s < states; s += bd)
    beta[(tn - 1) * states + s] = s >= states - 2 ? q.lp(tn - 1, q.lab(s)) : -INFINITY;
  __syncthreads();
  for (int64_t t = tn - 2; t >= 0; --t) {
    const float* nxt = beta + (t + 1) * states;
    for (int64_t s = tid; s < states; s += bd) {
      const int32_t ls = q.lab(s);
      float v = nxt[s];
      if (s + 1 < states) v = log_add(v, nxt[s + 1]);
      if (s + 2 < states && ls != 0 && ls != q.lab(s + 2)) v = log_add(v, nxt[s + 2]);
      beta[t * states + s] = v == -INFINITY ? -INFINITY : v + q.lp(t, ls);
    }
    __syncthreads();
  }
}

// Per class, the states that carry it in ascending order, as a linked list: head[class] is the
// first (-1: none), next[state] the one after (-1: the last).
__device__ __forceinline__ void class_state_lists(const CtcSequence& q, int32_t* head, int32_t* next, int64_t classes) {
  const int64_t tid = threadIdx.x, bd = blockDim.x, states = q.states;
  for (int64_t a = tid; a < classes; a += bd) head[a] = -1;
  __syncthreads();
  for (int64_t s = tid; s < states; s += bd) {
    const int32_t ls = q.lab(s);
    bool first = true;
    for (int64_t s2 = s - 2; s2 >= 0 && first; s2 -= 2) first = q.lab(s2) != ls;  // same class: same parity
    if (first) head[ls] = static_cast<int32_t>(s);
    int32_t nx = -1;
    for (int64_t s2 = s + 2; s2 < states; s2 += 2)
      if (q.lab(s2) == ls) {
        nx = static_cast<int32_t>(s2);
        break;
      }
    next[s] = nx;
  }
  __syncthreads();
}

// grad[t, n, a] = softmax - occupancy for t < T_n (0 beyond): one thread per element, its
// occupancy summed over the class's states in list order.
__device__ __forceinline__ void write_gradient(const CtcSequence& q, const int32_t* head, const int32_t* next,
                                               float logp, float* grad, const ref::CtcDims& d, int64_t n) {
  const int64_t tid = threadIdx.x, bd = blockDim.x, states = q.states;
  for (int64_t i = tid; i < d.t * d.a; i += bd) {
    const int64_t t = i / d.a;
    const int32_t a = static_cast<int32_t>(i % d.a);
    float g = 0.f;
    if (t < q.tn) {
      const float lpa = q.lp(t, a);
      float occ = 0.f;
      for (int32_t s = head[a]; s >= 0; s = next[s]) {
        const float v = q.alpha[t * states + s] + q.beta[t * states + s];
        if (v != -INFINITY) occ += expf(v - lpa - logp);
      }
      g = expf(lpa) - occ;
    }
    grad[t * q.row_stride + n * d.a + a] = g;
  }
}

// One block per sequence n (ref::ctc_loss's arithmetic in float). Every sum has a fixed order:
// each log-softmax normalizer is one thread's loop over the classes; alpha[t, s] and beta[t, s] are
// one thread's log-add of at most three neighbours of the previous row (rows separated by
// barriers); each gradient element is one thread's loop over the states of its class in ascending
// order (a linked list built per sequence: head[class], next[state]). No atomics, no work shared
// between blocks: deterministic, and the same on any GPU.
__global__ void __launch_bounds__(kCtcThreads)
    ctc_kernel(const float* __restrict__ logits, const int32_t* __restrict__ labels,
               const int32_t* __restrict__ label_len, const int32_t* __restrict__ input_len, float* __restrict__ cost,
               float* __restrict__ grad, CtcLayout ws, ref::CtcDims d) {
  const int64_t n = blockIdx.x, tid = threadIdx.x, row_stride = d.n * d.a;
  __shared__ int s_valid;
  __shared__ float s_logp;
  if (tid == 0) s_valid = sample_valid(labels, label_len, input_len, d, n);
  __syncthreads();
  if (!s_valid) {
    if (tid == 0) cost[n] = NAN;
    if (grad) fill_grad_rows(grad, d, n, row_stride, NAN);
    return;
  }
  CtcSequence q;
  q.lg = logits + n * d.a;
  q.lab_n = labels + n * d.s;
  q.lse = ws.lse + n * d.t;
  q.alpha = ws.alpha + n * d.t * (2 * d.s + 1);
  q.beta = ws.beta + n * d.t * (2 * d.s + 1);
  q.row_stride = row_stride;
  q.tn = input_len[n];
  q.states = 2 * int64_t(label_len[n]) + 1;

  log_softmax_normalizers(q, d.a);
  alpha_recursion(q);
  if (tid == 0) {
    const float logp = sequence_log_likelihood(q);
    s_logp = logp;
    cost[n] = logp == -INFINITY ? INFINITY : -logp;
  }
  __syncthreads();
  if (!grad) return;
  const float logp = s_logp;
  if (logp == -INFINITY) {  // no alignment fits: zero gradient
    fill_grad_rows(grad, d, n, row_stride, 0.f);
    return;
  }
  beta_recursion(q);
  int32_t* head = ws.head + n * d.a;
  int32_t* next = ws.next + n * (2 * d.s + 1);
  class_state_lists(q, head, next, d.a);
  write_gradient(q, head, next, logp, grad, d, n);
}

// ---- staging around cuDNN: one thread per sample, per (time, sample) or per element; every sum
// is one thread's loop in a fixed order ------------------------------------------------------

// Status per sample (kernels/detail/ctc_cuda.h): 0 cuDNN's, 1 invalid, 2 more labels than frames,
// 3 an empty label. Samples 1..3 hand cuDNN a stand-in (one label 1 over all T frames).
__global__ void ctc_stage_lengths_kernel(const int32_t* __restrict__ labels, const int32_t* __restrict__ label_len,
                                         const int32_t* __restrict__ input_len, int32_t* __restrict__ len_clean,
                                         int32_t* __restrict__ in_clean, int32_t* __restrict__ status,
                                         ref::CtcDims d) {
  for (int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; n < d.n; n += int64_t(gridDim.x) * blockDim.x) {
    const bool valid = sample_valid(labels, label_len, input_len, d, n);
    const int32_t st = !valid ? 1 : (label_len[n] > input_len[n] ? 2 : (label_len[n] == 0 ? 3 : 0));
    status[n] = st;
    len_clean[n] = st == 0 ? label_len[n] : 1;
    in_clean[n] = st == 0 ? input_len[n] : static_cast<int32_t>(d.t);
  }
}

__global__ void ctc_stage_labels_kernel(const int32_t* __restrict__ labels, const int32_t* __restrict__ status,
                                        const int32_t* __restrict__ len_clean, const int32_t* __restrict__ offsets,
                                        int32_t* __restrict__ flat, ref::CtcDims d) {
  const int64_t total = d.n * d.s;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / d.s, j = i % d.s;
    if (j < len_clean[n]) flat[offsets[n] + j] = status[n] == 0 ? labels[i] : 1;
  }
  // A stand-in when S == 0 has no (n, j) slot above: write its single label here.
  if (d.s == 0)
    for (int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; n < d.n; n += int64_t(gridDim.x) * blockDim.x)
      if (len_clean[n] == 1) flat[offsets[n]] = 1;
}

// Empty labels, part 1: the log-softmax normalizer of every frame t < T_n of such a sample, one
// thread per (t, n) looping over the classes in order (ctc_kernel's arithmetic).
__global__ void ctc_empty_lse_kernel(const float* __restrict__ logits, const int32_t* __restrict__ status,
                                     const int32_t* __restrict__ input_len, float* __restrict__ lse, ref::CtcDims d) {
  const int64_t total = d.t * d.n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i % d.n, t = i / d.n;
    if (status[n] != 3 || t >= input_len[n]) continue;
    const float* row = logits + i * d.a;
    float m = row[0];
    for (int64_t a = 1; a < d.a; ++a) m = fmaxf(m, row[a]);
    float s = 0.f;
    for (int64_t a = 0; a < d.a; ++a) s += expf(row[a] - m);
    lse[i] = m + logf(s);
  }
}

// Gradient rows, one thread per element: status 1 NaN; status 2 and frames t >= T_n zero (cuDNN may
// leave those rows untouched); status 3 softmax - onehot(blank) for t < T_n (the only alignment of
// an empty label is all blanks, so its occupancy is 1 at the blank).
__global__ void ctc_cudnn_finish_grad_kernel(const float* __restrict__ logits, const int32_t* __restrict__ status,
                                             const int32_t* __restrict__ input_len, const float* __restrict__ lse,
                                             float* __restrict__ grad, ref::CtcDims d) {
  const int64_t total = d.t * d.n * d.a;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t a = i % d.a, tn = i / d.a, n = tn % d.n, t = tn / d.n;
    const int32_t st = status[n];
    if (st == 1)
      grad[i] = NAN;
    else if (st == 2 || t >= input_len[n])
      grad[i] = 0.f;
    else if (st == 3)
      grad[i] = expf(logits[i] - lse[tn]) - (a == 0 ? 1.f : 0.f);
  }
}

// Costs, one thread per sample: status 1 NaN, 2 +inf, 3 -sum_t log softmax[t, blank] added in
// ascending t; status 0 keeps cuDNN's.
__global__ void ctc_cudnn_finish_cost_kernel(const float* __restrict__ logits, const int32_t* __restrict__ status,
                                             const int32_t* __restrict__ input_len, const float* __restrict__ lse,
                                             float* __restrict__ cost, ref::CtcDims d) {
  for (int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; n < d.n; n += int64_t(gridDim.x) * blockDim.x) {
    const int32_t st = status[n];
    if (st == 1) cost[n] = NAN;
    if (st == 2) cost[n] = INFINITY;
    if (st != 3) continue;
    float c = 0.f;
    for (int64_t t = 0; t < input_len[n]; ++t) c += lse[t * d.n + n] - logits[(t * d.n + n) * d.a];
    cost[n] = c;
  }
}

__global__ void ctc_scale_grad_kernel(const float* __restrict__ grad, const float* __restrict__ dcost,
                                      float* __restrict__ out, ref::CtcDims d) {
  const int64_t total = d.t * d.n * d.a;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = dcost[(i / d.a) % d.n] * grad[i];
}

struct StageLayout {
  CtcCudnnStage stage;
  int32_t* offsets;
  void* scan_temp;
  std::size_t scan_bytes, bytes;
};

StageLayout stage_layout(void* base, const ref::CtcDims& d) {
  StageLayout l;
  DITTO_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, l.scan_bytes, static_cast<const int32_t*>(nullptr),
                                                 static_cast<int32_t*>(nullptr), d.n));
  WorkspaceCarve carve{static_cast<char*>(base)};
  // Each sample has at most max(S, 1) labels (a stand-in has one).
  l.stage.flat_labels = carve.take<int32_t>(d.n * (d.s > 1 ? d.s : 1));
  l.stage.label_len = carve.take<int32_t>(d.n);
  l.stage.input_len = carve.take<int32_t>(d.n);
  l.stage.status = carve.take<int32_t>(d.n);
  l.offsets = carve.take<int32_t>(d.n);
  l.stage.lse = carve.take<float>(d.t * d.n);
  l.scan_temp = carve.take<char>(static_cast<int64_t>(l.scan_bytes));
  l.bytes = carve.bytes;
  return l;
}

}  // namespace

std::size_t ctc_workspace(const ref::CtcDims& d) { return ctc_layout(nullptr, d).bytes; }

void ctc_ditto(Context& ctx, const float* logits, const int32_t* labels, const int32_t* label_len,
               const int32_t* input_len, float* cost, float* grad, void* workspace, const ref::CtcDims& d) {
  if (d.n == 0) return;
  ctc_kernel<<<static_cast<unsigned>(d.n), kCtcThreads, 0, detail::stream_of(ctx)>>>(
      logits, labels, label_len, input_len, cost, grad, ctc_layout(workspace, d), d);
  DITTO_CHECK_LAUNCH(ctx);
}

std::size_t ctc_cudnn_stage_workspace(const ref::CtcDims& d) { return stage_layout(nullptr, d).bytes; }

CtcCudnnStage ctc_cudnn_stage(Context& ctx, const int32_t* labels, const int32_t* label_len, const int32_t* input_len,
                              void* workspace, const ref::CtcDims& d) {
  const StageLayout l = stage_layout(workspace, d);
  if (d.n == 0) return l.stage;
  cudaStream_t st = detail::stream_of(ctx);
  ctc_stage_lengths_kernel<<<blocks_for(d.n), kThreads, 0, st>>>(labels, label_len, input_len, l.stage.label_len,
                                                                  l.stage.input_len, l.stage.status, d);
  DITTO_CHECK_LAUNCH(ctx);
  std::size_t scan_bytes = l.scan_bytes;
  DITTO_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(l.scan_temp, scan_bytes, l.stage.label_len, l.offsets, d.n, st));
  ctc_stage_labels_kernel<<<blocks_for(d.n * (d.s > 1 ? d.s : 1)), kThreads, 0, st>>>(
      labels, l.stage.status, l.stage.label_len, l.offsets, l.stage.flat_labels, d);
  DITTO_CHECK_LAUNCH(ctx);
  return l.stage;
}

void ctc_cudnn_finish(Context& ctx, const CtcCudnnStage& stage, const float* logits, const int32_t* input_len,
                      float* cost, float* grad, const ref::CtcDims& d) {
  if (d.n == 0) return;
  cudaStream_t st = detail::stream_of(ctx);
  if (d.t > 0) {
    ctc_empty_lse_kernel<<<blocks_for(d.t * d.n), kThreads, 0, st>>>(logits, stage.status, input_len, stage.lse, d);
    DITTO_CHECK_LAUNCH(ctx);
  }
  if (grad && d.t * d.a > 0) {
    ctc_cudnn_finish_grad_kernel<<<blocks_for(d.t * d.n * d.a), kThreads, 0, st>>>(logits, stage.status, input_len,
                                                                                     stage.lse, grad, d);
    DITTO_CHECK_LAUNCH(ctx);
  }
  ctc_cudnn_finish_cost_kernel<<<blocks_for(d.n), kThreads, 0, st>>>(logits, stage.status, input_len, stage.lse, cost,
                                                                     d);
  DITTO_CHECK_LAUNCH(ctx);
}

void ctc_scale_grad(Context& ctx, const float* grad, const float* dcost, float* out, const ref::CtcDims& d) {
  const int64_t total = d.t * d.n * d.a;
  if (total == 0) return;
  ctc_scale_grad_kernel<<<blocks_for(total), kThreads, 0, detail::stream_of(ctx)>>>(grad, dcost, out, d);
  DITTO_CHECK_LAUNCH(ctx);
}

}  // namespace ditto::cuda
