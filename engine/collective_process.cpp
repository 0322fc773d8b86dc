// The transports of a RankGroup spread over processes (engine/detail/process_link.h).
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>
#include <unistd.h>

#include "engine/context.h"
#include "engine/detail/capture_gate.h"
#include "engine/detail/cuda_state.h"
#include "engine/detail/nccl.h"
#include "engine/detail/process_link.h"
#include "engine/error.h"

namespace ditto::detail {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

std::string read_whole(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw IoError(fmt::format("{}: cannot be read", p.string()));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The first failed.r* file in dir, and what it says; "" when there is none.
std::string failure_in(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("failed.r", 0) == 0) {
      std::string why;
      try {
        why = read_whole(e.path());
      } catch (const Error&) {
      }
      return fmt::format("rank {} failed: {}", name.substr(8), why.empty() ? "(no reason written)" : why);
    }
  }
  return "";
}

}  // namespace

void write_rendezvous_file(const std::string& dir, const std::string& name, const std::string& bytes) {
  const fs::path final_path = fs::path(dir) / name;
  const fs::path tmp = fs::path(dir) / fmt::format(".{}.{}.tmp", name, ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw IoError(fmt::format("{}: cannot be written (the rendezvous folder)", tmp.string()));
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) throw IoError(fmt::format("{}: writing {} bytes failed", tmp.string(), bytes.size()));
  }
  std::error_code ec;
  fs::rename(tmp, final_path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw IoError(fmt::format("{}: cannot be renamed into place: {}", final_path.string(), ec.message()));
  }
}

std::string wait_rendezvous_file(const std::string& dir, const std::string& name, double timeout_s,
                                 const std::string& what) {
  const fs::path p = fs::path(dir) / name;
  const auto start = Clock::now();
  auto pause = std::chrono::microseconds(50);
  auto next_failure_check = start;
  for (;;) {
    std::error_code ec;
    if (fs::exists(p, ec)) return read_whole(p);
    const auto now = Clock::now();
    if (now >= next_failure_check) {
      const std::string failed = failure_in(dir);
      // A rank writes its part before it can fail on what it reads, so a part that exists once
      // the failure is seen was written first: take it (the call then fails, or not, on its own
      // terms) rather than report a failure this rank never waited on.
      if (!failed.empty() && fs::exists(p, ec)) return read_whole(p);
      if (!failed.empty()) throw Error(fmt::format("stopped: {} (while waiting for {})", failed, what));
      next_failure_check = now + std::chrono::milliseconds(100);
    }
    const double waited = std::chrono::duration<double>(now - start).count();
    if (waited > timeout_s)
      throw Error(fmt::format("data parallel: waited {:.0f} s for {} ({} in the rendezvous folder {}); the rank that "
                              "writes it never got there (not started, stopped, or on a node that cannot see this "
                              "folder); --dp-timeout sets the wait",
                              waited, what, name, dir));
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(20000));
  }
}

namespace {

// ---- CPU ranks: files -----------------------------------------------------------------------

class FileLink : public ProcessLink {
 public:
  explicit FileLink(const ProcessRank& me) : me_(me) {}

  void prepare(const std::vector<AllReduceConfig>& configs) override {
    for (const auto& c : configs)
      if (c.nccl())
        throw Error(fmt::format("all-reduce {}: NCCL needs CUDA devices; ranks on the CPU are simulated and run the "
                                "fixed-order or ring all-reduce: pick one with the rule *.algo=fixed-order, or run "
                                "every kernel deterministic",
                                c.str()));
  }

  void all_gather(Context&, const void* send, std::size_t bytes, void* recv) override {
    meet(static_cast<const char*>(send), bytes, [&](int) { return bytes; }, [&](int q, const std::string& got) {
      std::memcpy(static_cast<char*>(recv) + q * bytes, got.data(), bytes);
    });
  }

  void all_to_all(Context&, const void* send, std::size_t chunk, void* recv) override {
    // Every rank writes its whole buffer; rank r takes chunk r of each.
    const std::size_t whole = chunk * static_cast<std::size_t>(me_.world);
    meet(static_cast<const char*>(send), whole, [&](int) { return whole; }, [&](int q, const std::string& got) {
      std::memcpy(static_cast<char*>(recv) + q * chunk, got.data() + me_.rank * chunk, chunk);
    });
  }

  void broadcast(Context&, void* buf, std::size_t bytes, int root) override {
    const bool mine = me_.rank == root;
    meet(
        mine ? static_cast<const char*>(buf) : nullptr, mine ? bytes : 0,
        [&](int q) { return q == root ? bytes : 0; },
        [&](int q, const std::string& got) {
          if (q == root && !mine) std::memcpy(buf, got.data(), bytes);
        });
  }

  void all_reduce_nccl(Context&, float*, int64_t, const AllReduceConfig& c) override {
    throw Error(fmt::format("all_reduce {}: CPU ranks have no NCCL", c.str()));
  }

  void barrier() override {
    meet(nullptr, 0, [](int) { return std::size_t(0); }, [](int, const std::string&) {});
  }

  // Rank 0 owns the folder, which goes once it returns: it first waits (up to the timeout) until
  // every other rank has seen the failure (left.r<q>) or failed itself (failed.r<q>), so none
  // is left waiting for files that vanished.
  void fail(const std::string& why) noexcept override {
    try {
      write_rendezvous_file(me_.rendezvous, fmt::format("failed.r{}", me_.rank), why);
      if (me_.rank != 0) return;
      const auto start = std::chrono::steady_clock::now();
      for (int q = 1; q < me_.world; ++q) {
        std::error_code ec;
        const fs::path dir(me_.rendezvous);
        while (!fs::exists(dir / fmt::format("left.r{}", q), ec) && !fs::exists(dir / fmt::format("failed.r{}", q), ec)) {
          if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > me_.timeout_s) return;
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      }
    } catch (...) {
    }
  }

  void leave() noexcept override {
    try {
      write_rendezvous_file(me_.rendezvous, fmt::format("left.r{}", me_.rank), "");
      if (me_.rank != 0) return;
      for (int q = 1; q < me_.world; ++q)
        wait_rendezvous_file(me_.rendezvous, fmt::format("left.r{}", q), me_.timeout_s,
                             fmt::format("rank {} to finish", q));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ditto: warning: data parallel: %s\n", e.what());
    }
  }

 private:
  // Meeting number seq_: offer `bytes` at `data`, then take(q, offer of q) for every rank q in
  // rank order, each offer first checked to hold expected(q) bytes (ranks whose calls differ are
  // an Error, never a read past an offer); then drop this rank's file of the meeting before.
  template <class Expected, class Take>
  void meet(const char* data, std::size_t bytes, Expected expected, Take take) {
    const uint64_t s = seq_++;
    write_rendezvous_file(me_.rendezvous, name(s, me_.rank), data ? std::string(data, bytes) : std::string());
    std::vector<std::string> got(static_cast<std::size_t>(me_.world));
    try {
      for (int q = 0; q < me_.world; ++q)
        got[q] = q == me_.rank ? std::string(data ? data : "", data ? bytes : 0)
                               : wait_rendezvous_file(me_.rendezvous, name(s, q), me_.timeout_s,
                                                      fmt::format("rank {}'s part of exchange {}", q, s));
    } catch (const Error& e) {
      // Another rank failed: say this one has seen it and leaves (what a failed rank 0 waits for).
      if (std::string(e.what()).rfind("stopped:", 0) == 0) {
        try {
          write_rendezvous_file(me_.rendezvous, fmt::format("left.r{}", me_.rank), "");
        } catch (...) {
        }
      }
      throw;
    }
    for (int q = 0; q < me_.world; ++q)
      if (got[q].size() != expected(q))
        throw Error(fmt::format("data parallel: rank {} offered {} bytes at exchange {}, rank {} expects {}: the ranks' "
                                "calls do not match (do all ranks run the same command?)",
                                q, got[q].size(), s, me_.rank, expected(q)));
    for (int q = 0; q < me_.world; ++q) take(q, got[q]);
    if (s > 0) {
      std::error_code ec;
      fs::remove(fs::path(me_.rendezvous) / name(s - 1, me_.rank), ec);
    }
  }
  static std::string name(uint64_t s, int r) { return fmt::format("x{}.r{}", s, r); }

  ProcessRank me_;
  uint64_t seq_ = 0;
};

// ---- CUDA ranks: NCCL -----------------------------------------------------------------------

class NcclLink : public ProcessLink {
 public:
  NcclLink(const ProcessRank& me, int device) : me_(me), device_(device) {
    if (!nccl_built())
      throw Error("data parallel over processes on GPUs: this build of ditto has no NCCL (nccl.h / libnccl were not "
                  "found at configure time; give -DNCCL_ROOT=DIR)");
  }
  ~NcclLink() override {
    for (auto& [name, comm] : comms_)
      if (aborted_)
        nccl_abort(comm);
      else
        nccl_destroy(comm);
    if (scratch_) {
      cudaSetDevice(device_);
      DeviceSyncScope sync(device_);
      cudaFree(scratch_);
      if (stream_) cudaStreamDestroy(stream_);
    }
  }

  void prepare(const std::vector<AllReduceConfig>& configs) override {
    nccl_check_environment();
    version_ = nccl_runtime_version();
    join("transport", AllReduceConfig{});
    for (const auto& c : configs)
      if (c.nccl()) join(comm_name(c), c);
    DITTO_CUDA_CHECK(cudaSetDevice(device_));
    DeviceSyncScope sync(device_);
    DITTO_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)));
    DITTO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }

  void all_gather(Context& ctx, const void* send, std::size_t bytes, void* recv) override {
    nccl_all_gather_bytes(transport(), send, recv, bytes, stream_of(ctx));
  }
  void all_to_all(Context& ctx, const void* send, std::size_t chunk, void* recv) override {
    nccl_all_to_all_bytes(transport(), me_.world, send, recv, chunk, stream_of(ctx));
  }
  void broadcast(Context& ctx, void* buf, std::size_t bytes, int root) override {
    nccl_broadcast_bytes(transport(), buf, bytes, root, stream_of(ctx));
  }
  void all_reduce_nccl(Context& ctx, float* buf, int64_t n, const AllReduceConfig& c) override {
    auto it = comms_.find(comm_name(c));
    if (it == comms_.end())
      throw Error(fmt::format("all_reduce {}: no NCCL communicator was prepared for it (RankGroup::prepare_nccl)",
                              c.str()));
    DITTO_CUDA_CHECK(cudaSetDevice(device_));
    nccl_all_reduce_sum(it->second, buf, n, stream_of(ctx));
  }
  void barrier() override {
    DITTO_CUDA_CHECK(cudaSetDevice(device_));
    nccl_all_reduce_sum(transport(), static_cast<float*>(scratch_), 1, stream_);
    DITTO_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void fail(const std::string& why) noexcept override {
    aborted_ = true;
    try {
      write_rendezvous_file(me_.rendezvous, fmt::format("failed.r{}", me_.rank), why);
    } catch (...) {
    }
    for (auto& [name, comm] : comms_) nccl_abort(comm);
    comms_.clear();
  }
  void leave() noexcept override {
    try {
      if (!comms_.empty()) barrier();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ditto: warning: data parallel: %s\n", e.what());
    }
  }
  std::string nccl_version() const override { return version_; }

 private:
  static std::string comm_name(const AllReduceConfig& c) {
    std::string s = c.str();
    for (char& ch : s)
      if (ch == '/') ch = '-';
    return s;
  }
  void* transport() {
    auto it = comms_.find("transport");
    if (it == comms_.end()) throw Error("data parallel: the NCCL transport was never prepared (RankGroup::prepare_nccl)");
    DITTO_CUDA_CHECK(cudaSetDevice(device_));
    return it->second;
  }
  // Rank 0 makes the id and writes it; the others wait for it; all join.
  void join(const std::string& name, const AllReduceConfig& c) {
    if (comms_.count(name)) return;
    const std::string file = fmt::format("nccl-{}.id", name);
    std::string id;
    if (me_.rank == 0) {
      id = nccl_unique_id();
      write_rendezvous_file(me_.rendezvous, file, id);
    } else {
      id = wait_rendezvous_file(me_.rendezvous, file, me_.timeout_s,
                                fmt::format("rank 0's NCCL id of the {} communicator", name));
    }
    comms_[name] = nccl_make_rank_comm(device_, me_.world, me_.rank, id, c.nccl() ? c.nccl_algo() : "",
                                       c.nccl() ? c.nccl_proto() : "", c.nccl() ? c.channels : 0);
  }

  ProcessRank me_;
  int device_;
  std::map<std::string, void*> comms_;
  bool aborted_ = false;
  std::string version_;
  void* scratch_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

std::unique_ptr<ProcessLink> make_file_link(const ProcessRank& me) { return std::make_unique<FileLink>(me); }
std::unique_ptr<ProcessLink> make_nccl_link(const ProcessRank& me, int device) {
  return std::make_unique<NcclLink>(me, device);
}

}  // namespace ditto::detail
