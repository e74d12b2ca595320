// Where one worker's allocations and finished plans wait to be taken (docs/design.md section 7): the
// planning thread of its own planner, or of its host's planner (plan_link.h), puts them here as
// iterations are planned; the training and loader threads take them, waiting with a timeout.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "herald/planner.h"

namespace hetu {
namespace herald {

// A wait for an allocation or a plan ran past its timeout.
class PlanTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct FinishedPlan {
  WorkerPlan plan;
  double planner_seconds = 0;  // the planner's time for the call that allocated this iteration, with its
                               // batch's preparation (BatchPreparer, on a thread of its own)
};

class PlanBook {
 public:
  // history: how many iterations back allocations stay available (data loaders read a few
  // behind). source: who plans, for the timeout's message. submissions: whether the planner is
  // fed by this worker (Submitted), so that asking for what was never submitted is an error; a
  // host's other workers take what its first worker's planner sends.
  PlanBook(int64_t history, std::string source, bool submissions)
      : history_(history), source_(std::move(source)), next_submit_(submissions ? 0 : -1) {}

  // The planner's side. Submitted: global batch `iteration` was handed to the planner.
  void Submitted(int64_t iteration);
  // Iteration `iteration` allocated: its samples, and the now final plan of iteration - 1.
  void Put(int64_t iteration, std::vector<int64_t> samples, bool has_finished, FinishedPlan finished);
  // The planner failed (waits rethrow it) or stopped (waits not yet answered fail).
  void Fail(std::exception_ptr error);
  void Stop();
  bool stopped();

  // The training side. Samples: this worker's samples of `iteration` (positions within its
  // global batch). Plan: the final plan of `iteration`, a copy (every table follows it). Try*:
  // without waiting, false if not ready yet (the caller may then wait without holding anything
  // the planner needs, e.g. the GIL).
  std::vector<int64_t> Samples(int64_t iteration, double timeout_s);
  FinishedPlan Plan(int64_t iteration, double timeout_s);
  bool TrySamples(int64_t iteration, std::vector<int64_t>* out);
  bool TryPlan(int64_t iteration, FinishedPlan* out);

 private:
  // With mu_ held: the answer if ready (pruning what is no longer needed), else false.
  bool TakeSamples(int64_t iteration, std::vector<int64_t>* out);
  bool TakePlan(int64_t iteration, FinishedPlan* out);
  // Waits (lock held) until ready() (which takes the answer) or an error, a stop or the timeout.
  template <typename Ready>
  void Await(std::unique_lock<std::mutex>& lock, const Ready& ready, const char* what, int64_t iteration,
             double timeout_s);

  const int64_t history_;
  const std::string source_;
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t next_submit_;  // -1: submissions are not tracked
  int64_t planned_ = 0;       // iterations allocated so far
  std::map<int64_t, std::vector<int64_t>> samples_;
  std::map<int64_t, FinishedPlan> plans_;
  std::exception_ptr error_;
  bool stop_ = false;
};

}  // namespace herald
}  // namespace hetu
