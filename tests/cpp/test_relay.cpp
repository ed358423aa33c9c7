// The relay between an engine's rings and a node agent's (NOTE [node agents] in src/runtime/relay.cpp) on loopback:
// the hello and its refusals, the frames that carry tasks, completions, outputs, bells and the abort word, deaths,
// replacements, and connections that end, go silent or send garbage.
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gfdit/clock.h"
#include "gfdit/error.h"
#include "gfdit/outputs.h"
#include "gfdit/relay.h"
#include "loopback.h"
#include "relay_wire.h"

using namespace gfdit;
using namespace gfdit::runtime;

namespace {

bool waitUntil(const std::function<bool()>& cond, double seconds = 10.0) {
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

NodeHello helloOf(int workers) {
  NodeHello h;
  h.host = "test-host";
  h.num_workers = workers;
  h.pid = static_cast<int32_t>(::getpid());
  return h;
}

NodeWelcome welcomeFor(std::vector<int32_t> workers, int world_size, int node) {
  NodeWelcome w;
  w.node = node;
  w.workers = std::move(workers);
  w.world_size = world_size;
  w.node_of.assign(world_size, 0);
  for (int32_t x : w.workers) w.node_of[x] = node;
  w.model = "tiny-wan";
  w.store_port = 1234;
  w.timeout_s = 20;
  return w;
}

void sendBytes(int fd, const void* p, size_t n) { ASSERT_EQ(::send(fd, p, n, MSG_NOSIGNAL), static_cast<ssize_t>(n)); }

bool recvBytes(int fd, void* p, size_t n) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    ssize_t r = ::recv(fd, b, n, 0);
    if (r <= 0) return false;
    b += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

relay_wire::Greeting greetingOf(uint32_t version) {
  relay_wire::Greeting g{};
  std::memcpy(g.magic, relay_wire::kMagic, sizeof(g.magic));
  g.version = version;
  return g;
}

// What the relay answers to a greeting (and a hello frame when given): its status and message.
std::pair<int, std::string> answerTo(int port, const relay_wire::Greeting& g, const std::string& hello = "") {
  int fd = gfdit::testing::dialLoopback(port);
  sendBytes(fd, &g, sizeof(g));
  if (!hello.empty()) {
    relay_wire::FrameHead h{relay_wire::kHello, -1, hello.size(), 0};
    sendBytes(fd, &h, sizeof(h));
    sendBytes(fd, hello.data(), hello.size());
  }
  relay_wire::Greeting answer{};
  bool got = recvBytes(fd, &answer, sizeof(answer));
  ::close(fd);
  if (!got) return {-1, ""};
  return {answer.status, std::string(answer.message, strnlen(answer.message, sizeof(answer.message)))};
}

// The names in /dev/shm that start with `prefix` (which starts with '/').
std::vector<std::string> shmNames(const std::string& prefix) {
  std::vector<std::string> out;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return out;
  while (dirent* e = ::readdir(dir)) {
    if (std::strncmp(e->d_name, prefix.c_str() + 1, prefix.size() - 1) == 0) out.push_back(e->d_name);
  }
  ::closedir(dir);
  return out;
}

// An engine's rings and relay with one agent that runs workers 2 and 3 of 4.
struct TwoHosts {
  std::unique_ptr<QueueSet> engine = QueueSet::create(4);
  std::shared_ptr<NodeRelay> relay;
  std::unique_ptr<AgentRelay> agent;
  std::string agent_queue;
  std::unique_ptr<QueueSet> workers;  // the agent's rings as its workers map them

  explicit TwoHosts(double node_timeout_s = 10.0) {
    relay = std::make_shared<NodeRelay>(4, "127.0.0.1", 0, node_timeout_s);
    std::thread dialer(
        [&] { agent = std::make_unique<AgentRelay>("127.0.0.1", relay->port(), helloOf(2), 10.0, node_timeout_s); });
    std::optional<PendingNode> p = relay->accept(10.0);
    EXPECT_TRUE(p.has_value());
    EXPECT_EQ(p->hello.host, "test-host");
    EXPECT_EQ(p->hello.num_workers, 2);
    relay->admit(p->id, welcomeFor({2, 3}, 4, 1));
    dialer.join();
    relay->start(engine->name());
    agent_queue = agent->start();
    workers = QueueSet::attach(agent_queue);
  }
};

}  // namespace

TEST(Relay, HelloAndWelcomeRoundTripAndRefuseWhatTheyAreNot) {
  NodeHello h = helloOf(3);
  NodeHello h2 = NodeHello::decode(h.encode());
  EXPECT_EQ(h2.host, "test-host");
  EXPECT_EQ(h2.num_workers, 3);
  NodeWelcome w = welcomeFor({2, 3}, 4, 1);
  w.joining = true;
  w.model_path = "/weights";
  w.heap_bytes = 1 << 20;
  NodeWelcome w2 = NodeWelcome::decode(w.encode());
  EXPECT_EQ(w2.workers, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(w2.node_of, (std::vector<int32_t>{0, 0, 1, 1}));
  EXPECT_TRUE(w2.joining);
  EXPECT_EQ(w2.model_path, "/weights");
  EXPECT_EQ(w2.heap_bytes, 1 << 20);
  std::string cut = w.encode();
  cut.pop_back();
  EXPECT_THROW(NodeWelcome::decode(cut), Error);
  EXPECT_THROW(NodeHello::decode(w.encode()), Error);  // another message's tag
  NodeWelcome bad = welcomeFor({2, 3}, 4, 1);
  bad.workers[1] = 7;
  EXPECT_THROW(NodeWelcome::decode(bad.encode()), Error);  // a worker outside the world
}

TEST(Relay, GarbageAndOtherVersionsAreRefusedWithAReasonAndTheEngineGoesOn) {
  NodeRelay relay(4, "127.0.0.1", 0);
  relay_wire::Greeting junk{};
  std::memset(&junk, 'x', sizeof(junk));
  auto [status, message] = answerTo(relay.port(), junk);
  EXPECT_EQ(status, 1);
  EXPECT_NE(message.find("not a gfdit node agent"), std::string::npos) << message;
  std::tie(status, message) = answerTo(relay.port(), greetingOf(kNodeProtocolVersion + 98));
  EXPECT_EQ(status, 1);
  EXPECT_NE(message.find("version " + std::to_string(kNodeProtocolVersion + 98)), std::string::npos) << message;
  std::tie(status, message) = answerTo(relay.port(), greetingOf(kNodeProtocolVersion), "not a hello");
  EXPECT_EQ(status, 1);
  EXPECT_NE(message.find("malformed hello"), std::string::npos) << message;
  EXPECT_TRUE(waitUntil([&] { return relay.refusals().size() == 3; })) << relay.refusals().size();
  EXPECT_FALSE(relay.accept(0.05).has_value());  // none of them waits for an answer
  // a real agent after them is heard, and one the engine does not take learns why
  std::string refused;
  std::thread dialer([&] {
    try {
      AgentRelay agent("127.0.0.1", relay.port(), helloOf(1), 10.0);
    } catch (const Error& e) {
      refused = e.what();
    }
  });
  std::optional<PendingNode> p = relay.accept(10.0);
  ASSERT_TRUE(p.has_value());
  relay.refuse(p->id, "the engine has all its workers");
  dialer.join();
  EXPECT_NE(refused.find("refused this node: the engine has all its workers"), std::string::npos) << refused;
}

TEST(Relay, TasksCompletionsOutputsBellsAndTheAbortWordCross) {
  TwoHosts h;
  // a task for worker 3 reaches the agent's ring for worker 3, byte for byte
  TaskDescriptor t;
  t.task_id = 41;
  t.request_id = 7;
  t.kind = static_cast<uint32_t>(TaskKind::kDenoise);
  t.num_ranks = 4;
  for (int i = 0; i < 4; ++i) t.ranks[i] = static_cast<int16_t>(i);
  const std::string payload = "payload bytes";
  t.payload_bytes = static_cast<uint32_t>(payload.size());
  ASSERT_TRUE(h.engine->pushTask(3, t, payload, std::chrono::seconds(1)));
  TaskDescriptor got;
  std::string got_payload;
  ASSERT_TRUE(h.workers->popTask(3, got, got_payload, std::chrono::seconds(10)));
  EXPECT_EQ(std::memcmp(&got, &t, sizeof(t)), 0);
  EXPECT_EQ(got_payload, payload);

  // a decode's completion with its output: the engine maps the bytes from an object of its own
  std::vector<float> pixels(3 * 16 * 16);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<float>(i) * 0.5f;
  Completion c;
  c.task_id = 41;
  c.request_id = 7;
  c.kind = static_cast<uint32_t>(TaskKind::kDecode);
  c.rank = 3;
  writeOutput(outputPrefix(h.agent_queue) + "41-3", pixels.data(), pixels.size() * sizeof(float), c.output);
  c.output.ndim = 3;
  c.output.shape[0] = 3;
  c.output.shape[1] = c.output.shape[2] = 16;
  const uint32_t bell = __atomic_load_n(&h.engine->controlBell()->value, __ATOMIC_SEQ_CST);
  ASSERT_TRUE(h.workers->pushCompletion(3, c, std::chrono::seconds(1), /*wake=*/true));
  ASSERT_TRUE(waitUntil([&] { return __atomic_load_n(&h.engine->controlBell()->value, __ATOMIC_SEQ_CST) != bell; }));
  Completion back;
  ASSERT_TRUE(waitUntil([&] { return h.engine->tryPopCompletion(3, back); }));
  EXPECT_EQ(back.task_id, 41u);
  const std::string name(back.output.name, strnlen(back.output.name, sizeof(back.output.name)));
  EXPECT_EQ(name.rfind(outputPrefix(h.engine->name()), 0), 0u) << name;
  EXPECT_EQ(back.output.shape[1], 16);
  auto mapped = MappedOutput::open(back.output);
  ASSERT_EQ(mapped->bytes(), pixels.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(mapped->data(), pixels.data(), mapped->bytes()), 0);
  EXPECT_TRUE(shmNames(outputPrefix(h.agent_queue)).empty());  // the agent's object went with its bytes

  // a quiet completion wakes nobody; the bell a worker rings before it idles does (NOTE [quiet completions])
  Completion quiet;
  quiet.task_id = 42;
  quiet.rank = 2;
  quiet.kind = static_cast<uint32_t>(TaskKind::kFree);
  ASSERT_TRUE(h.workers->pushCompletion(2, quiet, std::chrono::seconds(1), /*wake=*/false));
  ASSERT_TRUE(waitUntil([&] { return h.engine->completion(2).size() == 1; }));
  const uint32_t before = __atomic_load_n(&h.engine->controlBell()->value, __ATOMIC_SEQ_CST);
  ringDoorbell(h.workers->controlBell());
  EXPECT_TRUE(waitUntil([&] { return __atomic_load_n(&h.engine->controlBell()->value, __ATOMIC_SEQ_CST) != before; }));

  // the engine's abort reaches the workers' abort word on their host
  const uint64_t word = __atomic_load_n(h.workers->abortWord(), __ATOMIC_SEQ_CST);
  h.relay->abortCollectives();
  EXPECT_TRUE(waitUntil([&] { return __atomic_load_n(h.workers->abortWord(), __ATOMIC_SEQ_CST) != word; }));
  // a task that does not fit in one frame send (a request's payload is up to 64 KiB)
  std::string big(60000, 'r');
  t.payload_bytes = static_cast<uint32_t>(big.size());
  ASSERT_TRUE(h.engine->pushTask(2, t, big, std::chrono::seconds(1)));
  ASSERT_TRUE(h.workers->popTask(2, got, got_payload, std::chrono::seconds(10)));
  EXPECT_EQ(got_payload, big);
}

TEST(Relay, DeathsKillsAndReplacementsOfARemoteWorker) {
  TwoHosts h;
  EXPECT_FALSE(h.relay->gone(2, nullptr));
  h.agent->workerStarted(2, 4242);
  EXPECT_TRUE(waitUntil([&] { return h.relay->workerState(2).pid == 4242; }));
  h.relay->kill(2);
  std::optional<AgentRequest> r = h.agent->next(10.0);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->kind, AgentRequest::kKill);
  EXPECT_EQ(r->worker, 2);
  // the agent reports the death after what the worker posted
  Completion last;
  last.task_id = 5;
  last.rank = 2;
  ASSERT_TRUE(h.workers->pushCompletion(2, last, std::chrono::seconds(1), /*wake=*/false));
  h.agent->workerDied(2, -9, "worker 2 was killed");
  std::string why;
  ASSERT_TRUE(waitUntil([&] { return h.relay->gone(2, &why); }));
  EXPECT_EQ(why, "worker 2 was killed");
  EXPECT_EQ(h.relay->workerState(2).exit_code, -9);
  Completion c;
  EXPECT_TRUE(h.engine->tryPopCompletion(2, c));
  EXPECT_EQ(c.task_id, 5u);
  EXPECT_FALSE(h.relay->gone(3, nullptr));  // its neighbour lives on
  // a replacement: the relay lets go of the ring, the engine resets it, the agent is asked to start a process
  EXPECT_TRUE(h.relay->release(2));
  h.engine->resetWorker(2);
  h.relay->startWorker(2);
  r = h.agent->next(10.0);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->kind, AgentRequest::kStart);
  EXPECT_EQ(r->worker, 2);
  EXPECT_FALSE(h.relay->gone(2, nullptr));
  TaskDescriptor t;
  t.task_id = 9;
  ASSERT_TRUE(h.engine->pushTask(2, t, std::string(), std::chrono::seconds(1)));
  TaskDescriptor got;
  std::string payload;
  EXPECT_TRUE(h.workers->popTask(2, got, payload, std::chrono::seconds(10)));
  EXPECT_EQ(got.task_id, 9u);
}

TEST(Relay, AnAgentThatLeavesTakesItsWorkersAndLeavesNothingInDevShm) {
  TwoHosts h;
  const std::string queue = h.agent_queue;
  h.workers.reset();
  h.agent->close();
  std::string why;
  ASSERT_TRUE(waitUntil([&] { return h.relay->gone(2, &why) && h.relay->gone(3, nullptr); }));
  EXPECT_NE(why.find("host test-host"), std::string::npos) << why;
  EXPECT_NE(why.find("its agent left"), std::string::npos) << why;
  EXPECT_EQ(h.relay->workerState(3).exit_code, -1);
  ASSERT_EQ(h.relay->nodes().size(), 1u);
  EXPECT_FALSE(h.relay->nodes()[0].connected);
  EXPECT_TRUE(shmNames(queue).empty());
  EXPECT_THROW(h.relay->startWorker(2), Error);  // nobody to start it: the host is gone
}

TEST(Relay, ASilentOrGarbledNodeIsLostAndTheEngineGoesOn) {
  NodeRelay relay(2, "127.0.0.1", 0, /*node_timeout_s=*/0.5);
  std::unique_ptr<QueueSet> engine = QueueSet::create(2);
  relay.start(engine->name());
  // a hand-made agent that says hello, takes its welcome, then says nothing
  auto handshake = [&](int worker) {
    int fd = gfdit::testing::dialLoopback(relay.port());
    relay_wire::Greeting g = greetingOf(kNodeProtocolVersion);
    sendBytes(fd, &g, sizeof(g));
    const std::string hello = helloOf(1).encode();
    relay_wire::FrameHead head{relay_wire::kHello, -1, hello.size(), 0};
    sendBytes(fd, &head, sizeof(head));
    sendBytes(fd, hello.data(), hello.size());
    std::optional<PendingNode> p = relay.accept(10.0);
    EXPECT_TRUE(p.has_value());
    relay.admit(p->id, welcomeFor({worker}, 2, worker + 1));
    relay_wire::Greeting answer{};
    EXPECT_TRUE(recvBytes(fd, &answer, sizeof(answer)));
    EXPECT_EQ(answer.status, 0);
    return fd;
  };
  int silent = handshake(0);
  std::string why;
  ASSERT_TRUE(waitUntil([&] { return relay.gone(0, &why); }, 10.0));
  EXPECT_NE(why.find("nothing came from it for 0.5 s"), std::string::npos) << why;
  // a node that sends a completion of a worker it does not run is cut off
  int garbled = handshake(1);
  relay_wire::FrameHead wrong{relay_wire::kCompletion, 0, sizeof(Completion), sizeof(Completion)};
  Completion c;
  c.rank = 0;
  sendBytes(garbled, &wrong, sizeof(wrong));
  sendBytes(garbled, &c, sizeof(c));
  ASSERT_TRUE(waitUntil([&] { return relay.gone(1, &why); }, 10.0));
  EXPECT_NE(why.find("which it does not run"), std::string::npos) << why;
  Completion nothing;
  EXPECT_FALSE(engine->tryPopCompletion(0, nothing));
  ::close(silent);
  ::close(garbled);
  EXPECT_EQ(relay.nodes().size(), 2u);
}

TEST(Relay, AnAgentHearsTheEngineLeaveOrGoSilent) {
  {
    TwoHosts h;
    h.relay->close();
    std::optional<AgentRequest> r = h.agent->next(10.0);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->kind, AgentRequest::kEnd);
    EXPECT_TRUE(r->orderly) << r->reason;
  }
  // a hand-made engine that welcomes the agent, then says nothing
  int server = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(::bind(server, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(server, 1), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(server, reinterpret_cast<sockaddr*>(&addr), &len);
  int conn = -1;
  std::thread engine([&] {
    conn = ::accept(server, nullptr, nullptr);
    relay_wire::Greeting g{};
    relay_wire::FrameHead head{};
    recvBytes(conn, &g, sizeof(g));
    recvBytes(conn, &head, sizeof(head));
    std::string hello(head.bytes, '\0');
    recvBytes(conn, hello.data(), hello.size());
    relay_wire::Greeting ok = greetingOf(kNodeProtocolVersion);
    sendBytes(conn, &ok, sizeof(ok));
    const std::string welcome = welcomeFor({1}, 2, 1).encode();
    relay_wire::FrameHead w{relay_wire::kWelcome, -1, welcome.size(), 0};
    sendBytes(conn, &w, sizeof(w));
    sendBytes(conn, welcome.data(), welcome.size());
  });
  AgentRelay agent("127.0.0.1", ntohs(addr.sin_port), helloOf(1), 10.0, /*node_timeout_s=*/0.5);
  engine.join();
  const std::string queue = agent.start();
  std::optional<AgentRequest> r = agent.next(10.0);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->kind, AgentRequest::kEnd);
  EXPECT_FALSE(r->orderly);
  EXPECT_NE(r->reason.find("nothing came from the engine"), std::string::npos) << r->reason;
  agent.close();
  EXPECT_TRUE(shmNames(queue).empty());
  ::close(conn);
  ::close(server);
}
