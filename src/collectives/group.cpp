// Group descriptor: validation only; see NOTE [group-free collectives].
#include "gfdit/group.h"

#include <cstdint>
#include <sstream>

#include "gfdit/error.h"

namespace gfdit {

Group Group::create(const int* ranks, int num_ranks, int world_size, int self_rank) {
  GFDIT_CHECK(num_ranks >= 1) << "a group needs at least one rank";
  GFDIT_CHECK(num_ranks <= world_size) << "group of " << num_ranks << " ranks in a world of " << world_size;
  GFDIT_CHECK(world_size <= kMaxRanks) << "world size " << world_size << " exceeds " << kMaxRanks;
  Group g;
  uint64_t seen = 0;
  for (int i = 0; i < num_ranks; ++i) {
    int r = ranks[i];
    GFDIT_CHECK(r >= 0 && r < world_size) << "rank " << r << " is out of range [0, " << world_size << ")";
    uint64_t bit = uint64_t{1} << r;
    GFDIT_CHECK((seen & bit) == 0) << "rank " << r << " appears twice in the group";
    seen |= bit;
    g.ranks_[i] = static_cast<int16_t>(r);
    if (r == self_rank) g.self_idx_ = static_cast<int16_t>(i);
  }
  g.num_ranks_ = static_cast<int16_t>(num_ranks);
  return g;
}

Group Group::whole(int world_size, int self_rank) {
  GFDIT_CHECK(world_size >= 1 && world_size <= kMaxRanks) << "world size " << world_size;
  GFDIT_CHECK(self_rank >= 0 && self_rank < world_size) << "rank " << self_rank;
  Group g;
  for (int i = 0; i < world_size; ++i) g.ranks_[i] = static_cast<int16_t>(i);
  g.num_ranks_ = static_cast<int16_t>(world_size);
  g.self_idx_ = static_cast<int16_t>(self_rank);
  return g;
}

int Group::indexOf(int r) const {
  for (int i = 0; i < num_ranks_; ++i) {
    if (ranks_[i] == r) return i;
  }
  return -1;
}

std::string Group::toString() const {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < num_ranks_; ++i) os << (i ? ", " : "") << ranks_[i];
  os << "]";
  return os.str();
}

}  // namespace gfdit
