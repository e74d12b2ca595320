#include "herald/planning_thread.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <utility>

namespace hetu {
namespace herald {

PlanningThread::PlanningThread(Planner planner, const int64_t* ids, int64_t num_samples, int64_t fields,
                               int64_t history, std::vector<Socket> followers, double send_timeout_s)
    : planner_(std::move(planner)), ids_(ids), num_samples_(num_samples), fields_(fields),
      followers_(std::move(followers)), send_timeout_s_(send_timeout_s),
      book_(history, "Herald scheduler", true) {
  if (followers_.size() + 1 != planner_.ranks().size())
    throw std::invalid_argument("Herald planning thread: " + std::to_string(followers_.size()) +
                                " follower sockets for a planner of " + std::to_string(planner_.ranks().size()) +
                                " ranks (one for each rank after the first)");
  thread_ = std::thread([this] { Run(); });
}

PlanningThread::~PlanningThread() { Stop(); }

void PlanningThread::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  book_.Stop();
  if (thread_.joinable()) thread_.join();
  followers_.clear();  // the host's other workers see the end of their plan streams
}

void PlanningThread::Submit(int64_t iteration, std::vector<int64_t> samples) {
  if (!ids_)
    throw std::invalid_argument("Herald planning thread: no id table to gather iteration " + std::to_string(iteration) +
                                " from: submit its ids");
  Queue(iteration, [this, iteration, samples = std::move(samples)] { return Gather(iteration, samples); }, fields_, {});
}

void PlanningThread::SubmitIds(int64_t iteration, std::vector<int64_t> ids, int64_t fields,
                               std::vector<int64_t> forget) {
  if (fields < 1)
    throw std::invalid_argument("Herald planning thread: iteration " + std::to_string(iteration) + " submitted with " +
                                std::to_string(fields) + " fields per sample");
  Queue(iteration, [ids = std::move(ids)]() mutable { return std::move(ids); }, fields, std::move(forget));
}

void PlanningThread::Queue(int64_t iteration, std::function<std::vector<int64_t>()> gather, int64_t fields,
                           std::vector<int64_t> forget) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (iteration != next_submit_)
      throw std::invalid_argument("Herald planning thread: iteration " + std::to_string(iteration) +
                                  " submitted, " + std::to_string(next_submit_) + " expected");
    ++next_submit_;
    inbox_.push_back(Job{iteration, preparer_.Submit(std::move(gather), fields), std::move(forget)});
  }
  book_.Submitted(iteration);
  cv_.notify_all();
}

void PlanningThread::Run() {
  // Named so that top, perf and /proc tell the planner's CPU from the training thread's.
  pthread_setname_np(pthread_self(), "herald-plan");
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !inbox_.empty(); });
      if (stop_) return;
      job = std::move(inbox_.front());
      inbox_.pop_front();
    }
    try {
      PlanOne(std::move(job));
    } catch (...) {
      book_.Fail(std::current_exception());
      return;
    }
  }
}

std::vector<int64_t> PlanningThread::Gather(int64_t iteration, const std::vector<int64_t>& samples) const {
  const int64_t n = static_cast<int64_t>(samples.size());
  std::vector<int64_t> ids(static_cast<size_t>(n * fields_));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = samples[i];
    if (s < 0 || s >= num_samples_)
      throw std::out_of_range("Herald planner: sample " + std::to_string(s) + " of iteration " +
                              std::to_string(iteration) + " outside the " + std::to_string(num_samples_) +
                              " samples of the data");
    std::copy(ids_ + s * fields_, ids_ + (s + 1) * fields_, ids.data() + i * fields_);
  }
  return ids;
}

void PlanningThread::PlanOne(Job job) {
  PreparedBatch batch = job.batch.get();
  const int64_t iteration = job.iteration;
  const auto start = std::chrono::steady_clock::now();
  const double prepared_seconds = batch.seconds;
  planner_.Forget(job.forget.data(), static_cast<int64_t>(job.forget.size()));
  Advanced r = planner_.Advance(std::move(batch), iteration);
  // The planner's time on both of its threads.
  const double seconds =
      prepared_seconds + std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double finished_seconds = unfinished_seconds_;
  unfinished_seconds_ = seconds;
  // The other workers of the host first: this worker's training takes its own answers at once.
  for (size_t i = 1; i < r.samples.size(); ++i)
    SendAdvanced(followers_[i - 1], planner_.ranks()[i], iteration, r.samples[i], r.has_finished,
                 FinishedPlan{r.has_finished ? std::move(r.finished[i]) : WorkerPlan{}, finished_seconds},
                 send_timeout_s_, stop_);
  book_.Put(iteration, std::move(r.samples[0]), r.has_finished,
            FinishedPlan{r.has_finished ? std::move(r.finished[0]) : WorkerPlan{}, finished_seconds});
}

}  // namespace herald
}  // namespace hetu
