// How a rank announces its device region to its peers through the store: the legacy CUDA IPC handle in
// hex and the layout every peer checks against its own (host only; tested without a device).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gfdit {
namespace cuda {

/// Lower-case hex of `bytes` bytes.
std::string hexEncode(const void* data, size_t bytes);
/// Decodes exactly `bytes` bytes of hex into out; throws kInvalidUsage on any other length or a non-hex digit.
void hexDecode(const std::string& hex, void* out, size_t bytes);

/// One rank's device region as its peers need to know it.
struct RegionAnnouncement {
  std::string handle;  // cudaIpcMemHandle_t in hex (64 bytes)
  std::string uuid;    // the device's UUID in hex (16 bytes)
  uint64_t total_bytes = 0;
  uint64_t slot_bytes = 0;
  uint64_t num_slots = 0;
  uint64_t heap_bytes = 0;
  int device = 0;
  int pid = 0;
};

/// "gfdit-cuda-region/1 handle=... uuid=... bytes=... slot=... slots=... heap=... device=... pid=...".
std::string encodeAnnouncement(const RegionAnnouncement& a);
/// The inverse of encodeAnnouncement; throws kInvalidUsage on anything else (another layout version too).
RegionAnnouncement parseAnnouncement(const std::string& text);

}  // namespace cuda
}  // namespace gfdit
