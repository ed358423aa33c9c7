// Copy paths and the selector that picks one per message size.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "gfdit/types.h"

namespace gfdit {

/// A way to move bytes: host paths (memcpy, streaming stores) and device paths (an SM copy kernel, the copy
/// engine, TMA bulk copies on sm_90); one table may only mix paths of one side.
enum class CopyPath { kCpuMemcpy, kCpuStreaming, kCudaSm, kCudaCe, kCudaTma };

/// Name of a copy path ("memcpy", "stream", "sm", "ce", "tma").
const char* copyPathName(CopyPath path);
/// Whether a path runs on a CUDA device (sm, ce, tma) rather than on the host.
inline bool isDevicePath(CopyPath path) {
  return path == CopyPath::kCudaSm || path == CopyPath::kCudaCe || path == CopyPath::kCudaTma;
}

/// Picks a copy path by message size from a table of (upper bound in bytes, path) entries.
class CopySelector {
 public:
  /// The CPU default: memcpy for every size.
  CopySelector();
  /// Parses "65536:memcpy,inf:stream" (bounds ascending; the last bound may be "inf"). Host and device paths
  /// may not be mixed in one table.
  static CopySelector parse(const std::string& spec);
  /// A table from (upper bound, path) entries, checked as parse checks them (the last bound becomes inf).
  static CopySelector fromEntries(std::vector<std::pair<size_t, CopyPath>> entries);
  /// The path for a message of `bytes`.
  CopyPath pick(size_t bytes) const {
    for (const auto& e : table_) {
      if (bytes <= e.first) return e.second;
    }
    return table_.back().second;
  }
  /// Copies with the path the table picks for `bytes` (host tables only: a device path is refused).
  void copy(void* dst, const void* src, size_t bytes) const;
  /// "65536:memcpy,inf:stream".
  std::string toString() const;
  /// The (upper bound, path) entries, bounds ascending, the last one SIZE_MAX.
  const std::vector<std::pair<size_t, CopyPath>>& entries() const { return table_; }
  /// Whether the table holds device paths (sm, ce, tma) rather than host ones.
  bool isDevice() const { return isDevicePath(table_.front().second); }
  /// The same table with every use of `from` replaced by `to` (e.g. tma -> sm where TMA is unavailable);
  /// neighbouring entries that end up with the same path are merged.
  CopySelector replaced(CopyPath from, CopyPath to) const;

 private:
  std::vector<std::pair<size_t, CopyPath>> table_;
};

/// Copies `len` payload bytes from src (starting at its payload offset src_off) into dst (at dst_off);
/// payload offsets count bytes in row order.
void copyView(const CopySelector& sel, const BufferView& dst, size_t dst_off, const BufferView& src, size_t src_off,
              size_t len);

}  // namespace gfdit
