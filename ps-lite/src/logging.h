// PS_VERBOSE=1 logs connections and control traffic, 2 also data messages; to stderr.
#pragma once
#include <cstdlib>
#include <iostream>
#include <sstream>

namespace ps {

inline int Verbosity() {
  static const int v = [] {
    const char* e = std::getenv("PS_VERBOSE");
    return e ? std::atoi(e) : 0;
  }();
  return v;
}

class LogLine {
 public:
  ~LogLine() { std::cerr << "[ps] " << s_.str() << std::endl; }
  template <typename T>
  LogLine& operator<<(const T& v) {
    s_ << v;
    return *this;
  }

 private:
  std::ostringstream s_;
};

}  // namespace ps

#define PS_VLOG(level) \
  if (::ps::Verbosity() >= (level)) ::ps::LogLine()
