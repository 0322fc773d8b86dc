// Typed errors thrown by ditto. The library never calls exit() or abort(): every failure
// reaches the caller as one of these, carrying the failing expression, file:line and the
// library's own message.
#pragma once
#include <stdexcept>
#include <string>

namespace ditto {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A CUDA runtime, cuDNN or cuBLAS call failed.
class CudaError : public Error { public: using Error::Error; };
class CudnnError : public Error { public: using Error::Error; };
class CublasError : public Error { public: using Error::Error; };

// Shapes, dtypes or devices of the operands do not fit the op.
class ShapeError : public Error { public: using Error::Error; };

// A policy string or pin names an unknown layer, knob or variant, or a pinned choice
// cannot be honoured for this layer (unsupported algorithm, workspace not allocatable).
class PolicyError : public Error { public: using Error::Error; };

// Input data are malformed: truncated or corrupt files, labels out of range.
class DataError : public Error { public: using Error::Error; };

// A file could not be read or written.
class IoError : public Error { public: using Error::Error; };

}  // namespace ditto
