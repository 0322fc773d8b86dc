// NCCL behind engine/detail/nccl.h. NCCL reads NCCL_ALGO and NCCL_PROTO when a communicator
// builds its tuning model (ncclTopoTuneModel, during initialization); the channel bounds have a
// per-communicator form, ncclConfig_t's minCTAs / maxCTAs. So a pinned configuration is made by
// setting the two variables, creating the communicators, and unsetting them, under a
// process-wide hold (TuningEnv) that creations of the same configuration share and others wait
// for: nothing else in ditto reads them, and ranks of one configuration may join from several
// threads at once (each blocks in ncclCommInitRankConfig until all have joined).
#include "engine/detail/nccl.h"

#include <fmt/format.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "engine/detail/cuda_check.h"
#include "engine/error.h"

#ifdef DITTO_HAVE_NCCL
#include <nccl.h>
#endif

namespace ditto::detail {

#ifdef DITTO_HAVE_NCCL
namespace {

#define DITTO_NCCL_CHECK(expr)                                                                              \
  do {                                                                                                      \
    ncclResult_t ditto_r_ = (expr);                                                                         \
    if (ditto_r_ != ncclSuccess)                                                                            \
      throw Error(fmt::format("{}:{} {} failed: {} ({})", __FILE__, __LINE__, #expr, ncclGetErrorString(ditto_r_), \
                              ncclGetLastError(nullptr)));                                                  \
  } while (0)

// NCCL_ALGO / NCCL_PROTO as one communicator's creation wants them, shared by the creations that
// want the same values at once: a rank's ncclCommInitRankConfig blocks until every rank has
// joined, and where ranks are threads of one process (tests; a library caller) they join
// concurrently. Creations that want other values wait until the last holder has left, so a
// communicator never sees another configuration's variables.
class TuningEnv {
 public:
  TuningEnv(const std::string& algo, const std::string& proto) {
    std::unique_lock<std::mutex> lk(m());
    State& st = state();
    cv().wait(lk, [&] { return st.users == 0 || (st.algo == algo && st.proto == proto); });
    if (st.users == 0) {
      set("NCCL_ALGO", algo);
      set("NCCL_PROTO", proto);
      st.algo = algo;
      st.proto = proto;
    }
    ++st.users;
  }
  ~TuningEnv() {
    std::lock_guard<std::mutex> lk(m());
    State& st = state();
    if (--st.users == 0) {
      if (!st.algo.empty()) unsetenv("NCCL_ALGO");
      if (!st.proto.empty()) unsetenv("NCCL_PROTO");
    }
    cv().notify_all();
  }
  TuningEnv(const TuningEnv&) = delete;
  TuningEnv& operator=(const TuningEnv&) = delete;

  // nccl_check_environment under the same lock: NCCL_ALGO / NCCL_PROTO set by a creation under
  // way on another thread are ditto's own, not the user's.
  static void check_environment() {
    std::lock_guard<std::mutex> lk(m());
    const bool ours = state().users > 0;
    const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
    if (!nvls) {
      if (setenv("NCCL_NVLS_ENABLE", "0", 1) != 0) throw Error("cannot set NCCL_NVLS_ENABLE=0");
    } else if (std::string(nvls) != "0") {
      throw Error(fmt::format("NCCL_NVLS_ENABLE={}: NVLink multicast reductions (NVLS) are not reproducible; ditto's "
                              "data-parallel runs need NCCL_NVLS_ENABLE=0 (or unset, and ditto sets 0)",
                              nvls));
    }
    for (const char* name : {"NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_MIN_CTAS",
                             "NCCL_MAX_CTAS"}) {
      if (ours && (std::string(name) == "NCCL_ALGO" || std::string(name) == "NCCL_PROTO")) continue;
      if (const char* v = std::getenv(name))
        throw Error(fmt::format("{}={} is set in the environment: ditto pins NCCL's algorithm, protocol and channels "
                                "per gradient bucket from the policy (e.g. --pin bucket0.algo=nccl-ring-simple --pin "
                                "bucket0.channels=4); unset {}",
                                name, v, name));
    }
  }

 private:
  struct State {
    int users = 0;
    std::string algo, proto;
  };
  static void set(const char* name, const std::string& value) {
    if (!value.empty() && setenv(name, value.c_str(), 1) != 0)
      throw Error(fmt::format("cannot set {}={}", name, value));
  }
  static std::mutex& m() {
    static std::mutex mu;
    return mu;
  }
  static std::condition_variable& cv() {
    static std::condition_variable c;
    return c;
  }
  static State& state() {
    static State s;
    return s;
  }
};

}  // namespace

bool nccl_built() { return true; }

std::string nccl_runtime_version() {
  int v = 0;
  DITTO_NCCL_CHECK(ncclGetVersion(&v));
  // Since 2.9 the code is major * 10000 + minor * 100 + patch.
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

void nccl_check_environment() { TuningEnv::check_environment(); }

std::vector<void*> nccl_make_comms(const std::vector<int>& devices, const std::string& algo, const std::string& proto,
                                   int channels) {
  int previous = 0;
  DITTO_CUDA_CHECK(cudaGetDevice(&previous));
  ncclUniqueId id;
  DITTO_NCCL_CHECK(ncclGetUniqueId(&id));
  // These communicators run all-reduces only, so the plain form (every collective) is enough.
  TuningEnv env(algo, proto);
  const int k = static_cast<int>(devices.size());
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(k), nullptr);
  DITTO_NCCL_CHECK(ncclGroupStart());
  for (int r = 0; r < k; ++r) {
    DITTO_CUDA_CHECK(cudaSetDevice(devices[r]));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    if (channels > 0) config.minCTAs = config.maxCTAs = channels;
    DITTO_NCCL_CHECK(ncclCommInitRankConfig(&comms[r], k, id, r, &config));
  }
  DITTO_NCCL_CHECK(ncclGroupEnd());
  DITTO_CUDA_CHECK(cudaSetDevice(previous));
  return std::vector<void*>(comms.begin(), comms.end());
}

std::string nccl_unique_id() {
  ncclUniqueId id;
  DITTO_NCCL_CHECK(ncclGetUniqueId(&id));
  return std::string(id.internal, sizeof id.internal);
}

void* nccl_make_rank_comm(int device, int world, int rank, const std::string& id, const std::string& algo,
                          const std::string& proto, int channels) {
  ncclUniqueId uid;
  if (id.size() != sizeof uid.internal)
    throw Error(fmt::format("NCCL unique id of {} bytes; NCCL's are {}", id.size(), sizeof uid.internal));
  std::memcpy(uid.internal, id.data(), sizeof uid.internal);
  DITTO_CUDA_CHECK(cudaSetDevice(device));
  TuningEnv env(algo, proto);  // shared with ranks of the same configuration joining from other threads
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  if (channels > 0) config.minCTAs = config.maxCTAs = channels;
  ncclComm_t comm = nullptr;
  DITTO_NCCL_CHECK(ncclCommInitRankConfig(&comm, world, uid, rank, &config));
  return comm;
}

void nccl_all_gather_bytes(void* comm, const void* send, void* recv, std::size_t bytes, cudaStream_t stream) {
  DITTO_NCCL_CHECK(ncclAllGather(send, recv, bytes, ncclInt8, static_cast<ncclComm_t>(comm), stream));
}

void nccl_all_to_all_bytes(void* comm, int world, const void* send, void* recv, std::size_t chunk,
                           cudaStream_t stream) {
  const auto* s = static_cast<const char*>(send);
  auto* r = static_cast<char*>(recv);
  DITTO_NCCL_CHECK(ncclGroupStart());
  for (int q = 0; q < world; ++q) {
    DITTO_NCCL_CHECK(ncclSend(s + q * chunk, chunk, ncclInt8, q, static_cast<ncclComm_t>(comm), stream));
    DITTO_NCCL_CHECK(ncclRecv(r + q * chunk, chunk, ncclInt8, q, static_cast<ncclComm_t>(comm), stream));
  }
  DITTO_NCCL_CHECK(ncclGroupEnd());
}

void nccl_broadcast_bytes(void* comm, void* buf, std::size_t bytes, int root, cudaStream_t stream) {
  DITTO_NCCL_CHECK(ncclBroadcast(buf, buf, bytes, ncclInt8, root, static_cast<ncclComm_t>(comm), stream));
}

void nccl_all_reduce_sum(void* comm, float* buf, int64_t n, cudaStream_t stream) {
  DITTO_NCCL_CHECK(ncclAllReduce(buf, buf, static_cast<size_t>(n), ncclFloat, ncclSum, static_cast<ncclComm_t>(comm),
                                 stream));
}

void nccl_destroy(void* comm) noexcept {
  if (comm) ncclCommDestroy(static_cast<ncclComm_t>(comm));
}

void nccl_abort(void* comm) noexcept {
  if (comm) ncclCommAbort(static_cast<ncclComm_t>(comm));
}

#else  // no NCCL in this build

namespace {
[[noreturn]] void no_nccl() {
  throw Error("this build of ditto has no NCCL (nccl.h / libnccl were not found at configure time; give "
              "-DNCCL_ROOT=DIR): only the fixed-order all-reduce can run");
}
}  // namespace

bool nccl_built() { return false; }
std::string nccl_runtime_version() { no_nccl(); }
void nccl_check_environment() { no_nccl(); }
std::vector<void*> nccl_make_comms(const std::vector<int>&, const std::string&, const std::string&, int) { no_nccl(); }
std::string nccl_unique_id() { no_nccl(); }
void* nccl_make_rank_comm(int, int, int, const std::string&, const std::string&, const std::string&, int) { no_nccl(); }
void nccl_all_gather_bytes(void*, const void*, void*, std::size_t, cudaStream_t) { no_nccl(); }
void nccl_all_to_all_bytes(void*, int, const void*, void*, std::size_t, cudaStream_t) { no_nccl(); }
void nccl_broadcast_bytes(void*, void*, std::size_t, int, cudaStream_t) { no_nccl(); }
void nccl_all_reduce_sum(void*, float*, int64_t, cudaStream_t) { no_nccl(); }
void nccl_destroy(void*) noexcept {}
void nccl_abort(void*) noexcept {}

#endif

}  // namespace ditto::detail
