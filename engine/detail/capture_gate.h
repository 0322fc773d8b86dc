// Internal: keeps device-synchronizing CUDA calls out of graph captures on other threads.
//
// CUDA invalidates every stream capture under way on a device when any thread calls something
// that synchronizes that device, whatever the capture mode (thread-local mode only spares other
// threads' *legal* calls): cudaFree and cudaFreeHost, destroying a memory pool or a stream,
// creating or destroying cuDNN / cuBLAS handles (they allocate and free), cudnnFind* (it
// allocates and times), instantiating or destroying a graph. Replicas that share a GPU (the
// ensemble's --concurrent, several jobs per lane) do exactly that: one replica ends or starts
// while another captures its step, and the capture fails with cudaErrorStreamCaptureInvalidated.
//
// So each device has a gate: a capture holds it shared from cudaStreamBeginCapture to
// cudaStreamEndCapture (captures on one device run together), and each of those calls holds it
// exclusively, waiting for the captures under way to end. A thread that is itself capturing on
// the device passes its own exclusive requests through (the call would break its own capture
// and CUDA says so; waiting for itself would hang).
#pragma once

namespace ditto::detail {

// Held shared by a capturing thread.
class CaptureScope {
 public:
  explicit CaptureScope(int device);
  ~CaptureScope();
  CaptureScope(const CaptureScope&) = delete;
  CaptureScope& operator=(const CaptureScope&) = delete;

 private:
  int device_;
};

// Held exclusively around a device-synchronizing call on `device` (the calling thread's current
// device when -1).
class DeviceSyncScope {
 public:
  explicit DeviceSyncScope(int device = -1);
  ~DeviceSyncScope();
  DeviceSyncScope(const DeviceSyncScope&) = delete;
  DeviceSyncScope& operator=(const DeviceSyncScope&) = delete;

 private:
  int device_ = -1;  // -1: nothing held
};

}  // namespace ditto::detail
