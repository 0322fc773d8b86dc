// Internal: the NCCL calls of engine/collective.cpp. nccl.h stays in engine/collective_nccl.cpp
// (communicators are opaque here); a build without NCCL compiles the same functions to throw
// Error saying so.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
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
// A fresh ncclUniqueId as its raw bytes (what rank 0 writes into the rendezvous folder).
std::string nccl_unique_id();
// This process's communicator of a group spread over processes (rank of world, on `device`), from
// the id rank 0 made, with algo / proto / channels as for nccl_make_comms. Blocks until every rank
// has joined.
void* nccl_make_rank_comm(int device, int world, int rank, const std::string& id, const std::string& algo,
                          const std::string& proto, int channels);
// Byte moves on comm, queued on stream: recv gets every rank's `bytes` in rank order; chunk q of
// send (chunk bytes each) goes to rank q and chunk q of recv comes from it; root's buf to all.
void nccl_all_gather_bytes(void* comm, const void* send, void* recv, std::size_t bytes, cudaStream_t stream);
void nccl_all_to_all_bytes(void* comm, int world, const void* send, void* recv, std::size_t chunk,
                           cudaStream_t stream);
void nccl_broadcast_bytes(void* comm, void* buf, std::size_t bytes, int root, cudaStream_t stream);
// In-place sum of n floats, queued on stream.
void nccl_all_reduce_sum(void* comm, float* buf, int64_t n, cudaStream_t stream);
void nccl_destroy(void* comm) noexcept;
void nccl_abort(void* comm) noexcept;

}  // namespace ditto::detail
