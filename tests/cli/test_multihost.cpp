// Two emulated hosts: network namespaces joined by a veth pair, Open MPI over TCP only (btl
// self,tcp, pml ob1) with a hostfile naming the two addresses and the remote daemon started
// through an agent that enters the second namespace (tests/cli/multihost/netns_mpirun.sh). The
// `brigade` binary trains data-parallel across them (dp 2, one rank per host) and must match one
// process with the same global batch within 1e-5. Skipped, saying why, where namespaces cannot
// be created (not root, no CAP_NET_ADMIN, no `ip`).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "support/recipes.h"
#include "support/tiny_models.h"

namespace fs = std::filesystem;
using namespace brigade;

namespace {

const std::string kLauncher = std::string(BRIGADE_SOURCE_DIR) + "/tests/cli/multihost/netns_mpirun.sh";

TEST(MultiHost, DataParallelOverTcpBetweenTwoNamespacesMatchesOneProcess) {
  // 12 steps of 8 rows at context 16 (seed 3), an evaluation and a checkpoint every 6 steps
  const fs::path dir = test_support::write_tiny_run(
      test_support::fresh_test_dir("brigade_multihost"),
      test_support::tiny_gpt_recipe(
          {"run.seed=3", "model.block_size=16", "train.seq_len=16", "train.eval_every=6", "train.checkpoint_every=6"}));
  const std::string train = test_support::kBrigade + " train tiny.toml --quiet --no-sample";
  // prepare the data once, as one process (then both hosts read the same folder)
  const test_support::CmdResult one = test_support::run_in(dir, train + " --set run.out_dir=one");
  ASSERT_EQ(one.code, 0) << one.err;
  const test_support::CmdResult two = test_support::run_in(
      dir, "NETNS_MPIRUN_TIMEOUT=300 NETNS_MPIRUN_STATS=1 bash " + kLauncher + " 1 -- " + train +
               " --set run.out_dir=two --set parallel.dp=2 --set train.batch_size=4 --set parallel.zero=1");
  if (two.code == 77) {
    fs::remove_all(dir);
    GTEST_SKIP() << two.err;
  }
  ASSERT_EQ(two.code, 0) << two.err;
  // the gradients crossed the veth: at least one fp32 gradient per step went each way
  std::smatch m;
  ASSERT_TRUE(std::regex_search(two.err, m, std::regex("before: (\\d+) (\\d+) after: (\\d+) (\\d+)"))) << two.err;
  const double sent = std::stod(m[3]) - std::stod(m[1]), received = std::stod(m[4]) - std::stod(m[2]);
  const double grads = 12.0 * 4.0 * 20000.0;  // steps x bytes x (fewer than the ~30k parameters)
  EXPECT_GT(sent, grads) << two.err;
  EXPECT_GT(received, grads) << two.err;
  const test_support::Curve a = test_support::read_curve(dir / "one/metrics.jsonl"),
                            b = test_support::read_curve(dir / "two/metrics.jsonl");
  ASSERT_EQ(a.loss.size(), 12u);
  test_support::expect_close(b.loss, a.loss, "loss", 1e-5);
  test_support::expect_close(b.val_loss, a.val_loss, "val_loss", 1e-5);
  // the checkpoint the two hosts wrote together resumes as one process
  EXPECT_EQ(test_support::run_in(dir, train + " --set run.out_dir=two --resume --set train.steps=14").code, 0);
  fs::remove_all(dir);
}

}  // namespace
