#include "heap.h"

#include <algorithm>
#include <iterator>
#include <limits>

namespace gfdit {
namespace core {

HeapAllocator::HeapAllocator(size_t capacity, size_t align) { reset(capacity, align); }

void HeapAllocator::reset(size_t capacity, size_t align) {
  std::lock_guard<std::mutex> lock(mu_);
  capacity_ = capacity;
  align_ = std::max<size_t>(align, 1);
  free_.clear();
  used_.clear();
  used_bytes_ = 0;
  if (capacity > 0) free_.emplace(0, capacity);
}

size_t HeapAllocator::rounded(size_t bytes) const {
  size_t b = std::max<size_t>(bytes, 1);
  // More than the heap can never fit; saying so here keeps the rounding below from wrapping to a small size.
  if (b > capacity_ || b > std::numeric_limits<size_t>::max() - align_) return std::numeric_limits<size_t>::max();
  return (b + align_ - 1) / align_ * align_;
}

size_t HeapAllocator::alloc(size_t bytes) {
  size_t need = rounded(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    size_t off = it->first, len = it->second;
    free_.erase(it);
    if (len > need) free_.emplace(off + need, len - need);
    used_.emplace(off, need);
    used_bytes_ += need;
    return off;
  }
  return kNone;
}

size_t HeapAllocator::firstFitFrom(size_t from, size_t bytes) const {
  size_t need = rounded(bytes);
  from = (from + align_ - 1) / align_ * align_;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [off, len] : free_) {
    size_t start = std::max(off, from);
    if (start < off + len && off + len - start >= need) return start;
  }
  return kNone;
}

bool HeapAllocator::allocAt(size_t offset, size_t bytes) {
  size_t need = rounded(bytes);
  if (offset % align_ != 0) return false;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = free_.upper_bound(offset);
  if (it == free_.begin()) return false;
  --it;  // the free block starting at or before offset
  size_t off = it->first, len = it->second;
  if (need > len || offset - off > len - need) return false;  // (offset + need could wrap)
  free_.erase(it);
  if (offset > off) free_.emplace(off, offset - off);
  if (off + len > offset + need) free_.emplace(offset + need, off + len - offset - need);
  used_.emplace(offset, need);
  used_bytes_ += need;
  return true;
}

bool HeapAllocator::free(size_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = used_.find(offset);
  if (it == used_.end()) return false;
  size_t len = it->second;
  used_.erase(it);
  used_bytes_ -= len;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && next->first == offset + len) {  // merge with the following block
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {  // merge with the preceding block
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += len;
      return true;
    }
  }
  free_.emplace(offset, len);
  return true;
}

size_t HeapAllocator::used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_bytes_;
}

}  // namespace core
}  // namespace gfdit
