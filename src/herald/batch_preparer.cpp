#include "herald/batch_preparer.h"

#include <pthread.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <utility>

namespace hetu {
namespace herald {

BatchPreparer::BatchPreparer(const Planner& planner) : planner_(planner), thread_([this] { Run(); }) {}

BatchPreparer::~BatchPreparer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::future<PreparedBatch> BatchPreparer::Submit(std::function<std::vector<int64_t>()> gather, int64_t fields) {
  std::packaged_task<PreparedBatch()> job([this, gather = std::move(gather), fields] {
    const auto begin = std::chrono::steady_clock::now();
    const std::vector<int64_t> ids = gather();
    const int64_t n = planner_.batch_samples();
    if (static_cast<int64_t>(ids.size()) != n * fields)
      throw std::invalid_argument("Herald batch preparer: " + std::to_string(ids.size()) + " ids given, " +
                                  std::to_string(n) + " samples of " + std::to_string(fields) + " fields expected");
    PreparedBatch out = planner_.Prepare(ids.data(), fields, &scratch_);
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    return out;
  });
  std::future<PreparedBatch> out = job.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
  return out;
}

void BatchPreparer::Run() {
  // Named so that top, perf and /proc tell it from the planner's thread.
  pthread_setname_np(pthread_self(), "herald-prep");
  for (;;) {
    std::packaged_task<PreparedBatch()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

}  // namespace herald
}  // namespace hetu
