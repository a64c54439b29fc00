// GoogleTest main for test binaries that run under mpirun (and also without it,
// as one rank). Every rank runs the same tests in the same order (they call
// collectives together). Rank 0 prints the usual gtest report; other ranks print
// only their failures, as "[rank r] file:line: Test.Name\nmessage". The exit status
// is non-zero on every rank when any rank failed (MAX over ranks of the local
// result, taken before MPI_Finalize), so mpirun and CTest see the failure whichever
// rank it happened on.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "brigade/dist/process_group.h"

namespace {

// Prints this rank's failed assertions with the rank in front (stderr, flushed at
// once so that lines from different ranks do not interleave mid-line).
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  // The test name is taken here: OnTestPartResult runs with gtest's lock held, so it
  // must not call UnitTest::current_test_info() (that would deadlock).
  void OnTestStart(const ::testing::TestInfo& info) override {
    test_ = std::string(info.test_suite_name()) + "." + info.name();
  }
  void OnTestEnd(const ::testing::TestInfo&) override { test_ = "(outside a test)"; }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::string where = result.file_name() ? result.file_name() : "unknown file";
    if (result.line_number() >= 0) where += ":" + std::to_string(result.line_number());
    const std::string text =
        "[rank " + std::to_string(rank_) + "] " + where + ": " + test_ + "\n" + result.message() + "\n";
    std::fputs(text.c_str(), stderr);
    std::fflush(stderr);
  }

 private:
  int rank_;
  std::string test_ = "(outside a test)";
};

}  // namespace

int main(int argc, char** argv) {
  using brigade::dist::Env;
  try {
    Env::init(&argc, &argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "MPI initialisation failed: %s\n", e.what());
    return 1;
  }
  ::testing::InitGoogleTest(&argc, argv);
  const int rank = Env::world_rank(), size = Env::world_size();
  if (rank != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  const int local = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int failed = local;
  if (Env::using_mpi()) {
    MPI_Allreduce(&local, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    std::vector<int> per_rank(static_cast<size_t>(size));
    MPI_Gather(&local, 1, MPI_INT, per_rank.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (rank == 0 && failed) {
      std::string ranks;
      for (int r = 0; r < size; ++r)
        if (per_rank[static_cast<size_t>(r)]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      std::fprintf(stderr, "FAILED on rank(s) %s of %d\n", ranks.c_str(), size);
    }
  }
  Env::finalize();
  return failed ? 1 : 0;
}
