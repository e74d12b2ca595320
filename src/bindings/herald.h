// hetu._C's Herald scheduler, one bind_* per bound class (or group of module functions), in the
// files herald*.cpp, and what they share: a plan as Python sees it.
#pragma once
#include "bindings/bindings.h"
#include "herald/planner.h"

namespace hetu {
namespace bindings {

// A worker's plan as the fields of hetu.herald.Plan, in order:
// [iteration, samples, keys, hit, pull, owner, invalidate, writeback].
// (herald_planner.cpp)
py::list plan_fields(const hetu::herald::WorkerPlan& p);

// herald.cpp: a worker's cache under the plan, and the allocators as functions.
void bind_plan_cache(py::module_& m);
void bind_allocators(py::module_& m);
// herald_planner.cpp: the planner and the batches prepared for it.
void bind_planner(py::module_& m);
void bind_prepared_batch(py::module_& m);
void bind_batch_preparer(py::module_& m);
// herald_plan_link.cpp: the planning thread and the link that carries a host's plans.
void bind_plan_timeout(py::module_& m);
void bind_plan_followers(py::module_& m);
void bind_plan_listener(py::module_& m);
void bind_planning_thread(py::module_& m);
void bind_plan_receiver(py::module_& m);

}  // namespace bindings
}  // namespace hetu
