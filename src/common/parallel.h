// A blocking parallel-for over an index range, for kernels called with the GIL released.
//
// Work runs on a persistent pool of num_threads() - 1 workers plus the calling thread (spawning
// std::threads per call cost tens of microseconds per kernel, more on a loaded machine). The
// pool serves one parallel_for at a time: a call made while it is busy (another Python thread,
// or a nested parallel_for) runs its range on its own thread, so there is no deadlock. A forked
// child gets a fresh pool. Chunking is a pure function of (n, min_chunk, num_threads()), so a
// kernel's results never depend on which thread ran which chunk.
//
// Pool is a pool of its own for work that sizes its threads apart from HETU_NUM_THREADS (Herald's
// planner: HETU_PLANNER_THREADS); its threads end with it.
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

// Parts of [0, n) worked on apart: part p of `parts` is [PartBegin(n, p, parts), PartBegin(n, p + 1, parts)).
inline int64_t PartBegin(int64_t n, int64_t p, int64_t parts) { return n * p / parts; }

inline int num_threads() {
  static const int n = [] {
    const char* env = std::getenv("HETU_NUM_THREADS");
    int v = env ? std::atoi(env) : static_cast<int>(std::thread::hardware_concurrency());
    return std::max(1, v);
  }();
  return n;
}

// The process's one object of a call site, made by make() (a new T*) at the first call. After a
// fork the old one's threads do not exist in the child: it is leaked and a new one made. Never
// destroyed, so no exit waits on its threads. Each call site (each make's type) has its own.
template <typename T, typename Make>
T* per_process(Make make) {
  static std::mutex mu;
  static T* object = nullptr;
  static pid_t owner = 0;
  std::lock_guard<std::mutex> lock(mu);
  const pid_t me = getpid();
  if (object == nullptr || owner != me) {
    object = make();
    owner = me;
  }
  return object;
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
  return per_process<ThreadPool>([] { return new ThreadPool(num_threads() - 1); });
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

// A pool of `threads` threads (the caller and threads - 1 workers) owned by its user, for series
// of short parallel steps on machines that may be busy. A step's range is cut into chunks, a pure
// function of (n, min_chunk, threads), and the threads take chunks one at a time as they come:
// a thread that the OS does not run for a while holds up no one (on a busy machine a step with a
// chunk per thread waits for the slowest), so callers must write each index's results to places
// of their own (they never depend on which thread ran which chunk). Idle workers watch for the
// next step for a while (half a millisecond or so), then sleep (at once after Rest()). A step
// takes no lock unless a worker sleeps: a few microseconds where a mutex handed from worker to
// worker took 7 at 8 threads and 20 at 16. One step at a time: a step started while one runs
// (another thread, or a nested call) runs all its chunks on its own thread.
class Pool {
 public:
  explicit Pool(int threads) : threads_(std::max(1, threads)) {
    for (int i = 1; i < threads_; ++i) workers_.emplace_back([this] { Loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_.store(true);
      generation_.fetch_add(1);
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  int threads() const { return threads_; }

  // Idle workers sleep from now until the next step instead of watching for it (the user's
  // series of steps is over for a while).
  void Rest() { resting_.store(true, std::memory_order_release); }

  // Calls fn(begin, end) on disjoint chunks of [0, n): up to 4 per thread, none under min_chunk.
  template <typename Fn>
  void parallel_for(int64_t n, int64_t min_chunk, Fn fn) {
    const int64_t most = n / std::max<int64_t>(1, min_chunk);
    if (threads_ <= 1 || most < 2) {
      fn(int64_t(0), n);
      return;
    }
    const int64_t chunks = std::min<int64_t>(most, 4 * static_cast<int64_t>(threads_));
    const int64_t size = (n + chunks - 1) / chunks;
    std::atomic<int64_t> next{0};
    const std::function<void()> work = [&] {
      for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < chunks;
           c = next.fetch_add(1, std::memory_order_relaxed)) {
        const int64_t b = c * size, e = std::min(n, b + size);
        if (b < e) fn(b, e);
      }
    };
    Run(work);
  }

 private:
  static constexpr int kPause = 64;   // checks a spinning thread makes with the CPU's pause hint
  static constexpr int kSpin = 1000;  // then yields, about half a millisecond on an idle machine

  static void Relax(int i) {
    if (i < kPause) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    } else {
      std::this_thread::yield();  // a busy machine's other threads run
    }
  }

  // Publishes the step (task_, then a new generation), works on it, then closes it to latecomers
  // (task_ null) and waits for the workers inside. A worker counts itself in (active_) before it
  // reads task_, and the caller nulls task_ before it reads active_, all sequentially consistent:
  // a worker that finds the task is waited for, and one that comes later finds none.
  void Run(const std::function<void()>& work) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) {
      work();
      return;
    }
    resting_.store(false, std::memory_order_relaxed);
    task_.store(&work);
    generation_.fetch_add(1);
    if (sleeping_.load() > 0) {
      std::lock_guard<std::mutex> lk(m_);  // a worker between its check and its wait holds m_
      cv_.notify_all();
    }
    work();
    task_.store(nullptr);
    for (int i = 0; active_.load() != 0; ++i) Relax(i);
  }

  void Loop() {
    uint64_t seen = 0;  // not the generation now: a pool ended before this thread ran has moved it on
    for (;;) {
      for (int i = 0; i < kPause + kSpin && generation_.load(std::memory_order_acquire) == seen &&
                      !resting_.load(std::memory_order_acquire);
           ++i)
        Relax(i);
      if (generation_.load() == seen) {
        std::unique_lock<std::mutex> lk(m_);
        sleeping_.fetch_add(1);
        cv_.wait(lk, [&] { return stop_.load() || generation_.load() != seen; });
        sleeping_.fetch_sub(1);
      }
      if (stop_.load()) return;
      seen = generation_.load();
      active_.fetch_add(1);
      if (const std::function<void()>* task = task_.load()) (*task)();
      active_.fetch_sub(1);
    }
  }

  const int threads_;
  std::mutex busy_, m_;
  std::condition_variable cv_;
  std::atomic<const std::function<void()>*> task_{nullptr};  // the step running, null between steps
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> active_{0};    // workers inside a step, or about to look for one
  std::atomic<int> sleeping_{0};  // workers asleep on cv_, or about to be
  std::atomic<bool> resting_{false};
  std::atomic<bool> stop_{false};
  std::vector<std::thread> workers_;  // last: they start once everything above is set
};

}  // namespace hetu
