// Restarting a crashed training process; see supervise.h.
#include "brigade/cli/supervise.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include "brigade/core/error.h"
#include "brigade/dist/process_group.h"
#include "brigade/train/checkpoint.h"

namespace brigade::cli {

namespace {

volatile sig_atomic_t g_child = 0;
// SIGTERM to the supervisor goes to the training process, which checkpoints and exits (130).
extern "C" void forward_term(int) {
  if (g_child > 0) ::kill(pid_t(g_child), SIGTERM);
}

// The checkpoint's state.json as it is now ("" when there is none): a restart resumes only from a
// checkpoint this supervision wrote, never from an older run's left in the same run.out_dir.
std::string checkpoint_identity(const std::string& dir) {
  try {
    if (!train::checkpoint_exists(dir)) return "";
  } catch (const Error&) {
    return "";
  }
  std::ifstream f(dir + "/state.json", std::ios::binary);
  return f ? std::string(std::istreambuf_iterator<char>(f), {}) : std::string();
}

}  // namespace

int supervise(int max_restarts, const std::string& ckpt_dir, bool resume, const std::function<int(bool)>& body) {
  BRIGADE_CHECK(max_restarts >= 0, ConfigError, "--max-restarts {}: must be >= 0", max_restarts);
  BRIGADE_CHECK(!dist::Env::using_mpi(), ConfigError,
                "--max-restarts restarts one training process; under mpirun one rank's death ends the whole job, so "
                "loop the launcher instead: `for i in 1 2 3; do mpirun ... brigade train R --resume-if-any && break; "
                "done` (docs/reliability.md)");
  const std::string before = checkpoint_identity(ckpt_dir);
  struct sigaction term {
  }, old_term{}, ign{}, old_int{};
  term.sa_handler = forward_term;
  sigemptyset(&term.sa_mask);
  ign.sa_handler = SIG_IGN;  // Ctrl-C reaches the child too (same process group); it checkpoints and exits
  sigemptyset(&ign.sa_mask);
  sigaction(SIGTERM, &term, &old_term);
  sigaction(SIGINT, &ign, &old_int);
  auto restore = [&] {
    sigaction(SIGTERM, &old_term, nullptr);
    sigaction(SIGINT, &old_int, nullptr);
  };
  bool resume_now = resume;
  for (int attempt = 0;; ++attempt) {
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) {
      restore();
      throw IoError(fmt::format("--max-restarts: cannot start the training process (fork: {})", std::strerror(errno)));
    }
    if (pid == 0) {
      sigaction(SIGTERM, &old_term, nullptr);
      sigaction(SIGINT, &old_int, nullptr);
      ::setenv("BRIGADE_ATTEMPT", std::to_string(attempt).c_str(), 1);
      const int code = body(resume_now);
      std::fflush(nullptr);
      std::exit(code);
    }
    g_child = pid;
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    g_child = 0;
    if (WIFEXITED(status)) {
      restore();
      return WEXITSTATUS(status);
    }
    const int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    const std::string now = checkpoint_identity(ckpt_dir);
    resume_now = resume || (!now.empty() && now != before);
    if (attempt >= max_restarts) {
      restore();
      fmt::print(stderr,
                 "brigade: error: the training process was killed by signal {} ({}) after {} restart{} "
                 "(--max-restarts {}); {}\n",
                 sig, strsignal(sig), attempt, attempt == 1 ? "" : "s", max_restarts,
                 now.empty() ? "no checkpoint was written"
                             : "the last checkpoint is in " + ckpt_dir + ": continue with --resume");
      return 1;
    }
    fmt::print(stderr, "brigade: the training process was killed by signal {} ({}); restart {} of {} {}\n", sig,
               strsignal(sig), attempt + 1, max_restarts,
               resume_now ? "from the checkpoint in " + ckpt_dir : std::string("from the start (no checkpoint yet)"));
  }
}

}  // namespace brigade::cli
