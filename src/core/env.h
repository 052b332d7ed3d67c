// The library's environment variables, read here and nowhere else (docs/tuning.md lists every one
// with its type, default and effect).
#pragma once

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

namespace fusedops::env {

// The value of `name`, "" when unset. Read at each call (FUSEDOPS_BACKEND may change between
// calls, as the tests do).
inline std::string text(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

// A boolean option: true when set to anything but "" or "0".
inline bool flag(const char* name) {
  const std::string v = text(name);
  return !v.empty() && v != "0";
}

// A test-only forcing of a shape-dependent kernel choice (docs/tuning.md, second table): 1 when
// the value starts with '1', 0 with '0', -1 (the library decides) when unset or anything else.
// Read once per name and process.
inline int force(const char* name) {
  static std::mutex mu;
  static std::map<std::string, int> seen;
  std::lock_guard<std::mutex> lock(mu);
  auto it = seen.find(name);
  if (it == seen.end()) {
    const char* e = std::getenv(name);
    it = seen.emplace(name, e == nullptr ? -1 : e[0] == '1' ? 1 : e[0] == '0' ? 0 : -1).first;
  }
  return it->second;
}

}  // namespace fusedops::env
