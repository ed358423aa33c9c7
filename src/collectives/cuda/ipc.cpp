#include "ipc.h"

#include <map>
#include <sstream>

#include "gfdit/error.h"

namespace gfdit {
namespace cuda {
namespace {

constexpr const char* kAnnouncementTag = "gfdit-cuda-region/1";

int hexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

uint64_t parseNumber(const std::map<std::string, std::string>& kv, const std::string& key, const std::string& text) {
  auto it = kv.find(key);
  GFDIT_CHECK(it != kv.end()) << "gfdit: device region announcement lacks '" << key << "': " << text;
  const std::string& v = it->second;
  GFDIT_CHECK(!v.empty() && v.size() <= 20 && v.find_first_not_of("0123456789") == std::string::npos)
      << "gfdit: device region announcement: '" << key << "=" << v << "' is not a number";
  return std::stoull(v);
}

}  // namespace

std::string hexEncode(const void* data, size_t bytes) {
  static const char* kDigits = "0123456789abcdef";
  const auto* p = static_cast<const uint8_t*>(data);
  std::string out(bytes * 2, '0');
  for (size_t i = 0; i < bytes; ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 15];
  }
  return out;
}

void hexDecode(const std::string& hex, void* out, size_t bytes) {
  GFDIT_CHECK(hex.size() == 2 * bytes) << "gfdit: expected " << 2 * bytes << " hex digits, got " << hex.size();
  auto* p = static_cast<uint8_t*>(out);
  for (size_t i = 0; i < bytes; ++i) {
    int hi = hexDigit(hex[2 * i]), lo = hexDigit(hex[2 * i + 1]);
    GFDIT_CHECK(hi >= 0 && lo >= 0) << "gfdit: '" << hex.substr(2 * i, 2) << "' is not a hex byte";
    p[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
}

std::string encodeAnnouncement(const RegionAnnouncement& a) {
  std::ostringstream os;
  os << kAnnouncementTag << " handle=" << a.handle << " uuid=" << a.uuid << " bytes=" << a.total_bytes
     << " slot=" << a.slot_bytes << " slots=" << a.num_slots << " heap=" << a.heap_bytes << " device=" << a.device
     << " pid=" << a.pid;
  return os.str();
}

RegionAnnouncement parseAnnouncement(const std::string& text) {
  std::istringstream is(text);
  std::string tag;
  is >> tag;
  GFDIT_CHECK(tag == kAnnouncementTag) << "gfdit: not a device region announcement of this layout ('" << tag
                                       << "', expected '" << kAnnouncementTag << "')";
  std::map<std::string, std::string> kv;
  std::string item;
  while (is >> item) {
    auto eq = item.find('=');
    GFDIT_CHECK(eq != std::string::npos && eq > 0) << "gfdit: device region announcement: bad item '" << item << "'";
    kv[item.substr(0, eq)] = item.substr(eq + 1);
  }
  RegionAnnouncement a;
  a.handle = kv["handle"];
  a.uuid = kv["uuid"];
  a.total_bytes = parseNumber(kv, "bytes", text);
  a.slot_bytes = parseNumber(kv, "slot", text);
  a.num_slots = parseNumber(kv, "slots", text);
  a.heap_bytes = parseNumber(kv, "heap", text);
  a.device = static_cast<int>(parseNumber(kv, "device", text));
  a.pid = static_cast<int>(parseNumber(kv, "pid", text));
  GFDIT_CHECK(!a.handle.empty()) << "gfdit: device region announcement without a handle";
  return a;
}

}  // namespace cuda
}  // namespace gfdit
