// The CUDA transport's host logic, which runs on every machine with or without a GPU: copy tables,
// error records, IPC announcements, launch shapes, path fallbacks and what the build compiled in.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda/cuda_transport.h"
#include "cuda/device_region.h"
#include "cuda/error_record.h"
#include "cuda/ipc.h"
#include "cuda/kernels.h"
#include "cuda/launcher.h"
#include "cuda/nvshmem_edges.h"
#include "cuda_harness.h"
#include "scoped_env.h"

using gfdit::CopyPath;
using gfdit::CopySelector;
using gfdit::ErrorCode;
namespace cuda = gfdit::cuda;

namespace {

using gfdit::testing::ScopedEnv;

cuda::ErrorRecord sampleRecord() {
  cuda::ErrorRecord r{};
  r.state = 1;
  r.failure = static_cast<uint32_t>(cuda::DeviceFailure::kTimeout);
  r.op = static_cast<uint32_t>(cuda::DeviceOp::kConsume);
  r.wait = static_cast<uint32_t>(cuda::DeviceWaitKind::kReady);
  r.rank = 1;
  r.peer = 0;
  r.seq = 7;
  r.observed = 6;
  r.waited_ns = 250000000;
  r.timeout_ns = 200000000;
  r.op_index = 12;
  return r;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(CudaCopyTable, DefaultPicksSmThenTmaThenCopyEngine) {
  unsetenv("GFDIT_CUDA_COPY_TABLE");
  CopySelector sel = cuda::resolveCopyTable("", true);
  EXPECT_EQ(sel.toString(), cuda::defaultCopyTable());
  EXPECT_EQ(sel.pick(4096), CopyPath::kCudaSm);
  EXPECT_EQ(sel.pick(size_t{1} << 20), CopyPath::kCudaTma);
  EXPECT_EQ(sel.pick(size_t{256} << 20), CopyPath::kCudaCe);
}

TEST(CudaCopyTable, WithoutTmaItsEntriesBecomeSm) {
  unsetenv("GFDIT_CUDA_COPY_TABLE");
  CopySelector sel = cuda::resolveCopyTable("", false);
  EXPECT_EQ(sel.toString(), "16777216:sm,inf:ce");
  EXPECT_EQ(cuda::resolveCopyTable("inf:tma", false).toString(), "inf:sm");
}

TEST(CudaCopyTable, EnvironmentOverridesTheDefaultAndAnOptionOverridesBoth) {
  ScopedEnv env("GFDIT_CUDA_COPY_TABLE", "1024:sm,inf:ce");
  EXPECT_EQ(cuda::resolveCopyTable("", true).toString(), "1024:sm,inf:ce");
  EXPECT_EQ(cuda::resolveCopyTable("inf:tma", true).toString(), "inf:tma");
}

TEST(CudaCopyTable, RefusesHostPathsAndMalformedTables) {
  try {
    cuda::resolveCopyTable("65536:memcpy,inf:stream", true);
    FAIL() << "a host table was accepted";
  } catch (const gfdit::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidUsage);
    EXPECT_TRUE(contains(e.what(), "host paths")) << e.what();
  }
  ScopedEnv env("GFDIT_CUDA_COPY_TABLE", "4096:sm,1024:ce");
  EXPECT_THROW(cuda::resolveCopyTable("", true), gfdit::Error);
}

TEST(CudaErrorRecord, ATimeoutNamesEdgeMessagePeerAndOperation) {
  cuda::ErrorRecord r = sampleRecord();
  EXPECT_EQ(cuda::errorCodeOf(r), ErrorCode::kTimeout);
  std::string s = cuda::formatError(r);
  EXPECT_TRUE(contains(s, "rank 1 timed out")) << s;
  EXPECT_TRUE(contains(s, "message 7 on edge 0->1")) << s;
  EXPECT_TRUE(contains(s, "signalled 6")) << s;
  EXPECT_TRUE(contains(s, "consume (operation 12)")) << s;
  EXPECT_TRUE(contains(s, "0.25 s")) << s;
}

TEST(CudaErrorRecord, AWaitForConsumedIsOnTheOutgoingEdge) {
  cuda::ErrorRecord r = sampleRecord();
  r.wait = static_cast<uint32_t>(cuda::DeviceWaitKind::kConsumed);
  r.op = static_cast<uint32_t>(cuda::DeviceOp::kStage);
  r.rank = 0;
  r.peer = 3;
  std::string s = cuda::formatError(r);
  EXPECT_TRUE(contains(s, "rank 3 to finish reading message 7 on edge 0->3")) << s;
  EXPECT_TRUE(contains(s, "stage")) << s;
}

TEST(CudaErrorRecord, APeerFailureIsARemoteError) {
  cuda::ErrorRecord r = sampleRecord();
  r.failure = static_cast<uint32_t>(cuda::DeviceFailure::kPeerFailed);
  EXPECT_EQ(cuda::errorCodeOf(r), ErrorCode::kRemoteError);
  std::string s = cuda::formatError(r);
  EXPECT_TRUE(contains(s, "rank 0's transport failed")) << s;
  EXPECT_TRUE(contains(s, "edge 0->1")) << s;
  r.wait = static_cast<uint32_t>(cuda::DeviceWaitKind::kReadCheck);
  s = cuda::formatError(r);
  EXPECT_TRUE(contains(s, "may have overwritten")) << s;
  EXPECT_TRUE(contains(s, "message 7 on edge 0->1")) << s;
}

TEST(CudaIpc, HexRoundTripsAndRefusesGarbage) {
  unsigned char bytes[64];
  for (int i = 0; i < 64; ++i) bytes[i] = static_cast<unsigned char>(i * 37 + 11);
  std::string hex = cuda::hexEncode(bytes, sizeof(bytes));
  EXPECT_EQ(hex.size(), 128u);
  unsigned char back[64] = {};
  cuda::hexDecode(hex, back, sizeof(back));
  EXPECT_EQ(std::memcmp(bytes, back, sizeof(bytes)), 0);
  EXPECT_THROW(cuda::hexDecode(hex.substr(2), back, sizeof(back)), gfdit::Error);
  std::string bad = hex;
  bad[5] = 'x';
  EXPECT_THROW(cuda::hexDecode(bad, back, sizeof(back)), gfdit::Error);
}

TEST(CudaIpc, AnnouncementsRoundTripThroughAFileStore) {
  cuda::RegionAnnouncement a;
  a.handle = std::string(128, 'a');
  a.uuid = std::string(32, '0');
  a.total_bytes = 1 << 30;
  a.slot_bytes = 4 << 20;
  a.num_slots = 8;
  a.heap_bytes = 256 << 20;
  a.device = 3;
  a.pid = 4242;
  char tmpl[] = "/tmp/gfdit-ipc-test-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  {
    gfdit::FileStore store(dir);
    store.set("w/cuda-region/0", cuda::encodeAnnouncement(a));
    cuda::RegionAnnouncement b = cuda::parseAnnouncement(store.get("w/cuda-region/0"));
    EXPECT_EQ(b.handle, a.handle);
    EXPECT_EQ(b.uuid, a.uuid);
    EXPECT_EQ(b.total_bytes, a.total_bytes);
    EXPECT_EQ(b.slot_bytes, a.slot_bytes);
    EXPECT_EQ(b.num_slots, a.num_slots);
    EXPECT_EQ(b.heap_bytes, a.heap_bytes);
    EXPECT_EQ(b.device, a.device);
    EXPECT_EQ(b.pid, a.pid);
  }
  EXPECT_EQ(std::system(("rm -rf " + dir).c_str()), 0);
  EXPECT_THROW(cuda::parseAnnouncement("gfdit-cuda-region/0 handle=aa"), gfdit::Error);
  EXPECT_THROW(cuda::parseAnnouncement("gfdit-cuda-region/1 handle=aa bytes=12x"), gfdit::Error);
}

TEST(CudaKernels, LaunchShapes) {
  EXPECT_EQ(cuda::smCopyBlocks(1, 32), 1);
  EXPECT_EQ(cuda::smCopyBlocks(64 << 10, 32), 1);
  EXPECT_EQ(cuda::smCopyBlocks((64 << 10) + 1, 32), 2);
  EXPECT_EQ(cuda::smCopyBlocks(size_t{1} << 30, 32), 32);
  EXPECT_EQ(cuda::tmaCopyBlocks(1, 16), 1);
  EXPECT_EQ(cuda::tmaCopyBlocks(size_t{cuda::kTmaChunkBytes} * cuda::kTmaStages * 3, 16), 3);
  EXPECT_EQ(cuda::tmaCopyBlocks(size_t{1} << 30, 16), 16);
  EXPECT_LE(cuda::kTmaSmemBytes, size_t{227} << 10);  // fits sm_90's shared memory per block
}

TEST(CudaLauncher, CopiesThatDoNotFitAPathFallBackToTheSmKernel) {
  alignas(16) static uint8_t a[4096], b[4096];
  cuda::CopySpec c;
  c.dst = cuda::deviceView(a, 1024);
  c.src = cuda::deviceView(b, 1024);
  c.bytes = 1024;
  EXPECT_EQ(cuda::effectivePath(c, CopyPath::kCudaTma, true), CopyPath::kCudaTma);
  EXPECT_EQ(cuda::effectivePath(c, CopyPath::kCudaTma, false), CopyPath::kCudaSm);
  EXPECT_EQ(cuda::effectivePath(c, CopyPath::kCudaCe, true), CopyPath::kCudaCe);
  c.src_off = 4;  // not 16-byte aligned: no TMA
  EXPECT_EQ(cuda::effectivePath(c, CopyPath::kCudaTma, true), CopyPath::kCudaSm);
  // Strided rows of the same length on both sides: one 2-D copy-engine call.
  c.src_off = 0;
  c.dst = cuda::DeviceView{a, 8, 100, 128};
  c.src = cuda::DeviceView{b, 8, 100, 256};
  c.bytes = 800;
  EXPECT_EQ(cuda::effectivePath(c, CopyPath::kCudaCe, true), CopyPath::kCudaCe);
  EXPECT_EQ(cuda::effectivePath(c, CopyPath::kCudaTma, true), CopyPath::kCudaSm);
  // Rows of different lengths: the SM kernel.
  c.src = cuda::DeviceView{b, 4, 200, 256};
  EXPECT_EQ(cuda::effectivePath(c, CopyPath::kCudaCe, true), CopyPath::kCudaSm);
  // A contiguous side against whole rows of the other: 2-D copy engine.
  c.src = cuda::deviceView(b, 800);
  EXPECT_EQ(cuda::effectivePath(c, CopyPath::kCudaCe, true), CopyPath::kCudaCe);
  c.dst_off = 50;  // not at a row start
  c.bytes = 700;
  EXPECT_EQ(cuda::effectivePath(c, CopyPath::kCudaCe, true), CopyPath::kCudaSm);
}

TEST(CudaBuild, FeaturesMatchTheBuild) {
  cuda::BuildFeatures f = cuda::buildFeatures();
  EXPECT_FALSE(f.cuda_version.empty());
  EXPECT_FALSE(f.architectures.empty());
  EXPECT_EQ(f.nvshmem, GFDIT_EXPECT_NVSHMEM != 0);
  EXPECT_EQ(f.nvshmem, !f.nvshmem_version.empty());
}

TEST(CudaBuild, TheImageADeviceRunsDecidesTma) {
  // The default targets: SASS for Hopper, PTX for compute_80 elsewhere.
  const std::string def = "90-real,80-virtual";
  EXPECT_EQ(cuda::imageArchFor(def, 90), 90);       // H100/H200: the sm_90 SASS (TMA)
  EXPECT_EQ(cuda::imageArchFor(def, 80), 80);       // A100: the PTX, just in time
  EXPECT_EQ(cuda::imageArchFor(def, 89), 80);       // Ada
  EXPECT_EQ(cuda::imageArchFor(def, 100), 80);      // Blackwell: sm_90 SASS does not run there, PTX 80 does
  EXPECT_EQ(cuda::imageArchFor(def, 75), 0);        // Turing: nothing runs
  EXPECT_EQ(cuda::imageArchFor("90;80", 100), 90);  // PTX 90 (plain "90" has both) beats PTX 80
  EXPECT_EQ(cuda::imageArchFor("80-real;90-virtual", 86), 80);
  EXPECT_EQ(cuda::imageArchFor("native", 90), 0);
}

TEST(CudaBuild, NvshmemIsRefusedWhenNotCompiledIn) {
  if (GFDIT_EXPECT_NVSHMEM) GTEST_SKIP() << "NVSHMEM is compiled in (its bootstrap needs a device)";
  char tmpl[] = "/tmp/gfdit-nvshmem-test-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  {
    gfdit::FileStore store(dir);
    try {
      cuda::NvshmemEdges::create(0, 1, 0, store, "w", std::chrono::seconds(1));
      FAIL() << "created without NVSHMEM";
    } catch (const gfdit::Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidUsage);
    }
  }
  EXPECT_EQ(std::system(("rm -rf " + dir).c_str()), 0);
}

TEST(CudaRuntime, AnswersWithoutADevice) {
  // In a child: this process must not initialise CUDA before the device tests fork.
  std::string failures = gfdit::testing::runInChild([] {
    RANK_CHECK(cuda::deviceCount() >= 0);
    RANK_CHECK(cuda::runtimeVersion() > 0);
  });
  EXPECT_EQ(failures, "");
}
