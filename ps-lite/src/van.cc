#include "van.h"

#include <cstdlib>
#include <stdexcept>

namespace ps {

std::vector<std::string> Van::Types() {
#ifdef PS_WITH_UCX
  return {"zmq", "ucx"};
#else
  return {"zmq"};
#endif
}

std::unique_ptr<Van> Van::Create(const std::string& type) {
  if (type.empty() || type == "zmq") return MakeZmqVan();
#ifdef PS_WITH_UCX
  if (type == "ucx") return MakeUcxVan();
#endif
  std::string built;
  for (const std::string& t : Types()) built += (built.empty() ? "" : ", ") + t;
#ifndef PS_WITH_UCX
  built += " (the ucx van needs libucx-dev when hetu is built)";
#endif
  throw std::invalid_argument("DMLC_PS_VAN_TYPE='" + type + "' is not supported; this build has: " + built);
}

int64_t MaxMessageBytes() {
  const char* cap = std::getenv("PS_MAX_FRAME_BYTES");
  if (cap && std::atoll(cap) > 0) return std::atoll(cap);
  // Servers receive pushes of one batch's rows and the scheduler control messages only; a
  // worker receives whole chunks of tables.
  const char* role = std::getenv("DMLC_ROLE");
  return role && std::string(role) != "worker" ? (int64_t(1) << 30) : (int64_t(4) << 30);
}

}  // namespace ps
