// Network edges (NOTE [network edges] in src/collectives/net_edges.h) between emulated nodes of one host
// (GFDIT_NODE_IDS and GFDIT_NET_EDGES=nodes): node ids, refusals on the edges' port, a peer lost mid-collective.
// The collectives themselves run over network edges in test_collectives.cpp (NetworkEdges/Collectives.*).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "loopback.h"
#include "rank_harness.h"
#include "scoped_env.h"
#include "transport.h"

using namespace gfdit;
using gfdit::testing::runRanks;
using gfdit::testing::ScopedEnv;

namespace {

WorldOptions options() {
  WorldOptions o;
  o.slot_bytes = 4096;
  o.num_slots = 4;
  o.timeout = std::chrono::seconds(20);
  o.heap_bytes = 1 << 20;
  return o;
}

// What rank `peer`'s network edges answer to `bytes` sent to their port: the reply's text (after its 16-byte
// head), or "" when nothing came back.
std::string replyTo(int port, const std::string& bytes) {
  int fd = gfdit::testing::dialLoopback(port);
  ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  ::shutdown(fd, SHUT_WR);  // a short HELLO: the edge refuses it when the stream ends
  std::string got;
  char buf[512];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) got.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return got.size() > 16 ? std::string(got.c_str() + 16) : "";
}

}  // namespace

TEST(NetEdges, NodesFollowGfditNodeIdsAndOnlyOtherNodesTalkOverTheNetwork) {
  ScopedEnv ids("GFDIT_NODE_IDS", "a,a,b,b");
  {
    ScopedEnv net("GFDIT_NET_EDGES", "nodes");
    EXPECT_EQ(runRanks(
                  4,
                  [](World& w) {
                    for (int p = 0; p < 4; ++p) {
                      RANK_CHECK(w.nodeOf(p) == p / 2);
                      RANK_CHECK(w.remote(p) == (p != w.rank() && p / 2 != w.rank() / 2));
                      RANK_CHECK(!w.hostOf(p).empty());
                    }
                    RANK_CHECK(w.netPort() > 0);
                    std::vector<int64_t> in(1000, w.rank()), out(4000);
                    w.allGather(w.worldGroup(), in.data(), out.data(), in.size() * 8);
                    for (int i = 0; i < 4000; ++i) RANK_CHECK(out[i] == i / 1000);
                  },
                  options()),
              "");
  }
  // labels alone: the nodes are known, every edge is in shared memory (one host)
  EXPECT_EQ(runRanks(
                4,
                [](World& w) {
                  for (int p = 0; p < 4; ++p) RANK_CHECK(w.nodeOf(p) == p / 2 && !w.remote(p));
                  RANK_CHECK(w.netPort() == -1);
                },
                options()),
            "");
}

// Stands in for the CUDA library's factory: a world that asks it for a transport fails naming it.
std::unique_ptr<Transport> refusingDeviceFactory(const DeviceTransportArgs& args) {
  GFDIT_THROW(kInvalidUsage) << "the stand-in device factory was asked for device " << args.device;
}

TEST(NetEdges, ADeviceWorldAcrossNodesHasNoDeviceTransportAndRecordsItsDevice) {
  ASSERT_FALSE(hasDeviceTransport()) << "this test binary registers no device transport of its own";
  registerDeviceTransport(&refusingDeviceFactory);
  WorldOptions o = options();
  o.device = 0;
  {
    // across nodes: no device transport is made (the factory would throw), the device is recorded as staged
    ScopedEnv ids("GFDIT_NODE_IDS", "a,a,b,b");
    ScopedEnv net("GFDIT_NET_EDGES", "nodes");
    EXPECT_EQ(runRanks(
                  4,
                  [](World& w) {
                    RANK_CHECK(w.device() == -1 && w.stagedDevice() == 0);
                    std::vector<int64_t> in(100, w.rank()), out(400);
                    w.allGather(w.worldGroup(), in.data(), out.data(), in.size() * 8);
                    for (int i = 0; i < 400; ++i) RANK_CHECK(out[i] == i / 100);
                  },
                  o),
              "");
  }
  // one host: the device transport is asked for, as before
  std::string err = runRanks(2, [](World&) {}, o);
  registerDeviceTransport(nullptr);
  EXPECT_NE(err.find("the stand-in device factory was asked for device 0"), std::string::npos) << err;
}

TEST(NetEdges, NodesDefaultToTheHostsAndABadSettingIsRefusedNamingIt) {
  EXPECT_EQ(runRanks(
                3,
                [](World& w) {
                  for (int p = 0; p < 3; ++p) RANK_CHECK(w.nodeOf(p) == 0 && !w.remote(p));
                },
                options()),
            "");
  {
    ScopedEnv net("GFDIT_NET_EDGES", "nodes");  // without GFDIT_NODE_IDS
    std::string err = runRanks(2, [](World&) {}, options());
    EXPECT_NE(err.find("GFDIT_NET_EDGES=nodes needs GFDIT_NODE_IDS"), std::string::npos) << err;
  }
  {
    ScopedEnv ids("GFDIT_NODE_IDS", "0,1,1");
    std::string err = runRanks(2, [](World&) {}, options());
    EXPECT_NE(err.find("names 3 ranks; the world has 2"), std::string::npos) << err;
  }
}

TEST(NetEdges, GarbageAndOtherVersionsOnTheEdgesPortAreRefusedAndTheWorldGoesOn) {
  ScopedEnv ids("GFDIT_NODE_IDS", "0,1");
  ScopedEnv net("GFDIT_NET_EDGES", "nodes");
  EXPECT_EQ(runRanks(
                2,
                [](World& w) {
                  // rank 0 tells rank 1 its port with a collective; rank 1 knocks on it with garbage and with a
                  // HELLO of another protocol version; rank 0 answers each, and the world still works
                  int64_t port[2] = {w.netPort(), 0};
                  int64_t ports[4] = {};
                  w.allGather(w.worldGroup(), port, ports, 16);
                  if (w.rank() == 1) {
                    std::string garbage(200, 'x');  // longer than a HELLO: read whole, refused by its magic
                    std::string got = replyTo(static_cast<int>(ports[0]), garbage);
                    RANK_CHECK_MSG(got.find("not a gfdit HELLO") != std::string::npos, got);
                    std::string hello(8 + 4 * 4 + 96, '\0');
                    std::memcpy(&hello[0], "gfditNET", 8);
                    uint32_t version = 99;
                    std::memcpy(&hello[8], &version, 4);
                    got = replyTo(static_cast<int>(ports[0]), hello);
                    RANK_CHECK_MSG(got.find("protocol version 99") != std::string::npos, got);
                  }
                  std::vector<float> x(3000, 1.0f + w.rank());
                  w.allReduce(w.worldGroup(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum);
                  for (float v : x) RANK_CHECK(v == 3.0f);
                },
                options()),
            "");
}

TEST(NetEdges, APeerLostMidCollectiveIsNamedAtOnce) {
  WorldOptions slow_timeout = options();
  slow_timeout.timeout = std::chrono::seconds(60);
  ScopedEnv ids("GFDIT_NODE_IDS", "0,1");
  ScopedEnv net("GFDIT_NET_EDGES", "nodes");
  EXPECT_EQ(runRanks(
                2,
                [](World& w) {
                  if (w.rank() == 1) _exit(0);  // gone without a word: its connection ends
                  auto start = std::chrono::steady_clock::now();
                  std::vector<float> x(100, 1.0f);
                  try {
                    w.allReduce(w.worldGroup(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum);
                    RANK_CHECK_MSG(false, "the collective ended without its peer");
                  } catch (const Error& e) {
                    std::string what = e.what();
                    RANK_CHECK_MSG(what.find("rank 1") != std::string::npos, what);
                    RANK_CHECK_MSG(what.find("connection") != std::string::npos, what);
                  }
                  // not the world's timeout (60 s here): the connection's end names the peer
                  RANK_CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
                },
                slow_timeout),
            "");
}
