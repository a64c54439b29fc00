// Communication thread; see comm_queue.h.
#include "brigade/parallel/comm_queue.h"

#include <chrono>

namespace brigade::parallel {

using Clock = std::chrono::steady_clock;

CommQueue::CommQueue(bool threaded) : threaded_(threaded) {
  if (threaded_) thread_ = std::thread([this] { loop(); });
}

CommQueue::~CommQueue() {
  if (threaded_) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_work_.notify_all();
    thread_.join();
  }
}

int64_t CommQueue::submit(std::function<void()> task) {
  if (!threaded_) {
    const auto t0 = Clock::now();
    ++submitted_;
    try {
      task();
    } catch (...) {
      if (!error_) error_ = std::current_exception();
    }
    ++completed_;
    wait_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    return submitted_;
  }
  int64_t ticket;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ticket = ++submitted_;
    tasks_.emplace_back(ticket, std::move(task));
  }
  cv_work_.notify_one();
  return ticket;
}

void CommQueue::wait(int64_t ticket) {
  const auto t0 = Clock::now();
  std::unique_lock<std::mutex> lk(mu_);
  cv_done_.wait(lk, [&] { return completed_ >= ticket || error_; });
  wait_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void CommQueue::wait_all() {
  int64_t last;
  {
    std::lock_guard<std::mutex> lk(mu_);
    last = submitted_;
  }
  wait(last);
}

void CommQueue::loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_work_.wait(lk, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stop requested and nothing left
      task = std::move(tasks_.front().second);
      tasks_.pop_front();
    }
    std::exception_ptr err;
    try {
      task();
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++completed_;
      if (err && !error_) error_ = err;
    }
    cv_done_.notify_all();
  }
}

}  // namespace brigade::parallel
