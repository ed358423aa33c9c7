// gfdit error type and check macros.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace gfdit {

/// What kind of failure an Error reports.
enum class ErrorCode {
  kInvalidUsage,  ///< bad arguments or a call that does not fit the state
  kTimeout,       ///< a bounded wait expired
  kSystemError,   ///< an operating-system call failed
  kRemoteError,   ///< a peer died or disagrees about a collective
  kInternal,      ///< a broken invariant inside gfdit
};

/// Name of an error code ("InvalidUsage", ...).
const char* errorCodeName(ErrorCode code);

/// The one exception type of the library; the bindings map each code to a Python class.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

namespace detail {

// Collects a message with operator<<; ThrowError's operator& (which binds after every <<) throws it. The
// throw happens in an ordinary [[noreturn]] function, not in a destructor, so it is safe during unwinding and
// the compiler knows that code after a failed check is unreachable.
class ErrorBuilder {
 public:
  ErrorBuilder(ErrorCode code, const char* file, int line, const char* expr) : code_(code) {
    const char* base = file;  // the file's name only, not where the build ran
    for (const char* p = file; *p != '\0'; ++p) {
      if (*p == '/') base = p + 1;
    }
    stream_ << base << ":" << line << ": ";
    if (expr != nullptr) stream_ << "check failed: " << expr << ": ";
  }
  ErrorBuilder(const ErrorBuilder&) = delete;
  ErrorBuilder& operator=(const ErrorBuilder&) = delete;
  template <typename T>
  ErrorBuilder& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }
  /// The error the message so far describes.
  Error error() const { return Error(code_, stream_.str()); }

 private:
  ErrorCode code_;
  std::ostringstream stream_;
};

struct ThrowError {
  [[noreturn]] void operator&(const ErrorBuilder& b) const { throw b.error(); }
};

}  // namespace detail
}  // namespace gfdit

/// Throws gfdit::Error(kInvalidUsage) with file, line and the expression unless cond holds.
#define GFDIT_CHECK(cond)           \
  if (cond) {                       \
  } else                            \
    ::gfdit::detail::ThrowError() & \
        ::gfdit::detail::ErrorBuilder(::gfdit::ErrorCode::kInvalidUsage, __FILE__, __LINE__, #cond)

/// Like GFDIT_CHECK with an explicit error code.
#define GFDIT_CHECK_CODE(code, cond) \
  if (cond) {                        \
  } else                             \
    ::gfdit::detail::ThrowError() & ::gfdit::detail::ErrorBuilder(::gfdit::ErrorCode::code, __FILE__, __LINE__, #cond)

/// Throws gfdit::Error(code) with file and line; stream the message after it.
#define GFDIT_THROW(code) \
  ::gfdit::detail::ThrowError() & ::gfdit::detail::ErrorBuilder(::gfdit::ErrorCode::code, __FILE__, __LINE__, nullptr)
