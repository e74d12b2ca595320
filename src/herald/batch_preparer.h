// Herald's plans in a pipeline: the batch-only part of a plan (Planner::Prepare: the distinct ids,
// each sample's rows, the rows the allocation scores) made on a thread of its own, while the
// planner plans the batches before it. A plan's latency is unchanged; the planner's thread is
// spared that part, a fifth to a quarter of a plan on one thread.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "herald/planner.h"

namespace hetu {
namespace herald {

class BatchPreparer {
 public:
  // Reads only `planner`'s settings, which must outlive this object.
  explicit BatchPreparer(const Planner& planner);
  // Jobs not yet started are dropped (their futures then fail).
  ~BatchPreparer();
  BatchPreparer(const BatchPreparer&) = delete;
  BatchPreparer& operator=(const BatchPreparer&) = delete;

  // Queues a batch: `gather`, on the preparer's thread, returns its ids [samples, fields],
  // row-major. Batches are prepared in the order queued; an exception from `gather` or Prepare
  // comes out of the future.
  std::future<PreparedBatch> Submit(std::function<std::vector<int64_t>()> gather, int64_t fields);

 private:
  void Run();

  const Planner& planner_;
  PrepareScratch scratch_;  // the thread's
  std::mutex mu_;           // guards jobs_ and stop_
  std::condition_variable cv_;
  std::deque<std::packaged_task<PreparedBatch()>> jobs_;
  bool stop_ = false;
  std::thread thread_;  // last: it starts once everything above is set
};

}  // namespace herald
}  // namespace hetu
