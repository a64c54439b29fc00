// `brigade train --max-restarts N`: training in a child process, restarted from the latest valid
// checkpoint when it dies by a signal (SIGKILL from the OOM killer or a user, SIGSEGV, SIGBUS,
// SIGABRT, ...). Resume is bitwise (data position, RNG, optimizer and scaler state travel in the
// checkpoint), so a run restarted any number of times ends with the weights of an uninterrupted
// run. An exit with a status (an error with its message, success, 130 after Ctrl-C) is final: a
// bad recipe, a full disk or a diverged loss would fail again the same way.
//
// One process only: under mpirun, one rank's death ends the job (MPI_Abort) and the launcher
// must be looped instead, with --resume-if-any (docs/reliability.md).
#pragma once
#include <functional>
#include <string>

namespace brigade::cli {

// Runs `body(resume)` in a child process (with BRIGADE_ATTEMPT = restarts so far in its
// environment) up to 1 + max_restarts times. `resume` is the user's --resume for the first
// child; a restarted child resumes when `ckpt_dir` holds a checkpoint written during this
// supervision (or the user asked for --resume), else it starts afresh. Returns the last child's
// exit status, or 1 after the last restart died too (with a message naming the signal).
int supervise(int max_restarts, const std::string& ckpt_dir, bool resume, const std::function<int(bool)>& body);

}  // namespace brigade::cli
