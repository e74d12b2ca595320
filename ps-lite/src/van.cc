#include "van.h"

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
  const char* built = "zmq, ucx";
#else
  const char* built = "zmq (the ucx van needs libucx-dev when hetu is built)";
#endif
  throw std::invalid_argument("DMLC_PS_VAN_TYPE='" + type + "' is not supported; this build has: " + built);
}

}  // namespace ps
