// Herald's planner on a thread of its own, some iterations ahead of training (docs/design.md
// section 7). The training side hands it the sample positions of each global batch (Submit) and
// takes this worker's samples and finished plans (Samples, Plan). A second thread (BatchPreparer)
// gathers each batch's ids from the id table and prepares it as it is submitted, while the
// planner plans the batches before it. Neither enters Python, so planning costs the
// training thread no GIL hand-offs: on a busy machine each hand-off waits for the OS to run the
// other thread, and a Python planning thread cost the training thread about 0.8 ms per step.
//
// A host's planner (plan_link.h) plans for every worker of the host: the first of the planner's
// ranks is this worker's, and each of the others' samples and plans go to that worker's socket.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "herald/batch_preparer.h"
#include "herald/plan_book.h"
#include "herald/plan_link.h"
#include "herald/planner.h"

namespace hetu {
namespace herald {

class PlanningThread {
 public:
  // ids: [num_samples, fields], every sample's row ids (null: none, every batch comes with its
  // ids, SubmitIds); it must outlive this object. history:
  // how many iterations back allocations stay available (data loaders read a few behind).
  // followers: one connected socket per planner rank after the first (a host's planner), in
  // order; a send that makes no progress for send_timeout_s fails the planner.
  PlanningThread(Planner planner, const int64_t* ids, int64_t num_samples, int64_t fields, int64_t history,
                 std::vector<Socket> followers = {}, double send_timeout_s = 600);
  ~PlanningThread();
  PlanningThread(const PlanningThread&) = delete;
  PlanningThread& operator=(const PlanningThread&) = delete;

  // Queues global batch `iteration`: its samples' positions in the id table. Iterations come in
  // order 0, 1, 2, ...
  void Submit(int64_t iteration, std::vector<int64_t> samples);
  // Queues global batch `iteration` by its ids: [samples, fields] row-major, -1 naming no row
  // (a bag's padding, a dynamic table's key without a row), and `forget`: the rows whose cached
  // copies every worker drops before the batch is planned (Planner::Forget; a dynamic table's
  // slots re-assigned at this iteration). Iterations in order, as for Submit.
  void SubmitIds(int64_t iteration, std::vector<int64_t> ids, int64_t fields, std::vector<int64_t> forget);
  // This worker's answers (PlanBook).
  PlanBook& book() { return book_; }
  // Stops after the iteration being planned; waits that are not yet answered then fail.
  void Stop();

 private:
  // A submitted iteration: its batch, prepared (or being prepared) by preparer_, and the rows to
  // forget before planning it.
  struct Job {
    int64_t iteration = -1;
    std::future<PreparedBatch> batch;
    std::vector<int64_t> forget;
  };
  // Queues `iteration`, whose ids `gather` returns on the preparer's thread.
  void Queue(int64_t iteration, std::function<std::vector<int64_t>()> gather, int64_t fields,
             std::vector<int64_t> forget);
  void Run();
  // Batch `iteration`'s ids from the id table (on the preparer's thread).
  std::vector<int64_t> Gather(int64_t iteration, const std::vector<int64_t>& samples) const;
  void PlanOne(Job job);

  Planner planner_;
  const int64_t* ids_;
  const int64_t num_samples_, fields_;
  std::vector<Socket> followers_;
  const double send_timeout_s_;
  PlanBook book_;

  std::mutex mu_;  // guards the inbox
  std::condition_variable cv_;
  std::deque<Job> inbox_;  // submitted, not yet planned
  int64_t next_submit_ = 0;
  double unfinished_seconds_ = 0;  // planner time of the iteration whose plan is not final yet
  std::atomic<bool> stop_{false};
  BatchPreparer preparer_{planner_};
  std::thread thread_;  // last: it starts once everything above is set
};

}  // namespace herald
}  // namespace hetu
