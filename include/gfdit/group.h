// Group descriptor: an ordered list of member ranks, formed locally.
#pragma once

#include <cstdint>
#include <string>

#include "gfdit/types.h"

namespace gfdit {

/// A logical communication group: who takes part and in which order. Plain data: forming one does no
/// communication, takes no lock and allocates nothing (see NOTE [group-free collectives] in world.h).
class Group {
 public:
  Group() = default;

  /// Validates `ranks` (non-empty, unique, each in [0, world_size)) and that self_rank is a member.
  /// Order is kept: position in `ranks` is the member's index in the group. Throws Error(kInvalidUsage).
  static Group create(const int* ranks, int num_ranks, int world_size, int self_rank);
  /// All ranks 0..world_size-1 in order.
  static Group whole(int world_size, int self_rank);

  /// Number of members.
  int size() const { return num_ranks_; }
  /// Index of the calling rank in the group.
  int selfIdx() const { return self_idx_; }
  /// Global rank of member idx.
  int rankAt(int idx) const { return ranks_[idx]; }
  /// Index of global rank r in the group, or -1.
  int indexOf(int r) const;
  /// "[0, 2, 3]".
  std::string toString() const;

 private:
  int16_t num_ranks_ = 0;
  int16_t self_idx_ = -1;
  int16_t ranks_[kMaxRanks] = {};
};

}  // namespace gfdit
