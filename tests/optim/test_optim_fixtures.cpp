// LAMB and SGD (momentum, Nesterov) against PyTorch references over 10 steps:
// tests/fixtures/optim_{lamb,sgd}.safetensors, made by tests/reference/make_optim_fixtures.py
// (LAMB written there from the paper's formula, SGD by torch.optim.SGD itself). Every
// step's parameters, the final state and LAMB's trust ratios are compared; then LAMB
// on two simulated ZeRO shards (two threads, one parameter cut in the middle) must
// give the same result through its norm-reduction hook.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <thread>

#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/optim/optimizer.h"

using namespace brigade;

namespace {

constexpr int kSteps = 10;

struct Fixture {
  ckpt::SafetensorsReader r;
  std::vector<std::string> names;  // parameter names, in order
  std::vector<bool> decay;         // LAMB weight decay per parameter
  std::vector<double> lr;          // (kSteps)

  explicit Fixture(const std::string& file) : r(std::string(BRIGADE_FIXTURES_DIR) + "/" + file) {
    EXPECT_EQ(r.metadata("magic").value_or(""), "brigade-fixture");
    // params = ["a", "b", ...] and decay = [true, false, ...] (JSON written by the script)
    const std::string p = r.metadata("params").value_or("");
    for (size_t i = p.find('"'); i != std::string::npos; i = p.find('"', i + 1)) {
      const size_t j = p.find('"', i + 1);
      names.push_back(p.substr(i + 1, j - i - 1));
      i = j;
    }
    const std::string d = r.metadata("decay").value_or("");
    for (size_t i = 0; i < d.size(); ++i) {
      if (d.compare(i, 4, "true") == 0) decay.push_back(true);
      if (d.compare(i, 5, "false") == 0) decay.push_back(false);
    }
    lr = f64("lr");
    EXPECT_EQ(names.size(), 5u);
    EXPECT_EQ(decay.size(), names.size());
    EXPECT_EQ(lr.size(), size_t(kSteps));
  }
  std::vector<double> f64(const std::string& name) const {
    const std::string b = r.raw_bytes(name);
    std::vector<double> v(b.size() / sizeof(double));
    std::memcpy(v.data(), b.data(), b.size());
    return v;
  }
  Tensor get(const std::string& name) const { return r.get(name); }
  // Fresh parameters (requires_grad, zero grad) from "<prefix>.init.<name>".
  nn::NamedTensors init(const std::string& prefix) const {
    nn::NamedTensors out;
    for (const auto& n : names) {
      Tensor p = get(prefix + ".init." + n).clone();
      p.set_requires_grad(true);
      p.set_grad(Tensor::zeros(p.shape()));
      out.emplace_back(n, p);
    }
    return out;
  }
  void set_grads(const nn::NamedTensors& ps, int t) const {
    for (auto& [n, p] : ps) p.grad().copy_(get("grad." + std::to_string(t) + "." + n));
  }
};

// |got - want| <= rel * max|want| elementwise (relative to the tensor's scale, so entries
// that pass near zero are not held to an impossible relative bound).
void expect_close(const Tensor& got, const Tensor& want, double rel, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<float> g = got.to_vector(), w = want.to_vector();
  double scale = 0.0;
  for (float x : w) scale = std::max(scale, double(std::fabs(x)));
  const double tol = rel * std::max(scale, 1e-30);
  for (size_t i = 0; i < w.size(); ++i)
    ASSERT_NEAR(g[i], w[i], tol) << what << " element " << i << " (scale " << scale << ")";
}

bool decays_by_name(const Fixture& fx, const std::string& name) {
  auto it = std::find(fx.names.begin(), fx.names.end(), name);
  return fx.decay[size_t(it - fx.names.begin())];
}

}  // namespace

TEST(LAMB, MatchesPyTorchReferenceOverTenSteps) {
  Fixture fx("optim_lamb.safetensors");
  nn::NamedTensors ps = fx.init("lamb");
  // the fixture's decay flags are Brigade's default rule (matrices only); use the default
  optim::LAMB opt(ps, optim::LAMBOptions{0.9, 0.999, 1e-6, 0.1});
  const std::vector<double> ratios = fx.f64("lamb.trust_ratio");  // (kSteps, P)
  const size_t P = fx.names.size();
  for (int t = 0; t < kSteps; ++t) {
    fx.set_grads(ps, t);
    opt.step(fx.lr[size_t(t)]);
    for (auto& [n, p] : ps) expect_close(p, fx.get("lamb.param." + std::to_string(t) + "." + n), 1e-6, n);
    ASSERT_EQ(opt.trust_ratios().size(), P);
    for (size_t i = 0; i < P; ++i)
      EXPECT_NEAR(opt.trust_ratios()[i], ratios[size_t(t) * P + i], 1e-5 * ratios[size_t(t) * P + i])
          << "step " << t << " " << fx.names[i];
  }
  // the convention: a zero-initialised bias (||w|| = 0) and a zero first gradient (||r|| = 0) give ratio 1
  EXPECT_EQ(ratios[3], 1.0);
  EXPECT_EQ(ratios[4], 1.0);
  for (auto& [n, t] : opt.state_tensors()) expect_close(t, fx.get("lamb." + n), 1e-6, n);
  EXPECT_EQ(opt.state_tensors().size(), 2 * P);
  EXPECT_EQ(opt.steps(), kSteps);
}

TEST(LAMB, StateRoundTripContinuesIdentically) {
  Fixture fx("optim_lamb.safetensors");
  nn::NamedTensors a = fx.init("lamb"), b = fx.init("lamb");
  optim::LAMB oa(a, optim::LAMBOptions{0.9, 0.999, 1e-6, 0.1});
  for (int t = 0; t < 5; ++t) {
    fx.set_grads(a, t);
    oa.step(fx.lr[size_t(t)]);
  }
  std::map<std::string, Tensor> state;
  for (auto& [n, t] : oa.state_tensors()) state.emplace(n, t.clone());
  for (size_t i = 0; i < a.size(); ++i) b[i].second.copy_(a[i].second);
  optim::LAMB ob(b, optim::LAMBOptions{0.9, 0.999, 1e-6, 0.1});
  ob.load_state(state, oa.steps());
  for (int t = 5; t < kSteps; ++t) {
    fx.set_grads(a, t);
    fx.set_grads(b, t);
    oa.step(fx.lr[size_t(t)]);
    ob.step(fx.lr[size_t(t)]);
  }
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].second.to_vector(), b[i].second.to_vector()) << a[i].first;
}

// Two "ranks" in two threads, each holding 1-D views of its part of one flat parameter
// space cut inside wte.weight (as ZeRO-1 does); the hook sums their partial norms.
TEST(LAMB, ShardedWithNormReductionMatchesWholeParameters) {
  Fixture fx("optim_lamb.safetensors");
  const nn::NamedTensors whole = fx.init("lamb");
  std::vector<int64_t> offset;
  int64_t N = 0;
  for (auto& [n, p] : whole) offset.push_back(N), N += p.numel();
  Tensor flat = Tensor::zeros({N}), gflat = Tensor::zeros({N});  // (N) parameters and gradients
  for (size_t i = 0; i < whole.size(); ++i)
    flat.narrow(0, offset[i], whole[i].second.numel()).copy_(whole[i].second.view({-1}));
  const int64_t cut = offset[2] + 7;  // inside wte.weight (5x4)
  ASSERT_LT(cut, offset[3]);

  // Each step the main thread sets the gradients, then rank 1 steps on a thread while rank 0
  // steps here; the hook is a two-party allreduce: publish, wait, sum slot 0 + slot 1, wait.
  std::barrier sync(2);
  std::vector<double> slot[2];
  std::vector<std::unique_ptr<optim::LAMB>> opts(2);
  std::vector<nn::NamedTensors> views(2);
  for (int r = 0; r < 2; ++r) {
    const int64_t lo = r == 0 ? 0 : cut, hi = r == 0 ? cut : N;
    std::vector<int> global;
    for (size_t i = 0; i < whole.size(); ++i) {
      const int64_t a = std::max(offset[i], lo), b = std::min(offset[i] + whole[i].second.numel(), hi);
      if (a >= b) continue;
      Tensor pv = flat.narrow(0, a, b - a);  // (b - a) this rank's part of parameter i
      pv.set_grad(gflat.narrow(0, a, b - a));
      views[size_t(r)].emplace_back(whole[i].first, pv);
      global.push_back(int(i));
    }
    opts[size_t(r)] =
        std::make_unique<optim::LAMB>(views[size_t(r)], optim::LAMBOptions{0.9, 0.999, 1e-6, 0.1},
                                      [&](const std::string& name, const Tensor&) { return decays_by_name(fx, name); });
    opts[size_t(r)]->set_norm_reduction(global, int(whole.size()), [&, r](double* data, int64_t n) {
      slot[r].assign(data, data + n);
      sync.arrive_and_wait();
      for (int64_t k = 0; k < n; ++k) data[k] = slot[0][size_t(k)] + slot[1][size_t(k)];
      sync.arrive_and_wait();
    });
  }
  ASSERT_EQ(views[0].back().first, "wte.weight");
  ASSERT_EQ(views[1].front().first, "wte.weight");
  for (int t = 0; t < kSteps; ++t) {
    for (size_t i = 0; i < whole.size(); ++i)
      gflat.narrow(0, offset[i], whole[i].second.numel())
          .copy_(fx.get("grad." + std::to_string(t) + "." + whole[i].first).view({-1}));
    std::thread t1([&] { opts[1]->step(fx.lr[size_t(t)]); });
    opts[0]->step(fx.lr[size_t(t)]);
    t1.join();
  }
  const std::vector<double> want = fx.f64("lamb.trust_ratio");
  const size_t P = whole.size();
  for (int r = 0; r < 2; ++r)
    for (size_t i = 0; i < P; ++i)
      EXPECT_NEAR(opts[size_t(r)]->trust_ratios()[i], want[(kSteps - 1) * P + i], 1e-5 * want[(kSteps - 1) * P + i])
          << "rank " << r << " " << whole[i].first;
  for (size_t i = 0; i < P; ++i)
    expect_close(flat.narrow(0, offset[i], whole[i].second.numel()).view(whole[i].second.shape()),
                 fx.get("lamb.param." + std::to_string(kSteps - 1) + "." + whole[i].first), 1e-6, whole[i].first);
}

TEST(LAMB, NormReductionRejectsBadIndices) {
  Tensor p = Tensor::zeros({3});
  optim::LAMB opt({{"p", p}}, {});
  EXPECT_THROW(opt.set_norm_reduction({0, 1}, 2, nullptr), ValueError);
  EXPECT_THROW(opt.set_norm_reduction({2}, 2, nullptr), ValueError);
  EXPECT_NO_THROW(opt.set_norm_reduction({1}, 2, nullptr));
  EXPECT_EQ(opt.trust_ratios().size(), 2u);
}

class SGDFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(SGDFixture, MatchesTorchOptimSGDOverTenSteps) {
  const std::string prefix = GetParam();
  Fixture fx("optim_sgd.safetensors");
  nn::NamedTensors ps = fx.init(prefix);
  optim::SGD opt(ps, optim::SGDOptions{0.9, 0.01, prefix == "nesterov"});
  for (int t = 0; t < kSteps; ++t) {
    fx.set_grads(ps, t);
    opt.step(fx.lr[size_t(t)]);
    for (auto& [n, p] : ps) expect_close(p, fx.get(prefix + ".param." + std::to_string(t) + "." + n), 1e-6, n);
  }
  ASSERT_EQ(opt.state_tensors().size(), ps.size());
  for (auto& [n, t] : opt.state_tensors()) expect_close(t, fx.get(prefix + "." + n), 1e-6, n);
}

INSTANTIATE_TEST_SUITE_P(Torch, SGDFixture, ::testing::Values("momentum", "nesterov"));

TEST(SGD, NesterovAndMomentumDiffer) {
  // guards the fixture: the two torch cases must not coincide, or the nesterov flag would be untested
  Fixture fx("optim_sgd.safetensors");
  const std::string last = std::to_string(kSteps - 1) + "." + fx.names[0];
  EXPECT_NE(fx.get("momentum.param." + last).to_vector(), fx.get("nesterov.param." + last).to_vector());
}
