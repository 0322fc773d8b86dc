// Internal: the NCCL calls of engine/collective.cpp. nccl.h stays in engine/collective_nccl.cpp
// (communicators are opaque here); a build without NCCL compiles the same functions to throw
// Error saying so.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ditto::detail {

bool nccl_built();
// The NCCL loaded at run time, "2.28.9".
std::string nccl_runtime_version();
// NCCL_NVLS_ENABLE unset: set to 0 (before NCCL reads it); set to anything but 0: Error. Any of
// NCCL_ALGO, NCCL_PROTO, NCCL_{MIN,MAX}_{NCHANNELS,CTAS} set: Error (ditto pins them per bucket).
void nccl_check_environment();
// One communicator per device (rank k on devices[k]) made together from the calling thread,
// with NCCL_ALGO / NCCL_PROTO set to algo / proto while NCCL builds its tuning model ("" leaves
// NCCL's choice) and, when channels > 0, ncclConfig_t minCTAs = maxCTAs = channels. Process-wide
// serialized (the environment is the process's).
std::vector<void*> nccl_make_comms(const std::vector<int>& devices, const std::string& algo, const std::string& proto,
                                   int channels);
// In-place sum of n floats, queued on stream.
void nccl_all_reduce_sum(void* comm, float* buf, int64_t n, cudaStream_t stream);
void nccl_destroy(void* comm) noexcept;
void nccl_abort(void* comm) noexcept;

}  // namespace ditto::detail
