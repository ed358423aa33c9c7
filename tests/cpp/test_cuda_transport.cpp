// The CUDA transport between forked processes on the device(s) at hand (all ranks share one GPU when there
// is one): IPC exchange, stage/publish/consume on every path and size class, zero-copy heap sends,
// reductions of every dtype and op against the host reference, bounded waits, failure propagation and
// abort. Every test skips without a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/cuda_transport.h"
#include "cuda/ipc.h"
#include "cuda_harness.h"
#include "reduce.h"

using gfdit::BufferView;
using gfdit::CudaTransport;
using gfdit::CudaTransportOptions;
using gfdit::DType;
using gfdit::ErrorCode;
using gfdit::ReduceOp;
using gfdit::SlotUse;
using gfdit::Store;
using gfdit::testing::mix;
using gfdit::testing::runCudaRanks;

namespace {

// Device memory for the life of a rank's test body.
struct DevBuf {
  uint8_t* p = nullptr;
  size_t bytes = 0;
  explicit DevBuf(size_t n) : bytes(n) {
    void* v = nullptr;
    GFDIT_CUDA_CHECK(cudaMalloc(&v, n == 0 ? 1 : n));
    p = static_cast<uint8_t*>(v);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() { cudaFree(p); }
  void upload(const std::vector<uint8_t>& h) {
    GFDIT_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size(), cudaMemcpyHostToDevice));
  }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> h(bytes);
    GFDIT_CUDA_CHECK(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost));
    return h;
  }
};

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { GFDIT_CUDA_CHECK(cudaStreamCreate(&s)); }
  ~Stream() { cudaStreamDestroy(s); }
};

uint8_t pattern(uint64_t seq, uint64_t j) { return static_cast<uint8_t>(mix(seq * 1000003ull + j)); }

// A message of the round-trip test: `bytes` payload bytes, laid out as `rows` rows of `row_bytes`, `stride`
// apart (rows == 0: contiguous) on the sender and as rrows x rrow_bytes / rstride on the receiver.
struct MsgShape {
  size_t bytes;
  size_t rows, row_bytes, stride;
  size_t rrows, rrow_bytes, rstride;
};

std::vector<MsgShape> roundTripShapes(size_t slot_bytes) {
  std::vector<MsgShape> v;
  for (size_t b : {size_t{1}, size_t{15}, size_t{16}, size_t{4099}, size_t{65536}, size_t{65536 + 48},
                   size_t{(1 << 20) + 16}, slot_bytes}) {
    v.push_back(MsgShape{b, 0, 0, 0, 0, 0, 0});
  }
  v.push_back(MsgShape{12800, 64, 200, 256, 64, 200, 320});  // same rows on both sides
  v.push_back(MsgShape{12800, 64, 200, 256, 32, 400, 512});  // different rows
  return v;
}

size_t extent(size_t bytes, size_t rows, size_t row_bytes, size_t stride) {
  return rows == 0 ? bytes : (rows - 1) * stride + row_bytes;
}

BufferView viewOf(uint8_t* p, size_t bytes, size_t rows, size_t row_bytes, size_t stride) {
  return rows == 0 ? BufferView::contiguous(p, bytes) : BufferView::strided(p, rows, row_bytes, stride);
}

// Host image of a (possibly strided) buffer whose payload byte j is pattern(seq, j).
std::vector<uint8_t> image(uint64_t seq, size_t bytes, size_t rows, size_t row_bytes, size_t stride) {
  std::vector<uint8_t> h(extent(bytes, rows, row_bytes, stride), 0xee);
  for (size_t j = 0; j < bytes; ++j) {
    size_t at = rows == 0 ? j : (j / row_bytes) * stride + j % row_bytes;
    h[at] = pattern(seq, j);
  }
  return h;
}

size_t slotOffset(CudaTransport& t, size_t k) { return static_cast<size_t>(t.slot(k) - t.base()); }

void expectError(const std::function<void()>& fn, ErrorCode code, const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const gfdit::Error& e) {
    RANK_CHECK_MSG(e.code() == code, e.what());
    for (const auto& p : parts) RANK_CHECK_MSG(std::string(e.what()).find(p) != std::string::npos, e.what());
    return;
  }
  RANK_CHECK_MSG(false, "no error");
}

CudaTransportOptions baseOptions() {
  CudaTransportOptions o;
  o.timeout = std::chrono::seconds(60);
  o.heap_bytes = size_t{16} << 20;
  return o;
}

}  // namespace

TEST(CudaTransport, OpensEveryPeerRegionAndAllocatesTheHeapSymmetrically) {
  GFDIT_REQUIRE_CUDA_DEVICE();
  for (int n : {2, 4}) {
    CudaTransportOptions o = baseOptions();
    o.slot_bytes = size_t{1} << 20;
    std::string failures = runCudaRanks(
        n,
        [&](int rank, CudaTransport& t, Store& store) {
          RANK_CHECK(t.kind() == gfdit::TransportKind::kCuda);
          RANK_CHECK(t.slotBytes() == (size_t{1} << 20));
          RANK_CHECK(t.numSlots() >= static_cast<size_t>(n - 1) && t.numSlots() >= 2);
          RANK_CHECK(t.peerBase(rank) == t.base());
          for (int p = 0; p < n; ++p) RANK_CHECK(t.peerBase(p) != nullptr);
          RANK_CHECK(t.slot(1) - t.slot(0) == static_cast<std::ptrdiff_t>(t.slotBytes()));
          void* a = t.heapAlloc(1000);
          void* b = t.heapAlloc(5000);
          t.heapFree(a);
          void* c = t.heapAlloc(100);  // first fit: where a was
          RANK_CHECK(t.inHeap(b, 5000) && !t.inHeap(t.slot(0), 1));
          RANK_CHECK(t.heapOffset(c) == 0);
          std::string mine = std::to_string(t.heapOffset(b)) + " " + std::to_string(t.heapOffset(c));
          store.set("heap/" + std::to_string(rank), mine);
          RANK_CHECK(store.get("heap/0") == mine);
          t.synchronize();
        },
        o);
    EXPECT_EQ(failures, "") << "world of " << n;
  }
}

TEST(CudaTransport, StagePublishConsumeRoundTripsOnEveryPathAndSize) {
  GFDIT_REQUIRE_CUDA_DEVICE();
  for (const char* table : {"inf:sm", "inf:tma", "inf:ce", ""}) {
    CudaTransportOptions o = baseOptions();
    o.copy_table = table;
    o.num_slots = 2;  // more messages than slots: every stage after the second waits for its slot's reader
    o.slot_bytes = size_t{4} << 20;
    std::string failures = runCudaRanks(
        2,
        [&](int rank, CudaTransport& t, Store&) {
          Stream s0, s1;  // messages alternate between two streams: the transport keeps them in order
          std::vector<MsgShape> shapes = roundTripShapes(t.slotBytes());
          std::vector<std::unique_ptr<DevBuf>> bufs;
          for (size_t i = 0; i < shapes.size(); ++i) {
            const MsgShape& m = shapes[i];
            uint64_t seq = i + 1;
            size_t k = i % t.numSlots();
            cudaStream_t s = (i % 2) ? s1.s : s0.s;
            if (rank == 0) {
              auto src = std::make_unique<DevBuf>(extent(m.bytes, m.rows, m.row_bytes, m.stride));
              src->upload(image(seq, m.bytes, m.rows, m.row_bytes, m.stride));
              SlotUse prior{1, seq - t.numSlots()};
              t.begin(s);
              t.stage(t.slot(k), viewOf(src->p, m.bytes, m.rows, m.row_bytes, m.stride), 0, m.bytes, &prior,
                      i >= t.numSlots() ? 1 : 0);
              t.publish(1, seq);
              t.end();
              bufs.push_back(std::move(src));
            } else {
              auto dst = std::make_unique<DevBuf>(extent(m.bytes, m.rrows, m.rrow_bytes, m.rstride));
              GFDIT_CUDA_CHECK(cudaMemset(dst->p, 0xee, dst->bytes));
              t.begin(s);
              t.consume(viewOf(dst->p, m.bytes, m.rrows, m.rrow_bytes, m.rstride), 0,
                        BufferView::contiguous(t.peerBase(0) + slotOffset(t, k), m.bytes), 0, m.bytes, 0, seq);
              t.end();
              bufs.push_back(std::move(dst));
            }
          }
          t.synchronize();
          if (rank == 1) {
            for (size_t i = 0; i < shapes.size(); ++i) {
              const MsgShape& m = shapes[i];
              RANK_CHECK_MSG(bufs[i]->download() == image(i + 1, m.bytes, m.rrows, m.rrow_bytes, m.rstride),
                             "message " << i + 1 << " of " << m.bytes << " bytes, table '" << table << "'");
            }
          }
        },
        o);
    EXPECT_EQ(failures, "") << "table '" << table << "'";
  }
}

TEST(CudaTransport, ZeroCopyHeapSendsWaitForTheReaderBeforeTheBytesChange) {
  GFDIT_REQUIRE_CUDA_DEVICE();
  const size_t bytes = (size_t{1} << 20) + 8;
  const int rounds = 4;
  std::string failures = runCudaRanks(
      2,
      [&](int rank, CudaTransport& t, Store&) {
        Stream s;
        uint8_t* h = static_cast<uint8_t*>(t.heapAlloc(bytes));  // the same offset on both ranks
        if (rank == 0) {
          std::vector<void*> host(rounds);
          for (int r = 0; r < rounds; ++r) {
            GFDIT_CUDA_CHECK(cudaMallocHost(&host[r], bytes));
            std::vector<uint8_t> img = image(100 + r, bytes, 0, 0, 0);
            std::memcpy(host[r], img.data(), bytes);
          }
          for (int r = 0; r < rounds; ++r) {
            uint64_t seq = r + 1;
            t.begin(s.s);
            // Rewriting the heap tensor is ordered after the previous round's awaitConsumed.
            GFDIT_CUDA_CHECK(cudaMemcpyAsync(h, host[r], bytes, cudaMemcpyHostToDevice, s.s));
            t.publish(1, seq);
            t.awaitConsumed(1, seq);
            t.end();
          }
          t.synchronize();
          for (void* p : host) cudaFreeHost(p);
        } else {
          std::vector<std::unique_ptr<DevBuf>> dst;
          const uint8_t* src = t.peerBase(0) + (h - t.base());
          for (int r = 0; r < rounds; ++r) {
            dst.push_back(std::make_unique<DevBuf>(bytes));
            t.begin(s.s);
            t.consume(BufferView::contiguous(dst.back()->p, bytes), 0,
                      BufferView::contiguous(const_cast<uint8_t*>(src), bytes), 0, bytes, 0, r + 1);
            t.end();
          }
          t.synchronize();
          for (int r = 0; r < rounds; ++r) {
            RANK_CHECK_MSG(dst[r]->download() == image(100 + r, bytes, 0, 0, 0), "round " << r);
          }
        }
      },
      baseOptions());
  EXPECT_EQ(failures, "");
}

namespace {

// Rank r's contribution for case c: values that exercise NaN propagation (floats), wrap-around (integer
// sums and products) and rounding (16-bit floats).
std::vector<uint8_t> contribution(int rank, int c, DType dtype, size_t count) {
  size_t es = gfdit::dtypeSize(dtype);
  std::vector<uint8_t> out(count * es);
  for (size_t i = 0; i < count; ++i) {
    uint64_t x = mix((static_cast<uint64_t>(c) << 40) ^ (static_cast<uint64_t>(rank) << 32) ^ i);
    double f = (static_cast<double>(x >> 11) / 9007199254740992.0) * 8.0 - 4.0;
    bool nan = i % 97 == static_cast<size_t>(rank) * 7;
    void* at = out.data() + i * es;
    switch (dtype) {
      case DType::kFloat32: {
        float v = nan ? std::nanf("") : static_cast<float>(f);
        std::memcpy(at, &v, 4);
        break;
      }
      case DType::kFloat64: {
        double v = nan ? std::nan("") : f * 1e3;
        std::memcpy(at, &v, 8);
        break;
      }
      case DType::kFloat16: {
        uint16_t v = gfdit::reduce::floatToHalf(nan ? std::nanf("") : static_cast<float>(f));
        std::memcpy(at, &v, 2);
        break;
      }
      case DType::kBFloat16: {
        uint16_t v = gfdit::reduce::floatToBf16(nan ? std::nanf("") : static_cast<float>(f * 100));
        std::memcpy(at, &v, 2);
        break;
      }
      case DType::kInt32: {
        int32_t v = static_cast<int32_t>(static_cast<uint32_t>(x));
        std::memcpy(at, &v, 4);
        break;
      }
      case DType::kInt64: {
        int64_t v = static_cast<int64_t>(x);
        std::memcpy(at, &v, 8);
        break;
      }
      case DType::kUInt8: out[i] = static_cast<uint8_t>(x); break;
    }
  }
  return out;
}

// reduce.cpp's arithmetic: start from contribs[first], apply the others in member order.
std::vector<uint8_t> hostReduce(const std::vector<std::vector<uint8_t>>& contribs, int first, DType dtype, ReduceOp op,
                                size_t count) {
  std::vector<uint8_t> acc(count * gfdit::reduce::accElemSize(dtype) + 16);
  gfdit::reduce::accInit(acc.data(), contribs[first].data(), count, dtype);
  for (size_t j = 0; j < contribs.size(); ++j) {
    if (static_cast<int>(j) != first) gfdit::reduce::accApply(acc.data(), contribs[j].data(), count, dtype, op);
  }
  std::vector<uint8_t> out(count * gfdit::dtypeSize(dtype));
  gfdit::reduce::accStore(out.data(), acc.data(), count, dtype);
  return out;
}

// Whether element i of a buffer of `dtype` is a NaN.
bool isNan(const std::vector<uint8_t>& b, size_t i, DType dtype) {
  const uint8_t* at = b.data() + i * gfdit::dtypeSize(dtype);
  switch (dtype) {
    case DType::kFloat32: {
      float v;
      std::memcpy(&v, at, 4);
      return std::isnan(v);
    }
    case DType::kFloat64: {
      double v;
      std::memcpy(&v, at, 8);
      return std::isnan(v);
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      uint16_t v;
      std::memcpy(&v, at, 2);
      return std::isnan(dtype == DType::kFloat16 ? gfdit::reduce::halfToFloat(v) : gfdit::reduce::bf16ToFloat(v));
    }
    default: return false;
  }
}

// "" when got equals want bit for bit, a NaN against any NaN aside: a NaN's payload is not part of the
// result (the device's arithmetic returns its canonical NaN where the host's keeps an operand's). Else the
// number of elements that differ and the first one, as bytes.
std::string reductionMismatch(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, DType dtype) {
  if (got.size() != want.size()) {
    return "got " + std::to_string(got.size()) + " bytes, want " + std::to_string(want.size());
  }
  size_t es = gfdit::dtypeSize(dtype);
  size_t count = got.size() / es, differ = 0, first = 0;
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(got.data() + i * es, want.data() + i * es, es) == 0) continue;
    if (isNan(got, i, dtype) && isNan(want, i, dtype)) continue;
    if (differ++ == 0) first = i;
  }
  if (differ == 0) return "";
  std::ostringstream os;
  os << differ << " of " << count << " elements differ, first [" << first << "]: got 0x"
     << gfdit::cuda::hexEncode(got.data() + first * es, es) << ", want 0x"
     << gfdit::cuda::hexEncode(want.data() + first * es, es) << " (bytes in memory order)";
  return os.str();
}

}  // namespace

TEST(CudaTransport, ReducesEveryDtypeAndOpLikeTheHost) {
  GFDIT_REQUIRE_CUDA_DEVICE();
  const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt32,
                          DType::kInt64,   DType::kUInt8,   DType::kFloat64};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kProd};
  const size_t count = 4099;  // vectors and a tail
  for (int n : {2, 3}) {
    CudaTransportOptions o = baseOptions();
    o.num_slots = 4;  // 28 cases: slots are reused, after their readers
    o.slot_bytes = size_t{1} << 20;
    std::string failures = runCudaRanks(
        n,
        [&](int rank, CudaTransport& t, Store&) {
          Stream s;
          struct Case {
            DType dtype;
            ReduceOp op;
            int first;
            std::unique_ptr<DevBuf> own, out;
          };
          std::vector<Case> cases;
          int c = 0;
          for (DType d : dtypes) {
            for (ReduceOp op : ops) {
              uint64_t seq = c + 1;
              size_t bytes = count * gfdit::dtypeSize(d);
              size_t k = c % t.numSlots();
              Case cs{d, op, 0, std::make_unique<DevBuf>(bytes), nullptr};
              cs.own->upload(contribution(rank, c, d, count));
              bool in_place = c % 2 == 1;  // out is our own block, the reduction starts from it
              cs.first = in_place ? rank : 0;
              if (!in_place) cs.out = std::make_unique<DevBuf>(bytes);
              uint8_t* out = in_place ? cs.own->p : cs.out->p;
              std::vector<SlotUse> prior, arrivals;
              std::vector<const uint8_t*> contribs(n);
              for (int p = 0; p < n; ++p) {
                if (p == rank) continue;
                if (c >= static_cast<int>(t.numSlots())) prior.push_back(SlotUse{p, seq - t.numSlots()});
                arrivals.push_back(SlotUse{p, seq});
                contribs[p] = t.peerBase(p) + slotOffset(t, k);
              }
              contribs[rank] = cs.own->p;
              t.begin(s.s);
              t.stage(t.slot(k), BufferView::contiguous(cs.own->p, bytes), 0, bytes, prior.data(),
                      static_cast<int>(prior.size()));
              for (int p = 0; p < n; ++p) {
                if (p != rank) t.publish(p, seq);
              }
              t.reduce(out, contribs.data(), n, cs.first, count, d, op, true, arrivals.data(),
                       static_cast<int>(arrivals.size()));
              for (int p = 0; p < n; ++p) {
                if (p != rank) t.consumed(p, seq);
              }
              t.end();
              cases.push_back(std::move(cs));
              ++c;
            }
          }
          t.synchronize();
          for (size_t i = 0; i < cases.size(); ++i) {
            const Case& cs = cases[i];
            std::vector<std::vector<uint8_t>> all;
            for (int p = 0; p < n; ++p) all.push_back(contribution(p, static_cast<int>(i), cs.dtype, count));
            std::vector<uint8_t> want = hostReduce(all, cs.first, cs.dtype, cs.op, count);
            std::vector<uint8_t> got = (cs.out ? cs.out : cs.own)->download();
            std::string mismatch = reductionMismatch(got, want, cs.dtype);
            RANK_CHECK_MSG(mismatch.empty(), gfdit::dtypeName(cs.dtype)
                                                 << " " << gfdit::reduceOpName(cs.op) << " from member " << cs.first
                                                 << " (world " << n << "): " << mismatch);
          }
        },
        o);
    EXPECT_EQ(failures, "") << "world of " << n;
  }
}

TEST(CudaTransport, AWaitTimesOutNamingTheEdgeAndItsPeerFailsAtOnce) {
  GFDIT_REQUIRE_CUDA_DEVICE();
  CudaTransportOptions o = baseOptions();
  o.timeout = std::chrono::milliseconds(300);
  std::string failures = runCudaRanks(
      2,
      [&](int rank, CudaTransport& t, Store& store) {
        Stream s;
        DevBuf dst(64);
        if (rank == 1) {
          // Message 1 from rank 0 never comes.
          t.begin(s.s);
          t.consume(BufferView::contiguous(dst.p, 64), 0, BufferView::contiguous(t.peerBase(0) + slotOffset(t, 0), 64),
                    0, 64, 0, 1);
          t.end();
          expectError([&] { t.synchronize(); }, ErrorCode::kTimeout, {"edge 0->1", "message 1", "consume"});
          expectError([&] { t.begin(s.s); }, ErrorCode::kTimeout, {"edge 0->1"});  // sticky
        } else {
          // Rank 0 waits for rank 1 to read a message with a long bound: rank 1's failure ends it first.
          t.setTimeout(std::chrono::seconds(30));
          auto start = std::chrono::steady_clock::now();
          t.begin(s.s);
          t.awaitConsumed(1, 1);
          t.end();
          expectError([&] { t.synchronize(); }, ErrorCode::kRemoteError, {"rank 1's transport failed", "edge 0->1"});
          RANK_CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
        }
        gfdit::testing::storeBarrier(store, "checked", rank, 2);
      },
      o);
  EXPECT_EQ(failures, "");
}

TEST(CudaTransport, AbortEndsAWaitInFlight) {
  GFDIT_REQUIRE_CUDA_DEVICE();
  std::string failures = runCudaRanks(
      2,
      [&](int rank, CudaTransport& t, Store& store) {
        if (rank == 0) {
          Stream s;
          DevBuf dst(64);
          t.begin(s.s);
          t.consume(BufferView::contiguous(dst.p, 64), 0, BufferView::contiguous(t.peerBase(1) + slotOffset(t, 0), 64),
                    0, 64, 1, 1);
          t.end();
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          auto start = std::chrono::steady_clock::now();
          t.abort();
          expectError([&] { t.synchronize(); }, ErrorCode::kRemoteError, {"aborted"});
          RANK_CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
        }
        gfdit::testing::storeBarrier(store, "aborted", rank, 2);
      },
      baseOptions());
  EXPECT_EQ(failures, "");
}

TEST(CudaCopyTable, MeasuresEveryPathOnTheDevice) {
  GFDIT_REQUIRE_CUDA_DEVICE();
  std::string failures = gfdit::testing::runInChild([] {
    gfdit::cuda::CopyMeasurement m = gfdit::cuda::measureCopyTable(0, 4096, size_t{4} << 20, 3);
    RANK_CHECK(m.timings.size() == 6);  // 4 KiB .. 4 MiB in steps of 4
    for (const auto& row : m.timings) RANK_CHECK(row.sm_us > 0 && row.ce_us > 0);
    gfdit::CopySelector sel = gfdit::CopySelector::parse(m.table);
    RANK_CHECK(sel.isDevice());
    RANK_CHECK_MSG(sel.pick(4096) == m.timings.front().best, m.table);
  });
  EXPECT_EQ(failures, "");
}
