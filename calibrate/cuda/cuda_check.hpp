#pragma once
// CPSIM_CUDA_CHECK / CPSIM_NCCL_CHECK / CPSIM_CUBLAS_CHECK: a failing call throws MeasureError
// naming the call, the file and line, and the library's error name. The backend lets it reach
// the calibrate boundary (`cpsim calibrate run`), which reports it and writes nothing.

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

namespace cpsim::calibrate::cuda {

[[noreturn]] void throw_cuda_error(const char* call, const char* file, int line, cudaError_t e);
[[noreturn]] void throw_nccl_error(const char* call, const char* file, int line, ncclResult_t e);
[[noreturn]] void throw_cublas_error(const char* call,
                                     const char* file,
                                     int line,
                                     cublasStatus_t e);

}  // namespace cpsim::calibrate::cuda

#define CPSIM_CUDA_CHECK(call)                                                              \
  do {                                                                                      \
    const cudaError_t cpsim_status_ = (call);                                               \
    if (cpsim_status_ != cudaSuccess) {                                                     \
      ::cpsim::calibrate::cuda::throw_cuda_error(#call, __FILE__, __LINE__, cpsim_status_); \
    }                                                                                       \
  } while (false)

#define CPSIM_NCCL_CHECK(call)                                                              \
  do {                                                                                      \
    const ncclResult_t cpsim_status_ = (call);                                              \
    if (cpsim_status_ != ncclSuccess) {                                                     \
      ::cpsim::calibrate::cuda::throw_nccl_error(#call, __FILE__, __LINE__, cpsim_status_); \
    }                                                                                       \
  } while (false)

#define CPSIM_CUBLAS_CHECK(call)                                                              \
  do {                                                                                        \
    const cublasStatus_t cpsim_status_ = (call);                                              \
    if (cpsim_status_ != CUBLAS_STATUS_SUCCESS) {                                             \
      ::cpsim::calibrate::cuda::throw_cublas_error(#call, __FILE__, __LINE__, cpsim_status_); \
    }                                                                                         \
  } while (false)
