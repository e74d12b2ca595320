// ZMQ van: a ROUTER socket receives from everyone; one DEALER per peer sends. Each
// DEALER->ROUTER pair is one TCP connection, so per-pair order is send order.
//
// With a job secret (auth.h) every connection is authenticated by ZMQ before any message
// reaches us: PLAIN (default) with a password derived from the secret, or CURVE with keypairs
// derived from it (PS_AUTH=curve: encrypted, and nothing secret crosses the wire), checked by
// a ZAP handler on this van's context. Either mechanism
// also makes libzmq refuse ZMTP 1.0/2.0 peers, whose bytes would otherwise reach the parser.
// A monitor on the ROUTER names, in a rate-limited line, the peers that never authenticated.
//
// On top of either, with a secret, every connection says a hello and waits for the receiver's
// welcome before its first message, and every message goes with a tag frame before its meta
// (message_auth.h): a password or a message seen on the wire commands nothing. The welcome is
// the one message a ROUTER sends back on a connection; a sender reads it on its first send.
#include <arpa/inet.h>
#include <sys/socket.h>
#include <zmq.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>

#include "auth.h"
#include "logging.h"
#include "message_auth.h"
#include "van.h"

namespace ps {
namespace {

void FreeNothing(void*, void*) {}
void FreeOwner(void*, void* hint) { delete static_cast<std::shared_ptr<void>*>(hint); }

struct Sender {
  void* socket = nullptr;
  void* monitor = nullptr;  // PAIR receiving the DEALER's handshake events
  int auth_failures = 0;
  int handshakes = 0;  // ZMTP handshakes that succeeded: more than one is a reconnection
  std::unique_ptr<auth::Outbound> session;  // with a secret: this connection's keys
  bool refused = false;  // the peer refused our hello, or its welcome proves another secret
  std::mutex mu;  // ZMQ sockets are not thread safe; callers send from several threads
};

std::string Z85(const std::string& raw32) {
  char out[41];
  zmq_z85_encode(out, reinterpret_cast<const uint8_t*>(raw32.data()), 32);
  return out;
}

// A CURVE keypair (Z85) whose secret half is derived from the job secret and `label`.
struct CurveKeys {
  std::string public_z85, secret_z85;
};
CurveKeys DeriveCurveKeys(const std::string& secret, const std::string& label) {
  CurveKeys k;
  k.secret_z85 = Z85(auth::HmacSha256(secret, label));
  char pub[41];
  if (zmq_curve_public(pub, k.secret_z85.c_str()) != 0)
    throw std::runtime_error("this libzmq has no CURVE support (built without libsodium): set PS_AUTH=plain");
  k.public_z85 = pub;
  return k;
}

std::string PeerAddress(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "an unknown address";
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

// One frame of a multipart message as a string; "" past the end.
std::string RecvFrame(void* s, bool* more) {
  zmq_msg_t m;
  zmq_msg_init(&m);
  if (zmq_msg_recv(&m, s, 0) < 0) {
    zmq_msg_close(&m);
    *more = false;
    return "";
  }
  std::string out(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
  *more = zmq_msg_more(&m);
  zmq_msg_close(&m);
  return out;
}

// The tag frame carries one byte more than the tag, so that with ZMQ's 2-byte frame header it
// moves the frames after it by 64 bytes in the receiver's buffer: a blob keeps the 8-byte
// alignment it had without it, where a misaligned one would be copied (Blob::Align; at 1K rows
// a request, that copy cost a third of the rate).
constexpr size_t kTagFrameBytes = auth::kTagBytes + 1;
static_assert((kTagFrameBytes + 2) % 8 == 0, "the tag frame must keep the blobs' alignment");

const char* kZapEndpoint = "inproc://zeromq.zap.01";
const char* kMonitorEndpoint = "inproc://hetu-van-monitor";
const char* kPlainUser = "hetu";

class ZmqVan : public Van {
 public:
  ZmqVan() {
    ctx_ = zmq_ctx_new();
    if (!ctx_) throw std::runtime_error("zmq_ctx_new failed");
    zmq_ctx_set(ctx_, ZMQ_IO_THREADS, 1);
    const std::string secret = auth::JobSecret();
    if (secret.empty()) {
      auth::WarnUnauthenticated("ZMQ");
      return;
    }
    mechanism_ = auth::ZmqMechanism();
    message_key_ = auth::MessageKey(secret);
    inbound_ = std::make_unique<auth::Inbound>(message_key_);
    if (mechanism_ == "curve") {
      server_keys_ = DeriveCurveKeys(secret, "hetu ps zmq curve server");
      client_keys_ = DeriveCurveKeys(secret, "hetu ps zmq curve client");
      client_public_.assign(32, '\0');
      zmq_z85_decode(reinterpret_cast<uint8_t*>(&client_public_[0]), client_keys_.public_z85.c_str());
    } else {
      // PLAIN sends this in clear: a password derived from the secret, never the secret itself.
      const std::string mac = auth::HmacSha256(secret, "hetu ps zmq plain password");
      static const char* hex = "0123456789abcdef";
      for (unsigned char c : mac) password_ += std::string{hex[c >> 4], hex[c & 15]};
    }
  }
  ~ZmqVan() override {
    Stop();
    if (guard_.joinable()) guard_.join();
    for (auto& kv : senders_) {
      zmq_close(kv.second->socket);
      if (kv.second->monitor) zmq_close(kv.second->monitor);
    }
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
    if (!mechanism_.empty()) StartGuard();
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
    SetClientSecurity(s);
    // Handshake events of this connection, so that a peer refusing our secret is an error
    // that says so (AuthError), not a silent wait.
    void* monitor = nullptr;
    if (!mechanism_.empty()) {
      const std::string ep = std::string(kMonitorEndpoint) + "-peer-" + std::to_string(next_monitor_++);
      zmq_socket_monitor(s, ep.c_str(), ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                            ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
      monitor = zmq_socket(ctx_, ZMQ_PAIR);
      zmq_connect(monitor, ep.c_str());
    }
    std::string addr = "tcp://" + host + ":" + std::to_string(port);
    if (zmq_connect(s, addr.c_str()) != 0) {
      zmq_close(s);
      if (monitor) zmq_close(monitor);
      throw std::runtime_error("cannot connect to " + addr + ": " + zmq_strerror(zmq_errno()));
    }
    std::lock_guard<std::mutex> lk(mu_);
    auto& slot = senders_[id];
    if (!slot) slot = std::make_unique<Sender>();
    std::lock_guard<std::mutex> lk2(slot->mu);
    if (slot->socket) zmq_close(slot->socket);
    if (slot->monitor) zmq_close(slot->monitor);
    slot->socket = s;
    slot->monitor = monitor;
    slot->session.reset();
    slot->refused = false;
    slot->handshakes = 0;
    if (!message_key_.empty()) StartSession(slot.get());
  }

  std::string AuthError(int id) override {
    Sender* sender;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = senders_.find(id);
      if (it == senders_.end() || !it->second->monitor) return "";
      sender = it->second.get();
    }
    std::lock_guard<std::mutex> lk(sender->mu);
    if (sender->refused)
      return "it refused this node's hello: this node's job secret (HETU_JOB_SECRET) differs from the peer's";
    ReadEvents(sender);
    // The peer hangs up on a handshake whose keys it cannot open; ZMQ reconnects, and a
    // peer still starting up does not get that far. Two failures in a row are a mismatch.
    if (sender->auth_failures < 2) return "";
    return "its handshake failed " + std::to_string(sender->auth_failures) +
           " times: this node's job secret (HETU_JOB_SECRET) differs from the peer's";
  }

  // Reads the DEALER's handshake events (sender->mu held): counts failed handshakes, and on a
  // handshake after the first (ZMQ reconnected, perhaps to a peer restarted on the same port,
  // which knows no earlier hello) starts a new session with a hello of its own.
  void ReadEvents(Sender* sender) {
    if (!sender->monitor) return;
    for (;;) {
      zmq_msg_t ev;
      zmq_msg_init(&ev);
      if (zmq_msg_recv(&ev, sender->monitor, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&ev);
        break;
      }
      uint16_t event = 0;
      uint32_t value = 0;
      if (zmq_msg_size(&ev) >= 6) {
        std::memcpy(&event, zmq_msg_data(&ev), 2);
        std::memcpy(&value, static_cast<char*>(zmq_msg_data(&ev)) + 2, 4);
      }
      const bool more = zmq_msg_more(&ev);
      zmq_msg_close(&ev);
      if (more) {  // the endpoint frame
        bool m;
        RecvFrame(sender->monitor, &m);
      }
      if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
        sender->auth_failures = 0;
        if (++sender->handshakes > 1 && sender->session) StartSession(sender);
      } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
        sender->auth_failures += 2;  // the peer's ZAP handler said no: conclusive at once
      } else if (event & (ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)) {
        ++sender->auth_failures;
      }
    }
  }

  // A new session on the sender's connection: its hello goes out now (or waits in the DEALER's
  // queue until the connection is made). sender->mu held, or the sender not yet shared.
  void StartSession(Sender* sender) {
    sender->session = std::make_unique<auth::Outbound>(message_key_);
    const std::string hello = sender->session->Hello();
    zmq_send(sender->socket, hello.data(), hello.size(), 0);
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
    if (sender->session) {
      // A registration is repeated every 2 s while the scheduler is not there yet; every other
      // message goes to a peer that is up, and waits only for its receive thread.
      const double wait_s = msg.meta.sender() == -1 ? 2 : 10;
      ReadEvents(sender);
      if (!sender->session->ready() && !AwaitWelcome(sender, wait_s)) {
        PS_VLOG(1) << "ZMQ van: no welcome from node " << id << " within " << wait_s << " s; message not sent";
        return false;
      }
      std::vector<uint64_t> sizes;
      for (const Blob& b : msg.data) sizes.push_back(b.size);
      std::string tag = sender->session->Seal({head.data(), head.size(), sizes});
      tag.resize(kTagFrameBytes, '\0');
      if (zmq_send(sender->socket, tag.data(), tag.size(), ZMQ_SNDMORE) < 0) return false;
    }
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
      // frames[0] is the ROUTER's peer identity (one per connection); then, with a secret, the
      // tag (or a hello alone); then the meta; the rest blobs.
      if (inbound_ && frames.size() == 2 &&
          auth::FrameKind(Bytes(frames[1]), Size(frames[1])) == auth::kHelloKind) {
        Welcome(frames[0].get(), frames[1].get());
        continue;
      }
      const size_t meta_at = inbound_ ? 2 : 1;
      std::string connection, why;
      if (frames.size() <= meta_at) {
        why = "a malformed message of " + std::to_string(frames.size()) + " frames";
      } else if (inbound_) {
        // The tag is checked before anything of the message is parsed.
        std::vector<uint64_t> sizes;
        for (size_t i = meta_at + 1; i < frames.size(); ++i) sizes.push_back(Size(frames[i]));
        const size_t tag = Size(frames[1]) == kTagFrameBytes ? auth::kTagBytes : Size(frames[1]);
        why = inbound_->Open(Bytes(frames[1]), tag, {Bytes(frames[meta_at]), Size(frames[meta_at]), sizes},
                             &connection);
      }
      if (why.empty() && !Parse(frames, meta_at, msg))
        why = "a malformed message of " + std::to_string(frames.size()) + " frames";
      if (why.empty())
        why = inbound_ ? inbound_->Speaks(connection, msg->meta.sender()) : Pinned(frames[0].get(), msg->meta.sender());
      if (!why.empty()) {
        ++dropped_;
        DropLine("dropped " + why);
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
  void DropLine(const std::string& what) {
    long held = 0;
    if (Verbosity() >= 1 || drop_log_.Allow(&held))
      LogLine() << "ZMQ van: " << what << (held ? " (and " + std::to_string(held) + " more not shown)" : "");
  }

  static const char* Bytes(const std::shared_ptr<zmq_msg_t>& m) {
    return static_cast<const char*>(zmq_msg_data(m.get()));
  }
  static size_t Size(const std::shared_ptr<zmq_msg_t>& m) { return zmq_msg_size(m.get()); }

  // Without a secret, a connection speaks for one node: the first node id it sends from is the
  // only one it may use later (a registration, from a node without an id yet, comes first).
  // "" when `sender` may speak on it, else why not. (With a secret, auth::Inbound::Speaks.)
  std::string Pinned(zmq_msg_t* identity, int sender) {
    if (sender < 0 && sender != -1) return "a message from node " + std::to_string(sender);
    const std::string conn(static_cast<const char*>(zmq_msg_data(identity)), zmq_msg_size(identity));
    auto it = pinned_.find(conn);
    if (it == pinned_.end()) {
      if (sender >= 0) pinned_[conn] = sender;
      return "";
    }
    if (it->second == sender) return "";
    return "a message that claims to come from node " + std::to_string(sender) + " on the connection of node " +
           std::to_string(it->second);
  }

  // Answers a connection's hello on that connection (receive thread: the ROUTER is its own).
  void Welcome(zmq_msg_t* identity, zmq_msg_t* hello) {
    bool refused = false;
    const std::string answer =
        inbound_->Answer(static_cast<const char*>(zmq_msg_data(hello)), zmq_msg_size(hello), &refused);
    if (refused) {
      ++dropped_;
      DropLine("refused a hello that does not prove this job's secret");
    }
    zmq_send(receiver_, zmq_msg_data(identity), zmq_msg_size(identity), ZMQ_SNDMORE);
    zmq_send(receiver_, answer.data(), answer.size(), 0);
  }

  // Reads the peer's answer to our hello from the DEALER, for up to wait_s (sender->mu held).
  bool AwaitWelcome(Sender* sender, double wait_s) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
    while (!stopped_ && !sender->refused) {
      using std::chrono::milliseconds;
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      zmq_pollitem_t item = {sender->socket, 0, ZMQ_POLLIN, 0};
      // Woken every 100 ms to see a reconnection (ReadEvents), which asks for a new welcome.
      const int got = zmq_poll(&item, 1, std::min<long>(100, left.count()));
      ReadEvents(sender);
      if (got <= 0) continue;
      bool more = true;
      std::string first;
      for (int i = 0; more; ++i) {
        const std::string frame = RecvFrame(sender->socket, &more);
        if (i == 0) first = frame;
      }
      if (sender->session->Accept(first.data(), first.size(), &sender->refused)) return true;
    }
    return sender->session->ready();
  }

  void SetClientSecurity(void* s) {
    if (mechanism_ == "curve") {
      zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, server_keys_.public_z85.c_str(), 40);
      zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, client_keys_.public_z85.c_str(), 40);
      zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, client_keys_.secret_z85.c_str(), 40);
    } else if (mechanism_ == "plain") {
      zmq_setsockopt(s, ZMQ_PLAIN_USERNAME, kPlainUser, std::strlen(kPlainUser));
      zmq_setsockopt(s, ZMQ_PLAIN_PASSWORD, password_.data(), password_.size());
    }
  }

  // The ZAP handler and the ROUTER's monitor, on one thread; both before the first peer can
  // connect, since libzmq asks ZAP about every connection once a mechanism is set.
  void StartGuard() {
    zap_ = zmq_socket(ctx_, ZMQ_REP);
    if (zmq_bind(zap_, kZapEndpoint) != 0)
      throw std::runtime_error(std::string("ZMQ van: cannot bind the ZAP handler: ") + zmq_strerror(zmq_errno()));
    zmq_socket_monitor(receiver_, kMonitorEndpoint,
                       ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
    monitor_ = zmq_socket(ctx_, ZMQ_PAIR);
    zmq_connect(monitor_, kMonitorEndpoint);
    const int one = 1;
    if (mechanism_ == "curve") {
      zmq_setsockopt(receiver_, ZMQ_CURVE_SERVER, &one, sizeof(one));
      zmq_setsockopt(receiver_, ZMQ_CURVE_SECRETKEY, server_keys_.secret_z85.c_str(), 40);
    } else {
      zmq_setsockopt(receiver_, ZMQ_PLAIN_SERVER, &one, sizeof(one));
    }
    zmq_setsockopt(receiver_, ZMQ_ZAP_DOMAIN, "hetu", 4);
    // A peer that connects and says nothing holds a connection for this long, not 30 s.
    const int handshake_ms = 5000;
    zmq_setsockopt(receiver_, ZMQ_HANDSHAKE_IVL, &handshake_ms, sizeof(handshake_ms));
    guard_ = std::thread([this] { GuardLoop(); });
  }

  void GuardLoop() {
    std::map<int, std::string> accepted;  // fd -> peer address, while its handshake runs
    std::deque<int> handshaking;          // fds in accept order, not yet known authenticated
    for (;;) {
      zmq_pollitem_t items[2] = {{zap_, 0, ZMQ_POLLIN, 0}, {monitor_, 0, ZMQ_POLLIN, 0}};
      if (zmq_poll(items, 2, -1) < 0) {
        if (zmq_errno() == EINTR) continue;
        break;  // ETERM: the van stopped
      }
      if (items[0].revents & ZMQ_POLLIN) AnswerZap();
      if (!(items[1].revents & ZMQ_POLLIN)) continue;
      bool more;
      const std::string head = RecvFrame(monitor_, &more);
      if (more) RecvFrame(monitor_, &more);
      if (head.size() < 6) continue;
      uint16_t event;
      uint32_t value;
      std::memcpy(&event, head.data(), 2);
      std::memcpy(&value, head.data() + 2, 4);
      const int fd = static_cast<int>(value);
      if (event == ZMQ_EVENT_ACCEPTED) {
        accepted[fd] = PeerAddress(fd);
        handshaking.push_back(fd);
      } else if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
        // The event does not say which connection; libzmq's one I/O thread finishes
        // handshakes about in accept order, and a wrong guess only misnames a log line.
        if (!handshaking.empty()) handshaking.pop_front();
      } else if (event == ZMQ_EVENT_DISCONNECTED) {
        for (auto it = handshaking.begin(); it != handshaking.end(); ++it) {
          if (*it != fd) continue;
          handshaking.erase(it);
          if (!stopped_)
            DropLine("refused a connection from " + accepted[fd] +
                     ": no ZMTP 3 handshake with this job's keys (" + mechanism_ + ")");
          break;
        }
        accepted.erase(fd);
      }
    }
    zmq_close(zap_);
    zmq_close(monitor_);
  }

  // ZAP (RFC 27): version, request id, domain, address, identity, mechanism, credentials.
  void AnswerZap() {
    std::vector<std::string> f;
    bool more = true;
    while (more) f.push_back(RecvFrame(zap_, &more));
    bool ok = f.size() >= 7 && f[0] == "1.0";
    if (ok && f[5] == "CURVE") {
      ok = auth::SameBytes(f[6], client_public_);
    } else if (ok && f[5] == "PLAIN") {
      ok = f.size() >= 8 && f[6] == kPlainUser && auth::SameBytes(f[7], password_);
    } else {
      ok = false;
    }
    if (!ok)
      DropLine("refused a connection from " + (f.size() > 3 ? f[3] : std::string("?")) +
               ": its credentials are not this job's (" + (f.size() > 5 ? f[5] : std::string("?")) + ")");
    const std::string reply[6] = {"1.0", f.size() > 1 ? f[1] : "", ok ? "200" : "400",
                                  ok ? "OK" : "not this job's credentials", ok ? "hetu" : "", ""};
    for (int i = 0; i < 6; ++i) zmq_send(zap_, reply[i].data(), reply[i].size(), i < 5 ? ZMQ_SNDMORE : 0);
  }

  // frames[meta_at] is the meta, the rest blobs.
  static bool Parse(const std::vector<std::shared_ptr<zmq_msg_t>>& frames, size_t meta_at, Message* msg) {
    zmq_msg_t* head = frames[meta_at].get();
    msg->data.clear();
    if (!msg->meta.ParseFromArray(zmq_msg_data(head), static_cast<int>(zmq_msg_size(head)))) return false;
    if (msg->meta.num_blobs() != static_cast<int>(frames.size() - meta_at - 1)) return false;
    for (size_t i = meta_at + 1; i < frames.size(); ++i) {
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
  std::string mechanism_;  // "" (no secret: no authentication), "curve" or "plain"
  CurveKeys server_keys_, client_keys_;
  std::string client_public_;  // 32 raw bytes, as ZAP hands it to us
  std::string password_;
  std::string message_key_;                 // "" without a secret: messages go without tags
  std::unique_ptr<auth::Inbound> inbound_;  // the connections to our ROUTER; receive thread only
  void* zap_ = nullptr;
  void* monitor_ = nullptr;
  std::thread guard_;
  std::atomic<int> next_monitor_{0};
  auth::RateLimit drop_log_;
  std::unordered_map<std::string, int> pinned_;  // ROUTER identity -> node id; receive thread only
  std::mutex mu_;
  std::unordered_map<int, std::unique_ptr<Sender>> senders_;
  std::atomic<bool> stopped_{false};
  std::atomic<long> dropped_{0};
};

}  // namespace

std::unique_ptr<Van> MakeZmqVan() { return std::make_unique<ZmqVan>(); }

}  // namespace ps
