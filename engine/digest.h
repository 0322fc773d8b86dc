// Tensor digests and bit distances computed where the tensor lives. What the noise lab's traces
// record per tensor: a traced GPU step moves 16 bytes per tensor to the host instead of the
// tensor, and two runs' tensors are compared on the device.
//
// A digest is 128 bits like a Fingerprint (engine/fingerprint.h) but a different function of the
// bytes, so a digest is only ever compared with another digest: two 64-bit sums over the tensor's
// 32-bit words of bijective mixes of (word index, word) (engine/digest_ref.h says why any change
// to a single word is always detected and two-word changes cancel with probability ~2^-128), then
// XXH3-128 over the sums, the dtype, the shape and the byte count. Sums modulo 2^64 do not depend
// on the order of adding, so the GPU kernel adds with atomics and is still deterministic, and a
// CPU and a GPU digest of the same bytes are equal. Like the fingerprint it detects differences
// and mistakes, not a forger: checkpoints and manifests keep XXH3 over the bytes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "engine/fingerprint.h"
#include "engine/tensor.h"

namespace ditto {

// Names the digest function in trace files, so traces made with another one are refused.
inline constexpr const char* kDigestName = "ditto-digest-sum128-v1";

// The digest of t (waits for the stream that produced a CUDA tensor). An undefined tensor's is
// Fingerprint{}.
Fingerprint digest(const Tensor& t);

// Digests queued on the streams that produced their tensors and collected once: a traced step
// adds every tensor it is shown and takes the digests at its end, with one wait.
class DigestQueue {
 public:
  DigestQueue();
  ~DigestQueue();
  DigestQueue(const DigestQueue&) = delete;
  DigestQueue& operator=(const DigestQueue&) = delete;

  // Queues t's digest (computed at once for a CPU tensor); returns its index in take()'s result.
  // The tensor may be freed or overwritten afterwards by work queued later on its stream.
  std::size_t add(const Tensor& t);
  // Waits for every queued digest and returns them in the order added; the queue is empty after.
  std::vector<Fingerprint> take();
  std::size_t size() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A copy of t made in stream order on the stream that produced it, from the same memory (the
// producing context's pool, or host memory): kept after the original is freed or overwritten.
Tensor snapshot(const Tensor& t);

// How far apart two tensors of one shape and dtype are, element by element.
struct BitDistance {
  int64_t numel = 0;
  int64_t differing = 0;  // elements whose bits differ
  uint64_t max_ulp = 0;   // in the tensors' own format (f32, bf16, f16; i32: |a - b|); NaN: UINT64_MAX
  double l2 = 0;          // sqrt(sum (a - b)^2) over the elements as doubles
  double max_abs = 0;     // largest |a - b|
  double norm = 0;        // sqrt(sum a^2): l2 / norm is the relative distance
};

// Distances of pairs (a, b) of tensors on one device: all on the CPU, or all on one GPU (each
// tensor's producing stream is waited for). Shapes and dtypes must match per pair (ShapeError).
// Deterministic: per-block partial sums on the GPU added in a fixed order on the host, a grid
// that depends only on the element count; the CPU adds in index order, so a GPU's l2/norm may
// differ from the CPU's in the last bits while counts and ULPs are equal.
std::vector<BitDistance> bit_distances(const std::vector<std::pair<const Tensor*, const Tensor*>>& pairs);
BitDistance bit_distance(const Tensor& a, const Tensor& b);

}  // namespace ditto
