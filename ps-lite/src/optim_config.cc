#include "optim_config.h"

#include <stdexcept>
#include <string>

namespace ps {

namespace {

// pb::OptimConfig's field of the hyperparameter's name (meta.proto names them alike).
const google::protobuf::FieldDescriptor* ProtoField(const OptimField& f) {
  const auto* field = pb::OptimConfig::descriptor()->FindFieldByName(f.name);
  if (!field) throw std::logic_error(std::string("pb::OptimConfig has no field ") + f.name);
  return field;
}

}  // namespace

const OptimField* FindOptimField(const std::string& name) {
  for (const OptimField& f : kOptimFields)
    if (name == f.name) return &f;
  return nullptr;
}

pb::OptimConfig OptimToProto(const hetu::optim::Config& c) {
  pb::OptimConfig p;
  p.set_kind(c.kind);
  for (const OptimField& f : kOptimFields) p.GetReflection()->SetFloat(&p, ProtoField(f), c.*f.value);
  return p;
}

hetu::optim::Config OptimFromProto(const pb::OptimConfig& p) {
  hetu::optim::Config c;
  c.kind = p.kind();
  for (const OptimField& f : kOptimFields) c.*f.value = p.GetReflection()->GetFloat(p, ProtoField(f));
  return c;
}

}  // namespace ps
