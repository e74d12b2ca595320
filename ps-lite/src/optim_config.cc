#include "optim_config.h"

#include <stdexcept>

namespace ps {

const hetu::optim::Hyperparameter* FindHyperparameter(const std::string& name) {
  for (const auto& h : hetu::optim::kHyperparameters)
    if (name == h.name) return &h;
  return nullptr;
}

pb::OptimConfig OptimToProto(const hetu::optim::Config& c) {
  pb::OptimConfig p;
  p.set_kind(c.kind);
  for (const auto& h : hetu::optim::kHyperparameters) (*p.mutable_settings())[h.name] = c.*h.member;
  return p;
}

hetu::optim::Config OptimFromProto(const pb::OptimConfig& p) {
  hetu::optim::Config c;
  c.kind = p.kind();
  for (const auto& [name, value] : p.settings()) {
    const auto* h = FindHyperparameter(name);
    if (!h) throw std::invalid_argument("unknown optimizer setting '" + name + "'");
    c.*h->member = value;
  }
  return c;
}

}  // namespace ps
