// Workers on other hosts: on each such host a node agent runs the workers on rings of its own, and a relay moves
// their tasks, completions, outputs and abort word between those rings and the engine's over one TCP connection
// (NOTE [node agents] in src/runtime/relay.cpp). NodeRelay is the engine's end, AgentRelay the agent's.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gfdit/engine_loop.h"
#include "gfdit/messages.h"
#include "gfdit/rings.h"

namespace gfdit {
namespace runtime {

/// The version of the node protocol (NOTE [node agents]); an agent and an engine must speak the same.
constexpr uint32_t kNodeProtocolVersion = 1;
/// How long a node may stay silent before its connection counts as lost, unless the caller says otherwise
/// (GFDIT_NODE_TIMEOUT_S).
constexpr double kNodeTimeoutS = 10.0;

/// What a node agent says of itself when it connects (typed: NOTE [typed messages]).
struct NodeHello {
  std::string host;         ///< the agent's host name (for messages)
  int32_t num_workers = 0;  ///< workers it can run
  int32_t pid = 0;          ///< the agent's process id (for messages)

  std::string encode() const;
  static NodeHello decode(const std::string& bytes);
};

/// The engine's answer to an agent it takes: which workers it runs, and what each worker is started with.
struct NodeWelcome {
  int32_t node = 0;              ///< the node index of these workers in the engine's topology (0: the engine's host)
  std::vector<int32_t> workers;  ///< the worker ids this agent runs
  /// they replace workers of a lost node in a running engine: they join the world at its next REINIT (NOTE
  /// [replacements] in src/runtime/control.cpp) instead of forming the first one
  bool joining = false;
  int32_t world_size = 0;
  std::vector<int32_t> node_of;  ///< every worker's node
  std::string model;
  std::string model_path;  ///< "" when none
  std::string store_host;  ///< the workers' rendezvous store ("": the address the agent reached the engine at)
  int32_t store_port = 0;
  double timeout_s = 0;    ///< the workers' collective timeout
  int64_t heap_bytes = 0;  ///< each worker's symmetric heap (0: the workers' default)
  int32_t threads = 1;     ///< torch's intra-op threads per worker

  std::string encode() const;
  static NodeWelcome decode(const std::string& bytes);
};

/// An agent that said a valid hello and waits for the engine's answer (NodeRelay::accept).
struct PendingNode {
  int id = 0;
  NodeHello hello;
  std::string address;  ///< where it connected from ("ip:port")
};

/// A node as the engine's relay knows it.
struct NodeState {
  int32_t node = 0;
  std::string host;
  std::string address;
  std::vector<int32_t> workers;
  bool connected = false;
  std::string why;  ///< why it is not connected
};

/// A remote worker as its agent last reported it.
struct RemoteWorkerState {
  int32_t node = -1;       ///< -1: no node runs it
  bool connected = false;  ///< its node's connection is up
  bool running = false;    ///< started and not reported dead
  int32_t pid = 0;         ///< its process id on its host (0: not reported yet)
  int32_t exit_code = 0;   ///< when not running: its exit status (-1: its host was lost)
  std::string why;         ///< when not running: what happened
};

/// The engine's end of the node agents' connections (NOTE [node agents]). It listens for agents, and for the
/// workers of each agent the engine admits it is the consumer of their dispatch rings and the producer of their
/// completion rings in the engine's queue set. Thread-safe.
class NodeRelay : public RemoteWorkers {
 public:
  /// Listens on `address`:`port` (port 0: any free one) for the agents of an engine of `num_workers` workers. A node
  /// silent for `node_timeout_s` is lost.
  NodeRelay(int num_workers, const std::string& address, int port, double node_timeout_s = kNodeTimeoutS);
  ~NodeRelay() override;
  NodeRelay(const NodeRelay&) = delete;
  NodeRelay& operator=(const NodeRelay&) = delete;

  int port() const { return port_; }
  /// The next agent that said a valid hello, waiting at most `timeout_s`; nullopt on timeout. An agent that speaks
  /// garbage or another protocol version is refused with the reason before it gets here (refusals()).
  std::optional<PendingNode> accept(double timeout_s);
  /// Takes pending agent `id` for the workers `welcome.workers` (each of them without a node now), sends it the
  /// welcome and, once start() ran, relays their messages. Throws when the agent is gone meanwhile.
  void admit(int id, const NodeWelcome& welcome);
  /// Refuses pending agent `id` with `reason` (it ends with that message).
  void refuse(int id, const std::string& reason);
  /// Relays between the admitted nodes and the rings of the engine's queue set `queue_name` (by name: before the
  /// engine loop's start() removes it). Once.
  void start(const std::string& queue_name);
  /// Asks `worker`'s agent to start a new process for it (a replacement: its rings here were reset). Throws when
  /// its node is not connected.
  void startWorker(int worker);
  RemoteWorkerState workerState(int worker) const;
  std::vector<NodeState> nodes() const;
  /// Why each connection was refused so far (a peer that spoke garbage or another version, or an agent the engine
  /// did not take), oldest first.
  std::vector<std::string> refusals() const;
  /// Says goodbye to every agent (they stop their workers and end) and stops relaying.
  void close();

  // RemoteWorkers
  bool gone(int worker, std::string* why) override;
  void kill(int worker) override;
  void abortCollectives() override;
  bool release(int worker) override;

 private:
  struct Node;
  struct Slot;
  struct Pending;
  void acceptLoop();
  void handshake(int fd, std::string address);
  void launch(const std::shared_ptr<Node>& node);
  void receiveLoop(std::shared_ptr<Node> node);
  void sendLoop(std::shared_ptr<Node> node, int worker);
  void handleFrame(Node& node, uint32_t type, int worker, uint64_t bytes, uint64_t aux);
  void lose(Node& node, const std::string& why);
  void post(Node& node, uint32_t type, int worker, uint64_t aux);
  void noteRefusal(const std::string& why);
  /// Removes and returns the agent `id` waiting for an answer (nullptr: none); mu_ held.
  std::unique_ptr<Pending> takePendingLocked(int id);

  const int num_workers_;
  const int64_t timeout_ns_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::unique_ptr<QueueSet> queues_;
  std::string output_prefix_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<std::shared_ptr<Node>> nodes_;
  std::deque<std::unique_ptr<Pending>> pending_;
  std::vector<std::thread> handshakes_;
  std::vector<std::string> refusals_;
  int next_pending_ = 1;
  bool started_ = false;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
};

/// What the engine asks of a node agent (AgentRelay::next).
struct AgentRequest {
  enum Kind : int32_t {
    kKill = 1,   ///< kill `worker`'s process
    kStart = 2,  ///< start a new process for `worker` (its rings were reset): it joins at the next REINIT
    kEnd = 3,    ///< stop every worker and end: the engine said goodbye, or the connection is lost (`reason`)
  };
  Kind kind = kEnd;
  int32_t worker = -1;
  std::string reason;
  bool orderly = false;  ///< kEnd: the engine said goodbye, or this node's relay was closed (not a lost connection)
};

/// A node agent's end of its connection to the engine (NOTE [node agents]): it says hello, gets its workers, makes
/// this host's rings for them and relays. Thread-safe.
class AgentRelay {
 public:
  /// Connects to the engine's relay at `host`:`port` and says `hello`, waiting at most `timeout_s` for the answer.
  /// Throws RemoteError with the engine's reason when it refuses this node, Timeout or SystemError when it cannot be
  /// reached. The connection counts as lost once the engine is silent for `node_timeout_s`.
  AgentRelay(const std::string& host, int port, const NodeHello& hello, double timeout_s,
             double node_timeout_s = kNodeTimeoutS);
  ~AgentRelay();
  AgentRelay(const AgentRelay&) = delete;
  AgentRelay& operator=(const AgentRelay&) = delete;

  const NodeWelcome& welcome() const { return welcome_; }
  /// Where the engine was reached ("ip"), for the workers' store when the welcome names none.
  const std::string& engineAddress() const { return engine_address_; }
  /// Makes this host's rings (one pair per worker id of the world; only the welcome's are used) and starts
  /// relaying; returns their name, for the workers to attach. Once.
  std::string start();
  /// A descriptor of the rings' region (for a replacement to inherit once the name is gone).
  int queueFd() const { return queue_fd_; }
  /// The engine's next request, waiting at most `timeout_s`; nullopt on timeout. After kEnd, kEnd again.
  std::optional<AgentRequest> next(double timeout_s);
  /// `worker`'s process ended with `exit_code`: what it posted is sent, then its death with `why`.
  void workerDied(int worker, int exit_code, const std::string& why);
  /// `worker`'s process started as `pid`.
  void workerStarted(int worker, int pid);
  /// Whether the connection is lost (or ended), and why.
  bool lost() const { return lost_.load(); }
  std::string why() const;
  /// Says goodbye (when still connected), stops relaying and removes every name this node made in /dev/shm (its
  /// rings, outputs not yet sent, worlds' regions a killed worker left).
  void close();

 private:
  struct Command {
    enum Kind { kDied, kStarted, kReset, kBye } kind;
    int worker = -1;
    int64_t value = 0;
    std::string text;
  };
  void uplink();
  void downlink();
  void lose(const std::string& why);
  void request(AgentRequest r);
  void command(Command c);
  bool mine(int worker) const;
  void sendCompletions(int worker, bool* any);

  int fd_ = -1;
  int64_t timeout_ns_;
  std::string where_;  // "host:port", for messages
  std::string engine_address_;
  NodeWelcome welcome_;
  std::unique_ptr<QueueSet> queues_;
  std::string queue_name_;
  int queue_fd_ = -1;
  bool name_unlinked_ = false;
  std::vector<bool> said_hello_;
  std::mutex send_mu_;
  std::atomic<int64_t> last_tx_{0};
  std::atomic<bool> lost_{false};
  std::atomic<bool> stopping_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<AgentRequest> requests_;
  std::deque<Command> commands_;
  std::string why_;
  bool ended_ = false;  // kEnd was queued
  bool closed_ = false;
  std::thread up_;
  std::thread down_;
};

}  // namespace runtime
}  // namespace gfdit
