// A communication thread: tasks (collectives) run one at a time, in submission
// order, on a dedicated thread, so they progress while the main thread computes
// (MPI_Iallreduce would not progress on its own). The main thread waits on a
// ticket, or on everything; the time it spends blocked is the "communication
// wait" the trainer reports. With threaded = false tasks run inline at submit
// (no overlap; used for single-rank groups and parallel.overlap = false).
// MPI safety: while tasks may be pending, only this thread calls MPI; the main
// thread calls MPI only after wait_all() (MPI_THREAD_SERIALIZED is enough).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace brigade::parallel {

class CommQueue {
 public:
  explicit CommQueue(bool threaded);
  ~CommQueue();
  CommQueue(const CommQueue&) = delete;
  CommQueue& operator=(const CommQueue&) = delete;

  // Enqueues a task; returns its ticket (increasing from 1).
  int64_t submit(std::function<void()> task);
  // Blocks until the task with this ticket (and all before it) has run. Rethrows
  // the first exception a task raised.
  void wait(int64_t ticket);
  void wait_all();
  bool threaded() const { return threaded_; }
  // Seconds the caller spent blocked in wait()/wait_all(), and running inline tasks.
  double wait_seconds() const { return wait_s_; }
  void reset_wait_seconds() { wait_s_ = 0.0; }
  // CPU seconds the tasks themselves used (on the communication thread, or inline), and their
  // wall seconds: on a machine whose cores the compute threads already fill, the CPU seconds are
  // taken from the compute even when the wait above is zero.
  double task_cpu_seconds() const;
  double task_wall_seconds() const;
  void reset_task_seconds();
  // The most tasks queued or running at once (counted at each submit; an inline task is 1), since
  // construction or the last reset (which starts from those pending then).
  int64_t peak_pending() const;
  void reset_peak_pending();

 private:
  void loop();
  bool threaded_;
  mutable std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  std::deque<std::pair<int64_t, std::function<void()>>> tasks_;
  int64_t submitted_ = 0, completed_ = 0, peak_pending_ = 0;  // guarded by mu_ (threaded)
  bool stop_ = false;
  std::exception_ptr error_;
  double wait_s_ = 0.0;
  double task_cpu_s_ = 0.0, task_wall_s_ = 0.0;  // guarded by mu_
  std::thread thread_;
};

}  // namespace brigade::parallel
