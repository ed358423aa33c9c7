// What a CUDA transport's ErrorRecord says, in words (host only; tested without a device).
#pragma once

#include <string>

#include "device_region.h"
#include "gfdit/error.h"

namespace gfdit {
namespace cuda {

/// Name of a device operation ("consume", ...).
const char* deviceOpName(uint32_t op);
/// The error a record reports: kTimeout for a wait that timed out, kRemoteError for a failed peer.
ErrorCode errorCodeOf(const ErrorRecord& record);
/// "gfdit: cuda transport: rank 1 timed out after 0.2 s waiting for message 3 on edge 0->1 ...".
std::string formatError(const ErrorRecord& record);

}  // namespace cuda
}  // namespace gfdit
