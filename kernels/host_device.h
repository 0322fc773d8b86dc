// DITTO_HD marks the helpers of the CPU references (kernels/*_ref.h) that ditto's CUDA kernels call
// as well, so that a kernel and its reference share their index and weight arithmetic: host and
// device functions under nvcc, plain functions otherwise.
#pragma once

#ifdef __CUDACC__
#define DITTO_HD __host__ __device__
#else
#define DITTO_HD
#endif
