#include "customer.h"

#include <chrono>
#include <stdexcept>

namespace ps {

int64_t Customer::Track(const std::shared_ptr<Request>& req) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!failure_.empty()) {
    std::lock_guard<std::mutex> rl(req->mu);
    req->error = failure_;
    req->abandoned = true;
    return 0;
  }
  req->remaining = static_cast<int>(req->parts.size());
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

std::string Customer::failure() {
  std::lock_guard<std::mutex> lk(mu_);
  return failure_;
}

void Customer::Wait(const std::shared_ptr<Request>& req, double timeout_s) {
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
