// CUDA kernels of tensor digests and bit distances (engine/digest.h).
//
// digest_sums_kernel: each thread adds the terms of its words (ref::digest_add_word) into two
// 64-bit lane sums, a block reduces them in shared memory, and one thread per block adds the
// block's sums into the slot with atomicAdd. Integer addition modulo 2^64 is associative and
// exact, so the atomics cannot change the result: the digest is deterministic.
//
// distance_kernel: one partial row per block (fixed grid for a given element count), added on
// the host in block order: deterministic, no atomics.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "engine/detail/cuda_check.h"
#include "engine/detail/digest_cuda.h"
#include "engine/detail/launch.cuh"
#include "engine/digest_ref.h"

namespace ditto::cuda {
namespace {

constexpr int kDigestThreads = 256;
constexpr unsigned kMaxDigestBlocks = 1024;

__global__ void digest_sums_kernel(const uint32_t* words, uint64_t n_words, const unsigned char* tail, int tail_bytes,
                                   unsigned long long* slot) {
  ref::DigestSums s;
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  const uint64_t t = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  // Four words per load where the words come in whole 16-byte groups (pool memory is aligned).
  const uint64_t quads = n_words / 4;
  const uint4* q = reinterpret_cast<const uint4*>(words);
  for (uint64_t k = t; k < quads; k += stride) {
    const uint4 v = q[k];
    ref::digest_add_word(s, 4 * k, v.x);
    ref::digest_add_word(s, 4 * k + 1, v.y);
    ref::digest_add_word(s, 4 * k + 2, v.z);
    ref::digest_add_word(s, 4 * k + 3, v.w);
  }
  for (uint64_t i = 4 * quads + t; i < n_words; i += stride) ref::digest_add_word(s, i, words[i]);
  if (t == 0 && tail_bytes) {
    uint32_t w = 0;
    for (int k = 0; k < tail_bytes; ++k) w |= uint32_t(tail[k]) << (8 * k);
    ref::digest_add_word(s, n_words, w);
  }
  __shared__ uint64_t sa[kDigestThreads], sb[kDigestThreads];
  sa[threadIdx.x] = s.a;
  sb[threadIdx.x] = s.b;
  __syncthreads();
  for (int half = kDigestThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      sa[threadIdx.x] += sa[threadIdx.x + half];
      sb[threadIdx.x] += sb[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    atomicAdd(&slot[0], static_cast<unsigned long long>(sa[0]));
    atomicAdd(&slot[1], static_cast<unsigned long long>(sb[0]));
  }
}

constexpr int kDistanceThreads = 256;

__device__ void load_pair(const void* a, const void* b, DType t, int64_t i, uint32_t& ba, uint32_t& bb, double& va,
                          double& vb) {
  if (t == DType::F32 || t == DType::I32) {
    ba = static_cast<const uint32_t*>(a)[i];
    bb = static_cast<const uint32_t*>(b)[i];
    if (t == DType::F32) {
      va = __uint_as_float(ba);
      vb = __uint_as_float(bb);
    } else {
      va = int32_t(ba);
      vb = int32_t(bb);
    }
    return;
  }
  ba = static_cast<const uint16_t*>(a)[i];
  bb = static_cast<const uint16_t*>(b)[i];
  if (t == DType::BF16) {
    va = __bfloat162float(__ushort_as_bfloat16(uint16_t(ba)));
    vb = __bfloat162float(__ushort_as_bfloat16(uint16_t(bb)));
  } else {
    va = __half2float(__ushort_as_half(uint16_t(ba)));
    vb = __half2float(__ushort_as_half(uint16_t(bb)));
  }
}

__global__ void distance_kernel(const void* a, const void* b, DType t, int64_t n, double* partials) {
  double differing = 0, sum_sq = 0, max_abs = 0, norm_sq = 0;
  uint64_t max_ulp = 0;
  const uint32_t sign = (t == DType::F32 || t == DType::I32) ? 0x80000000u : 0x8000u;
  DITTO_GRID_STRIDE(i, n) {
    uint32_t ba, bb;
    double va, vb;
    load_pair(a, b, t, i, ba, bb, va, vb);
    norm_sq += va * va;
    if (ba == bb) continue;
    differing += 1;
    uint64_t ulp;
    if (t == DType::I32) {
      ulp = uint64_t(va > vb ? int64_t(va) - int64_t(vb) : int64_t(vb) - int64_t(va));
    } else if (isnan(va) || isnan(vb)) {
      ulp = ~0ULL;
    } else {
      const int64_t ia = ref::ordered_bits(ba, sign), ib = ref::ordered_bits(bb, sign);
      ulp = uint64_t(ia > ib ? ia - ib : ib - ia);
    }
    max_ulp = ulp > max_ulp ? ulp : max_ulp;
    const double d = va - vb;
    sum_sq += d * d;
    max_abs = fabs(d) > max_abs ? fabs(d) : max_abs;
  }
  __shared__ double sd[kDistanceThreads], ss[kDistanceThreads], sm[kDistanceThreads], sn[kDistanceThreads];
  __shared__ uint64_t su[kDistanceThreads];
  sd[threadIdx.x] = differing;
  ss[threadIdx.x] = sum_sq;
  sm[threadIdx.x] = max_abs;
  sn[threadIdx.x] = norm_sq;
  su[threadIdx.x] = max_ulp;
  __syncthreads();
  for (int half = kDistanceThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      const int o = threadIdx.x + half;
      sd[threadIdx.x] += sd[o];
      ss[threadIdx.x] += ss[o];
      sn[threadIdx.x] += sn[o];
      sm[threadIdx.x] = sm[o] > sm[threadIdx.x] ? sm[o] : sm[threadIdx.x];
      su[threadIdx.x] = su[o] > su[threadIdx.x] ? su[o] : su[threadIdx.x];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    double* row = partials + std::size_t(blockIdx.x) * kDistanceFields;
    row[0] = sd[0];
    row[1] = __longlong_as_double(static_cast<long long>(su[0]));
    row[2] = ss[0];
    row[3] = sm[0];
    row[4] = sn[0];
  }
}

}  // namespace

void digest_sums(const void* bytes, std::size_t n, unsigned long long* slot, cudaStream_t stream) {
  const uint64_t n_words = n / 4;
  const int tail = static_cast<int>(n % 4);
  uint64_t blocks = (n_words / 4 + kDigestThreads - 1) / kDigestThreads;
  blocks = blocks < 1 ? 1 : (blocks > kMaxDigestBlocks ? kMaxDigestBlocks : blocks);
  const auto* base = static_cast<const unsigned char*>(bytes);
  digest_sums_kernel<<<static_cast<unsigned>(blocks), kDigestThreads, 0, stream>>>(
      static_cast<const uint32_t*>(bytes), n_words, base + 4 * n_words, tail, slot);
  DITTO_CUDA_CHECK(cudaGetLastError());
}

unsigned distance_blocks(int64_t n) {
  const int64_t b = (n + 8 * kDistanceThreads - 1) / (8 * kDistanceThreads);
  return static_cast<unsigned>(b < 1 ? 1 : (b > 512 ? 512 : b));
}

void distance_partials(const void* a, const void* b, DType dtype, int64_t n, double* partials, cudaStream_t stream) {
  distance_kernel<<<distance_blocks(n), kDistanceThreads, 0, stream>>>(a, b, dtype, n, partials);
  DITTO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ditto::cuda
