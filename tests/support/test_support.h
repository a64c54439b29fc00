// Helpers shared by the end-to-end tests that run the `brigade` binary: the tiny
// structured corpus they train on, reading a file whole, the Open MPI environment
// for mpirun as root on shared memory, running a command, and a test's own folder.
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace brigade::test_support {

// File contents ("" if missing).
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// 3000 short sentences of a small grammar, written deterministically: enough
// structure to learn from in a few steps, and enough text for a 128-token BPE.
inline void write_tiny_corpus(const std::filesystem::path& p) {
  const char* subj[] = {"the king", "a shepherd", "the people", "my servant", "the prophet", "his son"};
  const char* verb[] = {"went up to", "spake unto", "came down from", "looked upon", "dwelt in", "built"};
  const char* obj[] = {"the city", "the mountain", "the temple", "the river", "the house of bread", "the land"};
  std::ofstream f(p);
  uint32_t s = 12345;
  auto pick = [&](int n) {
    s = s * 1664525u + 1013904223u;
    return int((s >> 16) % uint32_t(n));
  };
  for (int i = 0; i < 3000; ++i) {
    const int a = pick(6), b = pick(6), c = pick(6);
    f << "And " << subj[a] << " " << verb[b] << " " << obj[c] << ", and it was good.\n";
  }
}

// Open MPI as root, on shared memory, idle ranks yielding (ranks outnumber cores), one thread each.
inline constexpr const char* kMpiEnv =
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader "
    "OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1";

struct CmdResult {
  int code = -1;
  std::string out, err;
  double seconds = 0;
};

// Runs the shell command line `command` in `dir`, its stdout and stderr into dir/stdout.txt and
// dir/stderr.txt: the exit status (128 + the signal when killed), both outputs and the seconds.
inline CmdResult run_in(const std::filesystem::path& dir, const std::string& command) {
  const std::filesystem::path out = dir / "stdout.txt", err = dir / "stderr.txt";
  const std::string cmd =
      "cd '" + dir.string() + "' && " + command + " >'" + out.string() + "' 2>'" + err.string() + "'";
  const auto t0 = std::chrono::steady_clock::now();
  const int st = std::system(cmd.c_str());
  CmdResult r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

// The launcher to put before a `brigade` command line: np > 0 ranks under `mpirun` (kMpiEnv), or
// np == 0 one plain process (the MPI launch variables unset, so a test itself started by mpirun
// does not make it a rank), with `env` settings and a hard time limit.
inline std::string launcher(int np, const std::string& mpirun, const std::string& env = "", int limit_s = 300) {
  const std::string limit = " timeout " + std::to_string(limit_s);
  return np > 0 ? "env " + std::string(kMpiEnv) + " " + env + limit + " " + mpirun +
                      " --oversubscribe --bind-to none -np " + std::to_string(np)
                : "env -u OMPI_COMM_WORLD_SIZE -u PMIX_RANK -u PMI_RANK " + env + limit;
}

// True when `mpirun` names an executable.
inline bool have_mpirun(const std::string& mpirun) { return !mpirun.empty() && ::access(mpirun.c_str(), X_OK) == 0; }

// A fresh, empty folder under the temp directory, named by `prefix`, the running test and the pid.
inline std::filesystem::path fresh_test_dir(const std::string& prefix) {
  std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();  // "Name/param" for TEST_P
  for (char& c : test)
    if (c == '/') c = '_';
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / (prefix + "_" + test + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// The test-time oracles scripts/install-deps.sh installs from npm into third_party/npm/: empty
// when node and `files` (paths inside the package `pkg`) are there, else what is missing and the
// command that installs it.
inline std::string npm_oracle_missing(const std::string& pkg, const std::string& version,
                                      const std::vector<std::string>& files) {
  if (std::system("command -v node >/dev/null 2>&1") != 0)
    return "node is not installed: run scripts/install-deps.sh (it installs nodejs and the npm packages)";
  const std::filesystem::path dir =
      std::filesystem::path(BRIGADE_SOURCE_DIR) / "third_party" / "npm" / "node_modules" / pkg;
  for (const std::string& f : files)
    if (!std::filesystem::is_regular_file(dir / f))
      return (dir / f).string() + " is missing: run scripts/install-deps.sh (npm install " + pkg + "@" + version +
             " into third_party/npm)";
  return "";
}

}  // namespace brigade::test_support
