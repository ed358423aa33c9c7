// GFDIT_CUDA_CHECK: a failed CUDA runtime call becomes gfdit::Error(kSystemError) with file, line and call.
#pragma once

#include <cuda_runtime_api.h>

#include "gfdit/error.h"

/// Throws gfdit::Error(kSystemError) naming the call and CUDA's message unless `call` returns cudaSuccess.
#define GFDIT_CUDA_CHECK(call)                                                                \
  do {                                                                                        \
    cudaError_t gfdit_cuda_err_ = (call);                                                     \
    if (gfdit_cuda_err_ != cudaSuccess) {                                                     \
      GFDIT_THROW(kSystemError) << #call << ": " << cudaGetErrorName(gfdit_cuda_err_) << ": " \
                                << cudaGetErrorString(gfdit_cuda_err_);                       \
    }                                                                                         \
  } while (0)
