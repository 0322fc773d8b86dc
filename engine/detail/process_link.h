// Internal: how the ranks of a RankGroup that spans processes reach each other
// (engine/collective.h, ProcessRank). Each process holds one rank. Every call is made by every
// rank in the same order, as for the in-process group.
//
//   files  CPU ranks. Each meeting is numbered; at meeting s rank r writes its offer as the file
//          x<s>.r<r> in the rendezvous folder (write, then rename: a reader never sees half a
//          file) and waits until every rank's file of meeting s is there, reading the ones it
//          needs. Seeing them all proves every rank finished meeting s-1, so r then removes its
//          own file of s-1: at most two meetings' files exist at once. A rank that stops writes
//          failed.r<r> with its reason; the others raise it at their next wait. A wait that
//          outlasts the timeout is an Error naming the file and the rank it waits for.
//   nccl   CUDA ranks. Rank 0 writes each communicator's ncclUniqueId as nccl-<name>.id (write,
//          then rename), the others read it, and everyone joins with ncclCommInitRankConfig. The
//          byte moves are ncclAllGather, ncclSend / ncclRecv and ncclBroadcast on a communicator
//          of NCCL's defaults (moving bytes, NCCL's choices cannot change a bit); the pinned
//          nccl-* all-reduces run on communicators of their own.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/collective.h"

namespace ditto::detail {

class ProcessLink {
 public:
  virtual ~ProcessLink() = default;
  // The communicators (nccl) or the refusal of nccl-* configurations (files).
  virtual void prepare(const std::vector<AllReduceConfig>& configs) = 0;
  virtual void all_gather(Context& ctx, const void* send, std::size_t bytes, void* recv) = 0;
  virtual void all_to_all(Context& ctx, const void* send, std::size_t chunk, void* recv) = 0;
  virtual void broadcast(Context& ctx, void* buf, std::size_t bytes, int root) = 0;
  virtual void all_reduce_nccl(Context& ctx, float* buf, int64_t n, const AllReduceConfig& config) = 0;
  virtual void barrier() = 0;
  // This rank stops: tell the others (best effort).
  virtual void fail(const std::string& why) noexcept = 0;
  // The last call of a rank that finished: rank 0 waits until every rank has left, so whoever
  // removes the rendezvous folder after it removes nothing a rank still reads.
  virtual void leave() noexcept = 0;
  virtual std::string nccl_version() const { return ""; }
};

std::unique_ptr<ProcessLink> make_file_link(const ProcessRank& me);
std::unique_ptr<ProcessLink> make_nccl_link(const ProcessRank& me, int device);

// Rendezvous files: `bytes` written to dir/name through a temporary and a rename; and the bytes
// of dir/name once it exists, waiting up to timeout_s (Error naming the file and what it is
// for), or Error as soon as a failed.r* file appears beside it.
void write_rendezvous_file(const std::string& dir, const std::string& name, const std::string& bytes);
std::string wait_rendezvous_file(const std::string& dir, const std::string& name, double timeout_s,
                                 const std::string& what);

}  // namespace ditto::detail
