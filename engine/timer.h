// IntervalTimer: how long the work between start() and stop() took on the device. On a CUDA
// context each interval is a pair of CUDA events recorded on the context's stream, so timing
// adds no host synchronization; milliseconds() waits for the last event. On the CPU it is the
// host's steady clock. Benchmarks time steps with it; tests never assert on its numbers.
#pragma once
#include <memory>
#include <vector>

namespace ditto {

class Context;

class IntervalTimer {
 public:
  explicit IntervalTimer(Context& ctx);
  ~IntervalTimer();
  IntervalTimer(const IntervalTimer&) = delete;
  IntervalTimer& operator=(const IntervalTimer&) = delete;

  void start();
  void stop();  // throws Error without a start() before it
  // Every finished interval in order, in milliseconds (waits for the device).
  std::vector<double> milliseconds();
  void clear();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ditto
