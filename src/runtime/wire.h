// The byte format of the messages that travel as task or completion payloads (a generation request, a
// worker's hello, a reinit plan): a 4-byte tag naming the message and its version, then fields in order,
// numbers little-endian as the machine stores them (both ends are processes of one machine), strings as a
// u32 length and their bytes. A reader checks every length and that nothing is left over, so a message cut
// short, another message's bytes or a stale version fail loudly instead of decoding into garbage.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "gfdit/error.h"

namespace gfdit {
namespace runtime {
namespace wire {

/// Appends fields to a message.
class Writer {
 public:
  explicit Writer(uint32_t tag) { put(tag); }
  template <typename T>
  Writer& put(const T& v) {
    static_assert(std::is_trivially_copyable<T>::value, "a wire field is plain data");
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
    return *this;
  }
  Writer& putString(const std::string& s) {
    put(static_cast<uint32_t>(s.size()));
    out_.append(s);
    return *this;
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

/// Reads the fields of a message in the order they were written; every read is bounds-checked.
class Reader {
 public:
  /// `what` names the message in errors ("a generation request").
  Reader(const std::string& bytes, uint32_t tag, const char* what) : bytes_(bytes), what_(what) {
    uint32_t got = get<uint32_t>();
    GFDIT_CHECK_CODE(kInternal, got == tag)
        << what_ << ": the message's tag is 0x" << std::hex << got << ", expected 0x" << tag << std::dec
        << " (another message, or another gfdit version)";
  }
  template <typename T>
  T get() {
    static_assert(std::is_trivially_copyable<T>::value, "a wire field is plain data");
    need(sizeof(T));
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string getString() {
    uint32_t n = get<uint32_t>();
    need(n);
    std::string s = bytes_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  /// Throws unless every byte was read.
  void end() const {
    GFDIT_CHECK_CODE(kInternal, pos_ == bytes_.size())
        << what_ << ": " << bytes_.size() - pos_ << " bytes left over after the last field";
  }

 private:
  void need(size_t n) const {
    GFDIT_CHECK_CODE(kInternal, pos_ + n <= bytes_.size()) << what_ << ": the message ends after " << bytes_.size()
                                                           << " bytes, a field needs " << n << " more at " << pos_;
  }
  const std::string& bytes_;
  const char* what_;
  size_t pos_ = 0;
};

}  // namespace wire
}  // namespace runtime
}  // namespace gfdit
