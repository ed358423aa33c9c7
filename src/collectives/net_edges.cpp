// Network edges: the protocol's remote stores over TCP (see net_edges.h, NOTE [network edges]).
#include "net_edges.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "doorbell.h"
#include "gfdit/error.h"
#include "gfdit/settings.h"

namespace gfdit {
namespace net {

namespace {

using Clock = std::chrono::steady_clock;

constexpr char kMagic[8] = {'g', 'f', 'd', 'i', 't', 'N', 'E', 'T'};
constexpr size_t kWorldKeyBytes = 96;
constexpr size_t kReplyMessageBytes = 240;
// How long a send may block in the kernel before the sender looks at the peer and the clock again.
constexpr int kSendSliceMs = 100;
// How long a connection's first bytes (its HELLO) may take: a peer that sends nothing is refused past it.
constexpr int kHelloTimeoutMs = 5000;
// How often an idle connection says it is alive.
constexpr std::chrono::milliseconds kKeepAlivePeriod{100};
// How long a rank that leaves the world waits for its peers to close their side of each stream.
constexpr std::chrono::milliseconds kLinger{1000};

enum FrameType : uint32_t { kPublish = 1, kAck = 2, kPut = 3, kHeartbeat = 4, kFail = 5, kBye = 6 };

// The head of every frame after the HELLO: what it is, then `head_bytes` of typed head (a descriptor), then
// `payload_bytes` of bytes.
struct FrameHead {
  uint32_t type;
  uint32_t head_bytes;
  uint64_t a;  // PUBLISH, ACK: seq; PUT: heap offset
  uint64_t b;  // PUBLISH: region offset of the bytes; PUT: the put count
  uint64_t c;
  uint64_t payload_bytes;
};

struct Hello {
  char magic[8];
  uint32_t version;
  int32_t from;
  int32_t to;
  int32_t world_size;
  char world_key[kWorldKeyBytes];
};

struct HelloReply {
  char magic[8];
  uint32_t version;
  int32_t status;  // 0: accepted
  char message[kReplyMessageBytes];
};

std::string errnoText(int e) { return std::string(std::strerror(e)); }

void setTimeoutOpt(int fd, int opt, int ms) {
  timeval tv{};
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  ::setsockopt(fd, SOL_SOCKET, opt, &tv, sizeof(tv));
}

// Reads exactly n bytes; false at the end of the stream or on an error (errno says which; 0 at the end).
bool readFull(int fd, void* dst, size_t n) {
  auto* p = static_cast<uint8_t*>(dst);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r == 0) {
      errno = 0;
      return false;
    }
    if (r < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// Writes exactly n bytes, within `within` (the caller's bound); false with errno on an error or past it.
bool writeFull(int fd, const void* src, size_t n, std::chrono::milliseconds within) {
  const auto* p = static_cast<const uint8_t*>(src);
  auto start = Clock::now();
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if ((errno == EAGAIN || errno == EWOULDBLOCK) && Clock::now() - start < within) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

void tuneSocket(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // signals and acks are small and urgent
}

}  // namespace

std::string hostKey() {
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  struct stat st{};
  std::ostringstream os;
  os << (boot.empty() ? "no-boot-id" : boot);
  if (::stat("/dev/shm", &st) == 0) os << ":" << st.st_dev << ":" << st.st_ino;
  return os.str();
}

std::string hostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  return buf;
}

std::string listenAddress(bool peers_on_this_host) {
  if (const char* v = settings::netAddress()) return v;
  std::string found = "127.0.0.1";
  if (peers_on_this_host) return found;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return found;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if ((a->ifa_flags & IFF_UP) == 0 || (a->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof(text));
    found = text;
    break;
  }
  ::freeifaddrs(list);
  return found;
}

struct NetEdges::Conn {
  int peer = -1;
  int fd = -1;
  RemotePeer where;
  std::mutex send_mu;
  std::thread receiver;
  std::atomic<bool> failed{false};
  std::atomic<bool> closed{false};         // the peer said BYE
  std::atomic<bool> receiver_done{false};  // the receiving thread ended (BYE, the stream's end or an error)
  std::string describe(int self) const {
    std::ostringstream os;
    os << "edge " << self << "<->" << peer << " (rank " << peer << " on " << where.host << ", " << where.address << ":"
       << where.port << ")";
    return os.str();
  }
};

NetEdges::NetEdges(int rank, int world_size, const std::string& world_key, const std::string& address,
                   std::chrono::milliseconds timeout, const std::vector<bool>& remote)
    : rank_(rank), size_(world_size), world_key_(world_key), timeout_ms_(timeout.count()) {
  GFDIT_CHECK(world_key.size() < kWorldKeyBytes) << "gfdit: a network world key of " << world_key.size() << " bytes";
  conns_.resize(world_size);
  for (int p = 0; p < world_size; ++p) {
    if (p == rank || !remote[p]) continue;
    conns_[p] = std::make_unique<Conn>();
    conns_[p]->peer = p;
    conns_[p]->where.rank = p;
  }
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  GFDIT_CHECK_CODE(kSystemError, listen_fd_ >= 0) << "gfdit: socket: " << errnoText(errno);
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  GFDIT_CHECK(::inet_pton(AF_INET, address.c_str(), &addr.sin_addr) == 1)
      << "gfdit: network edges: '" << address << "' is not an IPv4 address (GFDIT_NET_ADDRESS)";
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(listen_fd_, 128) != 0) {
    int e = errno;
    ::close(listen_fd_);
    GFDIT_THROW(kSystemError) << "gfdit: network edges: cannot listen on " << address << ": " << errnoText(e);
  }
  socklen_t len = sizeof(addr);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] { acceptLoop(); });
}

NetEdges::~NetEdges() {
  stopping_ = true;
  // BYE, then this side of each stream closes; the peer closes its side when it reads the BYE, and the receiver
  // here drains what it still sent (acknowledgements) until that end, so neither side resets the connection
  for (auto& c : conns_) {
    if (c == nullptr || c->fd < 0) continue;
    try {
      if (!c->failed && !c->closed) sendFrame(c->peer, kBye, 0, 0, 0, nullptr, 0, nullptr, 0);
    } catch (...) {  // a peer already gone: nothing to say goodbye to
    }
    ::shutdown(c->fd, SHUT_WR);
  }
  auto linger_until = Clock::now() + kLinger;
  for (auto& c : conns_) {
    if (c == nullptr || !c->receiver.joinable()) continue;
    while (!c->receiver_done && Clock::now() < linger_until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ::shutdown(c->fd, SHUT_RDWR);  // a peer still busy: its reader ends here
    c->receiver.join();
  }
  {
    std::lock_guard<std::mutex> lock(keepalive_mu_);
    keepalive_cv_.notify_all();
  }
  if (keepalive_.joinable()) keepalive_.join();
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  for (auto& c : conns_) {
    if (c != nullptr && c->fd >= 0) ::close(c->fd);
  }
}

void NetEdges::refuse(int fd, const std::string& why) {
  ++refused_;
  HelloReply r{};
  std::memcpy(r.magic, kMagic, sizeof(kMagic));
  r.version = kProtocolVersion;
  r.status = 1;
  std::snprintf(r.message, sizeof(r.message), "%s", why.c_str());
  writeFull(fd, &r, sizeof(r), std::chrono::milliseconds(kHelloTimeoutMs));
  ::close(fd);
}

// Takes connections for the whole life of the world: the expected higher ranks during setup, and refuses
// anything else (garbage, another version, another world, a rank already connected) with a reply that says why.
void NetEdges::acceptLoop() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    int n = ::poll(&p, 1, 100);
    if (n <= 0) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    setTimeoutOpt(fd, SO_RCVTIMEO, kHelloTimeoutMs);
    Hello h{};
    if (!readFull(fd, &h, sizeof(h))) {
      refuse(fd, "gfdit network edge: no complete HELLO within 5 s");
      continue;
    }
    if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) {
      refuse(fd, "gfdit network edge: not a gfdit HELLO (bad magic): refused");
      continue;
    }
    if (h.version != kProtocolVersion) {
      refuse(fd, "gfdit network edge: protocol version " + std::to_string(h.version) + ", but rank " +
                     std::to_string(rank_) + " speaks version " + std::to_string(kProtocolVersion));
      continue;
    }
    h.world_key[kWorldKeyBytes - 1] = '\0';
    if (world_key_ != h.world_key || h.world_size != size_ || h.to != rank_) {
      refuse(fd, "gfdit network edge: a HELLO for another world or rank (world '" + std::string(h.world_key) +
                     "', rank " + std::to_string(h.to) + "); this is rank " + std::to_string(rank_) + " of '" +
                     world_key_ + "'");
      continue;
    }
    std::unique_lock<std::mutex> lock(accept_mu_);
    bool wanted = h.from > rank_ && h.from < size_ && conns_[h.from] != nullptr && conns_[h.from]->fd < 0;
    if (!wanted) {
      lock.unlock();
      refuse(fd, "gfdit network edge: rank " + std::to_string(h.from) + " is not a remote peer of rank " +
                     std::to_string(rank_) + " waiting to connect");
      continue;
    }
    HelloReply r{};
    std::memcpy(r.magic, kMagic, sizeof(kMagic));
    r.version = kProtocolVersion;
    if (!writeFull(fd, &r, sizeof(r), std::chrono::milliseconds(kHelloTimeoutMs))) {
      ::close(fd);
      continue;
    }
    setTimeoutOpt(fd, SO_RCVTIMEO, 0);
    setTimeoutOpt(fd, SO_SNDTIMEO, kSendSliceMs);
    tuneSocket(fd);
    conns_[h.from]->fd = fd;
    accept_cv_.notify_all();
  }
}

void NetEdges::connect(const std::vector<RemotePeer>& peers, const std::vector<protocol::HostRegion>& regions) {
  regions_ = regions;
  {
    std::lock_guard<std::mutex> lock(accept_mu_);
    for (const RemotePeer& p : peers) {
      GFDIT_CHECK_CODE(kInternal, p.rank >= 0 && p.rank < size_ && conns_[p.rank] != nullptr)
          << "rank " << p.rank << " is not a remote peer of rank " << rank_;
      conns_[p.rank]->where = p;
    }
  }
  const auto bound = std::chrono::milliseconds(timeout_ms_.load());
  // this rank dials the lower ranks; the higher ones dial it (NOTE [network edges])
  for (const RemotePeer& p : peers) {
    if (p.rank > rank_) continue;
    Conn& c = *conns_[p.rank];
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(p.port));
    GFDIT_CHECK(::inet_pton(AF_INET, p.address.c_str(), &addr.sin_addr) == 1)
        << "gfdit: rank " << p.rank << " published '" << p.address << "', not an IPv4 address";
    auto start = Clock::now();
    int fd = -1;
    while (true) {
      fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      GFDIT_CHECK_CODE(kSystemError, fd >= 0) << "gfdit: socket: " << errnoText(errno);
      setTimeoutOpt(fd, SO_SNDTIMEO, kHelloTimeoutMs);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) break;
      int e = errno;
      ::close(fd);
      fd = -1;
      if (Clock::now() - start > bound) {
        GFDIT_THROW(kTimeout) << "gfdit: rank " << rank_ << " cannot reach " << c.describe(rank_) << ": "
                              << errnoText(e);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    Hello h{};
    std::memcpy(h.magic, kMagic, sizeof(kMagic));
    h.version = kProtocolVersion;
    h.from = rank_;
    h.to = p.rank;
    h.world_size = size_;
    std::snprintf(h.world_key, sizeof(h.world_key), "%s", world_key_.c_str());
    setTimeoutOpt(fd, SO_RCVTIMEO, kHelloTimeoutMs);
    HelloReply r{};
    bool ok = writeFull(fd, &h, sizeof(h), std::chrono::milliseconds(kHelloTimeoutMs)) && readFull(fd, &r, sizeof(r));
    if (!ok || std::memcmp(r.magic, kMagic, sizeof(kMagic)) != 0 || r.status != 0) {
      int e = errno;
      ::close(fd);
      r.message[kReplyMessageBytes - 1] = '\0';
      GFDIT_THROW(kRemoteError) << "gfdit: rank " << rank_ << " was refused by " << c.describe(rank_) << ": "
                                << (ok ? std::string(r.message) : "no reply (" + errnoText(e) + ")");
    }
    setTimeoutOpt(fd, SO_RCVTIMEO, 0);
    setTimeoutOpt(fd, SO_SNDTIMEO, kSendSliceMs);
    tuneSocket(fd);
    std::lock_guard<std::mutex> lock(accept_mu_);
    c.fd = fd;
  }
  {
    std::unique_lock<std::mutex> lock(accept_mu_);
    auto all_in = [&] {
      for (const RemotePeer& p : peers) {
        if (conns_[p.rank]->fd < 0) return false;
      }
      return true;
    };
    if (!accept_cv_.wait_for(lock, bound, all_in)) {
      std::ostringstream missing;
      for (const RemotePeer& p : peers) {
        if (conns_[p.rank]->fd < 0) missing << " " << conns_[p.rank]->describe(rank_);
      }
      GFDIT_THROW(kTimeout) << "gfdit: rank " << rank_ << ": no connection within "
                            << std::chrono::duration<double>(bound).count() << " s on" << missing.str();
    }
  }
  for (const RemotePeer& p : peers) {
    Conn* c = conns_[p.rank].get();
    c->receiver = std::thread([this, c] { receiveLoop(c); });
  }
  keepalive_ = std::thread([this] { keepAlive(); });
}

void NetEdges::markFailed(Conn* c, const std::string& why) {
  if (c->failed.exchange(true)) return;
  edge::RegionHeader* mirror = regions_[c->peer].header;
  // see NOTE [failure broadcast]: the reason first, then the flag; a reason the peer sent itself stays
  if (edge::loadAcquire(&mirror->failed) == 0) {
    std::snprintf(mirror->fail_reason, edge::kFailReasonBytes, "%s", why.c_str());
    edge::storeRelease(&mirror->failed, 1);
  }
  edge::RegionHeader* own = regions_[rank_].header;
  core::ringBell(&own->doorbell, &own->num_waiters);
}

// Applies what a peer sends to this rank's memory (NOTE [network edges]).
void NetEdges::receiveLoop(Conn* c) {
  struct Done {
    Conn* c;
    ~Done() { c->receiver_done = true; }
  } done{c};
  const protocol::HostRegion& own = regions_[rank_];
  const protocol::HostRegion& mirror = regions_[c->peer];
  std::vector<char> reason;
  while (true) {
    FrameHead f{};
    if (!readFull(c->fd, &f, sizeof(f))) break;
    __atomic_add_fetch(&mirror.header->heartbeat, 1, __ATOMIC_RELEASE);  // any frame is a beat
    switch (f.type) {
      case kPublish: {
        edge::MessageDesc d{};
        if (f.head_bytes != sizeof(d) || !readFull(c->fd, &d, sizeof(d))) {
          markFailed(c, "gfdit: a malformed PUBLISH on " + c->describe(rank_));
          return;
        }
        uint64_t offset = f.b;
        if (offset > mirror.header->total_bytes || f.payload_bytes > mirror.header->total_bytes - offset ||
            !readFull(c->fd, mirror.base + offset, f.payload_bytes)) {
          markFailed(c, "gfdit: bytes of a message lost or out of range on " + c->describe(rank_));
          return;
        }
        edge::InEdge& e = own.in_edges[c->peer];
        e.desc[f.a % 2] = d;
        edge::storeRelease(&e.signal, f.a);  // release: the bytes and the descriptor above first
        break;
      }
      case kAck: edge::storeRelease(&own.out_edges[c->peer].ack, f.a); break;
      case kPut: {
        uint64_t heap = own.header->heap_bytes;
        if (f.a > heap || f.payload_bytes > heap - f.a ||
            !readFull(c->fd, own.base + own.header->heap_offset + f.a, f.payload_bytes)) {
          markFailed(c, "gfdit: a put lost or out of range on " + c->describe(rank_));
          return;
        }
        edge::storeRelease(&own.in_edges[c->peer].put_signal, f.b);
        break;
      }
      case kHeartbeat: break;
      case kFail: {
        reason.assign(static_cast<size_t>(std::min<uint64_t>(f.payload_bytes, 1 << 16)) + 1, '\0');
        if (!readFull(c->fd, reason.data(), reason.size() - 1)) break;
        if (edge::loadAcquire(&mirror.header->failed) == 0) {
          std::snprintf(mirror.header->fail_reason, edge::kFailReasonBytes, "%s", reason.data());
          edge::storeRelease(&mirror.header->failed, 1);
        }
        break;
      }
      case kBye: {  // the peer left the world: waits on it end at once, and its side of the stream closes
        c->closed = true;
        if (edge::loadAcquire(&mirror.header->failed) == 0) {
          std::snprintf(mirror.header->fail_reason, edge::kFailReasonBytes,
                        "rank %d left the world (it closed its network edges)", c->peer);
          edge::storeRelease(&mirror.header->failed, 1);
        }
        ::shutdown(c->fd, SHUT_WR);
        core::ringBell(&own.header->doorbell, &own.header->num_waiters);
        c->receiver_done = true;
        return;
      }
      default: markFailed(c, "gfdit: an unknown frame on " + c->describe(rank_)); return;
    }
    core::ringBell(&own.header->doorbell, &own.header->num_waiters);
  }
  if (!stopping_ && !c->closed) {
    int e = errno;
    markFailed(c, "gfdit: lost the connection of " + c->describe(rank_) +
                      (e != 0 ? ": " + errnoText(e) : std::string(": closed by the peer")));
  }
}

void NetEdges::keepAlive() {
  std::unique_lock<std::mutex> lock(keepalive_mu_);
  while (!stopping_) {
    keepalive_cv_.wait_for(lock, kKeepAlivePeriod);
    if (stopping_) break;
    for (auto& c : conns_) {
      if (c == nullptr || c->failed || c->closed) continue;
      std::unique_lock<std::mutex> send(c->send_mu, std::try_to_lock);
      if (!send.owns_lock()) continue;  // a frame is on its way: that is a beat too
      FrameHead f{};
      f.type = kHeartbeat;
      if (!writeFull(c->fd, &f, sizeof(f), std::chrono::milliseconds(kSendSliceMs))) continue;
    }
  }
}

void NetEdges::sendFrame(int peer, uint32_t type, uint64_t a, uint64_t b, uint64_t c_arg, const void* head,
                         size_t head_bytes, const void* payload, size_t payload_bytes) {
  Conn* c = conns_[peer].get();
  GFDIT_CHECK_CODE(kInternal, c != nullptr && c->fd >= 0) << "gfdit: no network edge to rank " << peer;
  FrameHead f{};
  f.type = type;
  f.head_bytes = static_cast<uint32_t>(head_bytes);
  f.a = a;
  f.b = b;
  f.c = c_arg;
  f.payload_bytes = payload_bytes;
  // an acknowledgement, a beat or a failure for a peer that left is for nobody; a message to it is an error
  const bool optional = type == kAck || type == kHeartbeat || type == kFail || type == kBye;
  auto gone = [&] {
    if (optional) return true;
    GFDIT_THROW(kRemoteError) << "gfdit: rank " << rank_ << " cannot send on " << c->describe(rank_) << ": rank "
                              << peer << " left the world";
  };
  std::lock_guard<std::mutex> lock(c->send_mu);
  if (c->closed && gone()) return;
  const auto bound = std::chrono::milliseconds(timeout_ms_.load());
  auto start = Clock::now();
  auto push = [&](const void* p, size_t n) -> bool {
    const auto* bytes = static_cast<const uint8_t*>(p);
    while (n > 0) {
      // bounded slices: between them, the peer's state and the clock (NOTE [network edges])
      if (c->failed) {
        GFDIT_THROW(kRemoteError) << "gfdit: rank " << rank_ << " cannot send on " << c->describe(rank_)
                                  << ": the connection is lost";
      }
      size_t piece = std::min<size_t>(n, size_t{4} << 20);
      ssize_t w = ::send(c->fd, bytes, piece, MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          if (Clock::now() - start > bound) {
            GFDIT_THROW(kTimeout) << "gfdit: timeout after " << std::chrono::duration<double>(bound).count()
                                  << " s: rank " << rank_ << " could not send on " << c->describe(rank_);
          }
          continue;
        }
        int e = errno;
        // a peer that left may have closed the stream before its BYE was read here: the reader tells
        auto settle = Clock::now() + kLinger;
        while (!c->receiver_done && Clock::now() < settle) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (c->closed && gone()) return false;
        markFailed(c, "gfdit: lost the connection of " + c->describe(rank_) + ": " + errnoText(e));
        GFDIT_THROW(kRemoteError) << "gfdit: rank " << rank_ << " lost the connection of " << c->describe(rank_) << ": "
                                  << errnoText(e);
      }
      bytes += w;
      n -= static_cast<size_t>(w);
      bytes_sent_ += static_cast<uint64_t>(w);
    }
    return true;
  };
  if (!push(&f, sizeof(f))) return;
  if (head_bytes > 0 && !push(head, head_bytes)) return;
  if (payload_bytes > 0) push(payload, payload_bytes);
}

void NetEdges::publish(int peer, uint64_t seq, const edge::MessageDesc& desc, const uint8_t* bytes, size_t span) {
  sendFrame(peer, kPublish, seq, desc.region_offset, 0, &desc, sizeof(desc), bytes, span);
}

void NetEdges::ack(int peer, uint64_t seq) { sendFrame(peer, kAck, seq, 0, 0, nullptr, 0, nullptr, 0); }

void NetEdges::put(int peer, uint64_t heap_offset, const void* src, size_t bytes, uint64_t count) {
  sendFrame(peer, kPut, heap_offset, count, 0, nullptr, 0, src, bytes);
}

void NetEdges::broadcastFailure(const std::string& reason) {
  for (auto& c : conns_) {
    if (c == nullptr || c->fd < 0 || c->failed || c->closed) continue;
    try {
      sendFrame(c->peer, kFail, 0, 0, 0, nullptr, 0, reason.data(), reason.size());
    } catch (...) {  // a peer we cannot tell finds out from the connection or its heartbeat
    }
  }
}

}  // namespace net
}  // namespace gfdit
