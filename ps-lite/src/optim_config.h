// The optimizer's config as it travels to the servers (pb::OptimConfig, in a table's TableSpec)
// and as it steps rows (hetu::optim::Config): the one place that maps one to the other.
#pragma once
#include "common/optim_rules.h"
#include "meta.pb.h"

namespace ps {

// The hyperparameters of hetu::optim::Config by name: the keys of the optimizer dict that
// hetu._ps.Table.init takes, and the names of pb::OptimConfig's fields.
struct OptimField {
  const char* name;
  float hetu::optim::Config::*value;
};
inline constexpr OptimField kOptimFields[] = {
    {"momentum", &hetu::optim::Config::momentum}, {"beta1", &hetu::optim::Config::beta1},
    {"beta2", &hetu::optim::Config::beta2},       {"eps", &hetu::optim::Config::eps},
    {"l2reg", &hetu::optim::Config::l2reg},       {"weight_decay", &hetu::optim::Config::weight_decay},
};

// The field of that name; null if the optimizer has none.
const OptimField* FindOptimField(const std::string& name);

pb::OptimConfig OptimToProto(const hetu::optim::Config& c);
// The rows' storage type is the table's (TableSpec.storage), not the optimizer's: left as is.
hetu::optim::Config OptimFromProto(const pb::OptimConfig& p);

}  // namespace ps
