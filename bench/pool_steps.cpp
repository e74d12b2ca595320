// The planner's thread pool (hetu::Pool, src/common/parallel.h): microseconds per step of trivial
// chunks, back to back and after the caller worked alone for a gap, at 2-16 threads.
//
//   g++ -O2 -std=c++17 -Isrc -pthread bench/pool_steps.cpp -o /tmp/pool_steps && /tmp/pool_steps
#include <chrono>
#include <cstdio>
#include <vector>

#include "common/parallel.h"

int main() {
  using Clock = std::chrono::steady_clock;
  constexpr int kSteps = 200, kWarm = 10;
  std::printf("%7s %8s %12s\n", "threads", "gap us", "us per step");
  for (int threads : {2, 4, 8, 16}) {
    hetu::Pool pool(threads);
    std::vector<double> sink(threads * 128, 1.0);
    for (int gap : {0, 50, 200, 500, 1000, 3000}) {
      double total = 0;
      for (int k = 0; k < kSteps + kWarm; ++k) {
        const auto idle = Clock::now();
        while (Clock::now() - idle < std::chrono::microseconds(gap)) {
        }
        const auto start = Clock::now();
        pool.parallel_for(threads * 128, 128, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) sink[i] += 1;
        });
        if (k >= kWarm) total += std::chrono::duration<double, std::micro>(Clock::now() - start).count();
      }
      std::printf("%7d %8d %12.1f\n", threads, gap, total / kSteps);
    }
  }
}
