// Thousands of collective instances over random overlapping groups, one global order; each rank runs
// the instances it belongs to. Small staging slots make chunking and ring reuse constant.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "rank_harness.h"

using namespace gfdit;
using gfdit::testing::mix;
using gfdit::testing::runRanks;

namespace {

int64_t val(uint64_t inst, int r, size_t i) { return static_cast<int64_t>(mix(inst * 7777 + r * 131 + i) % 1000); }

struct Instance {
  int op;
  std::vector<int> ranks;
  size_t count;
  int root_idx;
};

std::vector<Instance> drawInstances(int world, int num, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Instance> out;
  std::vector<int> all(world);
  for (int i = 0; i < world; ++i) all[i] = i;
  for (int k = 0; k < num; ++k) {
    Instance in;
    in.op = static_cast<int>(rng() % 4);
    std::shuffle(all.begin(), all.end(), rng);
    int size = 2 + static_cast<int>(rng() % (world - 1));
    in.ranks.assign(all.begin(), all.begin() + size);
    in.count = (rng() % 10 == 0) ? 3000 + rng() % 5000 : rng() % 64;  // some exceed a 4 KiB slot
    in.root_idx = static_cast<int>(rng() % size);
    out.push_back(in);
  }
  return out;
}

void runStress(World& w, const std::vector<Instance>& instances) {
  int me = w.rank();
  std::vector<int64_t> a, b;
  for (size_t k = 0; k < instances.size(); ++k) {
    const Instance& in = instances[k];
    auto it = std::find(in.ranks.begin(), in.ranks.end(), me);
    if (it == in.ranks.end()) continue;
    Group g = w.newGroup(in.ranks.data(), static_cast<int>(in.ranks.size()));
    int n = g.size(), idx = g.selfIdx();
    size_t c = in.count;
    switch (in.op) {
      case 0: {  // all_gather
        a.resize(c);
        b.assign(c * n, -1);
        for (size_t i = 0; i < c; ++i) a[i] = val(k, me, i);
        w.allGather(g, a.data(), b.data(), c * 8);
        for (int j = 0; j < n; ++j)
          for (size_t i = 0; i < c; ++i) RANK_CHECK_MSG(b[j * c + i] == val(k, in.ranks[j], i), "instance " << k);
        break;
      }
      case 1: {  // all_reduce
        a.resize(c);
        for (size_t i = 0; i < c; ++i) a[i] = val(k, me, i);
        w.allReduce(g, a.data(), c, DType::kInt64, ReduceOp::kSum);
        for (size_t i = 0; i < c; ++i) {
          int64_t e = 0;
          for (int r : in.ranks) e += val(k, r, i);
          RANK_CHECK_MSG(a[i] == e, "instance " << k);
        }
        break;
      }
      case 2: {  // all_to_all
        a.resize(c * n);
        b.assign(c * n, -1);
        for (size_t i = 0; i < c * n; ++i) a[i] = val(k, me, i);
        w.allToAll(g, a.data(), b.data(), c * 8);
        for (int j = 0; j < n; ++j)
          for (size_t i = 0; i < c; ++i)
            RANK_CHECK_MSG(b[j * c + i] == val(k, in.ranks[j], idx * c + i), "instance " << k);
        break;
      }
      default: {  // broadcast
        int root = in.ranks[in.root_idx];
        a.resize(c);
        for (size_t i = 0; i < c; ++i) a[i] = me == root ? val(k, root, i) : -1;
        w.broadcast(g, a.data(), c * 8, root);
        for (size_t i = 0; i < c; ++i) RANK_CHECK_MSG(a[i] == val(k, root, i), "instance " << k);
      }
    }
  }
  w.barrier(w.worldGroup());
}

}  // namespace

TEST(Stress, OverlappingGroupsFourRanks) {
  auto instances = drawInstances(4, 3000, 42);
  WorldOptions o;
  o.slot_bytes = 4096;
  o.num_slots = 3;
  o.timeout = std::chrono::seconds(60);
  EXPECT_EQ(runRanks(4, [&](World& w) { runStress(w, instances); }, o, 240), "");
}

TEST(Stress, OverlappingGroupsSixRanksOversubscribed) {
  auto instances = drawInstances(6, 1000, 7);
  WorldOptions o;
  o.slot_bytes = 8192;
  o.num_slots = 2;
  o.timeout = std::chrono::seconds(60);
  EXPECT_EQ(runRanks(6, [&](World& w) { runStress(w, instances); }, o, 240), "");
}
