// fusedops::Error: every failure of the library is one of these, carrying the op name and the
// source location. The Python binding maps the kind to ValueError / TypeError / RuntimeError.
#pragma once

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
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
template <class>
inline constexpr bool kUnsupportedPart = false;

// Appends one part of a message the way std::ostream's defaults print it (integers in decimal,
// floating point as %g, bool as 1/0), but without iostreams: formatting through std::locale
// crashed inside some Python processes, where another library's copy of the C++ runtime
// interposed the locale facet ids (seen with torch 2.11+cu130 on an H200 host).
template <class T>
void append_part(std::string& out, const T& v) {
  using U = std::decay_t<T>;
  if constexpr (std::is_same_v<U, bool>) {
    out += v ? '1' : '0';
  } else if constexpr (std::is_same_v<U, char>) {
    out += v;
  } else if constexpr (std::is_enum_v<U>) {
    append_part(out, static_cast<std::underlying_type_t<U>>(v));
  } else if constexpr (std::is_integral_v<U>) {
    char buf[24];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, r.ptr);
  } else if constexpr (std::is_floating_point_v<U>) {
    char buf[40];
    const int n = std::snprintf(buf, sizeof buf, "%g", static_cast<double>(v));
    out.append(buf, n > 0 ? static_cast<size_t>(n) : 0);
  } else if constexpr (std::is_convertible_v<const U&, std::string_view>) {
    if constexpr (std::is_pointer_v<T>) {
      out += v ? std::string_view(v) : std::string_view("(null)");
    } else {
      out += std::string_view(v);
    }
  } else {
    static_assert(kUnsupportedPart<U>, "fusedops::detail::concat: unsupported message part type");
  }
}

template <class... Parts>
std::string concat(Parts&&... parts) {
  std::string out;
  (append_part(out, parts), ...);
  return out;
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
