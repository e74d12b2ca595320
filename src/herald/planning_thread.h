// Herald's planner on a thread of its own, some iterations ahead of training (DESIGN.md
// section 7). The training side hands it the sample positions of each global batch (Submit) and
// takes this worker's samples and finished plans (Samples, Plan). The thread gathers each batch's
// ids from the id table and plans it without ever entering Python, so planning costs the
// training thread no GIL hand-offs: on a busy machine each hand-off waits for the OS to run the
// other thread, and a Python planning thread cost the training thread about 0.8 ms per step.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>
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
  double planner_seconds = 0;  // the planner's time for the call that allocated this iteration
};

class PlanningThread {
 public:
  // ids: [num_samples, fields], every sample's row ids; it must outlive this object. history:
  // how many iterations back allocations stay available (data loaders read a few behind).
  PlanningThread(Planner planner, const int64_t* ids, int64_t num_samples, int64_t fields, int64_t history);
  ~PlanningThread();
  PlanningThread(const PlanningThread&) = delete;
  PlanningThread& operator=(const PlanningThread&) = delete;

  // Queues global batch `iteration`: its samples' positions in the id table. Iterations come in
  // order 0, 1, 2, ...
  void Submit(int64_t iteration, std::vector<int64_t> samples);
  // This worker's samples of `iteration`, as positions within its global batch.
  std::vector<int64_t> Samples(int64_t iteration, double timeout_s);
  // The final plan of `iteration`. A copy: every embedding table of the model follows it.
  FinishedPlan Plan(int64_t iteration, double timeout_s);
  // Samples and Plan without waiting: false if not ready yet (the caller may then wait without
  // holding anything the planner needs, e.g. the GIL).
  bool TrySamples(int64_t iteration, std::vector<int64_t>* out);
  bool TryPlan(int64_t iteration, FinishedPlan* out);
  // Stops after the iteration being planned; waits that are not yet answered then fail.
  void Stop();

 private:
  void Run();
  void PlanOne(int64_t iteration, const std::vector<int64_t>& samples);
  // With mu_ held: the answer if ready (pruning what is no longer needed), else false.
  bool TakeSamples(int64_t iteration, std::vector<int64_t>* out);
  bool TakePlan(int64_t iteration, FinishedPlan* out);
  // Waits (lock held) until ready() (which takes the answer) or an error, a stop or the timeout.
  template <typename Ready>
  void Await(std::unique_lock<std::mutex>& lock, const Ready& ready, const char* what, int64_t iteration,
             double timeout_s);

  Planner planner_;
  const int64_t* ids_;
  const int64_t num_samples_, fields_, history_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<int64_t, std::vector<int64_t>>> inbox_;
  int64_t next_submit_ = 0;
  int64_t planned_ = 0;  // iterations allocated so far
  std::map<int64_t, std::vector<int64_t>> samples_;
  std::map<int64_t, FinishedPlan> plans_;
  double unfinished_seconds_ = 0;  // planner time of the iteration whose plan is not final yet
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;  // last: it starts once everything above is set
};

}  // namespace herald
}  // namespace hetu
