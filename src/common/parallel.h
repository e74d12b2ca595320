// A blocking parallel-for over an index range, for kernels called with the GIL released.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <thread>
#include <vector>

namespace hetu {

inline int num_threads() {
  static const int n = [] {
    const char* env = std::getenv("HETU_NUM_THREADS");
    int v = env ? std::atoi(env) : static_cast<int>(std::thread::hardware_concurrency());
    return std::max(1, v);
  }();
  return n;
}

// Calls fn(begin, end) on disjoint chunks of [0, n); small ranges run on the calling thread.
template <typename Fn>
void parallel_for(int64_t n, int64_t min_chunk, Fn fn) {
  const int64_t max_parts = std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk));
  const int parts = static_cast<int>(std::min<int64_t>(num_threads(), max_parts));
  if (parts <= 1) {
    fn(int64_t(0), n);
    return;
  }
  std::vector<std::thread> workers;
  workers.reserve(parts - 1);
  const int64_t chunk = (n + parts - 1) / parts;
  for (int p = 1; p < parts; ++p) {
    const int64_t b = p * chunk, e = std::min(n, b + chunk);
    if (b < e) workers.emplace_back([=] { fn(b, e); });
  }
  fn(int64_t(0), std::min(n, chunk));
  for (auto& t : workers) t.join();
}

}  // namespace hetu
