#include "engine/digest.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "engine/detail/capture_gate.h"
#include "engine/detail/cuda_state.h"
#include "engine/detail/digest_cuda.h"
#include "engine/detail/half_bits.h"
#include "engine/digest_ref.h"
#include "engine/error.h"

namespace ditto {
namespace {

// The digest proper: the lane sums folded with everything that tells two tensors apart besides
// their bytes.
Fingerprint fold(const std::string& type_tag, const Shape& shape, std::size_t nbytes, const ref::DigestSums& s) {
  Hasher h;
  h.add(std::string(kDigestName)).add(type_tag);
  h.sized(shape.data(), shape.size() * sizeof(int64_t)).add(uint64_t(nbytes)).add(s.a).add(s.b);
  return h.digest();
}

Fingerprint digest_host(const Tensor& t) {
  return fold(t.type_tag(), t.shape(), t.nbytes(), ref::digest_sums(static_cast<const unsigned char*>(t.raw()), t.nbytes()));
}

// Slots of lane sums on the device, 4096 (64 KiB) per chunk; chunks are kept and reused.
constexpr std::size_t kChunkSlots = 4096;

}  // namespace

struct DigestQueue::Impl {
  struct Item {
    Fingerprint value;  // CPU tensors and undefined ones: known at add
    bool on_device = false;
    std::size_t slot = 0;
    std::string type_tag;
    Shape shape;
    std::size_t nbytes = 0;
  };
  std::vector<Item> items;
  // Device memory, 2 * kChunkSlots each, zero between uses. A new chunk is zeroed on the stream of
  // the tensor that needed it (fresh_on) and is safe there at once; a tensor on another stream
  // waits for that zeroing first. take() zeroes every chunk again and waits, so reused chunks are
  // zero on every stream.
  struct Chunk {
    unsigned long long* ptr = nullptr;
    cudaStream_t fresh_on = nullptr;
  };
  std::vector<Chunk> chunks;
  int device = -1;
  std::size_t used = 0;                                     // slots in use
  std::vector<std::shared_ptr<detail::CudaState>> streams;  // to wait for at take()

  unsigned long long* slot_for(std::size_t slot, cudaStream_t stream) {
    while (chunks.size() <= slot / kChunkSlots) {
      void* p = nullptr;
      {
        detail::DeviceSyncScope sync(device);
        DITTO_CUDA_CHECK(cudaMalloc(&p, 2 * kChunkSlots * sizeof(unsigned long long)));
      }
      chunks.push_back({static_cast<unsigned long long*>(p), stream});
      // Not cudaMemset: it runs on the legacy default stream, which ditto's non-blocking streams
      // do not wait for, so a digest could add into the chunk before (or while) it is zeroed.
      DITTO_CUDA_CHECK(cudaMemsetAsync(p, 0, 2 * kChunkSlots * sizeof(unsigned long long), stream));
    }
    Chunk& c = chunks[slot / kChunkSlots];
    if (c.fresh_on && c.fresh_on != stream) {
      DITTO_CUDA_CHECK(cudaStreamSynchronize(c.fresh_on));
      c.fresh_on = nullptr;
    }
    return c.ptr + 2 * (slot % kChunkSlots);
  }

  ~Impl() {
    if (chunks.empty()) return;
    detail::DeviceSyncScope sync(device);  // cudaFree synchronizes the device
    for (const auto& c : chunks) DITTO_CUDA_CHECK_PRINT(cudaFree(c.ptr));
  }
};

DigestQueue::DigestQueue() : impl_(std::make_unique<Impl>()) {}
DigestQueue::~DigestQueue() = default;
std::size_t DigestQueue::size() const { return impl_->items.size(); }

std::size_t DigestQueue::add(const Tensor& t) {
  Impl& q = *impl_;
  Impl::Item item;
  if (!t.defined()) {
    q.items.push_back(item);
    return q.items.size() - 1;
  }
  const auto& st = detail::storage_of(t);
  if (!st->cuda) {
    item.value = digest_host(t);
    q.items.push_back(std::move(item));
    return q.items.size() - 1;
  }
  if (q.device >= 0 && q.device != st->cuda->device)
    throw Error(fmt::format("DigestQueue: a tensor on cuda:{} after tensors on cuda:{}; one queue serves one GPU",
                            st->cuda->device, q.device));
  q.device = st->cuda->device;
  DITTO_CUDA_CHECK(cudaSetDevice(q.device));
  item.on_device = true;
  item.slot = q.used++;
  item.type_tag = t.type_tag();
  item.shape = t.shape();
  item.nbytes = t.nbytes();
  unsigned long long* slot = q.slot_for(item.slot, st->cuda->stream);
  if (item.nbytes) cuda::digest_sums(st->ptr, item.nbytes, slot, st->cuda->stream);
  if (std::find(q.streams.begin(), q.streams.end(), st->cuda) == q.streams.end()) q.streams.push_back(st->cuda);
  q.items.push_back(std::move(item));
  return q.items.size() - 1;
}

std::vector<Fingerprint> DigestQueue::take() {
  Impl& q = *impl_;
  std::vector<unsigned long long> sums;
  if (q.used) {
    DITTO_CUDA_CHECK(cudaSetDevice(q.device));
    for (const auto& s : q.streams) DITTO_CUDA_CHECK(cudaStreamSynchronize(s->stream));
    // On one of the streams the digests ran on (the legacy default stream would also wait for
    // another thread's run).
    const cudaStream_t stream = q.streams.front()->stream;
    sums.resize(2 * q.used);
    for (std::size_t c = 0; c * kChunkSlots < q.used; ++c) {
      const std::size_t n = std::min(kChunkSlots, q.used - c * kChunkSlots);
      DITTO_CUDA_CHECK(cudaMemcpyAsync(sums.data() + 2 * c * kChunkSlots, q.chunks[c].ptr,
                                       2 * n * sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream));
      DITTO_CUDA_CHECK(cudaMemsetAsync(q.chunks[c].ptr, 0, 2 * n * sizeof(unsigned long long), stream));
    }
    DITTO_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (auto& c : q.chunks) c.fresh_on = nullptr;
  }
  std::vector<Fingerprint> out;
  out.reserve(q.items.size());
  for (const auto& item : q.items) {
    if (!item.on_device) {
      out.push_back(item.value);
      continue;
    }
    const ref::DigestSums s{sums[2 * item.slot], sums[2 * item.slot + 1]};
    out.push_back(fold(item.type_tag, item.shape, item.nbytes, s));
  }
  q.items.clear();
  q.used = 0;
  q.streams.clear();
  return out;
}

Fingerprint digest(const Tensor& t) {
  DigestQueue q;
  q.add(t);
  return q.take().front();
}

Tensor snapshot(const Tensor& t) {
  if (!t.defined()) return {};
  const auto& src = detail::storage_of(t);
  auto st = std::make_shared<detail::Storage>();
  st->device = src->device;
  st->bytes = t.nbytes();
  if (src->cuda) {
    st->cuda = src->cuda;
    DITTO_CUDA_CHECK(cudaSetDevice(st->cuda->device));
    if (st->bytes) {
      st->ptr = st->cuda->alloc(st->bytes);
      DITTO_CUDA_CHECK(cudaMemcpyAsync(st->ptr, src->ptr, st->bytes, cudaMemcpyDeviceToDevice, st->cuda->stream));
    }
  } else if (st->bytes) {
    st->ptr = std::aligned_alloc(64, (st->bytes + 63) / 64 * 64);
    if (!st->ptr) throw Error(fmt::format("out of host memory: {} bytes for a snapshot", st->bytes));
    std::memcpy(st->ptr, src->ptr, st->bytes);
  }
  return Tensor(std::move(st), t.shape(), t.dtype(), t.layout());
}

namespace {

void check_pair(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) throw ShapeError("bit_distance of an undefined tensor");
  if (a.shape() != b.shape() || a.dtype() != b.dtype() || a.layout() != b.layout())
    throw ShapeError(fmt::format("bit_distance of {} {} and {} {}", a.type_tag(), shape_str(a.shape()), b.type_tag(),
                                 shape_str(b.shape())));
  if (a.device() != b.device())
    throw Error(fmt::format("bit_distance of tensors on {} and {}", a.device().str(), b.device().str()));
}

uint32_t bits_at(const Tensor& t, int64_t i) {
  if (dtype_size(t.dtype()) == 4) {
    uint32_t w;
    std::memcpy(&w, static_cast<const unsigned char*>(t.raw()) + 4 * i, 4);
    return w;
  }
  uint16_t h;
  std::memcpy(&h, static_cast<const unsigned char*>(t.raw()) + 2 * i, 2);
  return h;
}

double value_of(DType dtype, uint32_t bits) {
  switch (dtype) {
    case DType::F32: {
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case DType::I32: return static_cast<int32_t>(bits);
    default: return detail::half_bits_to_float(dtype, static_cast<uint16_t>(bits));
  }
}

BitDistance distance_host(const Tensor& a, const Tensor& b) {
  BitDistance d;
  d.numel = a.numel();
  const uint32_t sign = dtype_size(a.dtype()) == 4 ? 0x80000000u : 0x8000u;
  double sum_sq = 0, norm_sq = 0;
  for (int64_t i = 0; i < d.numel; ++i) {
    const uint32_t ba = bits_at(a, i), bb = bits_at(b, i);
    const double va = value_of(a.dtype(), ba), vb = value_of(a.dtype(), bb);
    norm_sq += va * va;
    if (ba == bb) continue;
    ++d.differing;
    uint64_t ulp;
    if (a.dtype() == DType::I32) {
      ulp = static_cast<uint64_t>(std::llabs(static_cast<long long>(va) - static_cast<long long>(vb)));
    } else if (std::isnan(va) || std::isnan(vb)) {
      ulp = UINT64_MAX;
    } else {
      const int64_t ia = ref::ordered_bits(ba, sign), ib = ref::ordered_bits(bb, sign);
      ulp = static_cast<uint64_t>(ia > ib ? ia - ib : ib - ia);
    }
    d.max_ulp = std::max(d.max_ulp, ulp);
    sum_sq += (va - vb) * (va - vb);
    d.max_abs = std::max(d.max_abs, std::abs(va - vb));
  }
  d.l2 = std::sqrt(sum_sq);
  d.norm = std::sqrt(norm_sq);
  return d;
}

}  // namespace

std::vector<BitDistance> bit_distances(const std::vector<std::pair<const Tensor*, const Tensor*>>& pairs) {
  std::vector<BitDistance> out(pairs.size());
  if (pairs.empty()) return out;
  for (const auto& [a, b] : pairs) check_pair(*a, *b);
  const Device device = pairs.front().first->device();
  for (const auto& [a, b] : pairs)
    if (a->device() != device)
      throw Error(fmt::format("bit_distances of tensors on {} and {}; one call serves one device", device.str(),
                              a->device().str()));
  if (!device.is_cuda()) {
    for (std::size_t k = 0; k < pairs.size(); ++k) out[k] = distance_host(*pairs[k].first, *pairs[k].second);
    return out;
  }
  // Both runs' streams finish what made the tensors; then everything runs on the first one's.
  std::vector<std::shared_ptr<detail::CudaState>> states;
  for (const auto& [a, b] : pairs)
    for (const Tensor* t : {a, b}) {
      const auto& s = detail::storage_of(*t)->cuda;
      if (s && std::find(states.begin(), states.end(), s) == states.end()) states.push_back(s);
    }
  DITTO_CUDA_CHECK(cudaSetDevice(device.index));
  for (const auto& s : states) DITTO_CUDA_CHECK(cudaStreamSynchronize(s->stream));
  detail::CudaState& cs = *states.front();
  std::vector<std::size_t> first_row(pairs.size() + 1, 0);
  for (std::size_t k = 0; k < pairs.size(); ++k)
    first_row[k + 1] = first_row[k] + cuda::distance_blocks(pairs[k].first->numel());
  const std::size_t bytes = first_row.back() * cuda::kDistanceFields * sizeof(double);
  detail::Workspace partials(cs, bytes);
  if (!partials.ok()) throw Error(fmt::format("bit_distances: no device memory for {} bytes of partial sums", bytes));
  auto* rows = static_cast<double*>(partials.get());
  for (std::size_t k = 0; k < pairs.size(); ++k)
    if (pairs[k].first->numel())
      cuda::distance_partials(pairs[k].first->raw(), pairs[k].second->raw(), pairs[k].first->dtype(),
                              pairs[k].first->numel(), rows + first_row[k] * cuda::kDistanceFields, cs.stream);
  std::vector<double> host(first_row.back() * cuda::kDistanceFields);
  DITTO_CUDA_CHECK(cudaMemcpyAsync(host.data(), rows, bytes, cudaMemcpyDeviceToHost, cs.stream));
  DITTO_CUDA_CHECK(cudaStreamSynchronize(cs.stream));
  for (std::size_t k = 0; k < pairs.size(); ++k) {
    BitDistance& d = out[k];
    d.numel = pairs[k].first->numel();
    if (!d.numel) continue;
    double differing = 0, sum_sq = 0, norm_sq = 0;
    for (std::size_t r = first_row[k]; r < first_row[k + 1]; ++r) {
      const double* row = host.data() + r * cuda::kDistanceFields;
      uint64_t ulp;
      std::memcpy(&ulp, &row[1], sizeof ulp);
      differing += row[0];
      d.max_ulp = std::max(d.max_ulp, ulp);
      sum_sq += row[2];
      d.max_abs = std::max(d.max_abs, row[3]);
      norm_sq += row[4];
    }
    d.differing = static_cast<int64_t>(differing);
    d.l2 = std::sqrt(sum_sq);
    d.norm = std::sqrt(norm_sq);
  }
  return out;
}

BitDistance bit_distance(const Tensor& a, const Tensor& b) { return bit_distances({{&a, &b}}).front(); }

}  // namespace ditto
