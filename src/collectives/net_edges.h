// Edges between ranks that cannot share memory (other hosts): the protocol's remote stores over TCP.
//
// NOTE [network edges]
// The edge protocol (NOTE [edge sequence numbers] in edge.h) is a handful of stores into a peer's region and
// reads of a peer's bytes: a sender writes a descriptor and then `signal` (release) into the receiver's region,
// the receiver copies the bytes from the sender's region and writes `ack` into it; a put writes into the peer's
// heap and then `put_signal`; a broken world writes its reason and then `failed` into its own region, where
// peers read it; a heartbeat word ticks there. Between ranks of one host those are plain loads and stores in
// POSIX shared memory. Between hosts each rank keeps a MIRROR of every remote peer's region (an anonymous
// mapping of the same layout, so the protocol engine addresses it exactly as a mapped one) and every store it
// would make into a remote region, and the bytes the receiver would read there, travel as messages on one TCP
// connection per pair instead:
// - PUBLISH carries the bytes the message describes (the staging slot's or, zero-copy, the heap range's) and
//   the descriptor; the receiving rank writes the bytes into its mirror of the sender's region at the same
//   offset, the descriptor into its own in-edge, then stores `signal` (release) and rings its own doorbell. A TCP
//   stream is ordered, so the bytes land before the signal that makes them readable, as the release store orders
//   them in shared memory; the receiver then consumes from the mirror unchanged. A strided message (the rows of a
//   zero-copy view) carries its rows only, not the gaps between them; the receiver puts them at their rows.
// - Acknowledgements ride on frames: every frame's head carries the sender's last consumed message of the
//   receiver's (0: nothing new), which the receiver stores as `ack` in its own out-edge when the head arrives (the
//   sender may reuse its slot: its bytes were already sent, so nothing of the sender's memory is read remotely
//   afterwards). A rank holds an acknowledgement back for the next frame to that peer, which in a request and
//   its reply costs no frame of its own, but never past the moment a peer could wait for it: an ACK frame goes
//   at once for a zero-copy message (its sender waits for it to finish), before the rank waits for anything
//   itself (RemoteEdges::flush), once the peer asked (WANT: a rank that cannot go on without a peer's
//   acknowledgement says so before it waits; from then on the peer's acknowledgements go at once), and at the
//   keep-alive period at the latest.
// - PUT writes into the receiver's own heap and then stores `put_signal`.
// - FAIL writes the reason and then `failed` into the mirror (NOTE [failure broadcast]), HEARTBEAT the mirror's
//   heartbeat word (NOTE [liveness]: a remote peer's pid means nothing here, so its liveness is its heartbeat
//   alone, and any bytes received from it count as a beat; no beat goes where another frame went lately); a
//   connection that ends without BYE marks the mirror failed with the reason at once, so a lost host is a set of
//   dead peers named by rank, host and address.
// Receiving: each connection has a thread that reads whatever arrives, and the rank's own thread reads too while
// it waits in a collective (RemoteEdges::poll while it spins): a small message then lands without waking another
// thread first, which is most of a round trip on a busy host. A wait on remote peers alone goes further: the
// rank's thread sleeps on their sockets itself (RemoteEdges::wait) while their threads are not woken by those
// bytes (RemoteEdges::reading), so one thread wakes per message, as with a plain socket. Whoever holds a
// connection's receive lock reads, without blocking, into a read-ahead buffer and on from there; a large payload
// goes straight from the socket to its place in the mirror (or the heap); the frame being read lives with the
// connection, not with a thread. A connection's thread never waits for the rank's: it leaves the bytes to it and
// the rank's thread reads once more when it lets go.
// Sending: a frame is one sendmsg (head, descriptor and payload gathered), so a small one is one segment.
// Sends are bounded: a send that cannot make progress for the world's timeout, or to a peer marked failed,
// throws (naming the edge), never waits for ever. Each connection starts with a HELLO (magic, protocol version,
// world key, ranks) that both sides check: garbage, another version or another world is refused with a reply
// that says why, and the world goes on (or, for the rank that is refused, fails at creation naming the cause).
// Group formation stays local: a group is still a list of ranks; only the edges' transport differs.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "edge.h"
#include "protocol.h"

namespace gfdit {
namespace net {

/// The version of the wire format; both ends of a connection must speak the same.
constexpr uint32_t kProtocolVersion = 2;

/// What identifies the memory a rank can share: ranks whose keys are equal can map each other's regions (the
/// boot, and the file system /dev/shm is on).
std::string hostKey();
/// This host's name (for messages).
std::string hostName();
/// The IPv4 address this rank listens on: GFDIT_NET_ADDRESS; else 127.0.0.1 when every remote peer runs on this
/// host (nodes emulated by GFDIT_NET_EDGES=nodes); else the first address of an interface that is up and not
/// loopback, else 127.0.0.1.
std::string listenAddress(bool peers_on_this_host);

/// A remote peer: its rank, where it listens, and its host's name.
struct RemotePeer {
  int rank = -1;
  std::string address;
  int port = 0;
  std::string host;
};

/// One rank's network edges (NOTE [network edges]).
class NetEdges : public protocol::RemoteEdges {
 public:
  /// Listens on `address` (an ephemeral port) for the world identified by `world_key`, whose ranks with
  /// `remote[rank]` set are this rank's remote peers (the higher of them may dial it from now on).
  NetEdges(int rank, int world_size, const std::string& world_key, const std::string& address,
           std::chrono::milliseconds timeout, const std::vector<bool>& remote);
  ~NetEdges() override;
  NetEdges(const NetEdges&) = delete;
  NetEdges& operator=(const NetEdges&) = delete;

  int port() const { return port_; }
  /// Connects to every remote peer (`peers`: where each listens; this rank dials the lower ranks and accepts the
  /// higher ones), checks each HELLO and starts the connections' threads. `regions`: every rank's host region as
  /// mapped here (mirrors for the remote ones). Throws naming the peer when one cannot be reached or refuses this
  /// rank.
  void connect(const std::vector<RemotePeer>& peers, const std::vector<protocol::HostRegion>& regions);

  // protocol::RemoteEdges
  bool remote(int peer) const override { return peer >= 0 && peer < size_ && conns_[peer] != nullptr; }
  void publish(int peer, uint64_t seq, const edge::MessageDesc& desc, const uint8_t* bytes, size_t span) override;
  void ack(int peer, uint64_t seq, bool now) override;
  void flush() override;
  void want(int peer) override;
  void put(int peer, uint64_t heap_offset, const void* src, size_t bytes, uint64_t count) override;
  void broadcastFailure(const std::string& reason) override;
  bool poll() override;
  void reading(bool on) override;
  bool wait(const uint32_t* bell, uint32_t seen, std::chrono::nanoseconds timeout) override;
  void setTimeout(std::chrono::milliseconds t) override { timeout_ms_.store(t.count()); }

  /// Connections refused so far (garbage, another version or another world on this rank's port).
  uint64_t refused() const { return refused_.load(); }
  /// Bytes of the protocol's frames sent on network edges so far (the keep-alive beats are not counted).
  uint64_t bytesSent() const { return bytes_sent_.load(); }
  /// Bytes of the protocol's frames received on network edges so far (the keep-alive beats are not counted).
  uint64_t bytesReceived() const { return bytes_received_.load(); }

 private:
  struct Conn;
  struct Rows;
  void acceptLoop();
  void refuse(int fd, const std::string& why);
  void receiveLoop(Conn* c);
  void letGo(Conn* c);
  void arm(Conn* c, bool on);
  bool drain(Conn* c);
  bool startPayload(Conn* c);
  bool finishFrame(Conn* c);
  void endStream(Conn* c, int error);
  void keepAlive();
  void sendFrame(int peer, uint32_t type, uint64_t a, uint64_t b, const void* head, size_t head_bytes,
                 const Rows& payload);
  void markFailed(Conn* c, const std::string& why);

  int rank_;
  int size_;
  std::string world_key_;
  std::atomic<int64_t> timeout_ms_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::vector<std::unique_ptr<Conn>> conns_;  // by peer rank; null for peers in shared memory
  std::vector<Conn*> connected_;              // the remote peers' connections, once connect() returned
  std::vector<protocol::HostRegion> regions_;
  std::mutex accept_mu_;
  std::condition_variable accept_cv_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};
  std::thread acceptor_;
  std::thread keepalive_;
  std::mutex keepalive_mu_;
  std::condition_variable keepalive_cv_;
  bool flush_asked_ = false;  // a peer asked for acknowledgements held back here (WANT); under keepalive_mu_
};

}  // namespace net
}  // namespace gfdit
