// fusedops::Error: every failure of the library is one of these, carrying the op name and the
// source location. The Python binding maps the kind to ValueError / TypeError / RuntimeError.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace fusedops {

enum class ErrorKind : uint8_t {
  kValue,    // bad argument value or shape
  kType,     // bad dtype or device kind
  kRuntime,  // failure while running (CUDA error, no backend, ...)
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string op, std::string message, const char* file, int line);

  ErrorKind kind() const noexcept { return kind_; }
  const std::string& op() const noexcept { return op_; }
  const std::string& message() const noexcept { return message_; }
  const std::string& file() const noexcept { return file_; }
  int line() const noexcept { return line_; }

 private:
  ErrorKind kind_;
  std::string op_;
  std::string message_;
  std::string file_;
  int line_;
};

namespace detail {
template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  return os.str();
}
[[noreturn]] void throw_error(ErrorKind kind, const std::string& op, const std::string& message,
                              const char* file, int line);
}  // namespace detail

}  // namespace fusedops

// FUSEDOPS_FAIL(kind, op, parts...): throw an Error whose message is the concatenation of parts.
#define FUSEDOPS_FAIL(kind, op, ...)                                                           \
  ::fusedops::detail::throw_error(::fusedops::ErrorKind::kind, (op),                           \
                                  ::fusedops::detail::concat(__VA_ARGS__), __FILE__, __LINE__)

// FUSEDOPS_REQUIRE(cond, kind, op, parts...): fail unless cond holds.
#define FUSEDOPS_REQUIRE(cond, kind, op, ...) \
  do {                                        \
    if (!(cond)) FUSEDOPS_FAIL(kind, op, __VA_ARGS__); \
  } while (0)
