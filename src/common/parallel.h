// A blocking parallel-for over an index range, for kernels called with the GIL released.
//
// Work runs on a persistent pool of num_threads() - 1 workers plus the calling thread (spawning
// std::threads per call cost tens of microseconds per kernel, more on a loaded machine). The
// pool serves one parallel_for at a time: a call made while it is busy (another Python thread,
// or a nested parallel_for) runs its range on its own thread, so there is no deadlock. A forked
// child gets a fresh pool. Chunking is a pure function of (n, min_chunk, num_threads()), so a
// kernel's results never depend on which thread ran which chunk.
//
// Pool is the same with a thread count of its own, for work that sizes its threads apart from
// HETU_NUM_THREADS (Herald's planner: HETU_PLANNER_THREADS); its threads end with it.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
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
  // detached: the global pool's threads are detached and the pool never destroyed, so static
  // destruction and interpreter shutdown never wait on a worker. Otherwise the destructor stops
  // and joins them.
  explicit ThreadPool(int workers, bool detached = true) {
    for (int i = 0; i < workers; ++i) {
      std::thread t([this, i] { loop(i + 1); });
      if (detached) {
        t.detach();
      } else {
        threads_.push_back(std::move(t));
      }
    }
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

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
        cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
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
  bool stop_ = false;
  std::atomic<int> pending_{0};
  std::vector<std::thread> threads_;
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


// Calls fn(begin, end) on disjoint chunks of [0, n) on `threads` threads of `pool`: chunk p is
// [p * chunk, (p + 1) * chunk), parts = min(threads, n / min_chunk).
template <typename Fn>
void run_chunks(ThreadPool* pool, int threads, int64_t n, int64_t min_chunk, Fn& fn) {
  const int64_t max_parts = std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk));
  const int parts = static_cast<int>(std::min<int64_t>(threads, max_parts));
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
  if (pool->run(parts, task)) return;
  for (int p = 0; p < parts; ++p) part(p);  // pool busy: this range runs here
}

}  // namespace detail

// Calls fn(begin, end) on disjoint chunks of [0, n); small ranges run on the calling thread.
template <typename Fn>
void parallel_for(int64_t n, int64_t min_chunk, Fn fn) {
  if (num_threads() <= 1 || n < 2 * std::max<int64_t>(1, min_chunk)) {
    fn(int64_t(0), n);
    return;
  }
  detail::run_chunks(detail::pool(), num_threads(), n, min_chunk, fn);
}

// A pool of `threads` threads (the caller and threads - 1 workers) owned by its user.
class Pool {
 public:
  explicit Pool(int threads)
      : threads_(std::max(1, threads)), pool_(threads_ > 1 ? new detail::ThreadPool(threads_ - 1, false) : nullptr) {}
  int threads() const { return threads_; }

  // As hetu::parallel_for, on this pool's threads.
  template <typename Fn>
  void parallel_for(int64_t n, int64_t min_chunk, Fn fn) {
    if (!pool_ || n < 2 * std::max<int64_t>(1, min_chunk)) {
      fn(int64_t(0), n);
      return;
    }
    detail::run_chunks(pool_.get(), threads_, n, min_chunk, fn);
  }

 private:
  const int threads_;
  std::unique_ptr<detail::ThreadPool> pool_;
};

}  // namespace hetu
