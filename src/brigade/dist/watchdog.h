// A watchdog for hung collectives (parallel.timeout_s). Every blocking MPI operation of a
// ProcessGroup marks its thread as waiting in it (WatchScope). A watchdog thread per rank checks
// those marks; when one has waited longer than the timeout it asks every other rank, on a
// communicator of its own, what it is doing, waits up to kAnswerSeconds for the answers, prints
// one error line naming the operation and the ranks that did not arrive (those that do not answer:
// stopped or hung; those busy outside any collective, and for how long; those waiting in another
// operation), and ends the job with MPI_Abort. A rank stopped with SIGSTOP therefore ends the job
// within timeout + kAnswerSeconds + the launcher's kill time instead of hanging it for ever.
//
// Each watchdog thread also answers the other ranks' questions, so it runs MPI calls beside the
// main and communication threads: it needs MPI_THREAD_MULTIPLE (start() says so and leaves the
// watchdog off when the library provides less).
#pragma once
#include <string>

namespace brigade::dist {

class Watchdog {
 public:
  static constexpr double kAnswerSeconds = 3.0;
  // Collective over MPI_COMM_WORLD (every rank calls it with the same timeout). Without MPI, with
  // one rank or with timeout_s <= 0 it does nothing and returns "". Returns a warning to print
  // when the watchdog cannot run (the MPI thread level). Calling it again while running changes
  // the timeout only.
  static std::string start(double timeout_s);
  static void stop();  // joins the thread (not collective); MPI_Finalize also stops it
  static bool running();
};

// The calling thread waits in a blocking MPI operation `op` over a group of `ranks` ranks while
// this lives (nested scopes keep the outermost one). Cheap: a few relaxed atomic stores.
class WatchScope {
 public:
  WatchScope(const char* op, int ranks);
  ~WatchScope();
  WatchScope(const WatchScope&) = delete;
  WatchScope& operator=(const WatchScope&) = delete;

 private:
  int slot_ = -1;
};

}  // namespace brigade::dist
