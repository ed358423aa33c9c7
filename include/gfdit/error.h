// gfdit error type and check macros.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

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
///
/// what() is `where` followed by `message` ("limits.cpp:40: check failed: s.height % m == 0: height 33 is not a
/// multiple of 16"). `param` names the argument or request field the error is about ("height"), so that a
/// caller (the HTTP server) can say which field to fix without reading the message.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message, std::string param = std::string(),
        std::string where = std::string())
      : std::runtime_error(where + message),
        code_(code),
        message_(message),
        param_(std::move(param)),
        where_(std::move(where)) {}
  ErrorCode code() const { return code_; }
  /// The message for people, without where it was raised.
  const std::string& message() const { return message_; }
  /// The parameter (argument, request field) it is about; "" when none.
  const std::string& param() const { return param_; }
  /// Where a check raised it ("file.cpp:NN: check failed: expr: "); "" when thrown otherwise.
  const std::string& where() const { return where_; }

 private:
  ErrorCode code_;
  std::string message_;
  std::string param_;
  std::string where_;
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
    std::ostringstream where;
    where << base << ":" << line << ": ";
    if (expr != nullptr) where << "check failed: " << expr << ": ";
    where_ = where.str();
  }
  ErrorBuilder(const ErrorBuilder&) = delete;
  ErrorBuilder& operator=(const ErrorBuilder&) = delete;
  template <typename T>
  ErrorBuilder& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }
  /// Names the parameter the error is about: GFDIT_CHECK(h > 0).param("height") << "...".
  ErrorBuilder& param(const char* name) {
    param_ = name;
    return *this;
  }
  /// The error the message so far describes.
  Error error() const { return Error(code_, stream_.str(), param_, where_); }

 private:
  ErrorCode code_;
  std::string where_;
  std::string param_;
  std::ostringstream stream_;
};

struct ThrowError {
  [[noreturn]] void operator&(const ErrorBuilder& b) const { throw b.error(); }
};

}  // namespace detail
}  // namespace gfdit

/// Throws gfdit::Error(kInvalidUsage) with file, line and the expression unless cond holds; stream the message
/// after it, and name the parameter at fault with .param("name") first.
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
