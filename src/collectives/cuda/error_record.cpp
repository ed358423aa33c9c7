#include "error_record.h"

#include <sstream>

namespace gfdit {
namespace cuda {

const char* deviceOpName(uint32_t op) {
  switch (static_cast<DeviceOp>(op)) {
    case DeviceOp::kNone: return "operation";
    case DeviceOp::kCopyLocal: return "copyLocal";
    case DeviceOp::kStage: return "stage";
    case DeviceOp::kPublish: return "publish";
    case DeviceOp::kConsume: return "consume";
    case DeviceOp::kReduce: return "reduce";
    case DeviceOp::kConsumed: return "consumed";
    case DeviceOp::kAwaitConsumed: return "awaitConsumed";
    case DeviceOp::kWaitSignal: return "wait_signal";
    case DeviceOp::kPutSignal: return "put_with_signal";
  }
  return "operation";
}

ErrorCode errorCodeOf(const ErrorRecord& record) {
  return record.failure == static_cast<uint32_t>(DeviceFailure::kPeerFailed) ? ErrorCode::kRemoteError
                                                                             : ErrorCode::kTimeout;
}

namespace {

// What the wait was for, with the edge it is on: the sender of a message is the peer for `ready` and
// put signals, this rank for `consumed`.
void describeWait(std::ostream& os, const ErrorRecord& r) {
  switch (static_cast<DeviceWaitKind>(r.wait)) {
    case DeviceWaitKind::kReady:
      os << "message " << r.seq << " on edge " << r.peer << "->" << r.rank << " (rank " << r.peer
         << "'s bytes ready; its device had signalled " << r.observed << ")";
      return;
    case DeviceWaitKind::kConsumed:
      os << "rank " << r.peer << " to finish reading message " << r.seq << " on edge " << r.rank << "->" << r.peer
         << " (its device had signalled " << r.observed << ")";
      return;
    case DeviceWaitKind::kPutSignal:
      os << "put signal " << r.seq << " from rank " << r.peer << " on edge " << r.peer << "->" << r.rank
         << " (it stood at " << r.observed << ")";
      return;
    case DeviceWaitKind::kBulkCopy: os << "a TMA bulk copy (chunk " << r.seq << ") to complete"; return;
    case DeviceWaitKind::kReadCheck: break;  // formatError words it
    case DeviceWaitKind::kNone: break;
  }
  os << "value " << r.seq << " from rank " << r.peer;
}

}  // namespace

std::string formatError(const ErrorRecord& r) {
  std::ostringstream os;
  os << "gfdit: cuda transport: ";
  if (r.wait == static_cast<uint32_t>(DeviceWaitKind::kReadCheck)) {
    os << "rank " << r.peer << "'s transport failed while rank " << r.rank << " read message " << r.seq << " on edge "
       << r.peer << "->" << r.rank << " in " << deviceOpName(r.op) << " (operation " << r.op_index << "); rank "
       << r.peer << " may have overwritten those bytes, so rank " << r.rank << " did not mark the message read";
  } else if (r.failure == static_cast<uint32_t>(DeviceFailure::kPeerFailed)) {
    os << "rank " << r.peer << "'s transport failed, so rank " << r.rank << " stopped waiting for ";
    describeWait(os, r);
    os << " in " << deviceOpName(r.op) << " (operation " << r.op_index << ")";
  } else {
    os << "rank " << r.rank << " timed out after " << static_cast<double>(r.waited_ns) * 1e-9 << " s (timeout "
       << static_cast<double>(r.timeout_ns) * 1e-9 << " s) waiting for ";
    describeWait(os, r);
    os << " in " << deviceOpName(r.op) << " (operation " << r.op_index << ")";
  }
  os << "; this rank's later device operations do nothing";
  return os.str();
}

}  // namespace cuda
}  // namespace gfdit
