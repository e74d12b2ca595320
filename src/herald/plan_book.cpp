#include "herald/plan_book.h"

#include <chrono>
#include <utility>

namespace hetu {
namespace herald {

namespace {

// Drops the entries of `m` before `first`.
template <typename Map>
void ForgetBefore(Map* m, int64_t first) {
  m->erase(m->begin(), m->lower_bound(first));
}

}  // namespace

void PlanBook::Submitted(int64_t iteration) {
  std::lock_guard<std::mutex> lock(mu_);
  next_submit_ = iteration + 1;
}

void PlanBook::Put(int64_t iteration, std::vector<int64_t> samples, bool has_finished, FinishedPlan finished) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    samples_[iteration] = std::move(samples);
    if (has_finished) {
      const int64_t done = finished.plan.iteration;
      plans_[done] = std::move(finished);
    }
    planned_ = iteration + 1;
  }
  cv_.notify_all();
}

void PlanBook::Fail(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_) error_ = std::move(error);
  }
  cv_.notify_all();
}

void PlanBook::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
}

bool PlanBook::stopped() {
  std::lock_guard<std::mutex> lock(mu_);
  return stop_;
}

template <typename Ready>
void PlanBook::Await(std::unique_lock<std::mutex>& lock, const Ready& ready, const char* what, int64_t iteration,
                     double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  bool timed_out = false;
  for (;;) {
    if (ready()) return;
    if (error_) std::rethrow_exception(error_);
    if (stop_) throw std::runtime_error("Herald planning stopped before the " + std::string(what) +
                                        " of iteration " + std::to_string(iteration));
    if (timed_out)
      throw PlanTimeout(source_ + " produced no " + std::string(what) + " for iteration " + std::to_string(iteration) +
                        " in " + std::to_string(static_cast<int64_t>(timeout_s)) + " s");
    timed_out = cv_.wait_until(lock, deadline) == std::cv_status::timeout;
  }
}

bool PlanBook::TakeSamples(int64_t iteration, std::vector<int64_t>* out) {
  if (planned_ <= iteration) return false;
  const auto found = samples_.find(iteration);
  if (found == samples_.end())
    throw std::logic_error("Herald planning: the allocation of iteration " + std::to_string(iteration) +
                           " is no longer kept");
  // Plans that nobody takes (the allocation-only ablation) must not pile up.
  ForgetBefore(&plans_, iteration - history_);
  *out = found->second;
  return true;
}

bool PlanBook::TakePlan(int64_t iteration, FinishedPlan* out) {
  if (next_submit_ >= 0 && iteration + 1 >= next_submit_)
    throw std::logic_error("Herald planning: the plan of iteration " + std::to_string(iteration) + " needs iteration " +
                           std::to_string(iteration + 1) + ", which was not submitted");
  if (planned_ <= iteration + 1) return false;
  const auto found = plans_.find(iteration);
  if (found == plans_.end())
    throw std::logic_error("Herald planning: the plan of iteration " + std::to_string(iteration) +
                           " is no longer kept");
  *out = found->second;
  ForgetBefore(&plans_, iteration - 2);
  ForgetBefore(&samples_, iteration - history_);
  return true;
}

bool PlanBook::TrySamples(int64_t iteration, std::vector<int64_t>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  return TakeSamples(iteration, out);
}

bool PlanBook::TryPlan(int64_t iteration, FinishedPlan* out) {
  std::lock_guard<std::mutex> lock(mu_);
  return TakePlan(iteration, out);
}

std::vector<int64_t> PlanBook::Samples(int64_t iteration, double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  if (next_submit_ >= 0 && iteration >= next_submit_)
    throw std::logic_error("Herald planning: samples of iteration " + std::to_string(iteration) +
                           " asked for before it was submitted");
  std::vector<int64_t> out;
  Await(lock, [&] { return TakeSamples(iteration, &out); }, "allocation", iteration, timeout_s);
  return out;
}

FinishedPlan PlanBook::Plan(int64_t iteration, double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  FinishedPlan out;
  Await(lock, [&] { return TakePlan(iteration, &out); }, "plan", iteration, timeout_s);
  return out;
}

}  // namespace herald
}  // namespace hetu
