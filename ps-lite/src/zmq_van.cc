// ZMQ van: a ROUTER socket receives from everyone; one DEALER per peer sends. Each
// DEALER->ROUTER pair is one TCP connection, so per-pair order is send order.
#include <zmq.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "logging.h"
#include "van.h"

namespace ps {
namespace {

void FreeNothing(void*, void*) {}
void FreeOwner(void*, void* hint) { delete static_cast<std::shared_ptr<void>*>(hint); }

struct Sender {
  void* socket = nullptr;
  std::mutex mu;  // ZMQ sockets are not thread safe; callers send from several threads
};

class ZmqVan : public Van {
 public:
  ZmqVan() {
    ctx_ = zmq_ctx_new();
    if (!ctx_) throw std::runtime_error("zmq_ctx_new failed");
    zmq_ctx_set(ctx_, ZMQ_IO_THREADS, 1);
  }
  ~ZmqVan() override {
    Stop();
    for (auto& kv : senders_) zmq_close(kv.second->socket);
    if (receiver_) zmq_close(receiver_);
    zmq_ctx_term(ctx_);
  }

  int Bind(const std::string& host, int port) override {
    receiver_ = zmq_socket(ctx_, ZMQ_ROUTER);
    // Bound the size a (possibly hostile) peer can make us allocate for one frame.
    int64_t max_bytes = MaxMessageBytes();
    zmq_setsockopt(receiver_, ZMQ_MAXMSGSIZE, &max_bytes, sizeof(max_bytes));
    int linger = 0;
    zmq_setsockopt(receiver_, ZMQ_LINGER, &linger, sizeof(linger));
    std::string addr = "tcp://" + host + ":" + (port > 0 ? std::to_string(port) : std::string("*"));
    if (zmq_bind(receiver_, addr.c_str()) != 0)
      throw std::runtime_error("cannot bind " + addr + ": " + zmq_strerror(zmq_errno()));
    char endpoint[256];
    size_t len = sizeof(endpoint);
    zmq_getsockopt(receiver_, ZMQ_LAST_ENDPOINT, endpoint, &len);
    std::string ep(endpoint);
    return std::atoi(ep.substr(ep.rfind(':') + 1).c_str());
  }

  void Connect(int id, const std::string& host, int port) override {
    void* s = zmq_socket(ctx_, ZMQ_DEALER);
    // Linger lets a final EXIT/ack reach the peer when we close right after sending.
    int linger = 1000;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    std::string addr = "tcp://" + host + ":" + std::to_string(port);
    if (zmq_connect(s, addr.c_str()) != 0) {
      zmq_close(s);
      throw std::runtime_error("cannot connect to " + addr + ": " + zmq_strerror(zmq_errno()));
    }
    std::lock_guard<std::mutex> lk(mu_);
    auto& slot = senders_[id];
    if (slot) {
      std::lock_guard<std::mutex> lk2(slot->mu);
      zmq_close(slot->socket);
      slot->socket = s;
    } else {
      slot = std::make_unique<Sender>();
      slot->socket = s;
    }
  }

  bool Send(int id, const Message& msg) override {
    if (stopped_) return false;
    Sender* sender;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = senders_.find(id);
      if (it == senders_.end()) return false;
      sender = it->second.get();
    }
    std::string head;
    pb::Meta meta = msg.meta;
    meta.set_num_blobs(static_cast<int>(msg.data.size()));
    meta.SerializeToString(&head);
    std::lock_guard<std::mutex> lk(sender->mu);
    const int more = msg.data.empty() ? 0 : ZMQ_SNDMORE;
    if (zmq_send(sender->socket, head.data(), head.size(), more) < 0) return false;
    for (size_t i = 0; i < msg.data.size(); ++i) {
      const Blob& b = msg.data[i];
      zmq_msg_t frame;
      if (b.owner) {
        auto* hint = new std::shared_ptr<void>(b.owner);
        zmq_msg_init_data(&frame, const_cast<char*>(b.data), b.size, FreeOwner, hint);
      } else {
        zmq_msg_init_data(&frame, const_cast<char*>(b.data), b.size, FreeNothing, nullptr);
      }
      const int flags = i + 1 < msg.data.size() ? ZMQ_SNDMORE : 0;
      if (zmq_msg_send(&frame, sender->socket, flags) < 0) {
        zmq_msg_close(&frame);
        return false;
      }
    }
    return true;
  }

  bool Recv(Message* msg) override {
    for (;;) {
      std::vector<std::shared_ptr<zmq_msg_t>> frames;
      bool more = true;
      while (more) {
        auto frame = std::shared_ptr<zmq_msg_t>(new zmq_msg_t, [](zmq_msg_t* m) {
          zmq_msg_close(m);
          delete m;
        });
        zmq_msg_init(frame.get());
        if (zmq_msg_recv(frame.get(), receiver_, 0) < 0) {
          if (zmq_errno() == EINTR) continue;
          return false;  // ETERM: the van was stopped
        }
        more = zmq_msg_more(frame.get());
        frames.push_back(std::move(frame));
      }
      // frames[0] is the ROUTER's peer identity; frames[1] the meta; the rest blobs.
      if (frames.size() < 2 || !Parse(frames, msg)) {
        ++dropped_;
        PS_VLOG(1) << "dropped a malformed message of " << frames.size() << " frames";
        continue;
      }
      return true;
    }
  }

  void Stop() override {
    if (stopped_.exchange(true)) return;
    zmq_ctx_shutdown(ctx_);
  }

  long dropped() const override { return dropped_; }

 private:
  static bool Parse(const std::vector<std::shared_ptr<zmq_msg_t>>& frames, Message* msg) {
    zmq_msg_t* head = frames[1].get();
    msg->data.clear();
    if (!msg->meta.ParseFromArray(zmq_msg_data(head), static_cast<int>(zmq_msg_size(head)))) return false;
    if (msg->meta.num_blobs() != static_cast<int>(frames.size()) - 2) return false;
    for (size_t i = 2; i < frames.size(); ++i) {
      Blob b;
      b.owner = frames[i];
      b.data = static_cast<const char*>(zmq_msg_data(frames[i].get()));
      b.size = zmq_msg_size(frames[i].get());
      b.Align();
      msg->data.push_back(std::move(b));
    }
    return true;
  }

  void* ctx_ = nullptr;
  void* receiver_ = nullptr;
  std::mutex mu_;
  std::unordered_map<int, std::unique_ptr<Sender>> senders_;
  std::atomic<bool> stopped_{false};
  std::atomic<long> dropped_{0};
};

}  // namespace

std::unique_ptr<Van> MakeZmqVan() { return std::make_unique<ZmqVan>(); }

}  // namespace ps
