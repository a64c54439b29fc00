// The hung-collective watchdog; see watchdog.h.
#include "brigade/dist/watchdog.h"

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/dist/process_group.h"

namespace brigade::dist {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One per thread that has made a blocking MPI call (main, communication threads).
struct Slot {
  std::atomic<bool> used{false};
  std::atomic<const char*> op{nullptr};  // non-null while the thread waits in an operation
  std::atomic<int> ranks{0};
  std::atomic<int64_t> since_ns{0};     // start of the current operation
  std::atomic<int64_t> last_end_ns{0};  // end of the previous one (0: none yet)
};
constexpr int kSlots = 32;
Slot g_slots[kSlots];

// The thread's slot, given back when the thread ends (communication threads come and go).
struct ThreadSlot {
  int index = -2;  // -2: not assigned yet; -1: none was free (the thread is not watched)
  int depth = 0;
  ~ThreadSlot() {
    if (index >= 0) {
      g_slots[index].op.store(nullptr);
      g_slots[index].used.store(false);
    }
  }
  int get() {
    if (index == -2) {
      index = -1;
      for (int i = 0; i < kSlots; ++i) {
        bool expected = false;
        if (g_slots[i].used.compare_exchange_strong(expected, true)) {
          g_slots[i].last_end_ns.store(0);
          index = i;
          break;
        }
      }
    }
    return index;
  }
};
thread_local ThreadSlot t_slot;

// What a rank answers when asked.
struct Answer {
  int32_t waiting = 0;  // 1: in an operation
  int32_t ranks = 0;
  double seconds = 0;  // in the operation, or since the last one ended (-1: none yet)
  char op[40] = {0};
};

Answer status_now() {
  Answer a;
  const int64_t now = now_ns();
  int64_t last_end = 0, since = 0;
  for (Slot& s : g_slots) {
    if (!s.used.load()) continue;
    const char* op = s.op.load();
    if (op != nullptr && (a.waiting == 0 || s.since_ns.load() < since)) {
      a.waiting = 1;
      since = s.since_ns.load();
      a.ranks = s.ranks.load();
      std::snprintf(a.op, sizeof a.op, "%s", op);
    }
    last_end = std::max(last_end, s.last_end_ns.load());
  }
  if (a.waiting)
    a.seconds = double(now - since) * 1e-9;
  else
    a.seconds = last_end > 0 ? double(now - last_end) * 1e-9 : -1.0;
  return a;
}

constexpr int kTagQuery = 1, kTagAnswer = 2;

class Runner {
 public:
  Runner(MPI_Comm comm, double timeout) : comm_(comm), timeout_(timeout) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    thread_ = std::thread([this] { loop(); });
  }
  ~Runner() {
    stop_.store(true);
    thread_.join();
  }
  void set_timeout(double t) { timeout_.store(t); }

 private:
  void serve() {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, kTagQuery, comm_, &flag, &st);
      if (!flag) return;
      char q = 0;
      MPI_Recv(&q, 1, MPI_BYTE, st.MPI_SOURCE, kTagQuery, comm_, MPI_STATUS_IGNORE);
      const Answer a = status_now();
      MPI_Send(&a, int(sizeof a), MPI_BYTE, st.MPI_SOURCE, kTagAnswer, comm_);
    }
  }

  void loop() {
    while (!stop_.load()) {
      serve();
      const int64_t now = now_ns();
      for (Slot& s : g_slots) {
        if (!s.used.load()) continue;
        const char* op = s.op.load();
        if (op == nullptr) continue;
        const double waited = double(now - s.since_ns.load()) * 1e-9;
        if (waited > timeout_.load()) diagnose_and_abort(op, s.ranks.load(), waited);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  [[noreturn]] void diagnose_and_abort(const char* op, int ranks, double waited) {
    std::vector<Answer> answers(static_cast<size_t>(size_));
    std::vector<MPI_Request> sends(size_t(size_), MPI_REQUEST_NULL), recvs(size_t(size_), MPI_REQUEST_NULL);
    std::vector<int> got(size_t(size_), 0);
    char q = 1;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      MPI_Isend(&q, 1, MPI_BYTE, p, kTagQuery, comm_, &sends[size_t(p)]);
      MPI_Irecv(&answers[size_t(p)], int(sizeof(Answer)), MPI_BYTE, p, kTagAnswer, comm_, &recvs[size_t(p)]);
    }
    const int64_t deadline = now_ns() + int64_t(Watchdog::kAnswerSeconds * 1e9);
    for (int left = size_ - 1; left > 0 && now_ns() < deadline;) {
      serve();  // the others may be asking too
      for (int p = 0; p < size_; ++p) {
        if (p == rank_ || got[size_t(p)]) continue;
        int flag = 0;
        MPI_Test(&recvs[size_t(p)], &flag, MPI_STATUS_IGNORE);
        if (flag) {
          got[size_t(p)] = 1;
          --left;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::string missing, waiting;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const Answer& a = answers[size_t(p)];
      std::string item;
      if (!got[size_t(p)]) {
        item = fmt::format("rank {} (does not answer: stopped, hung or gone)", p);
      } else if (!a.waiting) {
        item = a.seconds < 0 ? fmt::format("rank {} (busy, in no collective yet)", p)
                             : fmt::format("rank {} (busy outside collectives for {:.0f} s)", p, a.seconds);
      } else if (std::strncmp(a.op, op, sizeof a.op) != 0 || a.ranks != ranks) {
        item = fmt::format("rank {} (waiting in {} over {} ranks for {:.0f} s)", p, a.op, a.ranks, a.seconds);
      } else {
        waiting += fmt::format("{}{}", waiting.empty() ? "" : ", ", p);
        continue;
      }
      missing += (missing.empty() ? "" : ", ") + item;
    }
    const std::string msg = fmt::format(
        "parallel.timeout_s = {:g}: {} over {} ranks has not completed after {:.0f} s; not arrived: {}{}; ending the "
        "job (raise parallel.timeout_s if a rank is legitimately slow)",
        timeout_.load(), op, ranks, waited, missing.empty() ? "none found (all answered waiting)" : missing,
        waiting.empty() ? "" : fmt::format(" (waiting with this rank: {})", waiting));
    std::fflush(stdout);
    std::fprintf(stderr, "\nbrigade: error: [rank %d of %d] %s\n", rank_, size_, msg.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
  }

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::atomic<double> timeout_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

std::mutex g_mu;
std::unique_ptr<Runner> g_runner;
MPI_Comm g_comm = MPI_COMM_NULL;  // the watchdog's own duplicate of MPI_COMM_WORLD

}  // namespace

std::string Watchdog::start(double timeout_s) {
  if (!Env::using_mpi() || Env::world_size() == 1 || !(timeout_s > 0)) return "";
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_runner) {
    g_runner->set_timeout(timeout_s);
    return "";
  }
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE)
    return fmt::format(
        "parallel.timeout_s = {:g} is not enforced: the hung-rank watchdog needs MPI_THREAD_MULTIPLE, "
        "and this MPI library provides less (a hung rank then hangs the job)",
        timeout_s);
  if (g_comm == MPI_COMM_NULL) MPI_Comm_dup(MPI_COMM_WORLD, &g_comm);
  g_runner = std::make_unique<Runner>(g_comm, timeout_s);
  return "";
}

void Watchdog::stop() {
  std::lock_guard<std::mutex> lk(g_mu);
  g_runner.reset();
}

bool Watchdog::running() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_runner != nullptr;
}

WatchScope::WatchScope(const char* op, int ranks) {
  if (t_slot.depth++ > 0) return;
  slot_ = t_slot.get();
  if (slot_ < 0) return;
  Slot& s = g_slots[slot_];
  s.ranks.store(ranks, std::memory_order_relaxed);
  s.since_ns.store(now_ns(), std::memory_order_relaxed);
  s.op.store(op, std::memory_order_release);
}

WatchScope::~WatchScope() {
  --t_slot.depth;
  if (slot_ < 0) return;
  Slot& s = g_slots[slot_];
  s.op.store(nullptr, std::memory_order_release);
  s.last_end_ns.store(now_ns(), std::memory_order_relaxed);
}

}  // namespace brigade::dist
