// The device side of the edge protocol; skipped where no GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "cuda/edge_kernels.h"

TEST(Cuda, PutWithSignalThenWait) {
  if (gfdit::cuda::deviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const size_t bytes = (1 << 20) + 13;
  std::vector<uint8_t> host(bytes);
  for (size_t i = 0; i < bytes; ++i) host[i] = static_cast<uint8_t>(i * 131 + 7);
  uint8_t *src = nullptr, *dst = nullptr;
  uint64_t* signal = nullptr;
  ASSERT_EQ(cudaMalloc(&src, bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dst, bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&signal, 64), cudaSuccess);
  ASSERT_EQ(cudaMemset(signal, 0, 64), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(src, host.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  gfdit::cuda::launchPutWithSignal(dst, src, bytes, signal, 1, nullptr);
  gfdit::cuda::launchWaitSignal(signal, 1, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> back(bytes);
  ASSERT_EQ(cudaMemcpy(back.data(), dst, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);
  uint64_t sig = 0;
  ASSERT_EQ(cudaMemcpy(&sig, signal, 8, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(sig, 1u);
  cudaFree(src);
  cudaFree(dst);
  cudaFree(signal);
}

TEST(Cuda, RuntimeAnswersWithoutADevice) {
  EXPECT_GE(gfdit::cuda::deviceCount(), 0);
  EXPECT_GT(gfdit::cuda::runtimeVersion(), 0);
}
