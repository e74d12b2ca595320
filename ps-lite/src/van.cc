#include "van.h"

#include <google/protobuf/stubs/common.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>

#include "auth.h"
#include "logging.h"

namespace ps {
namespace {

#if GOOGLE_PROTOBUF_VERSION < 4022000  // later versions log through abseil
void ProtobufLog(google::protobuf::LogLevel level, const char*, int, const std::string& message) {
  static auth::RateLimit limit;
  long held = 0;
  if (level >= google::protobuf::LOGLEVEL_FATAL || limit.Allow(&held))
    LogLine() << "protobuf: " << message << (held ? " (and " + std::to_string(held) + " more not shown)" : "");
}
#endif

void QuietProtobuf() {
#if GOOGLE_PROTOBUF_VERSION < 4022000
  static std::once_flag once;
  std::call_once(once, [] { google::protobuf::SetLogHandler(&ProtobufLog); });
#endif
}

}  // namespace

std::vector<std::string> Van::Types() {
#ifdef PS_WITH_UCX
  return {"zmq", "ucx"};
#else
  return {"zmq"};
#endif
}

std::unique_ptr<Van> Van::Create(const std::string& type) {
  QuietProtobuf();
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
