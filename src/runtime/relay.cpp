// Workers on other hosts (see gfdit/relay.h).
//
// NOTE [node agents]
// The control plane stays on the engine's host. A host that runs some of the engine's workers runs a node agent
// (gfdit.serving.agent): it makes that host's rings (a QueueSet of its own), starts the workers on them with the
// ordinary worker loop, and relays between those rings and the engine's over one TCP connection, so that neither
// the control plane nor a worker knows whether a worker is local.
// - Hello. The agent sends a greeting (magic "gfditNOD", kNodeProtocolVersion) and a NodeHello; garbage, another
//   version or a malformed hello is answered with a refusal that says why, and the engine goes on. The engine takes
//   an agent (NodeRelay::admit) with a NodeWelcome: the worker ids it runs, their nodes, the model and the workers'
//   store (by default at the address the agent reached the engine at), or refuses it with the reason.
// - Rings. For a remote worker the engine's relay is the consumer of its dispatch ring (one thread per worker, as
//   the worker would be) and the producer of its completion ring; the agent is the producer of the worker's dispatch
//   ring on its host and the consumer of its completion ring. Every ring stays single-producer single-consumer
//   (NOTE [message ring]), and a task reaches its worker in the order the control plane wrote it (one TCP stream).
//   Frames carry ring messages byte for byte; every length, worker id and count is checked where it arrives, and a
//   frame that fails a check ends the connection (the node's workers are then dead), never the engine.
// - Bells. A worker rings its host's control bell as always (NOTE [quiet completions]); the agent sends a BELL after
//   the completions it read whenever that bell moved, and the engine's relay pushes relayed completions quietly and
//   rings the engine's control bell on each BELL: the control thread wakes exactly as often as for local workers.
// - Outputs. A decoded output is a shared-memory object on the worker's host (NOTE [outputs]); the agent maps it,
//   removes its name and sends its bytes behind the completion; the engine's relay writes them into an object under
//   its own output prefix and rewrites the completion's OutputRef, so the engine maps outputs as from a local worker.
//   An output the engine's host has no room for fails its task with the reason.
// - Abort. The engine's abort (QueueSet::requestAbort) also sends ABORT to every node, whose agent bumps its host's
//   abort word (World::watchAbort): collectives blocked on a dead worker are released on every host.
// - Liveness. Each side sends PING when it has sent nothing for a while; a connection that brings nothing for the
//   node timeout (GFDIT_NODE_TIMEOUT_S), ends without BYE, or fails a send within that bound is lost. A lost node
//   means all its workers died, named by host and address: the engine loop sees them gone (RemoteWorkers::gone),
//   and the control plane recovers from the surviving copies, as for a killed worker. The agent of a lost
//   connection kills its workers and removes what it made in /dev/shm.
// - Deaths and replacements. The agent reports each worker's end (DIED, after the completions the worker posted), and
//   kills a worker on KILL (a missed deadline, a wedged ring, a replacement of the wrong model). A dead worker of a
//   connected node is replaced as a local one (NOTE [healing] in gfdit.serving.engine): the engine resets its rings
//   once its relay let go of them (release), then START makes the agent reset its host's rings and start a new
//   process that joins at the next REINIT. Workers of a lost host are not replaced there; an agent that connects to
//   the running engine may take them over, its workers joining as replacements.
// - Bounds. Every wait is bounded: a greeting or hello within 5 s, a send within the node timeout, a completion push
//   within 30 s, a relay's release of a dead worker's ring within 1 s.
#include "gfdit/relay.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <sstream>

#include "doorbell.h"
#include "gfdit/clock.h"
#include "gfdit/error.h"
#include "gfdit/outputs.h"
#include "relay_wire.h"
#include "wire.h"

namespace gfdit {
namespace runtime {

using namespace relay_wire;

namespace {

constexpr int64_t kMs = 1000000;
constexpr int64_t kSecond = 1000 * kMs;
constexpr uint32_t kHelloTag = 0x4e48'0001;    // "NH" v1
constexpr uint32_t kWelcomeTag = 0x4e57'0001;  // "NW" v1
// How long a greeting and a hello (or the engine's answer to them) may take.
constexpr int64_t kHandshakeNs = 5 * kSecond;
// How long the engine's relay waits to push a relayed completion into a full ring (a worker waits as long).
constexpr auto kPushTimeout = std::chrono::seconds(30);
// How long a relay may take to let go of a dead worker's dispatch ring.
constexpr auto kReleaseTimeout = std::chrono::seconds(1);
// How long the relay's thread of a remote worker waits on its dispatch ring at a time.
constexpr auto kDispatchWait = std::chrono::milliseconds(100);
// A backlog on the agent this old means a wedged worker (as the engine's own: NOTE [control thread]).
constexpr int64_t kWedgedNs = 5 * kSecond;
// Outputs travel in pieces of this size (read from the socket, written into the object).
constexpr size_t kChunk = 1 << 20;

std::string errnoText(int e) { return std::strerror(e); }

int64_t timeoutNs(double s) {
  GFDIT_CHECK(std::isfinite(s) && s > 0).param("node_timeout_s")
      << "a node timeout must be a positive number, got " << s;
  return static_cast<int64_t>(std::min(s, 1e6) * kSecond);
}

// How often an idle side says it is alive: a few times per timeout, at least every second.
int64_t pingPeriodNs(int64_t timeout_ns) { return std::max<int64_t>(10 * kMs, std::min(kSecond, timeout_ns / 4)); }

std::string secondsText(int64_t ns) {
  std::ostringstream os;
  os << static_cast<double>(ns) / kSecond;
  return os.str();
}

void tuneSocket(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // tasks and completions are small and urgent
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);  // every wait goes through poll, with a bound
}

// Waits until `fd` is ready for `events` or `until_ns` passes: > 0 ready, 0 timeout, < 0 error.
int waitFd(int fd, short events, int64_t until_ns) {
  while (true) {
    int64_t left = until_ns - nowNs();
    if (left <= 0) return 0;
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left / kMs + 1, 100)));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return -1;
    if (rc > 0) return 1;
  }
}

// Moves exactly n bytes (receiving into p, or sending from it); fails when nothing moves for `idle_ns`, at the
// stream's end or on an error (`why`).
bool moveAll(int fd, uint8_t* p, size_t n, bool receiving, int64_t idle_ns, std::string* why) {
  int64_t until = nowNs() + idle_ns;
  while (n > 0) {
    ssize_t k = receiving ? ::recv(fd, p, n, 0) : ::send(fd, p, n, MSG_NOSIGNAL);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      until = nowNs() + idle_ns;
      continue;
    }
    if (k == 0) {  // only a receive ends so: the stream did
      *why = "the connection was closed";
      return false;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      *why = std::string(receiving ? "receive" : "send") + " failed: " + errnoText(errno);
      return false;
    }
    int rc = waitFd(fd, receiving ? POLLIN : POLLOUT, until);
    if (rc == 0) {
      *why = (receiving ? "nothing arrived for " : "the peer took nothing for ") + secondsText(idle_ns) + " s";
      return false;
    }
    if (rc < 0) {
      *why = "poll failed: " + errnoText(errno);
      return false;
    }
  }
  return true;
}

bool recvAll(int fd, void* dst, size_t n, int64_t idle_ns, std::string* why) {
  return moveAll(fd, static_cast<uint8_t*>(dst), n, true, idle_ns, why);
}

bool sendAll(int fd, const void* src, size_t n, int64_t idle_ns, std::string* why) {
  // send only reads the bytes
  return moveAll(fd, const_cast<uint8_t*>(static_cast<const uint8_t*>(src)), n, false, idle_ns, why);
}

// Reads and drops n bytes (the rest of a frame nobody wants).
bool skipBytes(int fd, uint64_t n, int64_t idle_ns, std::string* why) {
  std::string scratch(static_cast<size_t>(std::min<uint64_t>(n, kChunk)), '\0');
  while (n > 0) {
    size_t k = static_cast<size_t>(std::min<uint64_t>(n, scratch.size()));
    if (!recvAll(fd, scratch.data(), k, idle_ns, why)) return false;
    n -= k;
  }
  return true;
}

Greeting greeting(int32_t status, const std::string& message) {
  Greeting g{};
  std::memcpy(g.magic, kMagic, sizeof(kMagic));
  g.version = kNodeProtocolVersion;
  g.status = status;
  std::strncpy(g.message, message.c_str(), kReasonBytes - 1);
  return g;
}

std::string reasonOf(const Greeting& g) { return std::string(g.message, strnlen(g.message, kReasonBytes)); }

// A frame: its head and up to two parts of bytes, sent as one unit (the caller holds the connection's send lock).
bool sendFrame(int fd, uint32_t type, int worker, uint64_t aux, const void* a, size_t a_bytes, int64_t idle_ns,
               std::string* why, const void* b = nullptr, size_t b_bytes = 0) {
  FrameHead h{type, worker, a_bytes + b_bytes, aux};
  if (a_bytes + b_bytes <= 64 * 1024) {  // one send: small frames are most of them
    std::string buf(sizeof(h) + a_bytes + b_bytes, '\0');
    std::memcpy(buf.data(), &h, sizeof(h));
    if (a_bytes) std::memcpy(buf.data() + sizeof(h), a, a_bytes);
    if (b_bytes) std::memcpy(buf.data() + sizeof(h) + a_bytes, b, b_bytes);
    return sendAll(fd, buf.data(), buf.size(), idle_ns, why);
  }
  return sendAll(fd, &h, sizeof(h), idle_ns, why) && (a_bytes == 0 || sendAll(fd, a, a_bytes, idle_ns, why)) &&
         (b_bytes == 0 || sendAll(fd, b, b_bytes, idle_ns, why));
}

std::string peerAddress(const sockaddr_in& a) {
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a.sin_addr, text, sizeof(text));
  return std::string(text) + ":" + std::to_string(ntohs(a.sin_port));
}

// The IPv4 address of `host` (a name or a dotted quad).
in_addr resolve(const std::string& host, const char* what) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  GFDIT_CHECK(rc == 0 && res != nullptr).param(what) << what << " '" << host << "' is not an IPv4 address or a host "
                                                     << "name this host can resolve (" << ::gai_strerror(rc) << ")";
  in_addr out = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return out;
}

void wake(int efd) {
  uint64_t one = 1;
  ssize_t rc = ::write(efd, &one, sizeof(one));
  (void)rc;  // a full counter still wakes the reader
}

}  // namespace

// ---- typed messages ----

std::string NodeHello::encode() const {
  wire::Writer w(kHelloTag);
  w.putString(host).put(num_workers).put(pid);
  return w.take();
}

NodeHello NodeHello::decode(const std::string& bytes) {
  wire::Reader r(bytes, kHelloTag, "a node agent's hello");
  NodeHello h;
  h.host = r.getString();
  h.num_workers = r.get<int32_t>();
  h.pid = r.get<int32_t>();
  r.end();
  GFDIT_CHECK_CODE(kInternal, h.num_workers >= 0 && h.num_workers <= kMaxRanks)
      << "a node agent's hello offers " << h.num_workers << " workers";
  return h;
}

std::string NodeWelcome::encode() const {
  GFDIT_CHECK(workers.size() <= static_cast<size_t>(kMaxRanks) && node_of.size() <= static_cast<size_t>(kMaxRanks))
      << "a welcome of " << workers.size() << " workers and " << node_of.size() << " nodes";
  wire::Writer w(kWelcomeTag);
  w.put(node).put(static_cast<uint32_t>(workers.size()));
  for (int32_t x : workers) w.put(x);
  w.put<uint8_t>(joining ? 1 : 0).put(world_size).put(static_cast<uint32_t>(node_of.size()));
  for (int32_t x : node_of) w.put(x);
  w.putString(model).putString(model_path).putString(store_host);
  w.put(store_port).put(timeout_s).put(heap_bytes).put(threads);
  return w.take();
}

NodeWelcome NodeWelcome::decode(const std::string& bytes) {
  wire::Reader r(bytes, kWelcomeTag, "an engine's welcome");
  NodeWelcome m;
  m.node = r.get<int32_t>();
  uint32_t n = r.get<uint32_t>();
  GFDIT_CHECK_CODE(kInternal, n <= static_cast<uint32_t>(kMaxRanks)) << "a welcome of " << n << " workers";
  for (uint32_t i = 0; i < n; ++i) m.workers.push_back(r.get<int32_t>());
  m.joining = r.get<uint8_t>() != 0;
  m.world_size = r.get<int32_t>();
  n = r.get<uint32_t>();
  GFDIT_CHECK_CODE(kInternal, n <= static_cast<uint32_t>(kMaxRanks)) << "a welcome of " << n << " nodes";
  for (uint32_t i = 0; i < n; ++i) m.node_of.push_back(r.get<int32_t>());
  m.model = r.getString();
  m.model_path = r.getString();
  m.store_host = r.getString();
  m.store_port = r.get<int32_t>();
  m.timeout_s = r.get<double>();
  m.heap_bytes = r.get<int64_t>();
  m.threads = r.get<int32_t>();
  r.end();
  GFDIT_CHECK_CODE(kInternal,
                   m.world_size >= 1 && m.world_size <= kMaxRanks && static_cast<int>(m.node_of.size()) == m.world_size)
      << "a welcome for a world of " << m.world_size << " workers with " << m.node_of.size() << " node ids";
  for (int32_t w : m.workers) {
    GFDIT_CHECK_CODE(kInternal, w >= 0 && w < m.world_size) << "a welcome names worker " << w;
  }
  return m;
}

// ---- the engine's end ----

struct NodeRelay::Slot {
  std::shared_ptr<Node> node;  // the node that runs the worker (null: none yet)
  bool running = false;        // started and not reported dead
  int pid = 0;
  int exit_code = 0;
  std::string why;
  bool parked = true;      // its sending thread takes no task (the worker is dead, or not relayed yet)
  bool parked_ack = true;  // ... and that thread is not inside a pop (or there is none)
  bool has_sender = false;
};

struct NodeRelay::Node {
  int32_t node = 0;
  int fd = -1;
  int wake_fd = -1;  // an eventfd: control frames wait for the receiving thread
  std::string host;
  std::string address;
  std::vector<int32_t> workers;
  std::atomic<bool> lost{false};
  std::string why;  // under the relay's lock
  bool launched = false;
  std::mutex send_mu;
  std::atomic<int64_t> last_tx{0};
  std::mutex ctl_mu;
  std::deque<FrameHead> ctl;
  std::thread receiver;
  std::vector<std::thread> senders;
  std::string describe() const { return "host " + host + " (" + address + ")"; }
};

struct NodeRelay::Pending {
  int id = 0;
  int fd = -1;
  NodeHello hello;
  std::string address;
  bool offered = false;
};

NodeRelay::NodeRelay(int num_workers, const std::string& address, int port, double node_timeout_s)
    : num_workers_(num_workers), timeout_ns_(timeoutNs(node_timeout_s)) {
  GFDIT_CHECK(num_workers >= 1 && num_workers <= kMaxRanks).param("world_size") << "workers: " << num_workers;
  GFDIT_CHECK(port >= 0 && port <= 65535).param("listen") << "port " << port << " is outside [0, 65535]";
  for (int w = 0; w < num_workers; ++w) slots_.push_back(std::make_unique<Slot>());
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr = resolve(address, "listen");
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  GFDIT_CHECK_CODE(kSystemError, listen_fd_ >= 0) << "socket: " << errnoText(errno);
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(listen_fd_, 64) != 0) {
    int e = errno;
    ::close(listen_fd_);
    GFDIT_THROW(kSystemError) << "the engine cannot listen for node agents on " << address << ":" << port << ": "
                              << errnoText(e);
  }
  socklen_t len = sizeof(addr);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] { acceptLoop(); });
}

NodeRelay::~NodeRelay() { close(); }

void NodeRelay::noteRefusal(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (refusals_.size() >= 100) refusals_.erase(refusals_.begin());
  refusals_.push_back(why);
}

std::vector<std::string> NodeRelay::refusals() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refusals_;
}

void NodeRelay::acceptLoop() {
  struct Handshake {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Handshake> running;
  while (!stopping_.load()) {
    // finished handshakes are joined as we go: a port scanned for hours keeps no threads
    for (auto it = running.begin(); it != running.end();) {
      if (it->done->load()) {
        it->thread.join();
        it = running.erase(it);
      } else {
        ++it;
      }
    }
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    sockaddr_in peer{};
    socklen_t len = sizeof(peer);
    int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC);
    if (fd < 0) continue;
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::string address = peerAddress(peer);
    running.push_back({std::thread([this, fd, address, done] {
                         handshake(fd, address);
                         done->store(true);
                       }),
                       done});
  }
  for (auto& h : running) h.thread.join();
}

void NodeRelay::handshake(int fd, std::string address) {
  tuneSocket(fd);
  auto refuse_now = [&](const std::string& why) {
    Greeting g = greeting(1, why);
    std::string ignored;
    sendAll(fd, &g, sizeof(g), kSecond, &ignored);
    ::close(fd);
    noteRefusal(address + ": " + why);
  };
  std::string why;
  Greeting g{};
  if (!recvAll(fd, &g, sizeof(g), kHandshakeNs, &why)) {
    ::close(fd);
    noteRefusal(address + ": no greeting (" + why + ")");
    return;
  }
  if (std::memcmp(g.magic, kMagic, sizeof(kMagic)) != 0) {
    refuse_now("not a gfdit node agent: this port takes node agents of a gfdit engine (gfdit node-agent)");
    return;
  }
  if (g.version != kNodeProtocolVersion) {
    refuse_now("the agent speaks node protocol version " + std::to_string(g.version) + ", this engine version " +
               std::to_string(kNodeProtocolVersion) + ": run the same gfdit on every host");
    return;
  }
  FrameHead h{};
  std::string bytes;
  if (!recvAll(fd, &h, sizeof(h), kHandshakeNs, &why)) {
    ::close(fd);
    noteRefusal(address + ": no hello (" + why + ")");
    return;
  }
  if (h.type != kHello || h.bytes > kMaxFrameBytes) {
    refuse_now("expected a hello frame, got a frame of type " + std::to_string(h.type) + " and " +
               std::to_string(h.bytes) + " bytes");
    return;
  }
  bytes.resize(h.bytes);
  if (!recvAll(fd, bytes.data(), bytes.size(), kHandshakeNs, &why)) {
    ::close(fd);
    noteRefusal(address + ": a hello cut short (" + why + ")");
    return;
  }
  auto p = std::make_unique<Pending>();
  try {
    p->hello = NodeHello::decode(bytes);
  } catch (const Error& e) {
    refuse_now(std::string("a malformed hello: ") + e.what());
    return;
  }
  p->fd = fd;
  p->address = address;
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_.load()) {
    ::close(fd);
    return;
  }
  p->id = next_pending_++;
  pending_.push_back(std::move(p));
  cv_.notify_all();
}

std::optional<PendingNode> NodeRelay::accept(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  auto first = [&]() -> Pending* {
    for (auto& p : pending_) {
      if (!p->offered) return p.get();
    }
    return nullptr;
  };
  auto until = std::chrono::steady_clock::now() +
               std::chrono::microseconds(static_cast<int64_t>(std::max(0.0, std::min(timeout_s, 1e6)) * 1e6));
  cv_.wait_until(lock, until, [&] { return first() != nullptr || stopping_.load(); });
  Pending* p = first();
  if (p == nullptr) return std::nullopt;
  p->offered = true;
  return PendingNode{p->id, p->hello, p->address};
}

std::unique_ptr<NodeRelay::Pending> NodeRelay::takePendingLocked(int id) {
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    if ((*it)->id == id) {
      std::unique_ptr<Pending> p = std::move(*it);
      pending_.erase(it);
      return p;
    }
  }
  return nullptr;
}

void NodeRelay::refuse(int id, const std::string& reason) {
  std::unique_ptr<Pending> p;
  {
    std::lock_guard<std::mutex> lock(mu_);
    p = takePendingLocked(id);
  }
  GFDIT_CHECK(p != nullptr).param("id") << "no node agent " << id << " waits for an answer";
  Greeting g = greeting(1, reason);
  std::string ignored;
  sendAll(p->fd, &g, sizeof(g), kSecond, &ignored);
  ::close(p->fd);
  noteRefusal(p->address + ": " + reason);
}

void NodeRelay::admit(int id, const NodeWelcome& welcome) {
  std::unique_ptr<Pending> p;
  {
    std::lock_guard<std::mutex> lock(mu_);
    GFDIT_CHECK(!stopping_.load()) << "the relay is closed";
    for (int32_t w : welcome.workers) {
      GFDIT_CHECK(w >= 0 && w < num_workers_).param("workers") << "worker " << w << " of " << num_workers_;
      const Slot& s = *slots_[w];
      GFDIT_CHECK(s.node == nullptr || s.node->lost.load()).param("workers")
          << "worker " << w << " runs on " << s.node->describe() << " already";
    }
    p = takePendingLocked(id);
  }
  GFDIT_CHECK(p != nullptr).param("id") << "no node agent " << id << " waits for an answer";
  const std::string message = welcome.encode();
  Greeting g = greeting(0, "");
  std::string why;
  if (!sendAll(p->fd, &g, sizeof(g), kHandshakeNs, &why) ||
      !sendFrame(p->fd, kWelcome, -1, 0, message.data(), message.size(), kHandshakeNs, &why)) {
    ::close(p->fd);
    GFDIT_THROW(kRemoteError) << "the node agent at " << p->address << " (host " << p->hello.host
                              << ") is gone: " << why;
  }
  auto node = std::make_shared<Node>();
  node->node = welcome.node;
  node->fd = p->fd;
  node->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  node->host = p->hello.host;
  node->address = p->address;
  node->workers = welcome.workers;
  std::lock_guard<std::mutex> lock(mu_);
  nodes_.push_back(node);
  for (int32_t w : welcome.workers) {
    Slot& s = *slots_[w];
    s.node = node;
    s.running = true;
    s.pid = 0;
    s.exit_code = 0;
    s.why.clear();
    s.parked = false;
    s.parked_ack = true;
    s.has_sender = false;
  }
  if (started_) launch(node);
}

void NodeRelay::start(const std::string& queue_name) {
  std::unique_ptr<QueueSet> q = QueueSet::attach(queue_name);
  GFDIT_CHECK(q->numWorkers() == num_workers_)
      << "the queue set '" << queue_name << "' has " << q->numWorkers() << " workers, the relay " << num_workers_;
  std::lock_guard<std::mutex> lock(mu_);
  GFDIT_CHECK(!started_) << "the relay is started already";
  queues_ = std::move(q);
  output_prefix_ = outputPrefix(queue_name);
  started_ = true;
  for (auto& n : nodes_) {
    if (!n->lost.load()) launch(n);
  }
}

// Under mu_.
void NodeRelay::launch(const std::shared_ptr<Node>& node) {
  node->launched = true;
  node->last_tx.store(nowNs());
  // a relay thread that fails ends its node's connection, never the engine
  node->receiver = std::thread([this, node] {
    try {
      receiveLoop(node);
    } catch (const std::exception& e) {
      lose(*node, std::string("relaying from it failed: ") + e.what());
    }
  });
  for (int32_t w : node->workers) {
    slots_[w]->has_sender = true;
    node->senders.emplace_back([this, node, w] {
      try {
        sendLoop(node, w);
      } catch (const std::exception& e) {
        lose(*node, std::string("relaying to it failed: ") + e.what());
      }
    });
  }
}

void NodeRelay::post(Node& node, uint32_t type, int worker, uint64_t aux) {
  if (node.lost.load()) return;
  {
    std::lock_guard<std::mutex> lock(node.ctl_mu);
    node.ctl.push_back(FrameHead{type, worker, 0, aux});
  }
  wake(node.wake_fd);
}

void NodeRelay::lose(Node& node, const std::string& why) {
  if (node.lost.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    node.why = why;
    for (int32_t w : node.workers) {
      Slot& s = *slots_[w];
      if (s.node.get() != &node) continue;
      if (s.running) {
        s.running = false;
        s.exit_code = -1;
        s.why = "its " + node.describe() + " was lost: " + why;
      }
      s.parked = true;
    }
    cv_.notify_all();
  }
  ::shutdown(node.fd, SHUT_RDWR);  // the node's other threads see it at once
}

void NodeRelay::sendLoop(std::shared_ptr<Node> node, int worker) {
  std::string message;
  while (!stopping_.load() && !node->lost.load()) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      Slot& s = *slots_[worker];
      if (s.node != node) break;  // another node took the worker over
      if (s.parked) {
        s.parked_ack = true;
        cv_.notify_all();
        cv_.wait_for(lock, std::chrono::milliseconds(200),
                     [&] { return !s.parked || s.node != node || stopping_.load() || node->lost.load(); });
        continue;
      }
      s.parked_ack = false;  // from here until the next look at `parked`, the ring may be read
    }
    if (!queues_->dispatch(worker).pop(message, kDispatchWait)) continue;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (slots_[worker]->parked || slots_[worker]->node != node) continue;  // the worker died: dropped
    }
    std::string why;
    bool sent;
    {
      std::lock_guard<std::mutex> lock(node->send_mu);
      sent = sendFrame(node->fd, kTask, worker, 0, message.data(), message.size(), timeout_ns_, &why);
    }
    if (!sent) {
      lose(*node, "sending a task failed: " + why);
      break;
    }
    node->last_tx.store(nowNs());
  }
  std::lock_guard<std::mutex> lock(mu_);
  Slot& s = *slots_[worker];
  if (s.node == node) {
    s.parked_ack = true;
    s.has_sender = false;
  }
  cv_.notify_all();
}

void NodeRelay::receiveLoop(std::shared_ptr<Node> node) {
  const int64_t ping = pingPeriodNs(timeout_ns_);
  int64_t last_rx = nowNs();
  while (!stopping_.load() && !node->lost.load()) {
    int64_t now = nowNs();
    int64_t wait = std::min(ping - (now - node->last_tx.load()), timeout_ns_ - (now - last_rx));
    pollfd fds[2] = {{node->fd, POLLIN, 0}, {node->wake_fd, POLLIN, 0}};
    int rc = ::poll(fds, 2, static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wait / kMs + 1, 100))));
    if (rc < 0 && errno != EINTR) {
      lose(*node, "poll failed: " + errnoText(errno));
      break;
    }
    std::string why;
    if (rc > 0 && (fds[1].revents & POLLIN)) {
      uint64_t count;
      ssize_t ignored = ::read(node->wake_fd, &count, sizeof(count));
      (void)ignored;
      std::deque<FrameHead> ctl;
      {
        std::lock_guard<std::mutex> lock(node->ctl_mu);
        ctl.swap(node->ctl);
      }
      bool ok = true;
      for (const FrameHead& f : ctl) {
        std::lock_guard<std::mutex> lock(node->send_mu);
        ok = sendFrame(node->fd, f.type, f.worker, f.aux, nullptr, 0, timeout_ns_, &why);
        if (!ok) break;
      }
      if (!ok) {
        lose(*node, "sending to it failed: " + why);
        break;
      }
      if (!ctl.empty()) node->last_tx.store(nowNs());
    }
    if (rc > 0 && (fds[0].revents & (POLLIN | POLLHUP | POLLERR))) {
      FrameHead h{};
      if (!recvAll(node->fd, &h, sizeof(h), timeout_ns_, &why)) {
        lose(*node, why);
        break;
      }
      try {
        handleFrame(*node, h.type, h.worker, h.bytes, h.aux);
      } catch (const std::exception& e) {
        lose(*node, e.what());
        break;
      }
      last_rx = nowNs();
    }
    now = nowNs();
    if (now - node->last_tx.load() >= ping) {
      bool ok;
      {
        std::lock_guard<std::mutex> lock(node->send_mu);
        ok = sendFrame(node->fd, kPing, -1, 0, nullptr, 0, timeout_ns_, &why);
      }
      if (!ok) {
        lose(*node, "sending to it failed: " + why);
        break;
      }
      node->last_tx.store(now);
    }
    if (now - last_rx > timeout_ns_) {
      lose(*node, "nothing came from it for " + secondsText(timeout_ns_) + " s");
      break;
    }
  }
}

void NodeRelay::handleFrame(Node& node, uint32_t type, int worker, uint64_t bytes, uint64_t aux) {
  auto mine = [&] {
    GFDIT_CHECK_CODE(kRemoteError, std::find(node.workers.begin(), node.workers.end(), worker) != node.workers.end())
        << "it sent a frame of type " << type << " for worker " << worker << ", which it does not run";
  };
  auto small = [&] {  // a frame whose bytes are read whole
    GFDIT_CHECK_CODE(kRemoteError, bytes <= kMaxFrameBytes)
        << "it sent a frame of type " << type << " of " << bytes << " bytes";
  };
  std::string why;
  auto read = [&](std::string& out, uint64_t n) {
    out.resize(static_cast<size_t>(n));
    GFDIT_CHECK_CODE(kRemoteError, recvAll(node.fd, out.data(), out.size(), timeout_ns_, &why)) << why;
  };
  if (type == kPing || type == kBell || type == kStarted || type == kBye) {
    GFDIT_CHECK_CODE(kRemoteError, bytes == 0) << "it sent a frame of type " << type << " with " << bytes << " bytes";
  }
  switch (type) {
    case kPing: break;
    case kBell:
      ringDoorbell(queues_->controlBell());  // see NOTE [quiet completions]
      break;
    case kStarted: {
      mine();
      std::lock_guard<std::mutex> lock(mu_);
      if (slots_[worker]->node.get() == &node) slots_[worker]->pid = static_cast<int>(aux);
      break;
    }
    case kDied: {
      mine();
      small();
      std::string text;
      read(text, bytes);
      std::lock_guard<std::mutex> lock(mu_);
      Slot& s = *slots_[worker];
      if (s.node.get() == &node && s.running) {
        s.running = false;
        s.exit_code = static_cast<int>(static_cast<int64_t>(aux));
        s.why = text;
        s.parked = true;  // its thread stops taking tasks: they would go nowhere
        cv_.notify_all();
      }
      break;
    }
    case kBye: throw Error(ErrorCode::kRemoteError, "its agent left");
    case kCompletion: {
      mine();
      GFDIT_CHECK_CODE(kRemoteError, aux >= sizeof(Completion) && aux <= kMaxFrameBytes && bytes >= aux &&
                                         bytes - aux <= kMaxOutputBytes)
          << "a completion frame of " << bytes << " bytes with a message of " << aux;
      std::string message;
      read(message, aux);
      Completion c;
      std::memcpy(&c, message.data(), sizeof(c));
      const uint64_t out_bytes = bytes - aux;
      const bool has_output = c.output.name[0] != '\0';
      GFDIT_CHECK_CODE(
          kRemoteError,
          c.rank == worker && c.payload_bytes == aux - sizeof(Completion) &&
              (has_output ? c.output.bytes == out_bytes && c.output.ndim >= 0 && c.output.ndim <= 6 : out_bytes == 0))
          << "a malformed completion of worker " << worker << " (rank " << c.rank << ", " << c.payload_bytes
          << " payload bytes in a message of " << aux << ", " << out_bytes << " output bytes)";
      bool wanted;
      {
        std::lock_guard<std::mutex> lock(mu_);
        wanted = slots_[worker]->node.get() == &node && !slots_[worker]->parked;
      }
      if (!wanted) {  // the worker died meanwhile: its late completion goes nowhere
        GFDIT_CHECK_CODE(kRemoteError, skipBytes(node.fd, out_bytes, timeout_ns_, &why)) << why;
        break;
      }
      if (has_output) {
        // the engine's own object for it (NOTE [outputs]); written with pwrite, so that a full /dev/shm is an error
        // here, not a fault in a mapping
        const std::string name = output_prefix_ + std::to_string(c.task_id) + "-" + std::to_string(worker);
        std::string failure;
        int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
        if (fd < 0) {
          failure = "shm_open(" + name + "): " + errnoText(errno);
        } else if (out_bytes > 0 && ::posix_fallocate(fd, 0, static_cast<off_t>(out_bytes)) != 0) {
          failure = "no room for " + std::to_string(out_bytes) + " bytes in /dev/shm";
        }
        std::string chunk(static_cast<size_t>(std::min<uint64_t>(out_bytes, kChunk)), '\0');
        for (uint64_t off = 0; off < out_bytes;) {
          size_t k = static_cast<size_t>(std::min<uint64_t>(out_bytes - off, chunk.size()));
          GFDIT_CHECK_CODE(kRemoteError, recvAll(node.fd, chunk.data(), k, timeout_ns_, &why)) << why;
          if (failure.empty() && ::pwrite(fd, chunk.data(), k, static_cast<off_t>(off)) != static_cast<ssize_t>(k)) {
            failure = "writing the output failed: " + errnoText(errno);
          }
          off += k;
        }
        if (fd >= 0) ::close(fd);
        if (failure.empty()) {
          std::memset(c.output.name, 0, sizeof(c.output.name));
          std::memcpy(c.output.name, name.data(), std::min(name.size(), sizeof(c.output.name) - 1));
        } else {
          if (fd >= 0) ::shm_unlink(name.c_str());
          const std::string text = "the output of worker " + std::to_string(worker) + " on " + node.describe() +
                                   " could not be stored on the engine's host: " + failure;
          c.output = OutputRef();
          c.error = static_cast<int32_t>(TaskError::kModelError);
          c.payload_bytes = static_cast<uint32_t>(text.size());
          message.assign(reinterpret_cast<const char*>(&c), sizeof(c));
          message += text;
        }
      }
      std::memcpy(message.data(), &c, sizeof(c));
      // quiet: the BELL that follows wakes the control thread (see NOTE [quiet completions])
      GFDIT_CHECK_CODE(kRemoteError, queues_->completion(worker).push(message.data(), message.size(), nullptr, 0,
                                                                      kPushTimeout, /*wake=*/false))
          << "the control plane did not take a completion of worker " << worker << " within 30 s";
      break;
    }
    default: GFDIT_THROW(kRemoteError) << "it sent a frame of unknown type " << type << " (" << bytes << " bytes)";
  }
}

bool NodeRelay::gone(int worker, std::string* why) {
  if (worker < 0 || worker >= num_workers_) return true;
  std::lock_guard<std::mutex> lock(mu_);
  const Slot& s = *slots_[worker];
  if (s.running) return false;
  if (why != nullptr) *why = s.why.empty() ? "no node runs it" : s.why;
  return true;
}

void NodeRelay::kill(int worker) {
  if (worker < 0 || worker >= num_workers_) return;
  std::shared_ptr<Node> node;
  {
    std::lock_guard<std::mutex> lock(mu_);
    node = slots_[worker]->node;
  }
  if (node != nullptr) post(*node, kKill, worker, 0);
}

void NodeRelay::abortCollectives() {
  std::vector<std::shared_ptr<Node>> nodes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    nodes = nodes_;
  }
  for (auto& n : nodes) {
    if (n->launched) post(*n, kAbort, -1, 0);
  }
}

bool NodeRelay::release(int worker) {
  if (worker < 0 || worker >= num_workers_) return true;
  std::unique_lock<std::mutex> lock(mu_);
  Slot& s = *slots_[worker];
  s.parked = true;
  return cv_.wait_for(lock, kReleaseTimeout, [&] {
    return s.parked_ack || !s.has_sender || s.node == nullptr || s.node->lost.load() || stopping_.load();
  });
}

void NodeRelay::startWorker(int worker) {
  GFDIT_CHECK(worker >= 0 && worker < num_workers_).param("worker") << "worker " << worker;
  std::shared_ptr<Node> node;
  {
    std::lock_guard<std::mutex> lock(mu_);
    node = slots_[worker]->node;
    GFDIT_CHECK(node != nullptr && !node->lost.load() && node->launched)
        << "worker " << worker << " has no connected node to start it"
        << (node != nullptr ? " (its " + node->describe() + " was lost: " + node->why + ")" : "");
    GFDIT_CHECK(!slots_[worker]->running) << "worker " << worker << " runs: there is nothing to start";
  }
  // START goes before any task for the new process: the agent resets the worker's rings on it
  std::string why;
  bool sent;
  {
    std::lock_guard<std::mutex> lock(node->send_mu);
    sent = sendFrame(node->fd, kStart, worker, 0, nullptr, 0, timeout_ns_, &why);
  }
  if (!sent) {
    lose(*node, "sending to it failed: " + why);
    GFDIT_THROW(kRemoteError) << "worker " << worker << "'s " << node->describe() << " is lost: " << why;
  }
  std::lock_guard<std::mutex> lock(mu_);
  Slot& s = *slots_[worker];
  if (s.node != node) return;
  s.running = true;
  s.pid = 0;
  s.exit_code = 0;
  s.why.clear();
  s.parked = false;
  cv_.notify_all();
}

RemoteWorkerState NodeRelay::workerState(int worker) const {
  GFDIT_CHECK(worker >= 0 && worker < num_workers_).param("worker") << "worker " << worker;
  std::lock_guard<std::mutex> lock(mu_);
  const Slot& s = *slots_[worker];
  RemoteWorkerState out;
  if (s.node != nullptr) {
    out.node = s.node->node;
    out.connected = !s.node->lost.load();
  }
  out.running = s.running;
  out.pid = s.pid;
  out.exit_code = s.exit_code;
  out.why = s.why;
  return out;
}

std::vector<NodeState> NodeRelay::nodes() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<NodeState> out;
  for (const auto& n : nodes_) {
    out.push_back(NodeState{n->node, n->host, n->address, n->workers, !n->lost.load(), n->why});
  }
  return out;
}

void NodeRelay::close() {
  if (stopping_.load()) return;
  std::vector<std::shared_ptr<Node>> nodes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    nodes = nodes_;
  }
  for (auto& n : nodes) {  // goodbye first: the agents stop their workers and end without waiting for a timeout
    if (n->lost.load()) continue;
    std::string why;
    std::lock_guard<std::mutex> lock(n->send_mu);
    sendFrame(n->fd, kBye, -1, 0, nullptr, 0, kSecond, &why);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_.store(true);
    cv_.notify_all();
  }
  for (auto& n : nodes) ::shutdown(n->fd, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  for (auto& n : nodes) {
    if (n->receiver.joinable()) n->receiver.join();
    for (auto& t : n->senders) t.join();
    n->lost.store(true);
    ::close(n->fd);
    if (n->wake_fd >= 0) ::close(n->wake_fd);
  }
  std::deque<std::unique_ptr<Pending>> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending.swap(pending_);
    for (auto& s : slots_) {
      if (s->running) {
        s->running = false;
        s->why = "the engine closed its relay";
      }
    }
  }
  for (auto& p : pending) {
    Greeting g = greeting(1, "the engine shut down");
    std::string ignored;
    sendAll(p->fd, &g, sizeof(g), kSecond / 10, &ignored);
    ::close(p->fd);
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

// ---- the agent's end ----

AgentRelay::AgentRelay(const std::string& host, int port, const NodeHello& hello, double timeout_s,
                       double node_timeout_s)
    : timeout_ns_(timeoutNs(node_timeout_s)) {
  GFDIT_CHECK(port > 0 && port <= 65535).param("engine") << "port " << port << " is outside [1, 65535]";
  GFDIT_CHECK(std::isfinite(timeout_s) && timeout_s > 0).param("timeout_s") << "timeout " << timeout_s;
  where_ = host + ":" + std::to_string(port);
  const int64_t deadline = nowNs() + static_cast<int64_t>(std::min(timeout_s, 1e6) * kSecond);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr = resolve(host, "engine");
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &addr.sin_addr, text, sizeof(text));
  engine_address_ = text;
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  GFDIT_CHECK_CODE(kSystemError, fd_ >= 0) << "socket: " << errnoText(errno);
  auto fail = [&](ErrorCode code, const std::string& why) {
    ::close(fd_);
    fd_ = -1;
    throw Error(code, why);
  };
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 && errno != EINPROGRESS) {
    fail(ErrorCode::kSystemError, "cannot reach the engine at " + where_ + ": " + errnoText(errno));
  }
  int rc = waitFd(fd_, POLLOUT, deadline);
  int err = 0;
  socklen_t len = sizeof(err);
  if (rc > 0) ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
  if (rc == 0) {
    fail(ErrorCode::kTimeout, "cannot reach the engine at " + where_ + " within " +
                                  secondsText(static_cast<int64_t>(timeout_s * kSecond)) + " s");
  }
  if (rc < 0 || err != 0) {
    fail(ErrorCode::kSystemError, "cannot reach the engine at " + where_ + ": " + errnoText(rc < 0 ? errno : err));
  }
  tuneSocket(fd_);
  std::string why;
  Greeting g = greeting(0, "");
  const std::string message = hello.encode();
  if (!sendAll(fd_, &g, sizeof(g), kHandshakeNs, &why) ||
      !sendFrame(fd_, kHello, -1, 0, message.data(), message.size(), kHandshakeNs, &why)) {
    fail(ErrorCode::kSystemError, "the engine at " + where_ + " did not take this node's hello: " + why);
  }
  Greeting answer{};
  if (!recvAll(fd_, &answer, sizeof(answer), std::max<int64_t>(deadline - nowNs(), kMs), &why)) {
    fail(ErrorCode::kTimeout, "the engine at " + where_ + " did not answer this node's hello: " + why);
  }
  if (std::memcmp(answer.magic, kMagic, sizeof(kMagic)) != 0) {
    fail(ErrorCode::kRemoteError, where_ + " is not a gfdit engine's node port (it answered something else)");
  }
  if (answer.status != 0) {
    fail(ErrorCode::kRemoteError, "the engine at " + where_ + " refused this node: " + reasonOf(answer));
  }
  FrameHead h{};
  std::string bytes;
  if (!recvAll(fd_, &h, sizeof(h), kHandshakeNs, &why) || h.type != kWelcome || h.bytes > kMaxFrameBytes) {
    fail(ErrorCode::kRemoteError, "the engine at " + where_ + " sent no welcome" + (why.empty() ? "" : ": " + why));
  }
  bytes.resize(h.bytes);
  if (!recvAll(fd_, bytes.data(), bytes.size(), kHandshakeNs, &why)) {
    fail(ErrorCode::kRemoteError, "the engine at " + where_ + " cut its welcome short: " + why);
  }
  try {
    welcome_ = NodeWelcome::decode(bytes);
  } catch (const Error& e) {
    fail(ErrorCode::kRemoteError, std::string("the engine at ") + where_ + " sent a malformed welcome: " + e.what());
  }
}

AgentRelay::~AgentRelay() { close(); }

bool AgentRelay::mine(int worker) const {
  return std::find(welcome_.workers.begin(), welcome_.workers.end(), worker) != welcome_.workers.end();
}

std::string AgentRelay::start() {
  std::lock_guard<std::mutex> lock(mu_);
  GFDIT_CHECK(queues_ == nullptr) << "the node's relay is started already";
  GFDIT_CHECK(!closed_) << "the node's relay is closed";
  queues_ = QueueSet::create(welcome_.world_size);
  queue_name_ = queues_->name();
  queue_fd_ = ::shm_open(queue_name_.c_str(), O_RDWR | O_CLOEXEC, 0600);
  GFDIT_CHECK_CODE(kSystemError, queue_fd_ >= 0) << "shm_open(" << queue_name_ << "): " << errnoText(errno);
  said_hello_.assign(welcome_.world_size, false);
  last_tx_.store(nowNs());
  // a relay thread that fails ends the connection, never the agent
  up_ = std::thread([this] {
    try {
      uplink();
    } catch (const std::exception& e) {
      lose(std::string("relaying to the engine failed: ") + e.what());
    }
  });
  down_ = std::thread([this] {
    try {
      downlink();
    } catch (const std::exception& e) {
      lose(std::string("relaying from the engine failed: ") + e.what());
    }
  });
  return queue_name_;
}

void AgentRelay::request(AgentRequest r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ended_) return;
  ended_ = r.kind == AgentRequest::kEnd;
  requests_.push_back(std::move(r));
  cv_.notify_all();
}

std::optional<AgentRequest> AgentRelay::next(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  auto until = std::chrono::steady_clock::now() +
               std::chrono::microseconds(static_cast<int64_t>(std::max(0.0, std::min(timeout_s, 1e6)) * 1e6));
  cv_.wait_until(lock, until, [&] { return !requests_.empty(); });
  if (requests_.empty()) return std::nullopt;
  AgentRequest r = std::move(requests_.front());
  requests_.pop_front();
  if (r.kind == AgentRequest::kEnd) requests_.push_back(r);  // kEnd stays the answer
  return r;
}

void AgentRelay::command(Command c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    commands_.push_back(std::move(c));
  }
  if (queues_ != nullptr) ringDoorbell(queues_->controlBell());  // the uplink waits on that bell
}

void AgentRelay::workerDied(int worker, int exit_code, const std::string& why) {
  GFDIT_CHECK(mine(worker)).param("worker") << "worker " << worker << " does not run on this node";
  command(Command{Command::kDied, worker, exit_code, why.substr(0, kMaxMessageBytes)});
}

void AgentRelay::workerStarted(int worker, int pid) {
  GFDIT_CHECK(mine(worker)).param("worker") << "worker " << worker << " does not run on this node";
  command(Command{Command::kStarted, worker, pid, {}});
}

std::string AgentRelay::why() const {
  std::lock_guard<std::mutex> lock(mu_);
  return why_;
}

void AgentRelay::lose(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (lost_.load()) return;
    why_ = why;
    lost_.store(true);
  }
  request(AgentRequest{AgentRequest::kEnd, -1, why});
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
  if (queues_ != nullptr) ringDoorbell(queues_->controlBell());
}

// Sends what `worker` posted (the caller is the uplink: the only reader of this host's completion rings).
void AgentRelay::sendCompletions(int worker, bool* any) {
  Completion c;
  std::string payload, why;
  while (queues_->tryPopCompletion(worker, c, &payload)) {
    *any = true;
    if (c.task_id == 0) said_hello_[worker] = true;
    std::shared_ptr<MappedOutput> out;
    if (c.output.name[0] != '\0') {
      try {
        out = MappedOutput::open(c.output);  // and its name goes: its bytes travel now (NOTE [outputs])
      } catch (const std::exception& e) {
        c.output = OutputRef();
        c.error = static_cast<int32_t>(TaskError::kModelError);
        payload = std::string("the output could not be read on its host: ") + e.what();
        c.payload_bytes = static_cast<uint32_t>(payload.size());
      }
    }
    std::string message(reinterpret_cast<const char*>(&c), sizeof(c));
    message += payload;
    const size_t out_bytes = out != nullptr ? out->bytes() : 0;
    bool ok;
    {
      std::lock_guard<std::mutex> lock(send_mu_);
      FrameHead h{kCompletion, worker, message.size() + out_bytes, message.size()};
      ok = sendAll(fd_, &h, sizeof(h), timeout_ns_, &why) &&
           sendAll(fd_, message.data(), message.size(), timeout_ns_, &why) &&
           (out_bytes == 0 || sendAll(fd_, out->data(), out_bytes, timeout_ns_, &why));
    }
    if (!ok) {
      lose("sending to the engine at " + where_ + " failed: " + why);
      return;
    }
    last_tx_.store(nowNs());
  }
}

void AgentRelay::uplink() {
  Doorbell* bell = queues_->controlBell();
  const int64_t ping = pingPeriodNs(timeout_ns_);
  uint32_t last_bell = core::readBell(&bell->value);
  std::string why;
  auto send = [&](uint32_t type, int worker, uint64_t aux, const std::string& bytes) {
    std::lock_guard<std::mutex> lock(send_mu_);
    if (!sendFrame(fd_, type, worker, aux, bytes.data(), bytes.size(), timeout_ns_, &why)) return false;
    last_tx_.store(nowNs());
    return true;
  };
  while (!stopping_.load() && !lost_.load()) {
    const uint32_t seen = core::readBell(&bell->value);
    std::deque<Command> commands;
    {
      std::lock_guard<std::mutex> lock(mu_);
      commands.swap(commands_);
    }
    bool ok = true;
    bool any = false;
    for (Command& c : commands) {
      switch (c.kind) {
        case Command::kDied:
          sendCompletions(c.worker, &any);  // what it posted before it died goes first
          ok = !lost_.load() && send(kDied, c.worker, static_cast<uint64_t>(c.value), c.text);
          break;
        case Command::kStarted: ok = send(kStarted, c.worker, static_cast<uint64_t>(c.value), std::string()); break;
        case Command::kReset: {
          Completion ignored;
          while (queues_->tryPopCompletion(c.worker, ignored)) {
          }
          said_hello_[c.worker] = false;
          request(AgentRequest{AgentRequest::kStart, c.worker, "the engine replaces it"});
          break;
        }
        case Command::kBye: send(kBye, -1, 0, std::string()); return;
      }
      if (!ok) break;
    }
    if (!ok) {
      lose("sending to the engine at " + where_ + " failed: " + why);
      break;
    }
    for (int32_t w : welcome_.workers) sendCompletions(w, &any);
    if (lost_.load()) break;
    if (seen != last_bell) {  // see NOTE [quiet completions]: the workers rang; so does the engine's relay
      if (!send(kBell, -1, 0, std::string())) {
        lose("sending to the engine at " + where_ + " failed: " + why);
        break;
      }
      last_bell = seen;
    }
    if (!name_unlinked_) {
      bool all = true;
      for (int32_t w : welcome_.workers) all = all && said_hello_[w];
      if (all) {  // every worker mapped the rings: their name goes (replacements inherit queueFd())
        queues_->unlinkName();
        name_unlinked_ = true;
      }
    }
    int64_t now = nowNs();
    if (now - last_tx_.load() >= ping && !send(kPing, -1, 0, std::string())) {
      lose("sending to the engine at " + where_ + " failed: " + why);
      break;
    }
    waitDoorbell(bell, seen, now + std::min<int64_t>(ping, 100 * kMs));
  }
}

void AgentRelay::downlink() {
  Dispatcher out(*queues_);
  int64_t last_rx = nowNs();
  std::string why;
  while (!stopping_.load() && !lost_.load()) {
    pollfd p{fd_, POLLIN, 0};
    int rc = ::poll(&p, 1, out.waiting() ? 1 : 100);
    if (rc < 0 && errno != EINTR) {
      lose("poll failed: " + errnoText(errno));
      break;
    }
    if (rc > 0) {
      FrameHead h{};
      if (!recvAll(fd_, &h, sizeof(h), timeout_ns_, &why)) {
        lose("the connection to the engine at " + where_ + " failed: " + why);
        break;
      }
      const int w = h.worker;
      const bool for_mine = mine(w);
      std::string problem;
      if (h.bytes > kMaxFrameBytes) {
        problem = "a frame of " + std::to_string(h.bytes) + " bytes";
      } else if (h.type == kTask) {
        std::string message(static_cast<size_t>(h.bytes), '\0');
        if (!recvAll(fd_, message.data(), message.size(), timeout_ns_, &why)) {
          lose("the connection to the engine at " + where_ + " failed: " + why);
          break;
        }
        TaskDescriptor t;
        if (!for_mine || message.size() < sizeof(t) || message.size() > queues_->dispatch(w).maxMessage()) {
          problem = "a task for worker " + std::to_string(w) + " of " + std::to_string(message.size()) + " bytes";
        } else {
          std::memcpy(&t, message.data(), sizeof(t));
          if (t.payload_bytes != message.size() - sizeof(t)) {
            problem = "a task whose payload is not the size it says";
          } else {
            out.push(w, t, message.substr(sizeof(t)), nowNs());
          }
        }
      } else if (h.bytes != 0) {
        problem = "a frame of type " + std::to_string(h.type) + " with " + std::to_string(h.bytes) + " bytes";
      } else if (h.type == kAbort) {
        queues_->requestAbort();
      } else if (h.type == kKill && for_mine) {
        request(AgentRequest{AgentRequest::kKill, w, "the engine asked"});
      } else if (h.type == kStart && for_mine) {
        out.clear(w);  // the dead process's tasks go nowhere; its ring is ours to reset (NOTE [message ring])
        queues_->dispatch(w).clear();
        command(Command{Command::kReset, w, 0, {}});
      } else if (h.type == kBye) {
        const std::string text = "the engine at " + where_ + " shut down";
        {
          std::lock_guard<std::mutex> lock(mu_);
          why_ = text;
          lost_.store(true);
        }
        request(AgentRequest{AgentRequest::kEnd, -1, text, true});
        break;
      } else if (h.type != kPing) {
        problem = "a frame of type " + std::to_string(h.type) + " for worker " + std::to_string(w);
      }
      if (!problem.empty()) {
        lose("the engine at " + where_ + " sent " + problem);
        break;
      }
      last_rx = nowNs();
    }
    for (int w : out.flush(nowNs(), kWedgedNs)) {
      request(AgentRequest{AgentRequest::kKill, w, "its dispatch ring stayed full for 5 s"});
    }
    if (nowNs() - last_rx > timeout_ns_) {
      lose("nothing came from the engine at " + where_ + " for " + secondsText(timeout_ns_) + " s");
      break;
    }
  }
}

void AgentRelay::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    cv_.notify_all();
  }
  if (up_.joinable()) {
    if (!lost_.load()) command(Command{Command::kBye, -1, 0, {}});  // the uplink says goodbye, then ends
    up_.join();
  } else if (fd_ >= 0 && !lost_.load()) {
    std::string why;
    std::lock_guard<std::mutex> lock(send_mu_);
    sendFrame(fd_, kBye, -1, 0, nullptr, 0, kSecond, &why);
  }
  stopping_.store(true);
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
  if (down_.joinable()) down_.join();
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!lost_.exchange(true)) {
    std::lock_guard<std::mutex> lock(mu_);
    if (why_.empty()) why_ = "the node's relay was closed";
  }
  request(AgentRequest{AgentRequest::kEnd, -1, "the node's relay was closed", true});
  if (queues_ != nullptr) {
    // everything this node made in /dev/shm: its rings' name, outputs not sent, regions of worlds a killed worker
    // left (NOTE [outputs], NOTE [group-free collectives] in gfdit/world.h)
    if (!name_unlinked_) queues_->unlinkName();
    name_unlinked_ = true;
    unlinkOutputs(outputPrefix(queue_name_));
    unlinkOutputs("/" + worldShmPrefix(queue_name_) + "-");
  }
  if (queue_fd_ >= 0) ::close(queue_fd_);
  queue_fd_ = -1;
}

}  // namespace runtime
}  // namespace gfdit
