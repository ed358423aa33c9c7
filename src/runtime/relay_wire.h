// The bytes on a node agent's connection (NOTE [node agents] in relay.cpp): the greeting each side sends first, and
// the frames after it. Internal: the relay and its tests only.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gfdit {
namespace runtime {
namespace relay_wire {

constexpr char kMagic[8] = {'g', 'f', 'd', 'i', 't', 'N', 'O', 'D'};
constexpr size_t kReasonBytes = 240;

/// What each side sends first: the agent with status 0, the engine with 0 (a welcome frame follows) or 1 (refused,
/// `message` says why, and the engine closes the connection).
struct Greeting {
  char magic[8];
  uint32_t version;
  int32_t status;
  char message[kReasonBytes];
};
static_assert(sizeof(Greeting) == 256, "the greeting is 256 bytes on the wire");

enum FrameType : uint32_t {
  kHello = 1,       ///< agent -> engine: NodeHello
  kWelcome = 2,     ///< engine -> agent: NodeWelcome
  kTask = 3,        ///< engine -> agent: `worker`'s next ring message (TaskDescriptor and payload)
  kCompletion = 4,  ///< agent -> engine: a ring message of `aux` bytes (Completion and payload), then its output
  kBell = 5,        ///< agent -> engine: the workers rang their control bell (NOTE [quiet completions])
  kAbort = 6,       ///< engine -> agent: bump the workers' abort word
  kKill = 7,        ///< engine -> agent: kill `worker`
  kStart = 8,       ///< engine -> agent: start a new process for `worker`
  kStarted = 9,     ///< agent -> engine: `worker` runs as process `aux`
  kDied = 10,       ///< agent -> engine: `worker` ended with exit status `aux` (signed); the bytes say why
  kPing = 11,       ///< either way: alive
  kBye = 12,        ///< either way: the sender ends the connection on purpose
};

/// The head of every frame; `bytes` follow it.
struct FrameHead {
  uint32_t type;
  int32_t worker;
  uint64_t bytes;
  uint64_t aux;
};
static_assert(sizeof(FrameHead) == 24, "a frame head is 24 bytes on the wire");

/// The most bytes a frame other than a completion's output may carry.
constexpr uint64_t kMaxFrameBytes = 1u << 20;
/// The most bytes an output may have.
constexpr uint64_t kMaxOutputBytes = uint64_t{1} << 38;

}  // namespace relay_wire
}  // namespace runtime
}  // namespace gfdit
