// What memory a process of this host may still take: /proc/meminfo's MemAvailable, or less where
// its memory cgroup leaves less (its limit less its usage, for the process's cgroup and each
// cgroup above it: v2 memory.max and memory.current, v1 memory.limit_in_bytes and
// memory.usage_in_bytes). HETU_MEMORY_AVAILABLE (bytes) stands in for the host's figure, so
// that a refusal can be tested without a host that lacks the memory.
//
// Checked before a large table is allocated (the workers' dynamic tables, hetu.dynamic; a
// server's shard, ps-lite/src/ops/init.cc): a table that cannot fit is refused in one line
// instead of ending in std::bad_alloc or in the kernel's out-of-memory kill.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace hetu {

struct AvailableMemory {
  int64_t bytes = INT64_MAX;
  std::string source;  // "MemAvailable", "the cgroup limit of <folder>" or "HETU_MEMORY_AVAILABLE"
};

namespace host_memory_detail {

inline bool ReadInt(const std::string& path, int64_t* out) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s == "max") return false;
  try {
    *out = std::stoll(s);
  } catch (...) {
    return false;
  }
  return true;
}

// limit - usage of cgroup folder `dir`, where it has a limit below 2^60 (v1 "no limit" is near 2^63).
inline void Limit(const std::string& dir, const char* limit, const char* usage, AvailableMemory* best) {
  int64_t l = 0, u = 0;
  if (!ReadInt(dir + "/" + limit, &l) || l >= (int64_t(1) << 60) || !ReadInt(dir + "/" + usage, &u)) return;
  const int64_t left = l > u ? l - u : 0;
  if (left < best->bytes) *best = {left, "the cgroup limit of " + dir};
}

// The cgroup folder of the process under `mount` and every folder above it up to `mount`.
inline void Walk(const std::string& mount, std::string path, const char* limit, const char* usage,
                 AvailableMemory* best) {
  while (true) {
    Limit(mount + path, limit, usage, best);
    if (path.empty() || path == "/") return;
    const size_t slash = path.find_last_of('/');
    path = slash == std::string::npos || slash == 0 ? "" : path.substr(0, slash);
  }
}

}  // namespace host_memory_detail

inline AvailableMemory HostAvailableMemory() {
  namespace d = host_memory_detail;
  AvailableMemory best;
  if (const char* env = std::getenv("HETU_MEMORY_AVAILABLE")) {
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    if (end != env && *end == '\0' && v >= 0) return {v, "HETU_MEMORY_AVAILABLE"};
  }
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    long long kb = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %lld kB", &kb) == 1) {
      best = {kb * 1024, "MemAvailable"};
      break;
    }
  }
  std::ifstream cgroups("/proc/self/cgroup");
  for (std::string line; std::getline(cgroups, line);) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = "," + line.substr(a + 1, b - a - 1) + ",", path = line.substr(b + 1);
    if (controllers == ",,")
      d::Walk("/sys/fs/cgroup", path, "memory.max", "memory.current", &best);
    else if (controllers.find(",memory,") != std::string::npos)
      d::Walk("/sys/fs/cgroup/memory", path, "memory.limit_in_bytes", "memory.usage_in_bytes", &best);
  }
  return best;
}

// "12.3 GB" (10^9 bytes), "512.0 MB", "800 bytes".
inline std::string ByteText(int64_t bytes) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(1);
  if (bytes >= 1000000000000LL) s << bytes / 1e12 << " TB";
  else if (bytes >= 1000000000) s << bytes / 1e9 << " GB";
  else if (bytes >= 1000000) s << bytes / 1e6 << " MB";
  else s << bytes << " bytes";
  return s.str();
}

}  // namespace hetu
