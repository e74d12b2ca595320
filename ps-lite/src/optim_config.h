// The optimizer's config as it travels to the servers (pb::OptimConfig, in a table's TableSpec)
// and as it steps rows (hetu::optim::Config): the one place that maps one to the other, by the
// hyperparameters' names in the registry (hetu::optim::kHyperparameters).
#pragma once
#include <string>

#include "common/optim_rules.h"
#include "meta.pb.h"

namespace ps {

// The registry's hyperparameter of that name; null if there is none.
const hetu::optim::Hyperparameter* FindHyperparameter(const std::string& name);

pb::OptimConfig OptimToProto(const hetu::optim::Config& c);
// The rows' storage type is the table's (TableSpec.storage), not the optimizer's: left as is.
// A setting the registry does not know is an error naming it.
hetu::optim::Config OptimFromProto(const pb::OptimConfig& p);

}  // namespace ps
