// Helpers shared by the end-to-end tests that run the `brigade` binary: the tiny
// structured corpus they train on, reading a file whole, the Open MPI environment
// for mpirun as root on shared memory, and a command result.
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

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

}  // namespace brigade::test_support
