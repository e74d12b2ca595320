// A blocking parallel-for over an index range, for kernels called with the GIL released.
//
// Work runs on a persistent pool of num_threads() - 1 workers plus the calling thread (spawning
// std::threads per call cost tens of microseconds per kernel, more on a loaded machine). The
// pool serves one parallel_for at a time: a call made while it is busy (another Python thread,
// or a nested parallel_for) runs its range on its own thread, so there is no deadlock. A forked
// child gets a fresh pool. Chunking is a pure function of (n, min_chunk, num_threads()), so a
// kernel's results never depend on which thread ran which chunk.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <mutex>
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

namespace detail {

class ThreadPool {
 public:
  explicit ThreadPool(int workers) {
    // Detached and never destroyed, so static destruction and interpreter shutdown never wait
    // on a worker.
    for (int i = 0; i < workers; ++i) std::thread([this, i] { loop(i + 1); }).detach();
  }

  // Runs task(p) for p in [0, parts): part 0 on the caller, the others on the workers.
  // Returns false (and runs nothing) if the pool is busy.
  bool run(int parts, const std::function<void(int)>& task) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    {
      std::lock_guard<std::mutex> lk(m_);
      task_ = &task;
      parts_ = parts;
      pending_.store(parts - 1, std::memory_order_relaxed);
      ++generation_;
    }
    cv_.notify_all();
    task(0);
    // Spin briefly (the other parts are usually about as long as ours), then sleep.
    for (int i = 0; i < 2000 && pending_.load(std::memory_order_acquire) != 0; ++i) std::this_thread::yield();
    if (pending_.load(std::memory_order_acquire) != 0) {
      std::unique_lock<std::mutex> lk(m_);
      done_cv_.wait(lk, [&] { return pending_.load(std::memory_order_acquire) == 0; });
    }
    std::lock_guard<std::mutex> lk(m_);
    task_ = nullptr;
    return true;
  }

 private:
  void loop(int index) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* task;
      int parts;
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return generation_ != seen; });
        seen = generation_;
        task = task_;
        parts = parts_;
      }
      if (task == nullptr || index >= parts) continue;
      (*task)(index);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lk(m_);
        done_cv_.notify_all();
      }
    }
  }

  std::mutex busy_;
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int)>* task_ = nullptr;
  int parts_ = 0;
  uint64_t generation_ = 0;
  std::atomic<int> pending_{0};
};

inline ThreadPool* pool() {
  static std::mutex mu;
  static ThreadPool* p = nullptr;
  static pid_t owner = 0;
  std::lock_guard<std::mutex> lk(mu);
  const pid_t me = getpid();
  if (p == nullptr || owner != me) {
    // After a fork the old pool's threads do not exist here: leak it and start a new one.
    p = new ThreadPool(num_threads() - 1);
    owner = me;
  }
  return p;
}

}  // namespace detail

// Calls fn(begin, end) on disjoint chunks of [0, n); small ranges run on the calling thread.
template <typename Fn>
void parallel_for(int64_t n, int64_t min_chunk, Fn fn) {
  const int64_t max_parts = std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk));
  const int parts = static_cast<int>(std::min<int64_t>(num_threads(), max_parts));
  if (parts <= 1) {
    fn(int64_t(0), n);
    return;
  }
  const int64_t chunk = (n + parts - 1) / parts;
  auto part = [&](int p) {
    const int64_t b = p * chunk, e = std::min(n, b + chunk);
    if (b < e) fn(b, e);
  };
  const std::function<void(int)> task = part;
  if (detail::pool()->run(parts, task)) return;
  for (int p = 0; p < parts; ++p) part(p);  // pool busy: this range runs here
}

}  // namespace hetu
