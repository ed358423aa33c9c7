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

  /// Validates `ranks` (non-empty, unique, each in [0, world_size)). Order is kept: position in `ranks` is
  /// the member's index in the group. self_rank need not be a member, so that every rank may describe
  /// every group as with torch.distributed.new_group; collectives refuse a non-member's descriptor.
  /// Throws Error(kInvalidUsage).
  static Group create(const int* ranks, int num_ranks, int world_size, int self_rank);
  /// All ranks 0..world_size-1 in order.
  static Group whole(int world_size, int self_rank);

  /// Number of members.
  int size() const { return num_ranks_; }
  /// Index of the calling rank in the group, or -1 when it is not a member.
  int selfIdx() const { return self_idx_; }
  /// Whether the calling rank is a member.
  bool isMember() const { return self_idx_ >= 0; }
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
