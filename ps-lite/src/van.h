// Van: the transport. One receiving endpoint per node, one outgoing channel per peer id.
// Messages from one sender to one receiver arrive in send order. The interface is kept to
// what both implementations provide (bind, connect, send, blocking receive, stop): the ZMQ van
// (zmq_van.cc, TCP) and the UCX van (ucx_van.cc: RDMA where the host has it, shared memory or
// TCP elsewhere), picked by Van::Create.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "message.h"

namespace ps {

class Van {
 public:
  virtual ~Van() = default;
  // Binds the receiving endpoint on host (port 0: any free port); returns the bound port.
  virtual int Bind(const std::string& host, int port) = 0;
  // Opens (or replaces) the channel to peer `id`.
  virtual void Connect(int id, const std::string& host, int port) = 0;
  // Sends to peer `id`; false if the van is stopped or the peer was never connected.
  virtual bool Send(int id, const Message& msg) = 0;
  // Blocks for the next well-formed message; false once Stop() was called. Malformed input
  // is dropped here (counted in dropped()), never handed on.
  virtual bool Recv(Message* msg) = 0;
  virtual void Stop() = 0;
  virtual long dropped() const = 0;
  // Why the channel to peer `id` cannot authenticate (its job secret differs), or "" while
  // nothing says so.
  virtual std::string AuthError(int) { return ""; }

  // DMLC_PS_VAN_TYPE: "zmq" (default) or "ucx" (when built with UCX). Throws on any other name.
  // Also routes protobuf's own log lines through a rate limit (a hostile peer's frames must
  // not each write a line).
  static std::unique_ptr<Van> Create(const std::string& type);
  static std::vector<std::string> Types();
};

// PS_MAX_FRAME_BYTES: the largest frame (ZMQ) or message (UCX) a van accepts, so that a
// (possibly hostile) peer cannot make us allocate more; a larger one is dropped, with its
// connection, and the job goes on. Default 1 GiB on servers and the scheduler, 4 GiB on workers.
int64_t MaxMessageBytes();

std::unique_ptr<Van> MakeZmqVan();
std::unique_ptr<Van> MakeUcxVan();
// Tests: one UCX active message of these bytes to the van listening at host:port: behind this
// process's tag when the listener welcomed it (message_auth.h), else exactly these bytes.
bool SendRawUcxMessage(const std::string& host, int port, const std::string& header, const std::string& payload);

}  // namespace ps
