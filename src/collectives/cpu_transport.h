// The host transport: staging and heap in this rank's POSIX shared-memory region, copies with memcpy or
// streaming stores (CopySelector), reductions in member order (reduce.h). See NOTE [transports].
#pragma once

#include <vector>

#include "copy.h"
#include "transport.h"

namespace gfdit {

class CpuTransport final : public Transport {
 public:
  /// Regions: every rank's region base as mapped here (own included); staging and heap: offsets and sizes,
  /// the same in every region.
  CpuTransport(int rank, std::vector<uint8_t*> region_bases, size_t staging_offset, size_t slot_bytes, size_t num_slots,
               size_t heap_offset, size_t heap_bytes, CopySelector copier);
  const CopySelector& copier() const { return copier_; }

  TransportKind kind() const override { return TransportKind::kCpu; }
  uint8_t* base() const override { return bases_[rank_]; }
  uint8_t* peerBase(int peer) const override { return bases_[peer]; }
  size_t slotBytes() const override { return slot_bytes_; }
  size_t numSlots() const override { return num_slots_; }
  uint8_t* slot(size_t k) const override { return base() + staging_offset_ + k * slot_bytes_; }
  uint8_t* heapBase() const override { return base() + heap_offset_; }
  size_t heapCapacity() const override { return heap_bytes_; }
  core::HeapAllocator& heap() override { return heap_; }
  uint8_t* scratch(size_t bytes) override;

  void begin(void*) override {}
  void end() override {}
  void copyLocal(const BufferView& dst, size_t dst_off, const BufferView& src, size_t src_off, size_t bytes) override;
  void stage(uint8_t* slot, const BufferView& src, size_t src_off, size_t bytes, const SlotUse*, int) override;
  // The copies are complete when they return and the host handshake orders them (NOTE [transports]).
  void publish(int, uint64_t) override {}
  void consume(const BufferView& dst, size_t dst_off, const BufferView& src, size_t src_off, size_t bytes, int,
               uint64_t) override;
  void reduce(uint8_t* out, const uint8_t* const* contribs, int n, int first, size_t count, DType dtype, ReduceOp op,
              bool acc, const SlotUse*, int) override;
  void consumed(int, uint64_t) override {}
  void awaitConsumed(int, uint64_t) override {}
  std::string describe() const override;

 private:
  int rank_;
  std::vector<uint8_t*> bases_;
  size_t staging_offset_, slot_bytes_, num_slots_, heap_offset_, heap_bytes_;
  CopySelector copier_;
  core::HeapAllocator heap_;
  std::vector<uint8_t> acc_;      // one round of the accumulator
  std::vector<uint8_t> scratch_;  // one-shot all-reduce results
};

}  // namespace gfdit
