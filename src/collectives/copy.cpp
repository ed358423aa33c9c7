#include "copy.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>

#include "gfdit/error.h"

namespace gfdit {
namespace {

// Non-temporal stores: large copies whose destination is not read soon skip the read-for-ownership.
// Without SSE2 (aarch64, ...) the streaming path is an ordinary memcpy.
void streamingCopy(void* dst, const void* src, size_t bytes) {
#if !defined(__SSE2__)
  std::memcpy(dst, src, bytes);
#else
  auto* d = static_cast<uint8_t*>(dst);
  auto* s = static_cast<const uint8_t*>(src);
  size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  if (head > bytes) head = bytes;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  size_t blocks = bytes / 64;
  for (size_t i = 0; i < blocks; ++i) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
    d += 64;
    s += 64;
  }
  _mm_sfence();  // streaming stores are weakly ordered: fence before any release that publishes them
  std::memcpy(d, s, bytes - blocks * 64);
#endif
}

struct Cursor {
  const BufferView& view;
  size_t off;
  uint8_t* at(size_t* avail) const {
    if (view.isContiguous()) {
      *avail = view.bytes() - off;
      return static_cast<uint8_t*>(view.ptr) + off;
    }
    size_t row = off / view.row_bytes;
    size_t col = off % view.row_bytes;
    *avail = view.row_bytes - col;
    return static_cast<uint8_t*>(view.ptr) + row * view.stride + col;
  }
};

}  // namespace

const char* copyPathName(CopyPath path) {
  switch (path) {
    case CopyPath::kCpuMemcpy: return "memcpy";
    case CopyPath::kCpuStreaming: return "stream";
    case CopyPath::kCudaSm: return "sm";
    case CopyPath::kCudaCe: return "ce";
    case CopyPath::kCudaTma: return "tma";
  }
  return "unknown";
}

CopySelector::CopySelector() { table_.emplace_back(std::numeric_limits<size_t>::max(), CopyPath::kCpuMemcpy); }

CopySelector CopySelector::parse(const std::string& spec) {
  CopySelector sel;
  sel.table_.clear();
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto colon = item.find(':');
    GFDIT_CHECK(colon != std::string::npos) << "copy table entry '" << item << "' is not BOUND:PATH";
    std::string bound = item.substr(0, colon), name = item.substr(colon + 1);
    size_t b = 0;
    if (bound == "inf") {
      b = std::numeric_limits<size_t>::max();
    } else {
      GFDIT_CHECK(!bound.empty() && bound.find_first_not_of("0123456789") == std::string::npos)
          << "copy table bound '" << bound << "' is not a number of bytes or inf";
      b = std::stoull(bound);
    }
    CopyPath path;
    if (name == "memcpy") {
      path = CopyPath::kCpuMemcpy;
    } else if (name == "stream") {
      path = CopyPath::kCpuStreaming;
    } else if (name == "sm") {
      path = CopyPath::kCudaSm;
    } else if (name == "ce") {
      path = CopyPath::kCudaCe;
    } else if (name == "tma") {
      path = CopyPath::kCudaTma;
    } else {
      GFDIT_THROW(kInvalidUsage) << "unknown copy path '" << name << "' (memcpy, stream; sm, ce, tma)";
    }
    sel.table_.emplace_back(b, path);
  }
  return fromEntries(std::move(sel.table_));
}

CopySelector CopySelector::fromEntries(std::vector<std::pair<size_t, CopyPath>> entries) {
  GFDIT_CHECK(!entries.empty()) << "empty copy table";
  for (size_t i = 1; i < entries.size(); ++i) {
    GFDIT_CHECK(entries[i].first > entries[i - 1].first) << "copy table bounds must ascend";
    GFDIT_CHECK(isDevicePath(entries[i].second) == isDevicePath(entries[0].second))
        << "a copy table may not mix host paths (memcpy, stream) and device paths (sm, ce, tma)";
  }
  CopySelector sel;
  sel.table_ = std::move(entries);
  sel.table_.back().first = std::numeric_limits<size_t>::max();
  return sel;
}

CopySelector CopySelector::replaced(CopyPath from, CopyPath to) const {
  std::vector<std::pair<size_t, CopyPath>> out;
  for (auto e : table_) {
    if (e.second == from) e.second = to;
    if (!out.empty() && out.back().second == e.second) {
      out.back().first = e.first;  // the previous entry now reaches this bound too
    } else {
      out.push_back(e);
    }
  }
  return fromEntries(std::move(out));
}

void CopySelector::copy(void* dst, const void* src, size_t bytes) const {
  if (bytes == 0) return;
  switch (pick(bytes)) {
    case CopyPath::kCpuMemcpy: std::memcpy(dst, src, bytes); return;
    case CopyPath::kCpuStreaming: streamingCopy(dst, src, bytes); return;
    case CopyPath::kCudaSm:
    case CopyPath::kCudaCe:
    case CopyPath::kCudaTma: break;
  }
  GFDIT_THROW(kInvalidUsage) << "copy path '" << copyPathName(pick(bytes))
                             << "' runs on a CUDA device; a host copy needs a table of memcpy/stream";
}

std::string CopySelector::toString() const {
  std::ostringstream os;
  for (size_t i = 0; i < table_.size(); ++i) {
    if (i) os << ",";
    if (table_[i].first == std::numeric_limits<size_t>::max()) {
      os << "inf";
    } else {
      os << table_[i].first;
    }
    os << ":" << copyPathName(table_[i].second);
  }
  return os.str();
}

void copyView(const CopySelector& sel, const BufferView& dst, size_t dst_off, const BufferView& src, size_t src_off,
              size_t len) {
  if (dst.isContiguous() && src.isContiguous()) {
    sel.copy(static_cast<uint8_t*>(dst.ptr) + dst_off, static_cast<const uint8_t*>(src.ptr) + src_off, len);
    return;
  }
  Cursor d{dst, dst_off}, s{src, src_off};
  while (len > 0) {
    size_t da, sa;
    uint8_t* dp = d.at(&da);
    uint8_t* sp = s.at(&sa);
    size_t n = std::min(len, std::min(da, sa));
    sel.copy(dp, sp, n);
    d.off += n;
    s.off += n;
    len -= n;
  }
}

}  // namespace gfdit
