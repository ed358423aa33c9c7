// The allocator of a region's heap: offsets into [0, capacity), first fit, with placement at a given offset
// so that a group can agree on one offset for every member (NOTE [symmetric allocation] in world.cpp).
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <vector>

namespace gfdit {
namespace core {

class HeapAllocator {
 public:
  static constexpr size_t kNone = ~size_t{0};

  HeapAllocator() = default;
  HeapAllocator(size_t capacity, size_t align);
  void reset(size_t capacity, size_t align);

  /// Bytes a request of `bytes` takes (rounded up to the alignment, at least one unit).
  size_t rounded(size_t bytes) const;
  /// First fit: the lowest offset with room, or kNone.
  size_t alloc(size_t bytes);
  /// The lowest offset >= `from` where `bytes` would fit, without allocating; kNone if none.
  size_t firstFitFrom(size_t from, size_t bytes) const;
  /// Allocates exactly [offset, offset + rounded(bytes)) if it is free; returns whether it did.
  bool allocAt(size_t offset, size_t bytes);
  /// Frees a block that alloc/allocAt returned; returns false for an offset that is not a block.
  bool free(size_t offset);
  size_t used() const;
  size_t capacity() const { return capacity_; }

 private:
  size_t capacity_ = 0;
  size_t align_ = 1;
  mutable std::mutex mu_;
  std::map<size_t, size_t> free_;  // offset -> bytes, coalesced
  std::map<size_t, size_t> used_;  // offset -> bytes
  size_t used_bytes_ = 0;
};

}  // namespace core
}  // namespace gfdit
