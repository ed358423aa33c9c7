// Every collective on forked ranks against values each rank computes independently.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "protocol.h"
#include "rank_harness.h"
#include "scoped_env.h"

using namespace gfdit;
using gfdit::testing::mix;
using gfdit::testing::runRanks;
using gfdit::testing::ScopedEnv;

namespace {

// A value rank r contributes at index i of instance `tag`.
int64_t val(uint64_t tag, int r, size_t i) { return static_cast<int64_t>(mix(tag * 1000003 + r * 7919 + i) % 100000); }

// Sizes around the staging slot (small slot so that chunking and ring reuse happen often).
const size_t kSizes[] = {0, 1, 7, 1000, 4096, 4096 * 3 + 5, 100000};

WorldOptions smallSlots() {
  WorldOptions o;
  o.slot_bytes = 4096;
  o.num_slots = 4;
  o.timeout = std::chrono::seconds(30);
  o.heap_bytes = 8 << 20;
  return o;
}

void allGatherCase(World& w, bool heap_input) {
  Group g = w.worldGroup();
  int n = w.size();
  for (size_t count : kSizes) {
    std::vector<int64_t> buf(count);
    int64_t* in = buf.data();
    if (heap_input) in = static_cast<int64_t*>(w.heapAlloc(count * 8));
    for (size_t i = 0; i < count; ++i) in[i] = val(count, w.rank(), i);
    std::vector<int64_t> out(count * n + 1, -1);
    w.allGather(g, in, out.data(), count * 8);
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) RANK_CHECK(out[r * count + i] == val(count, r, i));
    }
    RANK_CHECK(out[count * n] == -1);
    if (heap_input) w.heapFree(in);
  }
}

}  // namespace

// A world of `ranks` ranks, its nodes emulated over the network or not: with `net`, ranks alternate between two
// nodes (0, 1, 0, 1, ...) that talk over the network (GFDIT_NET_EDGES=nodes, NOTE [network edges]), so one world
// mixes edges in shared memory and edges over TCP.
struct Edges {
  int ranks;
  bool net;
};

void PrintTo(const Edges& e, std::ostream* os) { *os << e.ranks << (e.net ? " ranks, network edges" : " ranks"); }

class Collectives : public ::testing::TestWithParam<Edges> {
 protected:
  void SetUp() override {
    if (!GetParam().net) return;
    std::string ids;
    for (int r = 0; r < GetParam().ranks; ++r) ids += (r ? "," : "") + std::to_string(r % 2);
    node_ids_ = std::make_unique<gfdit::testing::ScopedEnv>("GFDIT_NODE_IDS", ids.c_str());
    net_edges_ = std::make_unique<gfdit::testing::ScopedEnv>("GFDIT_NET_EDGES", "nodes");
  }
  int ranks() const { return GetParam().ranks; }

 private:
  std::unique_ptr<gfdit::testing::ScopedEnv> node_ids_;
  std::unique_ptr<gfdit::testing::ScopedEnv> net_edges_;
};

TEST_P(Collectives, AllGather) {
  EXPECT_EQ(runRanks(ranks(), [](World& w) { allGatherCase(w, false); }, smallSlots()), "");
}

TEST_P(Collectives, AllGatherFromHeap) {
  EXPECT_EQ(runRanks(
                ranks(),
                [](World& w) {
                  allGatherCase(w, true);
                  RANK_CHECK(w.size() == 1 || w.stats().zero_copy_sends > 0);
                },
                smallSlots()),
            "");
}

TEST_P(Collectives, AllToAll) {
  EXPECT_EQ(runRanks(
                ranks(),
                [](World& w) {
                  Group g = w.worldGroup();
                  int n = w.size(), me = w.rank();
                  for (size_t count : kSizes) {
                    std::vector<int64_t> in(count * n), out(count * n, -1);
                    for (int j = 0; j < n; ++j)
                      for (size_t i = 0; i < count; ++i) in[j * count + i] = val(count + j, me, i);
                    w.allToAll(g, in.data(), out.data(), count * 8);
                    for (int j = 0; j < n; ++j)
                      for (size_t i = 0; i < count; ++i) RANK_CHECK(out[j * count + i] == val(count + me, j, i));
                  }
                },
                smallSlots()),
            "");
}

TEST_P(Collectives, AllToAllStridedViews) {
  // The Ulysses shuffle: [S_local, H, D] -> [S, H/n, D], expressed as strided views.
  EXPECT_EQ(runRanks(
                ranks(),
                [](World& w) {
                  Group g = w.worldGroup();
                  int n = w.size(), me = w.rank();
                  const size_t s_local = 37, hn = 3, d = 5, h = hn * n;
                  std::vector<int32_t> in(s_local * h * d), out(s_local * n * hn * d, -1);
                  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int32_t>(val(1, me, i));
                  std::vector<BufferView> ins(n), outs(n);
                  for (int j = 0; j < n; ++j) {
                    ins[j] = BufferView::strided(in.data() + j * hn * d, s_local, hn * d * 4, h * d * 4);
                    outs[j] = BufferView::contiguous(out.data() + j * s_local * hn * d, s_local * hn * d * 4);
                  }
                  w.allToAllV(g, ins.data(), outs.data());
                  for (int j = 0; j < n; ++j)
                    for (size_t s = 0; s < s_local; ++s)
                      for (size_t k = 0; k < hn * d; ++k) {
                        size_t src_idx = s * h * d + me * hn * d + k;
                        RANK_CHECK(out[(j * s_local + s) * hn * d + k] == static_cast<int32_t>(val(1, j, src_idx)));
                      }
                },
                smallSlots()),
            "");
}

TEST_P(Collectives, ReduceScatterAndAllReduce) {
  EXPECT_EQ(runRanks(
                ranks(),
                [](World& w) {
                  Group g = w.worldGroup();
                  int n = w.size(), me = w.rank();
                  for (size_t count : kSizes) {
                    for (bool heap : {false, true}) {
                      // reduce_scatter, int64 sum and float32 max (exact in both cases)
                      std::vector<int64_t> in_vec(count * n);
                      int64_t* in = heap ? static_cast<int64_t*>(w.heapAlloc(count * n * 8)) : in_vec.data();
                      for (size_t i = 0; i < count * n; ++i) in[i] = val(count, me, i);
                      std::vector<int64_t> out(count);
                      w.reduceScatter(g, in, out.data(), count, DType::kInt64, ReduceOp::kSum);
                      for (size_t i = 0; i < count; ++i) {
                        int64_t expect = 0;
                        for (int r = 0; r < n; ++r) expect += val(count, r, me * count + i);
                        RANK_CHECK(out[i] == expect);
                      }
                      // all_reduce in place, including a count not divisible by n
                      size_t ar = count * n + 1;
                      std::vector<float> data_vec(ar);
                      float* data = heap ? static_cast<float*>(w.heapAlloc(ar * 4)) : data_vec.data();
                      for (size_t i = 0; i < ar; ++i) data[i] = static_cast<float>(val(ar, me, i));
                      w.allReduce(g, data, ar, DType::kFloat32, ReduceOp::kMax);
                      for (size_t i = 0; i < ar; ++i) {
                        float expect = -1;
                        for (int r = 0; r < n; ++r) expect = std::max(expect, static_cast<float>(val(ar, r, i)));
                        RANK_CHECK(data[i] == expect);
                      }
                      if (heap) {
                        w.heapFree(in);
                        w.heapFree(data);
                      }
                    }
                  }
                },
                smallSlots()),
            "");
}

TEST_P(Collectives, AllReduceGivesIdenticalBitsEverywhere) {
  EXPECT_EQ(runRanks(
                ranks(),
                [](World& w) {
                  Group g = w.worldGroup();
                  int n = w.size();
                  for (size_t count : {size_t{100}, size_t{50000}}) {
                    std::vector<float> data(count);
                    for (size_t i = 0; i < count; ++i)
                      data[i] = static_cast<float>(val(count, w.rank(), i)) * 1e-3f + 0.1f;
                    w.allReduce(g, data.data(), count, DType::kFloat32, ReduceOp::kSum);
                    std::vector<float> all(count * n);
                    w.allGather(g, data.data(), all.data(), count * 4);
                    for (int r = 0; r < n; ++r)
                      RANK_CHECK(std::memcmp(all.data() + r * count, data.data(), count * 4) == 0);
                    for (size_t i = 0; i < count; ++i) {
                      double expect = 0;
                      for (int r = 0; r < n; ++r) expect += static_cast<float>(val(count, r, i)) * 1e-3f + 0.1f;
                      RANK_CHECK(std::fabs(data[i] - expect) <= 1e-5 * std::fabs(expect) + 1e-6);
                    }
                  }
                },
                smallSlots()),
            "");
}

TEST_P(Collectives, BroadcastSendRecvBarrier) {
  EXPECT_EQ(runRanks(
                ranks(),
                [](World& w) {
                  Group g = w.worldGroup();
                  int n = w.size(), me = w.rank();
                  for (int root = 0; root < n; ++root) {
                    for (size_t count : kSizes) {
                      std::vector<int64_t> data(count);
                      for (size_t i = 0; i < count; ++i) data[i] = me == root ? val(count, root, i) : -1;
                      w.broadcast(g, data.data(), count * 8, root);
                      for (size_t i = 0; i < count; ++i) RANK_CHECK(data[i] == val(count, root, i));
                    }
                  }
                  // A ring of point-to-point messages: even ranks send first.
                  if (n > 1) {
                    std::vector<int64_t> out(20000), in(20000);
                    for (size_t i = 0; i < out.size(); ++i) out[i] = val(5, me, i);
                    int next = (me + 1) % n, prev = (me + n - 1) % n;
                    if (me % 2 == 0) {
                      w.send(out.data(), out.size() * 8, next);
                      w.recv(in.data(), in.size() * 8, prev);
                    } else {
                      w.recv(in.data(), in.size() * 8, prev);
                      w.send(out.data(), out.size() * 8, next);
                    }
                    for (size_t i = 0; i < in.size(); ++i) RANK_CHECK(in[i] == val(5, prev, i));
                  }
                  for (int i = 0; i < 100; ++i) w.barrier(g);
                },
                smallSlots()),
            "");
}

TEST_P(Collectives, PutWithSignal) {
  EXPECT_EQ(runRanks(
                ranks(),
                [](World& w) {
                  int n = w.size(), me = w.rank();
                  if (n == 1) return;
                  const size_t count = 3000;
                  // Symmetric: every rank allocates the same block first, so offsets agree.
                  auto* box = static_cast<int64_t*>(w.heapAlloc(count * 8 * n));
                  std::vector<int64_t> mine(count);
                  for (size_t i = 0; i < count; ++i) mine[i] = val(9, me, i);
                  for (int p = 0; p < n; ++p) {
                    if (p != me) w.putWithSignal(p, mine.data(), count * 8, w.heapOffset(box + me * count));
                  }
                  for (int p = 0; p < n; ++p) {
                    if (p == me) continue;
                    w.waitSignal(p, 1);
                    for (size_t i = 0; i < count; ++i) RANK_CHECK(box[p * count + i] == val(9, p, i));
                  }
                  w.barrier(w.worldGroup());
                  w.heapFree(box);
                },
                smallSlots()),
            "");
}

TEST_P(Collectives, DefaultSlotsLargeMessages) {
  EXPECT_EQ(runRanks(ranks(),
                     [](World& w) {
                       Group g = w.worldGroup();
                       int n = w.size();
                       size_t count = (3 << 20) / 8 + 17;  // > one 256 KiB slot, many chunks
                       std::vector<int64_t> in(count), out(count * n);
                       for (size_t i = 0; i < count; ++i) in[i] = val(2, w.rank(), i);
                       w.allGather(g, in.data(), out.data(), count * 8);
                       for (int r = 0; r < n; ++r)
                         for (size_t i = 0; i < count; i += 97) RANK_CHECK(out[r * count + i] == val(2, r, i));
                       w.allReduce(g, in.data(), count, DType::kInt64, ReduceOp::kSum);
                       for (size_t i = 0; i < count; i += 101) {
                         int64_t e = 0;
                         for (int r = 0; r < n; ++r) e += val(2, r, i);
                         RANK_CHECK(in[i] == e);
                       }
                     }),
            "");
}

TEST_P(Collectives, ProdNaNWrapAndAliasing) {
  EXPECT_EQ(
      runRanks(
          ranks(),
          [](World& w) {
            Group g = w.worldGroup();
            int n = w.size(), me = w.rank();
            const size_t count = 3000;  // past one 4 KiB slot: the reduce-scatter + all-gather path too
            // prod: factors of +-1 and 2, so every product is exact in float32 and int64.
            auto factor = [](int r, size_t i) {
              return ((r + i) % 3 == 0 ? -1.0f : 1.0f) * ((r + i) % 5 == 0 ? 2.0f : 1.0f);
            };
            std::vector<float> f(count);
            std::vector<int64_t> l(count);
            for (size_t i = 0; i < count; ++i) {
              f[i] = factor(me, i);
              l[i] = static_cast<int64_t>(factor(me, i));
            }
            w.allReduce(g, f.data(), count, DType::kFloat32, ReduceOp::kProd);
            w.allReduce(g, l.data(), count, DType::kInt64, ReduceOp::kProd);
            for (size_t i = 0; i < count; ++i) {
              float expect = 1;
              for (int r = 0; r < n; ++r) expect *= factor(r, i);
              RANK_CHECK(f[i] == expect && l[i] == static_cast<int64_t>(expect));
            }
            std::vector<float> in(count * n), out(count);
            for (size_t i = 0; i < in.size(); ++i) in[i] = factor(me, i);
            w.reduceScatter(g, in.data(), out.data(), count, DType::kFloat32, ReduceOp::kProd);
            for (size_t i = 0; i < count; ++i) {
              float expect = 1;
              for (int r = 0; r < n; ++r) expect *= factor(r, me * count + i);
              RANK_CHECK(out[i] == expect);
            }
            // max/min: a NaN on the last rank reaches every rank; int32 sums wrap around.
            std::vector<float> m(count, static_cast<float>(me));
            if (me == n - 1) m[7] = std::nanf("");
            std::vector<float> mn(m);
            w.allReduce(g, m.data(), count, DType::kFloat32, ReduceOp::kMax);
            w.allReduce(g, mn.data(), count, DType::kFloat32, ReduceOp::kMin);
            RANK_CHECK(std::isnan(m[7]) && std::isnan(mn[7]));
            RANK_CHECK(m[8] == static_cast<float>(n - 1) && mn[8] == 0.0f);
            std::vector<int32_t> big(5, INT32_MAX);
            w.allReduce(g, big.data(), 5, DType::kInt32, ReduceOp::kSum);
            RANK_CHECK(big[0] == static_cast<int32_t>(static_cast<uint32_t>(INT32_MAX) * static_cast<uint32_t>(n)));
            // An output over another member's block of the input is refused (before any message, so the
            // world stays usable); this rank's own block in place is fine.
            if (n > 1) {
              int other = (me + 1) % n;
              bool refused = false;
              try {
                w.reduceScatter(g, in.data(), in.data() + other * count + 1, count, DType::kFloat32, ReduceOp::kSum);
              } catch (const Error& e) {
                refused = e.code() == ErrorCode::kInvalidUsage &&
                          std::string(e.what()).find("overlaps the input") != std::string::npos;
              }
              RANK_CHECK(refused);
            }
            for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(val(1, me, i) % 100);
            w.reduceScatter(g, in.data(), in.data() + me * count, count, DType::kFloat32, ReduceOp::kSum);
            for (size_t i = 0; i < count; i += 13) {
              float expect = 0;
              for (int r = 0; r < n; ++r) expect += static_cast<float>(val(1, r, me * count + i) % 100);
              RANK_CHECK(in[me * count + i] == expect);
            }
          },
          smallSlots()),
      "");
}

TEST_P(Collectives, OverlappingOutputsSizesAndPutBoundsAreRefused) {
  EXPECT_EQ(runRanks(
                ranks(),
                [](World& w) {
                  Group g = w.worldGroup();
                  int n = w.size(), me = w.rank();
                  const size_t block = 5000;  // past one small slot: chunks staged while peers already read
                  auto refused = [](auto&& call, const char* what) {
                    try {
                      call();
                    } catch (const Error& e) {
                      return e.code() == ErrorCode::kInvalidUsage &&
                             std::string(e.what()).find(what) != std::string::npos;
                    }
                    return false;
                  };
                  std::vector<uint8_t> buf(block * n), other(block * n);
                  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(val(2, me, i));
                  if (n > 1) {
                    // all_to_all in place: every other block would be overwritten while its peer reads it
                    RANK_CHECK(refused([&] { w.allToAll(g, buf.data(), buf.data(), block); }, "overlaps input block"));
                    // all_gather whose input sits in another member's output block
                    int next = (me + 1) % n;
                    RANK_CHECK(refused([&] { w.allGather(g, buf.data() + next * block, buf.data(), block); },
                                       "overlaps input block"));
                    // members asking for different sizes get no symmetric block (on every member alike)
                    RANK_CHECK(refused([&] { w.symmetricAlloc(g, 4096 * (me + 1)); }, "different sizes"));
                    // a put whose offset + size wraps around is refused, not sent
                    int peer = (me + 1) % n;
                    RANK_CHECK(refused([&] { w.putWithSignal(peer, buf.data(), 16, SIZE_MAX - 8); }, "overruns"));
                  }
                  // The refusals came before any message: the world still works, in place where it is allowed.
                  RANK_CHECK(w.usable());
                  w.allGather(g, buf.data() + me * block, buf.data(), block);
                  for (int r = 0; r < n; ++r) {
                    for (size_t i = 0; i < block; i += 97) {
                      RANK_CHECK(buf[r * block + i] == static_cast<uint8_t>(val(2, r, r * block + i)));
                    }
                  }
                  void* p = w.symmetricAlloc(g, 4096);
                  w.heapFree(p);
                },
                smallSlots()),
            "");
}

TEST_P(Collectives, SymmetricAllocAgreesAfterHeapsDiverged) {
  EXPECT_EQ(runRanks(
                ranks(),
                [](World& w) {
                  Group g = w.worldGroup();
                  int n = w.size(), me = w.rank();
                  // Each rank allocates a different amount first (as receivers of migrations do): first fit
                  // now gives different offsets on different ranks.
                  std::vector<void*> skew;
                  for (int i = 0; i <= me; ++i) skew.push_back(w.heapAlloc(1000 + 3000 * me));
                  for (int round = 0; round < 3; ++round) {
                    void* p = w.symmetricAlloc(g, 50000);
                    int64_t off = static_cast<int64_t>(w.heapOffset(p));
                    std::vector<int64_t> all(n);
                    w.allGather(g, &off, all.data(), sizeof(off));
                    for (int r = 0; r < n; ++r) RANK_CHECK_MSG(all[r] == off, "rank " << r << " at " << all[r]);
                    // One-sided puts can address the peer's copy by the local offset now.
                    if (n > 1) {
                      int peer = (me + 1) % n;
                      int64_t v = 1000 * me + round;
                      w.putWithSignal(peer, &v, sizeof(v), static_cast<size_t>(off));
                      w.waitSignal((me + n - 1) % n);
                      RANK_CHECK(*static_cast<int64_t*>(p) == 1000 * ((me + n - 1) % n) + round);
                      w.barrier(g);
                    }
                    if (round == 1) w.heapFree(p);  // keep some, free some: the heaps stay different
                  }
                  // No common room: the same error on every member, and the world stays usable.
                  bool refused = false;
                  try {
                    w.symmetricAlloc(g, w.options().heap_bytes);
                  } catch (const Error& e) {
                    refused = e.code() == ErrorCode::kInvalidUsage &&
                              std::string(e.what()).find("on every member") != std::string::npos;
                  }
                  RANK_CHECK(refused);
                  w.barrier(g);
                  for (void* p : skew) w.heapFree(p);
                },
                smallSlots()),
            "");
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Collectives,
                         ::testing::Values(Edges{1, false}, Edges{2, false}, Edges{3, false}, Edges{4, false}),
                         [](const ::testing::TestParamInfo<Edges>& i) { return std::to_string(i.param.ranks); });
INSTANTIATE_TEST_SUITE_P(NetworkEdges, Collectives, ::testing::Values(Edges{2, true}, Edges{3, true}, Edges{4, true}),
                         [](const ::testing::TestParamInfo<Edges>& i) { return std::to_string(i.param.ranks); });

TEST(Collectives, SubgroupsInAnyOrder) {
  EXPECT_EQ(runRanks(4,
                     [](World& w) {
                       int me = w.rank();
                       int a[] = {2, 0}, b[] = {3, 1, 2};
                       if (me == 0 || me == 2) {
                         Group g = w.newGroup(a, 2);
                         int64_t in = 100 + me, out[2] = {};
                         w.allGather(g, &in, out, 8);
                         RANK_CHECK(out[0] == 102 && out[1] == 100);  // group order, not rank order
                       }
                       if (me != 0) {
                         Group g = w.newGroup(b, 3);
                         int64_t x = me;
                         w.allReduce(g, &x, 1, DType::kInt64, ReduceOp::kSum);
                         RANK_CHECK(x == 6);
                       }
                     }),
            "");
}

TEST(Collectives, WaitsAdaptWhereEveryRankHasACoreUnlessFixed) {
  using std::chrono::microseconds;
  auto expect = [](const core::SpinPolicy& p, bool adaptive, int spin_us, int yield_us, const char* what) {
    EXPECT_EQ(p.adaptive(), adaptive) << what;
    EXPECT_EQ(p.current().spin, microseconds(spin_us)) << what;
    EXPECT_EQ(p.current().yield, microseconds(yield_us)) << what;
  };
  {
    ScopedEnv a("GFDIT_SPIN_US", nullptr), b("GFDIT_YIELD_US", nullptr);
    expect(protocol::hostSpinPolicy(2, 2, -1), true, 1000, 0, "a core per rank: adaptive, from 1 ms");
    expect(protocol::hostSpinPolicy(3, 2, -1), false, 2, 300, "more ranks than cores: brief spin, then yield");
    expect(protocol::hostSpinPolicy(2, 2, 5), false, 5, 0, "WorldOptions::spin_us fixes the spin");
    core::SpinPolicy p = protocol::hostSpinPolicy(4, 8, -1);
    p.observe(core::SpinPolicy::kBusyPreemptions, core::SpinPolicy::Clock::now());
    expect(p, true, 2, 0, "preempted often: the floor is what a rank sharing its core spins");
  }
  {
    ScopedEnv a("GFDIT_SPIN_US", "7"), b("GFDIT_YIELD_US", nullptr);
    expect(protocol::hostSpinPolicy(2, 2, -1), false, 7, 0, "GFDIT_SPIN_US fixes the waits");
  }
  {
    ScopedEnv a("GFDIT_SPIN_US", nullptr), b("GFDIT_YIELD_US", "9");
    expect(protocol::hostSpinPolicy(2, 2, -1), false, 1000, 9, "GFDIT_YIELD_US fixes the waits too");
  }
}
