#include "fusedops/core/error.h"

#include <cstring>

namespace fusedops {
namespace {

// Shortens an absolute __FILE__ to the path inside the repository (src/..., include/...).
std::string repo_relative(const char* file) {
  std::string f = file ? file : "";
  for (const char* root : {"/src/", "/include/", "/python/", "/tests/"}) {
    auto pos = f.rfind(root);
    if (pos != std::string::npos) return f.substr(pos + 1);
  }
  return f;
}

std::string format(const std::string& op, const std::string& message, const std::string& file,
                   int line) {
  std::string s = "fusedops: ";
  if (!op.empty()) s += op + ": ";
  s += message;
  s += " (" + file + ":" + std::to_string(line) + ")";
  return s;
}

}  // namespace

Error::Error(ErrorKind kind, std::string op, std::string message, const char* file, int line)
    : std::runtime_error(format(op, message, repo_relative(file), line)),
      kind_(kind),
      op_(std::move(op)),
      message_(std::move(message)),
      file_(repo_relative(file)),
      line_(line) {}

namespace detail {
void throw_error(ErrorKind kind, const std::string& op, const std::string& message,
                 const char* file, int line) {
  throw Error(kind, op, message, file, line);
}
}  // namespace detail

}  // namespace fusedops
