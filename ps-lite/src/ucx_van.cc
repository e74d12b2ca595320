// UCX van: UCP active messages over whatever transports UCX finds (RDMA verbs on an
// InfiniBand or RoCE host; shared memory and TCP elsewhere). One listener accepts peers; one
// client endpoint per peer sends. A message is one active message: the header carries the blob
// sizes and the protobuf meta, the payload carries the blobs back to back, each padded to 8
// bytes so that the receiver can hand out aligned views of one buffer without copying.
//
// All UCP calls on the worker are serialised by `worker_mu_`. The receive thread progresses the
// worker (sleeping on its event fd when idle) and so runs the callbacks, which fill the inbox,
// finish sends and signal `wake_fd_`. Send returns once a send is under way, keeping what it
// borrows alive until its callback. Messages are delivered in header-arrival order, which UCP
// keeps per endpoint, so per-pair order is send order as the Van interface promises.
//
// With a job secret (auth.h), a client endpoint first says a hello (with the REPLY flag) and
// sends nothing else until the listener's welcome has come, or its refusal, which lets the
// client say why it cannot join; then every message's header starts with its tag
// (message_auth.h: the endpoint's nonce, a sequence number, an HMAC under the endpoint's key),
// checked before anything else of the message is read.
#include <arpa/inet.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "auth.h"
#include "logging.h"
#include "message_auth.h"
#include "van.h"

namespace ps {
namespace {

constexpr unsigned kAmId = 7;
constexpr unsigned kHelloAmId = 8;    // client -> listener: auth::Outbound::Hello
constexpr unsigned kWelcomeAmId = 9;  // listener -> client: auth::Inbound::Answer
constexpr double kFailedPeerWelcomeWait = 0.2;  // seconds: Post's wait on a reopened endpoint
constexpr uint32_t kMagic = 0x31535048;  // "HPS1"
constexpr size_t kAlign = 8;

size_t Padded(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

void Check(ucs_status_t st, const std::string& what) {
  if (st != UCS_OK) throw std::runtime_error("UCX van: " + what + ": " + ucs_status_string(st));
}

// `action` ("bind", "connect to") names the step in the error for a host that is not an IPv4 address.
sockaddr_in IPv4Address(const std::string& host, int port, const char* action) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1)
    throw std::runtime_error(std::string("UCX van: cannot ") + action + " '" + host + "': not an IPv4 address");
  return addr;
}

// A message whose header has arrived; its payload may still be on the way (rendezvous).
struct Incoming {
  Message msg;
  bool ready = false;
  bool bad = false;
};

// A peer we send to: its endpoint and address, so that a failed endpoint is re-created on
// the next send (the ZMQ van's DEALER reconnects on its own; registration retries rely on it).
struct Peer {
  ucp_ep_h ep = nullptr;
  std::string host;
  int port = 0;
  std::atomic<bool> failed{false};
  std::unique_ptr<auth::Outbound> session;  // with a secret: the endpoint's keys, new with each endpoint
  int refusals = 0;  // hellos the listener refused, or answered without proof of our secret
};

// A send in flight: the header, the payload's pieces and the blobs' owners stay alive until
// UCX reports the send complete (a rendezvous send ends when the peer has fetched the payload).
struct Outgoing {
  std::string head;
  std::vector<ucp_dt_iov_t> iov;
  std::vector<std::shared_ptr<void>> owners;
  int peer = 0;
};

class UcxVan : public Van {
 public:
  UcxVan() {
    max_bytes_ = MaxMessageBytes();
    const std::string secret = auth::JobSecret();
    if (secret.empty()) auth::WarnUnauthenticated("UCX");
    else message_key_ = auth::MessageKey(secret);
    inbound_ = std::make_unique<auth::Inbound>(message_key_);
    // A scheduler restarted on its port must be able to bind while the old connections sit in
    // TIME_WAIT (ZMQ sets SO_REUSEADDR too). The user's own setting wins.
    setenv("UCX_CM_REUSEADDR", "y", 0);
    // Over TCP, UCX moves a large payload in segments of TX_SEG_SIZE, one send() each; at the
    // 8 KB default an 8 MB reply costs a thousand system calls and runs at a third of the ZMQ
    // van's rate on loopback (bench/ps_throughput.py --vans zmq ucx). RDMA transports ignore these.
    setenv("UCX_TCP_TX_SEG_SIZE", "1m", 0);
    setenv("UCX_TCP_RX_SEG_SIZE", "1m", 0);
    ucp_config_t* config = nullptr;
    Check(ucp_config_read(nullptr, nullptr, &config), "reading the UCX configuration");
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    params.mt_workers_shared = 0;
    const ucs_status_t st = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    Check(st, "ucp_init");
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // worker_mu_ serialises every call
    Check(ucp_worker_create(context_, &wp, &worker_), "ucp_worker_create");
    Check(ucp_worker_get_efd(worker_, &worker_fd_), "ucp_worker_get_efd");
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) throw std::runtime_error("UCX van: eventfd failed");
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = kAmId;
    hp.cb = &UcxVan::OnMessage;
    hp.arg = this;
    Check(ucp_worker_set_am_recv_handler(worker_, &hp), "registering the message handler");
    hp.id = kHelloAmId;
    hp.cb = &UcxVan::OnHello;
    Check(ucp_worker_set_am_recv_handler(worker_, &hp), "registering the hello handler");
    hp.id = kWelcomeAmId;
    hp.cb = &UcxVan::OnWelcome;
    Check(ucp_worker_set_am_recv_handler(worker_, &hp), "registering the welcome handler");
  }

  ~UcxVan() override {
    Stop();
    std::lock_guard<std::mutex> lk(worker_mu_);
    // The last messages (a worker's EXIT, the scheduler's end of job) must reach their peers
    // before the endpoints close, as the ZMQ van's linger lets them: a send counts as complete
    // once the transport has taken it, and a forced close drops what the transport still
    // holds. So the worker is flushed first; a dead peer cannot hold it past the deadline.
    ucp_request_param_t rp{};
    Finish(ucp_worker_flush_nbx(worker_, &rp), std::chrono::seconds(2));
    for (auto& kv : peers_) CloseEndpoint(kv.second->ep);
    for (ucp_ep_h ep : accepted_) CloseEndpoint(ep);
    // Destroyed last, just before the worker: a connection still being set up through a
    // listener that is gone crashes UCX (WaitConnected), so the time between the two is short.
    if (listener_) ucp_listener_destroy(listener_);
    listener_ = nullptr;
    ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
    close(wake_fd_);
  }

  int Bind(const std::string& host, int port) override {
    const sockaddr_in addr = IPv4Address(host, port > 0 ? port : 0, "bind");
    ucp_listener_params_t lp{};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    lp.sockaddr.addrlen = sizeof(addr);
    lp.conn_handler.cb = &UcxVan::OnConnectionRequest;
    lp.conn_handler.arg = this;
    std::lock_guard<std::mutex> lk(worker_mu_);
    const ucs_status_t st = ucp_listener_create(worker_, &lp, &listener_);
    if (st != UCS_OK)
      throw std::runtime_error("UCX van: cannot listen on " + host + ":" + std::to_string(port) + ": " +
                               ucs_status_string(st));
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    Check(ucp_listener_query(listener_, &attr), "ucp_listener_query");
    port_ = ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
    return port_;
  }

  std::string AuthError(int id) override {
    std::lock_guard<std::mutex> lk(worker_mu_);
    auto it = peers_.find(id);
    if (it == peers_.end() || it->second->refusals == 0) return "";
    return "it refused this node's hello: this node's job secret (HETU_JOB_SECRET) differs from the peer's";
  }

  void Connect(int id, const std::string& host, int port) override {
    std::lock_guard<std::mutex> lk(worker_mu_);
    auto& slot = peers_[id];
    if (!slot) slot = std::make_unique<Peer>();
    if (slot->ep) CloseEndpoint(slot->ep);
    slot->host = host;
    slot->port = port;
    Open(slot.get());
    WaitConnected(slot.get());
  }

  bool Send(int id, const Message& msg) override {
    if (stopped_) return false;
    // Header: magic, blob count, blob sizes, then the meta.
    auto out = std::make_unique<Outgoing>();
    pb::Meta meta = msg.meta;
    meta.set_num_blobs(static_cast<int>(msg.data.size()));
    const uint32_t n = static_cast<uint32_t>(msg.data.size());
    out->head.assign(8 + 8 * msg.data.size(), '\0');
    std::memcpy(&out->head[0], &kMagic, 4);
    std::memcpy(&out->head[4], &n, 4);
    static const char kZeros[kAlign] = {};
    for (size_t i = 0; i < msg.data.size(); ++i) {
      const Blob& b = msg.data[i];
      const uint64_t size = b.size;
      std::memcpy(&out->head[8 + 8 * i], &size, 8);
      if (size) out->iov.push_back({const_cast<char*>(b.data), size});
      if (Padded(size) != size) out->iov.push_back({const_cast<char*>(kZeros), Padded(size) - size});
      if (b.owner) out->owners.push_back(b.owner);
    }
    out->head += meta.SerializeAsString();
    // A registration is repeated every 2 s while the scheduler is not there yet; every other
    // message goes to a peer that is up.
    return Post(id, std::move(out), /*seal=*/true, msg.meta.sender() == -1 ? 2 : 10);
  }

  // Starts sending one active message of `out->head` and the bytes of `out->iov`: with a
  // secret and `seal`, after the endpoint's welcome (waited for up to wait_s) and behind its
  // tag; else as they are (tests use this to play a peer that speaks the protocol badly).
  // Returns once the send is under way, like zmq_send: completion (or a dead peer) is seen
  // later, by whichever thread progresses the worker.
  bool Post(int id, std::unique_ptr<Outgoing> out, bool seal, double wait_s) {
    std::lock_guard<std::mutex> lk(worker_mu_);
    auto it = peers_.find(id);
    if (it == peers_.end()) return false;
    Peer* peer = it->second.get();
    bool reopened = false;
    if (peer->failed) {
      CloseEndpoint(peer->ep);
      Open(peer);
      reopened = true;
    }
    out->peer = id;
    if (seal && peer->session) {
      // A peer whose endpoint failed is stopped or gone: its welcome is awaited only briefly,
      // since every other send and receive waits on worker_mu_ meanwhile. A message it misses is
      // dropped, as one to a dead peer is (the scheduler sends its control messages again).
      if (!AwaitWelcome(peer, reopened ? std::min(wait_s, kFailedPeerWelcomeWait) : wait_s)) {
        PS_VLOG(1) << "UCX van: no welcome from node " << id << " within " << wait_s << " s; message not sent";
        return false;
      }
      out->head.insert(0, peer->session->Seal({out->head.data(), out->head.size(), {}}));
    }
    return PostOn(peer->ep, kAmId, std::move(out));
  }

  // Called with worker_mu_ held: progresses the worker (which runs OnWelcome) until the
  // listener has answered the endpoint's hello, for up to wait_s.
  bool AwaitWelcome(Peer* peer, double wait_s) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
    while (!peer->session->ready() && peer->refusals == 0 && !peer->failed && !stopped_ &&
           std::chrono::steady_clock::now() < deadline)
      ucp_worker_progress(worker_);
    return peer->session->ready();
  }

  // Called with worker_mu_ held.
  bool PostOn(ucp_ep_h ep, unsigned am_id, std::unique_ptr<Outgoing> out) {
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.send = &UcxVan::OnSent;
    rp.user_data = out.get();
    if (am_id == kHelloAmId) {  // so that the listener can answer it
      rp.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
      rp.flags = UCP_AM_SEND_FLAG_REPLY;
    }
    if (!out->iov.empty()) {  // UCX wants a contiguous datatype (and no buffer) for no payload
      rp.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
      rp.datatype = ucp_dt_make_iov();
    }
    ucs_status_ptr_t req = ucp_am_send_nbx(ep, am_id, out->head.data(), out->head.size(),
                                           out->iov.empty() ? nullptr : out->iov.data(), out->iov.size(), &rp);
    if (req == nullptr) return true;  // sent already; `out` may go
    if (UCS_PTR_IS_ERR(req)) {
      PS_VLOG(1) << "UCX van: send to node " << out->peer << " failed: " << ucs_status_string(UCS_PTR_STATUS(req));
      return false;
    }
    // Callbacks run only inside progress, which needs worker_mu_: OnSent cannot have run yet.
    out.release();
    Wake();  // the receive thread progresses the worker, and so the send
    return true;
  }

  bool Recv(Message* msg) override {
    for (;;) {
      {
        std::lock_guard<std::mutex> lk(worker_mu_);
        while (ucp_worker_progress(worker_) != 0) {
        }
      }
      if (PopReady(msg)) return true;
      if (stopped_) return false;
      ucs_status_t armed;
      {
        std::lock_guard<std::mutex> lk(worker_mu_);
        armed = ucp_worker_arm(worker_);
      }
      if (armed == UCS_ERR_BUSY) continue;
      // Send (a send to progress), Stop and callbacks run by other threads' progress (Connect,
      // Post) signal wake_fd_; the timeout only guards against an event lost before the arm.
      pollfd fds[2] = {{worker_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      poll(fds, 2, 100);
      uint64_t drained;
      if (fds[1].revents & POLLIN) (void)!read(wake_fd_, &drained, sizeof(drained));
    }
  }

  void Stop() override {
    if (stopped_.exchange(true)) return;
    Wake();
  }

  long dropped() const override { return dropped_; }

 private:
  void Wake() {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }

  // Called with worker_mu_ held.
  void Open(Peer* peer) {
    const sockaddr_in addr = IPv4Address(peer->host, peer->port, "connect to");
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    ep.sockaddr.addrlen = sizeof(addr);
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;  // a dead peer fails our requests, not the process
    ep.err_handler.cb = &UcxVan::OnPeerFailed;
    ep.err_handler.arg = peer;
    peer->failed = false;
    const ucs_status_t st = ucp_ep_create(worker_, &ep, &peer->ep);
    if (st != UCS_OK) {
      peer->ep = nullptr;
      peer->failed = true;
      throw std::runtime_error("UCX van: cannot connect to " + peer->host + ":" + std::to_string(peer->port) +
                               ": " + ucs_status_string(st));
    }
    if (message_key_.empty()) return;
    peer->session = std::make_unique<auth::Outbound>(message_key_);
    peer->refusals = 0;
    auto hello = std::make_unique<Outgoing>();
    hello->head = peer->session->Hello();
    hello->peer = -1;
    PostOn(peer->ep, kHelloAmId, std::move(hello));
  }

  void DropLine(const std::string& what) {
    long held = 0;
    if (Verbosity() >= 1 || drop_log_.Allow(&held))
      LogLine() << "UCX van: " << what << (held ? " (and " + std::to_string(held) + " more not shown)" : "");
  }

  // Called inside progress. Without a secret every message is read. With one, a message is
  // read only after its tag (auth::Inbound::Open), which is taken off the header; then
  // (Admit) only if it names the node id that its endpoint first sent from.
  bool Authenticated(const void** header, size_t* header_length, std::string* connection) {
    if (message_key_.empty()) return true;
    const char* h = static_cast<const char*>(*header);
    const size_t tag = *header_length >= auth::kTagBytes ? auth::kTagBytes : *header_length;
    const std::string why = inbound_->Open(h, tag, {h + tag, *header_length - tag, {}}, connection);
    if (!why.empty()) {
      DropLine("dropped " + why);
      return false;
    }
    *header = h + tag;
    *header_length -= tag;
    return true;
  }
  bool Admit(const std::string& connection, int sender) {
    if (message_key_.empty()) return true;
    const std::string why = inbound_->Speaks(connection, sender);
    if (!why.empty()) DropLine("dropped " + why);
    return why.empty();
  }

  std::string Address(ucp_ep_h ep) const {
    auto it = ep ? addresses_.find(ep) : addresses_.end();
    return it == addresses_.end() ? std::string("an unknown peer") : it->second;
  }

  // Called with worker_mu_ held. UCX connects in the background, and a handshake still under
  // way when the peer closes reaches a listener being destroyed: UCX then crashes on its own
  // thread, in ucp_cm_server_conn_request_cb (docs/ps-lite-notes.md). Nodes connect to their peers
  // once, at start, and may send nothing on a connection until the end, so the handshake is
  // completed here (an endpoint flush), bounded by a deadline.
  void WaitConnected(Peer* peer) {
    ucp_request_param_t rp{};
    const ucs_status_t st = Finish(ucp_ep_flush_nbx(peer->ep, &rp), std::chrono::seconds(2));
    if (st != UCS_OK)
      PS_VLOG(1) << "UCX van: connection to " << peer->host << ":" << peer->port << " not made yet: "
                 << ucs_status_string(st);
  }

  // Called with worker_mu_ held. Force-closes: a flush could wait on a dead peer.
  void CloseEndpoint(ucp_ep_h ep) {
    if (!ep) return;
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = UCP_EP_CLOSE_FLAG_FORCE;
    Finish(ucp_ep_close_nbx(ep, &rp), std::chrono::seconds(5));
  }

  // Called with worker_mu_ held. Progresses the worker until request `req` completes or
  // `limit` passes (a dead peer must not hold us), then releases it; its status, or
  // UCS_INPROGRESS if the deadline came first.
  ucs_status_t Finish(ucs_status_ptr_t req, std::chrono::seconds limit) {
    if (req == nullptr) return UCS_OK;
    if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (ucp_request_check_status(req) == UCS_INPROGRESS && std::chrono::steady_clock::now() < deadline)
      ucp_worker_progress(worker_);
    const ucs_status_t st = ucp_request_check_status(req);
    ucp_request_free(req);
    return st;
  }

  bool PopReady(Message* msg) {
    std::lock_guard<std::mutex> lk(inbox_mu_);
    while (!inbox_.empty()) {
      Incoming& head = *inbox_.front();
      if (head.bad) {
        ++dropped_;
        inbox_.pop_front();
        continue;
      }
      if (!head.ready) return false;
      *msg = std::move(head.msg);
      inbox_.pop_front();
      return true;
    }
    return false;
  }

  // Parses the header into `in->msg` (blob views set later); the blob sizes, or empty.
  bool ParseHeader(const void* header, size_t header_length, size_t length, Incoming* in,
                   std::vector<uint64_t>* sizes) const {
    if (header_length < 8) return false;
    const char* h = static_cast<const char*>(header);
    uint32_t magic, n;
    std::memcpy(&magic, h, 4);
    std::memcpy(&n, h + 4, 4);
    if (magic != kMagic || n > (header_length - 8) / 8) return false;
    sizes->resize(n);
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; ++i) {
      std::memcpy(&(*sizes)[i], h + 8 + 8 * i, 8);
      if ((*sizes)[i] > static_cast<uint64_t>(max_bytes_)) return false;
      total += Padded((*sizes)[i]);
    }
    if (total != length || static_cast<int64_t>(length) > max_bytes_) return false;
    const size_t meta_at = 8 + 8 * size_t(n);
    if (!in->msg.meta.ParseFromArray(h + meta_at, static_cast<int>(header_length - meta_at))) return false;
    return in->msg.meta.num_blobs() == static_cast<int>(n);
  }

  static void SetBlobs(const std::shared_ptr<char[]>& buffer, const std::vector<uint64_t>& sizes, Message* msg) {
    size_t at = 0;
    msg->data.clear();
    for (uint64_t size : sizes) {
      Blob b;
      b.owner = std::shared_ptr<void>(buffer, buffer.get() + at);
      b.data = buffer.get() + at;
      b.size = size;
      msg->data.push_back(std::move(b));
      at += Padded(size);
    }
  }

  // ---- callbacks (run inside ucp_worker_progress, worker_mu_ held by the progressing thread)

  static ucs_status_t OnMessage(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                const ucp_am_recv_param_t* param) {
    auto* self = static_cast<UcxVan*>(arg);
    auto in = std::make_shared<Incoming>();
    std::vector<uint64_t> sizes;
    const bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
    std::string connection;
    if (!self->Authenticated(&header, &header_length, &connection)) {
      ++self->dropped_;
      if (rndv) ucp_am_data_release(self->worker_, data);
      return UCS_OK;
    }
    if (!self->ParseHeader(header, header_length, length, in.get(), &sizes)) {
      self->DropLine("dropped a malformed message (" + std::to_string(header_length) + "-byte header, " +
                     std::to_string(length) + " bytes)");
      ++self->dropped_;
      if (rndv) ucp_am_data_release(self->worker_, data);
      return UCS_OK;
    }
    if (!self->Admit(connection, in->msg.meta.sender())) {
      ++self->dropped_;
      if (rndv) ucp_am_data_release(self->worker_, data);
      return UCS_OK;
    }
    // new char[] is aligned for any fundamental type, and every blob starts at a multiple of 8.
    std::shared_ptr<char[]> buffer(new char[length > 0 ? length : 1]);
    SetBlobs(buffer, sizes, &in->msg);
    {
      std::lock_guard<std::mutex> lk(self->inbox_mu_);
      self->inbox_.push_back(in);
    }
    if (!rndv) {
      if (length) std::memcpy(buffer.get(), data, length);
      self->MarkDone(in.get(), true);
      return UCS_OK;
    }
    // Rendezvous: fetch the payload into the buffer; the message is delivered when it lands.
    auto* ctx = new std::pair<UcxVan*, std::shared_ptr<Incoming>>(self, in);
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.recv_am = &UcxVan::OnPayload;
    rp.user_data = ctx;
    ucs_status_ptr_t req = ucp_am_recv_data_nbx(self->worker_, data, buffer.get(), length, &rp);
    if (req == nullptr || UCS_PTR_IS_ERR(req)) {
      self->MarkDone(in.get(), req == nullptr);
      delete ctx;
    }
    return UCS_OK;
  }

  // Listener side: a client endpoint's hello, answered so that a client with another secret
  // learns why it cannot join (its messages are refused on their own proofs).
  static ucs_status_t OnHello(void* arg, const void* header, size_t header_length, void*, size_t,
                              const ucp_am_recv_param_t* param) {
    auto* self = static_cast<UcxVan*>(arg);
    if (self->message_key_.empty() || !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ||
        (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV))
      return UCS_OK;
    const ucp_ep_h ep = param->reply_ep;
    bool refused = false;
    const std::string answer = self->inbound_->Answer(static_cast<const char*>(header), header_length, &refused);
    if (answer.empty() || refused) {
      ++self->dropped_;
      self->DropLine("refused a connection from " + self->Address(ep) + ": its hello does not prove this job's secret");
    }
    if (answer.empty()) return UCS_OK;
    auto out = std::make_unique<Outgoing>();
    out->head = answer;
    out->peer = -1;
    self->PostOn(ep, kWelcomeAmId, std::move(out));
    return UCS_OK;
  }

  // Client side: the listener's answer to one of our hellos.
  static ucs_status_t OnWelcome(void* arg, const void* header, size_t header_length, void*, size_t,
                                const ucp_am_recv_param_t*) {
    auto* self = static_cast<UcxVan*>(arg);
    if (self->message_key_.empty()) return UCS_OK;
    const char* h = static_cast<const char*>(header);
    for (auto& kv : self->peers_) {
      Peer& p = *kv.second;
      if (!p.session || p.session->ready()) continue;
      bool refused = false;
      p.session->Accept(h, header_length, &refused);
      if (refused) ++p.refusals;
    }
    return UCS_OK;
  }

  static void OnPayload(void* request, ucs_status_t status, size_t, void* user_data) {
    auto* ctx = static_cast<std::pair<UcxVan*, std::shared_ptr<Incoming>>*>(user_data);
    ctx->first->MarkDone(ctx->second.get(), status == UCS_OK);
    delete ctx;
    ucp_request_free(request);
  }

  void MarkDone(Incoming* in, bool ok) {
    {
      std::lock_guard<std::mutex> lk(inbox_mu_);
      (ok ? in->ready : in->bad) = true;
    }
    Wake();
  }

  static void OnSent(void* request, ucs_status_t status, void* user_data) {
    std::unique_ptr<Outgoing> out(static_cast<Outgoing*>(user_data));
    if (status != UCS_OK)
      PS_VLOG(1) << "UCX van: send to node " << out->peer << " failed: " << ucs_status_string(status);
    ucp_request_free(request);
  }

  static void OnConnectionRequest(ucp_conn_request_h request, void* arg) {
    auto* self = static_cast<UcxVan*>(arg);
    if (self->stopped_) {  // a van that is closing takes no new peers
      PS_VLOG(1) << "UCX van: closing, refused a connection";
      if (self->listener_) ucp_listener_reject(self->listener_, request);
      return;
    }
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.conn_request = request;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &UcxVan::OnAcceptedFailed;
    ep.err_handler.arg = self;
    ucp_conn_request_attr_t attr{};
    attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    std::string address = "an unknown peer";
    if (ucp_conn_request_query(request, &attr) == UCS_OK && attr.client_address.ss_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(&attr.client_address);
      char host[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
      address = std::string(host) + ":" + std::to_string(ntohs(a->sin_port));
    }
    ucp_ep_h handle = nullptr;
    const ucs_status_t st = ucp_ep_create(self->worker_, &ep, &handle);
    if (st != UCS_OK) {
      PS_VLOG(1) << "UCX van: refused a connection: " << ucs_status_string(st);
      return;
    }
    self->accepted_.push_back(handle);
    self->addresses_[handle] = address;
  }

  static void OnPeerFailed(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* peer = static_cast<Peer*>(arg);
    PS_VLOG(1) << "UCX van: connection to " << peer->host << ":" << peer->port << " failed: "
               << ucs_status_string(status);
    peer->failed = true;
  }

  // A peer that sent to us went away (it finished, or died: the heartbeats tell which).
  static void OnAcceptedFailed(void*, ucp_ep_h, ucs_status_t status) {
    PS_VLOG(2) << "UCX van: an incoming connection closed: " << ucs_status_string(status);
  }

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  int worker_fd_ = -1;
  int wake_fd_ = -1;
  int64_t max_bytes_ = 0;
  int port_ = 0;     // the listener's
  std::string message_key_;  // from the job secret; "" without one (no authentication)
  // Guarded by worker_mu_ (used in callbacks): the endpoints opened to us, which said a good
  // hello; accepted endpoints' addresses, for log lines.
  std::unique_ptr<auth::Inbound> inbound_;
  std::unordered_map<ucp_ep_h, std::string> addresses_;
  auth::RateLimit drop_log_;
  std::mutex worker_mu_;
  std::unordered_map<int, std::unique_ptr<Peer>> peers_;
  std::vector<ucp_ep_h> accepted_;
  std::mutex inbox_mu_;
  std::deque<std::shared_ptr<Incoming>> inbox_;
  std::atomic<bool> stopped_{false};
  std::atomic<long> dropped_{0};
};

}  // namespace

std::unique_ptr<Van> MakeUcxVan() { return std::make_unique<UcxVan>(); }

bool SendRawUcxMessage(const std::string& host, int port, const std::string& header, const std::string& payload) {
  UcxVan van;
  van.Connect(0, host, port);
  auto bytes = std::make_shared<std::string>(payload);
  auto message = [&] {
    auto out = std::make_unique<Outgoing>();
    out->head = header;
    if (!bytes->empty()) out->iov.push_back({&(*bytes)[0], bytes->size()});
    out->owners.push_back(bytes);
    return out;
  };
  // With this process's job secret, behind a tag of its own (the listener reads the header as
  // the van's); without one, or where the listener refused our hello, as the bytes are.
  // The van's destructor flushes the send.
  return van.Post(0, message(), /*seal=*/true, 2) || van.Post(0, message(), /*seal=*/false, 0);
}

}  // namespace ps
