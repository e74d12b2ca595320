#include "herald/planning_thread.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <string>

namespace hetu {
namespace herald {

namespace {

// Drops the entries of `m` before `first`.
template <typename Map>
void ForgetBefore(Map* m, int64_t first) {
  m->erase(m->begin(), m->lower_bound(first));
}

}  // namespace

PlanningThread::PlanningThread(Planner planner, const int64_t* ids, int64_t num_samples, int64_t fields,
                               int64_t history)
    : planner_(std::move(planner)), ids_(ids), num_samples_(num_samples), fields_(fields), history_(history),
      thread_([this] { Run(); }) {}

PlanningThread::~PlanningThread() { Stop(); }

void PlanningThread::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void PlanningThread::Submit(int64_t iteration, std::vector<int64_t> samples) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (iteration != next_submit_)
      throw std::invalid_argument("Herald planning thread: iteration " + std::to_string(iteration) +
                                  " submitted, " + std::to_string(next_submit_) + " expected");
    ++next_submit_;
    inbox_.emplace_back(iteration, std::move(samples));
  }
  cv_.notify_all();
}

void PlanningThread::Run() {
  // Named so that top, perf and /proc tell the planner's CPU from the training thread's.
  pthread_setname_np(pthread_self(), "herald-plan");
  for (;;) {
    std::pair<int64_t, std::vector<int64_t>> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !inbox_.empty(); });
      if (stop_) return;
      job = std::move(inbox_.front());
      inbox_.pop_front();
    }
    try {
      PlanOne(job.first, job.second);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
      cv_.notify_all();
      return;
    }
  }
}

void PlanningThread::PlanOne(int64_t iteration, const std::vector<int64_t>& samples) {
  const auto start = std::chrono::steady_clock::now();
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
  Advanced r = planner_.Advance(ids.data(), fields_, iteration);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  {
    std::lock_guard<std::mutex> lock(mu_);
    samples_[iteration] = std::move(r.samples);
    if (r.has_finished) plans_[r.finished.iteration] = FinishedPlan{std::move(r.finished), unfinished_seconds_};
    unfinished_seconds_ = seconds;
    planned_ = iteration + 1;
  }
  cv_.notify_all();
}

template <typename Ready>
void PlanningThread::Await(std::unique_lock<std::mutex>& lock, const Ready& ready, const char* what,
                           int64_t iteration, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  bool timed_out = false;
  for (;;) {
    if (ready()) return;
    if (error_) std::rethrow_exception(error_);
    if (stop_) throw std::runtime_error("Herald planning thread stopped before the " + std::string(what) +
                                        " of iteration " + std::to_string(iteration));
    if (timed_out)
      throw PlanTimeout("Herald scheduler produced no " + std::string(what) + " for iteration " +
                        std::to_string(iteration) + " in " + std::to_string(static_cast<int64_t>(timeout_s)) + " s");
    timed_out = cv_.wait_until(lock, deadline) == std::cv_status::timeout;
  }
}

bool PlanningThread::TakeSamples(int64_t iteration, std::vector<int64_t>* out) {
  if (planned_ <= iteration) return false;
  const auto found = samples_.find(iteration);
  if (found == samples_.end())
    throw std::logic_error("Herald planning thread: the allocation of iteration " + std::to_string(iteration) +
                           " is no longer kept");
  // Plans that nobody takes (the allocation-only ablation) must not pile up.
  ForgetBefore(&plans_, iteration - history_);
  *out = found->second;
  return true;
}

bool PlanningThread::TakePlan(int64_t iteration, FinishedPlan* out) {
  if (iteration + 1 >= next_submit_)
    throw std::logic_error("Herald planning thread: the plan of iteration " + std::to_string(iteration) +
                           " needs iteration " + std::to_string(iteration + 1) + ", which was not submitted");
  if (planned_ <= iteration + 1) return false;
  const auto found = plans_.find(iteration);
  if (found == plans_.end())
    throw std::logic_error("Herald planning thread: the plan of iteration " + std::to_string(iteration) +
                           " is no longer kept");
  *out = found->second;
  ForgetBefore(&plans_, iteration - 2);
  ForgetBefore(&samples_, iteration - history_);
  return true;
}

bool PlanningThread::TrySamples(int64_t iteration, std::vector<int64_t>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  return TakeSamples(iteration, out);
}

bool PlanningThread::TryPlan(int64_t iteration, FinishedPlan* out) {
  std::lock_guard<std::mutex> lock(mu_);
  return TakePlan(iteration, out);
}

std::vector<int64_t> PlanningThread::Samples(int64_t iteration, double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  if (iteration >= next_submit_)
    throw std::logic_error("Herald planning thread: samples of iteration " + std::to_string(iteration) +
                           " asked for before it was submitted");
  std::vector<int64_t> out;
  Await(lock, [&] { return TakeSamples(iteration, &out); }, "allocation", iteration, timeout_s);
  return out;
}

FinishedPlan PlanningThread::Plan(int64_t iteration, double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  FinishedPlan out;
  Await(lock, [&] { return TakePlan(iteration, &out); }, "plan", iteration, timeout_s);
  return out;
}

}  // namespace herald
}  // namespace hetu
