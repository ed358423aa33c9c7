#include "cpu_transport.h"

#include <cstring>
#include <sstream>

#include "edge.h"
#include "gfdit/error.h"
#include "reduce.h"

namespace gfdit {

const char* transportKindName(TransportKind kind) {
  switch (kind) {
    case TransportKind::kCpu: return "cpu";
    case TransportKind::kCuda: return "cuda";
  }
  return "unknown";
}

void Transport::putWithSignal(int, size_t, const void*, size_t) {
  GFDIT_THROW(kInvalidUsage) << "gfdit: the " << transportKindName(kind()) << " transport has no one-sided puts";
}

void Transport::waitPuts(int, uint64_t) {
  GFDIT_THROW(kInvalidUsage) << "gfdit: the " << transportKindName(kind()) << " transport has no one-sided puts";
}

CpuTransport::CpuTransport(int rank, std::vector<uint8_t*> region_bases, size_t staging_offset, size_t slot_bytes,
                           size_t num_slots, size_t heap_offset, size_t heap_bytes, CopySelector copier)
    : rank_(rank),
      bases_(std::move(region_bases)),
      staging_offset_(staging_offset),
      slot_bytes_(slot_bytes),
      num_slots_(num_slots),
      heap_offset_(heap_offset),
      heap_bytes_(heap_bytes),
      copier_(std::move(copier)),
      heap_(heap_bytes, edge::kHeapAlign) {
  acc_.resize(slot_bytes_ * 2 + 64);  // float32 accumulator of one slot of 16-bit elements, and slack
}

uint8_t* CpuTransport::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

void CpuTransport::copyLocal(const BufferView& dst, size_t dst_off, const BufferView& src, size_t src_off,
                             size_t bytes) {
  copyView(copier_, dst, dst_off, src, src_off, bytes);
}

void CpuTransport::stage(uint8_t* slot, const BufferView& src, size_t src_off, size_t bytes, const SlotUse*, int) {
  copyView(copier_, BufferView::contiguous(slot, bytes), 0, src, src_off, bytes);
}

void CpuTransport::consume(const BufferView& dst, size_t dst_off, const BufferView& src, size_t src_off, size_t bytes,
                           int, uint64_t) {
  copyView(copier_, dst, dst_off, src, src_off, bytes);
}

void CpuTransport::reduce(uint8_t* out, const uint8_t* const* contribs, int n, int first, size_t count, DType dtype,
                          ReduceOp op, bool acc, const SlotUse*, int) {
  if (acc) {
    size_t need = count * reduce::accElemSize(dtype);
    if (acc_.size() < need) acc_.resize(need);
    reduce::accInit(acc_.data(), contribs[first], count, dtype);
    for (int j = 0; j < n; ++j) {
      if (j != first) reduce::accApply(acc_.data(), contribs[j], count, dtype, op);
    }
    reduce::accStore(out, acc_.data(), count, dtype);
    return;
  }
  // Straight into the output, starting from contribs[first] (in place when out is that block).
  if (out != contribs[first]) std::memcpy(out, contribs[first], count * dtypeSize(dtype));
  for (int j = 0; j < n; ++j) {
    if (j != first) reduce::accApply(out, contribs[j], count, dtype, op);
  }
}

std::string CpuTransport::describe() const {
  std::ostringstream os;
  os << "cpu " << copier_.toString();
  return os.str();
}

}  // namespace gfdit
