#include "engine/timer.h"

#include <chrono>

#include "engine/detail/cuda_state.h"
#include "engine/error.h"

namespace ditto {

struct IntervalTimer::Impl {
  Context* ctx;
  std::vector<cudaEvent_t> starts, stops;  // CUDA
  std::vector<std::chrono::steady_clock::time_point> host_starts, host_stops;  // CPU
  bool open = false;
  ~Impl() {
    for (auto e : starts) DITTO_CUDA_CHECK_PRINT(cudaEventDestroy(e));
    for (auto e : stops) DITTO_CUDA_CHECK_PRINT(cudaEventDestroy(e));
  }
  cudaEvent_t record() {
    cudaEvent_t e = nullptr;
    DITTO_CUDA_CHECK(cudaEventCreate(&e));
    DITTO_CUDA_CHECK(cudaEventRecord(e, detail::stream_of(*ctx)));
    return e;
  }
};

IntervalTimer::IntervalTimer(Context& ctx) : impl_(std::make_unique<Impl>()) { impl_->ctx = &ctx; }
IntervalTimer::~IntervalTimer() = default;

void IntervalTimer::start() {
  if (impl_->ctx->is_cuda())
    impl_->starts.push_back(impl_->record());
  else
    impl_->host_starts.push_back(std::chrono::steady_clock::now());
  impl_->open = true;
}

void IntervalTimer::stop() {
  if (!impl_->open) throw Error("IntervalTimer::stop without start");
  if (impl_->ctx->is_cuda())
    impl_->stops.push_back(impl_->record());
  else
    impl_->host_stops.push_back(std::chrono::steady_clock::now());
  impl_->open = false;
}

std::vector<double> IntervalTimer::milliseconds() {
  std::vector<double> out;
  if (impl_->ctx->is_cuda()) {
    if (!impl_->stops.empty()) DITTO_CUDA_CHECK(cudaEventSynchronize(impl_->stops.back()));
    for (std::size_t i = 0; i < impl_->stops.size(); ++i) {
      float ms = 0;
      DITTO_CUDA_CHECK(cudaEventElapsedTime(&ms, impl_->starts[i], impl_->stops[i]));
      out.push_back(ms);
    }
  } else {
    for (std::size_t i = 0; i < impl_->host_stops.size(); ++i)
      out.push_back(std::chrono::duration<double, std::milli>(impl_->host_stops[i] - impl_->host_starts[i]).count());
  }
  return out;
}

void IntervalTimer::clear() {
  Context* ctx = impl_->ctx;
  impl_ = std::make_unique<Impl>();
  impl_->ctx = ctx;
}

}  // namespace ditto
