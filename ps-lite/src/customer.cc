#include "customer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace ps {
namespace {

// Copies a chunk of a part's rows into the request's rows; "" or what is wrong with it.
std::string TakeChunk(Request& req, const Part& part, const Message& msg) {
  const int64_t off = msg.meta.offset();
  const size_t row_bytes = static_cast<size_t>(req.row_bytes);
  if (!req.rows_data || msg.data.size() != 1 || row_bytes == 0 || msg.data[0].size % row_bytes != 0)
    return "server answer has the wrong size";
  const int64_t m = static_cast<int64_t>(msg.data[0].size / row_bytes);
  if (off < 0 || off + m > part.size()) return "server answer has the wrong size";
  const char* src = msg.data[0].data;
  if (part.contiguous) {
    std::memcpy(req.rows_data + (part.begin + off) * row_bytes, src, m * row_bytes);
  } else {
    for (int64_t i = 0; i < m; ++i)
      std::memcpy(req.rows_data + part.pos[off + i] * row_bytes, src + i * row_bytes, row_bytes);
  }
  return "";
}

}  // namespace

int64_t Customer::Track(const std::shared_ptr<Request>& req) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!failure_.empty()) {
    std::lock_guard<std::mutex> rl(req->mu);
    req->error = failure_;
    req->abandoned = true;
    return 0;
  }
  req->remaining = static_cast<int>(req->parts.size());
  req->sent = std::chrono::steady_clock::now();
  const int64_t ts = next_ts_++;
  if (req->remaining > 0) pending_[ts] = req;
  return ts;
}

void Customer::OnResponse(Message& msg) {
  std::shared_ptr<Request> req;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = pending_.find(msg.meta.timestamp());
    if (it == pending_.end()) return;  // late answer to a request that already failed
    req = it->second;
  }
  std::lock_guard<std::mutex> rl(req->mu);
  for (auto& part : req->parts) {
    if (part.node != msg.meta.sender() || part.answered) continue;
    if (msg.meta.chunked()) {
      std::string err = msg.meta.error().empty() ? TakeChunk(*req, part, msg) : msg.meta.error();
      if (!err.empty() && req->error.empty()) {
        req->error = err;
        req->cv.notify_all();
      }
      if (msg.meta.more()) return;  // the part is answered by its last chunk
      part.chunked = true;
      msg.data.clear();
    }
    part.answered = true;
    if (!msg.meta.error().empty() && req->error.empty()) req->error = msg.meta.error();
    part.response = std::move(msg);
    if (--req->remaining == 0) {
      std::lock_guard<std::mutex> lk(mu_);
      pending_.erase(part.response.meta.timestamp());
    }
    req->cv.notify_all();
    return;
  }
}

void Customer::FailAll(const std::string& why) {
  std::map<int64_t, std::shared_ptr<Request>> failed;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (failure_.empty()) failure_ = why;
    failed.swap(pending_);
  }
  for (auto& kv : failed) {
    std::lock_guard<std::mutex> rl(kv.second->mu);
    kv.second->abandoned = true;
    if (kv.second->error.empty()) kv.second->error = why;
    kv.second->cv.notify_all();
  }
}

bool Customer::WaitSettled(const std::shared_ptr<Request>& req, double timeout_s) {
  std::unique_lock<std::mutex> rl(req->mu);
  return req->cv.wait_for(rl, std::chrono::duration<double>(timeout_s),
                          [&] { return req->remaining == 0 || req->abandoned; });
}

std::vector<Customer::Unanswered> Customer::InFlight() {
  std::vector<std::shared_ptr<Request>> pending;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& kv : pending_) pending.push_back(kv.second);
  }
  const auto now = std::chrono::steady_clock::now();
  std::vector<Unanswered> out;
  for (const auto& req : pending) {
    Unanswered u;
    std::lock_guard<std::mutex> rl(req->mu);
    u.what = req->what;
    u.seconds = std::chrono::duration<double>(now - req->sent).count();
    for (const auto& p : req->parts)
      if (!p.answered) u.owed_by.push_back(describe_(p.node));
    if (!u.owed_by.empty()) out.push_back(std::move(u));
  }
  return out;
}

std::string Customer::failure() {
  std::lock_guard<std::mutex> lk(mu_);
  return failure_;
}

void Customer::Wait(const std::shared_ptr<Request>& req, double timeout_s) {
  if (wait_spin_s_ > 0) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(std::min(wait_spin_s_, timeout_s));
    while (!req->finished() && std::chrono::steady_clock::now() < until)
      std::this_thread::yield();
  }
  std::unique_lock<std::mutex> rl(req->mu);
  const bool ok = req->cv.wait_for(rl, std::chrono::duration<double>(timeout_s),
                                   [&] { return req->remaining == 0 || !req->error.empty(); });
  if (!req->error.empty()) throw std::runtime_error(req->what + " failed: " + req->error);
  if (!ok) {
    std::string missing;
    for (const auto& p : req->parts)
      if (!p.answered) missing += (missing.empty() ? "" : ", ") + describe_(p.node);
    throw std::runtime_error(req->what + ": no answer after " + std::to_string(timeout_s) + " s from " + missing);
  }
}

}  // namespace ps
