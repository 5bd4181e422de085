// Tests of the CUDA measurement harness. The error macros, the rotation arithmetic and the
// "no device" path run everywhere; the kernels and the timer skip themselves without a device.
#include <cstdint>
#include <cuda_runtime_api.h>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cpsim/calibrate/measure.hpp"
#include "cpsim/models/error.hpp"

#include "kernels.hpp"
#include "measure_internal.hpp"

namespace cpsim::calibrate::cuda {
namespace {

using ::testing::HasSubstr;

bool has_device() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
}

TEST(CudaCheck, NamesTheCallTheFileAndTheError) {
  try {
    CPSIM_CUDA_CHECK(cudaErrorInvalidValue);
    ADD_FAILURE() << "expected MeasureError";
  } catch (const MeasureError& e) {
    EXPECT_THAT(e.what(), HasSubstr("cudaErrorInvalidValue failed at"));
    EXPECT_THAT(e.what(), HasSubstr("measure_gpu_test.cpp:"));
    EXPECT_THAT(e.what(), HasSubstr(": cudaErrorInvalidValue ("));
  }
  try {
    CPSIM_NCCL_CHECK(ncclInvalidArgument);
    ADD_FAILURE() << "expected MeasureError";
  } catch (const MeasureError& e) {
    EXPECT_THAT(e.what(), HasSubstr("ncclInvalidArgument failed at"));
  }
  try {
    CPSIM_CUBLAS_CHECK(CUBLAS_STATUS_NOT_SUPPORTED);
    ADD_FAILURE() << "expected MeasureError";
  } catch (const MeasureError& e) {
    EXPECT_THAT(e.what(), HasSubstr("CUBLAS_STATUS_NOT_SUPPORTED"));
  }
}

TEST(Rotation, TouchesAtLeastTheRotationBytes) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  EXPECT_EQ(rotation_sets(kMiB, 1024 * kMiB, 100 * kMiB), 100);
  EXPECT_EQ(rotation_sets(3 * kMiB, 1024 * kMiB, 100 * kMiB), 34);
  EXPECT_EQ(rotation_sets(200 * kMiB, 1024 * kMiB, 100 * kMiB), 1);
  EXPECT_EQ(rotation_sets(kMiB, 10 * kMiB, 100 * kMiB), 10);    // limited by the arena
  EXPECT_EQ(rotation_sets(16, 1024 * kMiB, 100 * kMiB), 4096);  // capped
  EXPECT_EQ(rotation_sets(2048 * kMiB, 1024 * kMiB, 100 * kMiB), 1);
}

TEST(Rotation, RegionsAre256ByteAligned) {
  const RegionLayout l = layout_regions({10, 256, 1, 0, 300});
  ASSERT_EQ(l.offsets.size(), 5U);
  EXPECT_EQ(l.offsets[0], 0U);
  EXPECT_EQ(l.offsets[1], 256U);
  EXPECT_EQ(l.offsets[2], 512U);
  EXPECT_EQ(l.offsets[3], 768U);
  EXPECT_EQ(l.offsets[4], 768U);
  EXPECT_EQ(l.total, 1280U);
}

TEST(Backend, ExplainsAMissingDevice) {
  const auto backend = make_measure_backend();
  EXPECT_EQ(backend->name(), "cuda");
  if (has_device()) {
    EXPECT_FALSE(backend->unavailable_reason().has_value());
    GTEST_SKIP() << "a device is present";
  }
  const auto reason = backend->unavailable_reason();
  ASSERT_TRUE(reason.has_value());
  EXPECT_THAT(*reason, HasSubstr("no CUDA device"));
  try {
    (void)backend->open(MeasureOptions{});
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "calibrate");
    EXPECT_THAT(e.what(), HasSubstr("no CUDA device"));
  }
}

TEST(Kernels, CopyAndFillAndTimer) {
  if (!has_device()) {
    GTEST_SKIP() << "no CUDA device available";
  }
  constexpr std::size_t kCount = std::size_t{1} << 20;
  const DeviceBuffer a(0, kCount * 2);
  const DeviceBuffer b(0, kCount * 2);
  const Stream stream(0);
  ASSERT_EQ(fill_uniform_bf16(a.at<__nv_bfloat16>(), kCount, 5, 1.0f, stream.get()), cudaSuccess);
  ASSERT_EQ(copy_kernel(a.at<void>(), b.at<void>(), kCount * 2, stream.get()), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
  std::vector<std::uint16_t> x(kCount), y(kCount);
  ASSERT_EQ(cudaMemcpy(x.data(), a.at<void>(), kCount * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(y.data(), b.at<void>(), kCount * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(x, y);
  std::size_t distinct = 0;
  for (std::size_t i = 1; i < kCount; ++i) {
    distinct += x[i] != x[i - 1] ? 1 : 0;
  }
  EXPECT_GT(distinct, kCount / 2);  // random, not constant

  const TimingConfig timing{2, 5, 1e-3, 16};
  const double t = time_launches(stream, timing, [&](int) {
    CPSIM_CUDA_CHECK(copy_kernel(a.at<void>(), b.at<void>(), kCount * 2, stream.get()));
  });
  EXPECT_GT(t, 0.0);
  EXPECT_LT(t, 0.1);
  const double t_empty =
      time_launches(stream, timing, [&](int) { CPSIM_CUDA_CHECK(empty_kernel(stream.get())); });
  EXPECT_GT(t_empty, 0.0);
  EXPECT_LT(t_empty, t);
  EXPECT_GT(measure_sm_clock_mhz(0), 100.0);
}

}  // namespace
}  // namespace cpsim::calibrate::cuda
