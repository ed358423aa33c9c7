// Network edges: the protocol's remote stores over TCP (see net_edges.h, NOTE [network edges]).
#include "net_edges.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
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
// A connection's read-ahead buffer: a small frame (head, descriptor, payload) and those behind it in one read.
constexpr size_t kReadAheadBytes = 64 << 10;
// From this many bytes of a payload still to come the reader hands the socket its destination instead.
constexpr size_t kDirectReadBytes = 16 << 10;
// The most payload rows one sendmsg gathers (the system's bound on an iovec is 1024).
constexpr size_t kMaxIov = 1024;
// The most of a FAIL's reason that is kept.
constexpr size_t kMaxReasonBytes = 1 << 16;

enum FrameType : uint32_t { kPublish = 1, kAck = 2, kPut = 3, kHeartbeat = 4, kFail = 5, kBye = 6, kWant = 7 };

// The head of every frame after the HELLO: what it is, then `head_bytes` of typed head (a descriptor), then
// `payload_bytes` of bytes.
struct FrameHead {
  uint32_t type;
  uint32_t head_bytes;
  uint64_t a;    // PUBLISH: seq; PUT: heap offset
  uint64_t b;    // PUBLISH: region offset of the bytes; PUT: the put count
  uint64_t ack;  // every frame: the last of the receiver's messages the sender consumed (0: nothing new)
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

// A payload as rows of row_bytes, stride apart (one row: contiguous).
struct NetEdges::Rows {
  const uint8_t* base = nullptr;
  uint64_t rows = 0;
  uint64_t row_bytes = 0;
  uint64_t stride = 0;
  uint64_t bytes() const { return rows * row_bytes; }
  static Rows contiguous(const void* p, uint64_t n) {
    return Rows{static_cast<const uint8_t*>(p), n > 0 ? 1u : 0u, n, n};
  }
};

// The frame a connection is reading, and the bytes read ahead of it (NOTE [network edges]): whoever holds
// Conn::recv_mu reads on from here.
struct FrameReader {
  enum Phase { kHead, kTyped, kPayload };
  std::vector<uint8_t> ahead = std::vector<uint8_t>(kReadAheadBytes);
  size_t rd = 0;  // [rd, wr) of `ahead` not yet taken
  size_t wr = 0;
  Phase phase = kHead;
  size_t got = 0;  // bytes of the head, or of the typed head, so far
  FrameHead f{};
  edge::MessageDesc d{};
  // where the payload goes: rows of row_bytes, stride apart, from dst (nullptr: read and dropped)
  uint8_t* dst = nullptr;
  uint64_t row_bytes = 0;
  uint64_t stride = 0;
  uint64_t done = 0;  // payload bytes taken
  std::string reason;
  bool ended = false;  // the stream ended (BYE, its end, an error, a malformed frame): nothing more is read

  // The next `n` payload bytes' place (within one row); nullptr while they are dropped.
  uint8_t* cursor() const { return dst == nullptr ? nullptr : dst + (done / row_bytes) * stride + done % row_bytes; }
  uint64_t rowLeft() const { return row_bytes - done % row_bytes; }
  uint64_t payloadLeft() const { return f.payload_bytes - done; }
};

struct NetEdges::Conn {
  int peer = -1;
  int fd = -1;
  RemotePeer where;
  std::mutex send_mu;
  std::mutex recv_mu;  // held by whoever reads: the connection's thread, or the rank's own while it waits
  FrameReader reader;
  std::thread receiver;
  std::atomic<bool> failed{false};
  std::atomic<bool> closed{false};         // the peer said BYE
  std::atomic<bool> receiver_done{false};  // reading ended (BYE, the stream's end or an error)
  std::atomic<int64_t> last_send_ns{0};    // steady clock of the last frame sent (a beat too)
  std::atomic<uint64_t> pending_ack{0};    // the peer's last message consumed here and not yet told (0: none)
  std::atomic<bool> missed{false};         // its thread left bytes to the rank's thread (see receiveLoop)
  std::atomic<bool> peer_wants{false};     // the peer waits for this rank's acknowledgements: no holding back
  std::atomic<bool> want_sent{false};      // this rank asked the peer for its acknowledgements (WANT)
  int ep = -1;                             // its thread's epoll set: the socket, edge-triggered (see arm)
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
      if (!c->failed && !c->closed) sendFrame(c->peer, kBye, 0, 0, nullptr, 0, Rows{});
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
    if (c != nullptr && c->ep >= 0) ::close(c->ep);
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
    c->ep = ::epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
    if (c->ep >= 0 && ::epoll_ctl(c->ep, EPOLL_CTL_ADD, c->fd, &ev) != 0) {
      ::close(c->ep);
      c->ep = -1;  // its thread polls the socket instead, and wakes with the rank's
    }
    c->receiver = std::thread([this, c] { receiveLoop(c); });
    connected_.push_back(c);
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

// Reading ended (caller holds c->recv_mu): the stream's end (error 0) or an error on it. A peer that said BYE, or
// a world that is closing, is no failure; anything else marks the peer failed (NOTE [network edges]).
void NetEdges::endStream(Conn* c, int error) {
  c->reader.ended = true;
  if (!stopping_ && !c->closed) {
    markFailed(c, "gfdit: lost the connection of " + c->describe(rank_) +
                      (error != 0 ? ": " + errnoText(error) : std::string(": closed by the peer")));
  }
  c->receiver_done = true;
}

// The head of a frame is in (caller holds c->recv_mu): checks it and says where its payload goes. false: a
// malformed frame, which failed the connection.
bool NetEdges::startPayload(Conn* c) {
  FrameReader& r = c->reader;
  const FrameHead& f = r.f;
  const protocol::HostRegion& own = regions_[rank_];
  const protocol::HostRegion& mirror = regions_[c->peer];
  r.dst = nullptr;
  r.row_bytes = std::max<uint64_t>(f.payload_bytes, 1);
  r.stride = r.row_bytes;
  r.done = 0;
  auto malformed = [&](const char* what) {
    markFailed(c, std::string("gfdit: ") + what + " on " + c->describe(rank_));
    r.ended = true;
    c->receiver_done = true;
    return false;
  };
  switch (f.type) {
    case kPublish: {
      // the bytes go where the sender's are in its region: contiguous, or the rows of a strided view
      const edge::MessageDesc& d = r.d;
      const uint64_t total = mirror.header->total_bytes;
      uint64_t extent = f.payload_bytes;
      if (d.rows > 0 && f.payload_bytes > 0) {
        if (d.row_bytes == 0 || d.stride < d.row_bytes || f.payload_bytes != d.rows * d.row_bytes) {
          return malformed("a PUBLISH whose rows disagree with its bytes");
        }
        r.row_bytes = d.row_bytes;
        r.stride = d.stride;
        extent = (d.rows - 1) * d.stride + d.row_bytes;
      }
      if (f.b > total || extent > total - f.b) return malformed("bytes of a message out of range");
      r.dst = mirror.base + f.b;
      return true;
    }
    case kPut: {
      const uint64_t heap = own.header->heap_bytes;
      if (f.a > heap || f.payload_bytes > heap - f.a) return malformed("a put out of range");
      r.dst = own.base + own.header->heap_offset + f.a;
      return true;
    }
    case kFail: r.reason.clear(); return true;  // taken from the read-ahead or dropped (see drain)
    case kAck:
    case kHeartbeat:
    case kBye:
    case kWant:
      if (f.payload_bytes != 0) return malformed("a frame with an unexpected payload");
      return true;
    default: return malformed("an unknown frame");
  }
}

// A whole frame is in (caller holds c->recv_mu): what it stores lands (NOTE [network edges]). Returns whether a
// signal, an acknowledgement, a put or a failure landed.
bool NetEdges::finishFrame(Conn* c) {
  FrameReader& r = c->reader;
  const FrameHead& f = r.f;
  const protocol::HostRegion& own = regions_[rank_];
  const protocol::HostRegion& mirror = regions_[c->peer];
  r.phase = FrameReader::kHead;
  r.got = 0;
  if (f.type != kHeartbeat) bytes_received_ += sizeof(FrameHead) + f.head_bytes + f.payload_bytes;
  switch (f.type) {
    case kPublish: {
      edge::InEdge& e = own.in_edges[c->peer];
      e.desc[f.a % 2] = r.d;
      edge::storeRelease(&e.signal, f.a);  // release: the bytes and the descriptor above first
      return true;
    }
    case kAck: return true;  // its ack landed with its head
    case kPut: edge::storeRelease(&own.in_edges[c->peer].put_signal, f.b); return true;
    case kHeartbeat: return false;
    case kWant:  // from now on this rank's acknowledgements go at once; what it holds back goes now, from the
                 // keep-alive thread (a reader never sends: it could wait for a peer that waits for its reading)
      c->peer_wants = true;
      if (c->pending_ack.load() != 0) {
        std::lock_guard<std::mutex> lock(keepalive_mu_);
        flush_asked_ = true;
        keepalive_cv_.notify_all();
      }
      return false;
    case kFail:
      if (edge::loadAcquire(&mirror.header->failed) == 0) {
        std::snprintf(mirror.header->fail_reason, edge::kFailReasonBytes, "%s", r.reason.c_str());
        edge::storeRelease(&mirror.header->failed, 1);
      }
      return true;
    case kBye:  // the peer left the world: waits on it end at once, and its side of the stream closes
      c->closed = true;
      if (edge::loadAcquire(&mirror.header->failed) == 0) {
        std::snprintf(mirror.header->fail_reason, edge::kFailReasonBytes,
                      "rank %d left the world (it closed its network edges)", c->peer);
        edge::storeRelease(&mirror.header->failed, 1);
      }
      ::shutdown(c->fd, SHUT_WR);
      r.ended = true;
      c->receiver_done = true;
      return true;
  }
  return false;
}

// Reads and applies what the connection holds now, without blocking (caller holds c->recv_mu): frames through the
// read-ahead buffer, large payloads straight into their place. Returns whether anything landed; rings this rank's
// doorbell if so.
bool NetEdges::drain(Conn* c) {
  FrameReader& r = c->reader;
  const protocol::HostRegion& own = regions_[rank_];
  const protocol::HostRegion& mirror = regions_[c->peer];
  bool landed = false;
  while (!r.ended) {
    if (r.rd == r.wr) {  // nothing read ahead: from the socket
      ssize_t n;
      const bool direct = r.phase == FrameReader::kPayload && r.dst != nullptr && r.rowLeft() >= kDirectReadBytes;
      if (direct) {
        n = ::recv(c->fd, r.cursor(), r.rowLeft(), MSG_DONTWAIT);
      } else {
        n = ::recv(c->fd, r.ahead.data(), r.ahead.size(), MSG_DONTWAIT);
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        endStream(c, errno);
        landed = true;
        break;
      }
      if (n == 0) {
        endStream(c, 0);
        landed = true;
        break;
      }
      __atomic_add_fetch(&mirror.header->heartbeat, 1, __ATOMIC_RELEASE);  // any bytes are a beat
      if (direct) {
        r.done += static_cast<uint64_t>(n);
        if (r.payloadLeft() == 0) landed |= finishFrame(c);
      } else {
        r.rd = 0;
        r.wr = static_cast<size_t>(n);
      }
      continue;
    }
    const size_t avail = r.wr - r.rd;
    const uint8_t* p = r.ahead.data() + r.rd;
    switch (r.phase) {
      case FrameReader::kHead: {
        size_t k = std::min(avail, sizeof(FrameHead) - r.got);
        std::memcpy(reinterpret_cast<uint8_t*>(&r.f) + r.got, p, k);
        r.rd += k;
        r.got += k;
        if (r.got < sizeof(FrameHead)) break;
        r.got = 0;
        if (r.f.type == kPublish ? r.f.head_bytes != sizeof(edge::MessageDesc) : r.f.head_bytes != 0) {
          markFailed(c, "gfdit: a malformed frame (type " + std::to_string(r.f.type) + ") on " + c->describe(rank_));
          r.ended = true;
          c->receiver_done = true;
          landed = true;
          break;
        }
        if (r.f.ack != 0) {  // the peer consumed this rank's messages up to it (NOTE [network edges])
          edge::storeRelease(&own.out_edges[c->peer].ack, r.f.ack);
          c->want_sent = false;
          landed = true;
        }
        if (r.f.head_bytes > 0) {
          r.phase = FrameReader::kTyped;
          break;
        }
        if (!startPayload(c)) {
          landed = true;
          break;
        }
        r.phase = FrameReader::kPayload;
        if (r.f.payload_bytes == 0) landed |= finishFrame(c);
        break;
      }
      case FrameReader::kTyped: {
        size_t k = std::min(avail, sizeof(edge::MessageDesc) - r.got);
        std::memcpy(reinterpret_cast<uint8_t*>(&r.d) + r.got, p, k);
        r.rd += k;
        r.got += k;
        if (r.got < sizeof(edge::MessageDesc)) break;
        r.got = 0;
        if (!startPayload(c)) {
          landed = true;
          break;
        }
        r.phase = FrameReader::kPayload;
        if (r.f.payload_bytes == 0) landed |= finishFrame(c);
        break;
      }
      case FrameReader::kPayload: {
        size_t k = static_cast<size_t>(std::min<uint64_t>({avail, r.rowLeft(), r.payloadLeft()}));
        if (r.f.type == kFail) {
          k = static_cast<size_t>(std::min<uint64_t>(avail, r.payloadLeft()));
          size_t keep = std::min(k, kMaxReasonBytes - std::min(kMaxReasonBytes, r.reason.size()));
          r.reason.append(reinterpret_cast<const char*>(p), keep);
        } else if (r.dst != nullptr) {
          std::memcpy(r.cursor(), p, k);
        }
        r.rd += k;
        r.done += k;
        if (r.payloadLeft() == 0) landed |= finishFrame(c);
        break;
      }
    }
  }
  if (landed) core::ringBell(&own.header->doorbell, &own.header->num_waiters);
  return landed;
}

// A connection's thread: it reads whenever bytes arrive and the rank's own thread is not reading them already. It
// never waits for the rank's thread: woken by bytes while that one reads (it holds recv_mu, maybe asleep in
// NetEdges::wait), it leaves them to it and says so in `missed`, so that the rank's thread reads once more when it
// lets go (letGo). Edge-triggered, so bytes left to the rank's thread do not wake this one again.
void NetEdges::receiveLoop(Conn* c) {
  const int ep = c->ep;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(c->recv_mu, std::try_to_lock);
      if (!lock.owns_lock()) {
        c->missed.store(true);
        std::atomic_thread_fence(std::memory_order_seq_cst);
        lock.try_lock();  // it let go meanwhile and may have looked at `missed` before it was set
      }
      if (lock.owns_lock()) {
        c->missed.store(false);  // it reads everything there is now
        if (c->reader.ended) break;
        drain(c);
        if (c->reader.ended) break;
      }
    }
    if (ep >= 0) {
      epoll_event got{};
      ::epoll_wait(ep, &got, 1, 100);  // bounded: a reader that ended on the rank's thread is seen above
    } else {
      pollfd p{c->fd, POLLIN, 0};
      ::poll(&p, 1, 100);
    }
  }
  c->receiver_done = true;
}

// Whether connection c's thread is woken by its bytes (armed) or not (while the rank's thread reads them itself in
// a wait on remote peers alone: one thread woken per message, not two). Arming again reports bytes that came
// meanwhile, so its thread reads what the rank's left.
void NetEdges::arm(Conn* c, bool on) {
  if (c->ep < 0) return;
  epoll_event ev{};
  ev.events = on ? EPOLLIN | EPOLLRDHUP | EPOLLET : 0;
  ::epoll_ctl(c->ep, EPOLL_CTL_MOD, c->fd, &ev);
}

// The rank's thread stopped reading connection c (it let go of recv_mu): bytes its thread left to it meanwhile
// are read now (see receiveLoop).
void NetEdges::letGo(Conn* c) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  while (c->missed.exchange(false)) {
    std::unique_lock<std::mutex> lock(c->recv_mu, std::try_to_lock);
    if (!lock.owns_lock()) return;  // its thread reads them
    if (!c->reader.ended) drain(c);
  }
}

bool NetEdges::poll() {
  bool landed = false;
  for (Conn* c : connected_) {
    {
      std::unique_lock<std::mutex> lock(c->recv_mu, std::try_to_lock);
      if (!lock.owns_lock()) continue;  // its thread is reading it now
      if (!c->reader.ended) landed |= drain(c);
    }
    letGo(c);
  }
  return landed;
}

void NetEdges::reading(bool on) {
  for (Conn* c : connected_) arm(c, !on);
}

bool NetEdges::wait(const uint32_t* bell, uint32_t seen, std::chrono::nanoseconds timeout) {
  // this thread reads every connection while it waits, so that nothing it waits for is read by another thread
  // between its look at the doorbell and its sleep in ppoll
  std::vector<std::unique_lock<std::mutex>> locks;
  std::vector<pollfd> fds;
  locks.reserve(connected_.size());
  fds.reserve(connected_.size());
  auto done = [&](bool waited) {
    for (size_t i = 0; i < locks.size(); ++i) {
      if (!locks[i].owns_lock()) continue;
      locks[i].unlock();
      letGo(connected_[i]);
    }
    return waited;
  };
  for (Conn* c : connected_) {
    locks.emplace_back(c->recv_mu, std::try_to_lock);
    if (!locks.back().owns_lock()) return done(false);  // its thread is reading it: the doorbell tells
    if (!c->reader.ended) fds.push_back({c->fd, POLLIN, 0});
  }
  if (fds.empty()) return done(false);  // every connection ended: the liveness checks tell
  if (core::readBell(bell) != seen) return done(true);
  bool landed = false;
  for (Conn* c : connected_) {
    if (!c->reader.ended) landed |= drain(c);
  }
  if (landed) return done(true);
  timespec ts{static_cast<time_t>(timeout.count() / 1000000000), static_cast<long>(timeout.count() % 1000000000)};
  if (timeout.count() > 0 && ::ppoll(fds.data(), fds.size(), &ts, nullptr) > 0) {
    for (Conn* c : connected_) {
      if (!c->reader.ended) drain(c);
    }
  }
  return done(true);
}

void NetEdges::keepAlive() {
  std::unique_lock<std::mutex> lock(keepalive_mu_);
  const int64_t period_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(kKeepAlivePeriod).count();
  auto last_beat = Clock::now();
  while (!stopping_) {
    keepalive_cv_.wait_until(lock, last_beat + kKeepAlivePeriod, [this] { return stopping_ || flush_asked_; });
    if (stopping_) break;
    flush_asked_ = false;
    const bool beat = Clock::now() >= last_beat + kKeepAlivePeriod;
    if (beat) last_beat = Clock::now();
    lock.unlock();
    const int64_t now = Clock::now().time_since_epoch().count();
    for (auto& c : conns_) {
      if (c == nullptr || c->fd < 0 || c->failed || c->closed) continue;
      // held back by a rank that has not waited since, and asked for or a beat's time old (NOTE [network edges])
      if (c->pending_ack.load() != 0 && (beat || c->peer_wants.exchange(false))) {
        try {
          sendFrame(c->peer, kAck, 0, 0, nullptr, 0, Rows{});
        } catch (const Error&) {  // the reader or the next send reports a lost connection
        }
        continue;
      }
      if (!beat || now - c->last_send_ns.load() < period_ns / 2) continue;  // a frame went out lately: a beat too
      std::unique_lock<std::mutex> send(c->send_mu, std::try_to_lock);
      if (!send.owns_lock()) continue;  // a frame is on its way: that is a beat too
      FrameHead f{};
      f.type = kHeartbeat;
      if (!writeFull(c->fd, &f, sizeof(f), std::chrono::milliseconds(kSendSliceMs))) continue;
      c->last_send_ns = now;
    }
    lock.lock();
  }
}

void NetEdges::sendFrame(int peer, uint32_t type, uint64_t a, uint64_t b, const void* head, size_t head_bytes,
                         const Rows& payload) {
  Conn* c = conns_[peer].get();
  GFDIT_CHECK_CODE(kInternal, c != nullptr && c->fd >= 0) << "gfdit: no network edge to rank " << peer;
  FrameHead f{};
  f.type = type;
  f.head_bytes = static_cast<uint32_t>(head_bytes);
  f.a = a;
  f.b = b;
  f.payload_bytes = payload.bytes();
  // an acknowledgement, a beat or a failure for a peer that left is for nobody; a message to it is an error
  const bool optional = type == kAck || type == kHeartbeat || type == kFail || type == kBye || type == kWant;
  auto gone = [&] {
    if (optional) return true;
    GFDIT_THROW(kRemoteError) << "gfdit: rank " << rank_ << " cannot send on " << c->describe(rank_) << ": rank "
                              << peer << " left the world";
  };
  std::lock_guard<std::mutex> lock(c->send_mu);
  if (c->closed && gone()) return;
  f.ack = c->pending_ack.exchange(0);  // every frame tells what this rank consumed (NOTE [network edges])
  const auto bound = std::chrono::milliseconds(timeout_ms_.load());
  // the frame gathered: head, typed head, then the payload's rows (NOTE [network edges]); up to kMaxIov at a time
  std::vector<iovec> iov;
  iov.reserve(2 + std::min<uint64_t>(payload.rows, kMaxIov));
  size_t next_row = 0;
  auto refill = [&] {
    while (iov.size() < kMaxIov && next_row < payload.rows) {
      iov.push_back({const_cast<uint8_t*>(payload.base + next_row * payload.stride), payload.row_bytes});
      ++next_row;
    }
  };
  iov.push_back({&f, sizeof(f)});
  if (head_bytes > 0) iov.push_back({const_cast<void*>(head), head_bytes});
  refill();
  size_t first = 0;  // iov[first..] still to go
  auto last_progress = Clock::now();
  while (first < iov.size()) {
    // bounded slices (SO_SNDTIMEO): between them, the peer's state and the clock (NOTE [network edges])
    if (c->failed) {
      GFDIT_THROW(kRemoteError) << "gfdit: rank " << rank_ << " cannot send on " << c->describe(rank_)
                                << ": the connection is lost";
    }
    msghdr msg{};
    msg.msg_iov = iov.data() + first;
    msg.msg_iovlen = iov.size() - first;
    ssize_t w = ::sendmsg(c->fd, &msg, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (Clock::now() - last_progress > bound) {
          GFDIT_THROW(kTimeout) << "gfdit: timeout after " << std::chrono::duration<double>(bound).count()
                                << " s: rank " << rank_ << " could not send on " << c->describe(rank_);
        }
        continue;
      }
      int e = errno;
      // a peer that left may have closed the stream before its BYE was read here: the reader tells
      auto settle = Clock::now() + kLinger;
      while (!c->receiver_done && Clock::now() < settle) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (c->closed && gone()) return;
      markFailed(c, "gfdit: lost the connection of " + c->describe(rank_) + ": " + errnoText(e));
      GFDIT_THROW(kRemoteError) << "gfdit: rank " << rank_ << " lost the connection of " << c->describe(rank_) << ": "
                                << errnoText(e);
    }
    last_progress = Clock::now();
    if (type != kHeartbeat) bytes_sent_ += static_cast<uint64_t>(w);
    auto left = static_cast<size_t>(w);
    while (first < iov.size() && left >= iov[first].iov_len) left -= iov[first++].iov_len;
    if (first < iov.size()) {
      iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
    if (first == iov.size() && next_row < payload.rows) {  // more rows than one call gathers
      iov.clear();
      first = 0;
      refill();
    }
  }
  c->last_send_ns = Clock::now().time_since_epoch().count();
}

void NetEdges::publish(int peer, uint64_t seq, const edge::MessageDesc& desc, const uint8_t* bytes, size_t span) {
  // a strided view sends its rows, not the gaps between them (NOTE [network edges])
  Rows rows = Rows::contiguous(bytes, span);
  if (desc.rows > 0 && span > 0) rows = Rows{bytes, desc.rows, desc.row_bytes, desc.stride};
  sendFrame(peer, kPublish, seq, desc.region_offset, &desc, sizeof(desc), rows);
}

void NetEdges::ack(int peer, uint64_t seq, bool now) {
  Conn* c = conns_[peer].get();
  c->pending_ack.store(seq);
  if (now || c->peer_wants.exchange(false)) sendFrame(peer, kAck, 0, 0, nullptr, 0, Rows{});
}

void NetEdges::want(int peer) {
  Conn* c = conns_[peer].get();
  if (c->failed || c->closed || c->want_sent.exchange(true)) return;  // asked already, and not answered since
  sendFrame(peer, kWant, 0, 0, nullptr, 0, Rows{});
}

void NetEdges::flush() {
  for (Conn* c : connected_) {
    if (c->pending_ack.load() != 0 && !c->failed && !c->closed) sendFrame(c->peer, kAck, 0, 0, nullptr, 0, Rows{});
  }
}

void NetEdges::put(int peer, uint64_t heap_offset, const void* src, size_t bytes, uint64_t count) {
  sendFrame(peer, kPut, heap_offset, count, nullptr, 0, Rows::contiguous(src, bytes));
}

void NetEdges::broadcastFailure(const std::string& reason) {
  for (auto& c : conns_) {
    if (c == nullptr || c->fd < 0 || c->failed || c->closed) continue;
    try {
      sendFrame(c->peer, kFail, 0, 0, nullptr, 0, Rows::contiguous(reason.data(), reason.size()));
    } catch (...) {  // a peer we cannot tell finds out from the connection or its heartbeat
    }
  }
}

}  // namespace net
}  // namespace gfdit
