// Copy paths and the selector that picks one per message size.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "gfdit/types.h"

namespace gfdit {

/// A way to move bytes. CPU paths now; the CUDA SM-copy, copy-engine and TMA paths join the same table.
enum class CopyPath { kCpuMemcpy, kCpuStreaming };

/// Name of a copy path ("memcpy", "stream").
const char* copyPathName(CopyPath path);

/// Picks a copy path by message size from a table of (upper bound in bytes, path) entries.
class CopySelector {
 public:
  /// The CPU default: memcpy for every size.
  CopySelector();
  /// Parses "65536:memcpy,inf:stream" (bounds ascending; the last bound may be "inf").
  static CopySelector parse(const std::string& spec);
  /// The path for a message of `bytes`.
  CopyPath pick(size_t bytes) const {
    for (const auto& e : table_) {
      if (bytes <= e.first) return e.second;
    }
    return table_.back().second;
  }
  /// Copies with the path the table picks for `bytes`.
  void copy(void* dst, const void* src, size_t bytes) const;
  /// "65536:memcpy,inf:stream".
  std::string toString() const;

 private:
  std::vector<std::pair<size_t, CopyPath>> table_;
};

/// Copies `len` payload bytes from src (starting at its payload offset src_off) into dst (at dst_off);
/// payload offsets count bytes in row order.
void copyView(const CopySelector& sel, const BufferView& dst, size_t dst_off, const BufferView& src, size_t src_off,
              size_t len);

}  // namespace gfdit
