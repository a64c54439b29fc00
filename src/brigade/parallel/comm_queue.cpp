// Communication thread; see comm_queue.h.
#include "brigade/parallel/comm_queue.h"

#include <algorithm>
#include <chrono>

#include "brigade/core/thread_clock.h"

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
    const double c0 = thread_cpu_seconds();
    ++submitted_;
    peak_pending_ = std::max<int64_t>(peak_pending_, 1);
    try {
      task();
    } catch (...) {
      if (!error_) error_ = std::current_exception();
    }
    ++completed_;
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    wait_s_ += wall;
    task_wall_s_ += wall;
    task_cpu_s_ += thread_cpu_seconds() - c0;
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    return submitted_;
  }
  int64_t ticket;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ticket = ++submitted_;
    tasks_.emplace_back(ticket, std::move(task));
    peak_pending_ = std::max(peak_pending_, submitted_ - completed_);
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

int64_t CommQueue::peak_pending() const {
  std::lock_guard<std::mutex> lk(mu_);
  return peak_pending_;
}

void CommQueue::reset_peak_pending() {
  std::lock_guard<std::mutex> lk(mu_);
  peak_pending_ = submitted_ - completed_;
}

double CommQueue::task_cpu_seconds() const {
  std::lock_guard<std::mutex> lk(mu_);
  return task_cpu_s_;
}

double CommQueue::task_wall_seconds() const {
  std::lock_guard<std::mutex> lk(mu_);
  return task_wall_s_;
}

void CommQueue::reset_task_seconds() {
  std::lock_guard<std::mutex> lk(mu_);
  task_cpu_s_ = task_wall_s_ = 0.0;
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
    const auto t0 = Clock::now();
    const double c0 = thread_cpu_seconds();
    try {
      task();
    } catch (...) {
      err = std::current_exception();
    }
    const double cpu = thread_cpu_seconds() - c0;
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    {
      std::lock_guard<std::mutex> lk(mu_);
      task_cpu_s_ += cpu;
      task_wall_s_ += wall;
      ++completed_;
      if (err && !error_) error_ = err;
    }
    cv_done_.notify_all();
  }
}

}  // namespace brigade::parallel
