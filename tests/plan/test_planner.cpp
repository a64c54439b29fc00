// The planner (plan/planner.h) on hand-written calibrations: each expected step time is worked
// out here from the calibration's numbers (the measured points, alpha-beta fits, the GPipe
// makespan of equal stages), each expected byte count from the parameter layout's algebra;
// the calibration file's JSON form; described clusters; the reasons plans are rejected.
#include <gtest/gtest.h>

#include <cmath>

#include "brigade/core/error.h"
#include "brigade/plan/calibration.h"
#include "brigade/plan/planner.h"
#include "brigade/train/config.h"

namespace brigade::plan {
namespace {

// A 4-block GPT of the default recipe's shape, global batch 16 x 128 tokens.
train::Recipe recipe() {
  train::Recipe r;
  r.model.type = "gpt";
  r.model.n_layer = 4, r.model.n_head = 4, r.model.n_embd = 256, r.model.vocab_size = 4096, r.model.block_size = 128;
  r.train.batch_size = 16, r.train.seq_len = 128;
  return r;
}

ComputePoint point(int ranks, int threads, const std::string& level, const std::string& rc, int64_t rows, double fb,
                   double upd, int64_t act = 0) {
  ComputePoint p;
  p.ranks = ranks, p.threads = threads, p.level = level, p.recompute = rc, p.rows = rows;
  p.fwd_bwd_s = fb, p.update_s = upd, p.act_peak = act, p.act_live = 0, p.work_compute = 4096;
  return p;
}

// Two units (embeddings + 4 blocks) of known sizes; every numel a multiple of 16, so the flat
// layout has no alignment padding: params = 4 B x sum.
Calibration calibration() {
  Calibration c;
  c.created = "2026-12-05T00:00:00Z", c.host = "test", c.cores = 2;
  c.gemm_peak_f32 = 400, c.gemm_peak_bf16 = 800;
  c.model = calibration_key(recipe());
  c.parameters = 1024 + 4 * 4096;
  c.num_blocks = 4;
  c.flops_per_item = 1e6, c.items_per_row = 128, c.item = "tokens";
  c.hidden_per_row = 128 * 256;
  c.has_stages = true, c.tp_plan = true;
  train::PlannedUnit outside{"embeddings+head", {{"transformer.wte.weight", 1024}}};
  c.units = {outside};
  c.units_zero3 = {outside};
  for (int b = 0; b < 4; ++b) {
    const std::pair<std::string, int64_t> w{fmt::format("transformer.h.{}.w", b), 4096};
    c.units.front().params.push_back(w);
    c.units_zero3.push_back({fmt::format("transformer.h.{}", b), {w}});
  }
  for (int64_t rows : {2, 4, 8, 16}) {
    c.compute.push_back(point(1, 2, "O0", "none", rows, 0.01 * double(rows) + 0.02, 0.005, rows * 1000));
    c.compute.push_back(point(2, 1, "O0", "none", rows, 0.02 * double(rows) + 0.03, 0.008));
  }
  CommCalibration cc;
  cc.ranks = 2;
  CommFit f;
  f.alpha_s = 1e-4, f.beta_s_per_byte = 1e-9;
  for (const char* k : {"allreduce/mpi", "allreduce/ring", "allreduce/tree", "reduce_scatter/mpi",
                        "reduce_scatter/ring", "allgather", "sendrecv"})
    cc.fits[k] = f;
  c.comm[2] = cc;
  return c;
}

Cluster machine() {
  Cluster cl;
  cl.nodes = 1, cl.ranks_per_node = 2, cl.cores_per_node = 2;
  return cl;
}

TEST(Calibration, InterpolatesLinearlyBetweenMeasuredRowsAndProportionallyBeyond) {
  const Calibration c = calibration();
  // measured at 2, 4, 8, 16 rows: 0.01 rows + 0.02
  EXPECT_DOUBLE_EQ(c.fwd_bwd_seconds(1, 2, "O0", "none", 8), 0.10);
  EXPECT_NEAR(c.fwd_bwd_seconds(1, 2, "O0", "none", 6), 0.08, 1e-12);       // between 4 (0.06) and 8 (0.10)
  EXPECT_NEAR(c.fwd_bwd_seconds(1, 2, "O0", "none", 1), 0.04 / 2, 1e-12);   // below 2: 0.04 x 1/2
  EXPECT_NEAR(c.fwd_bwd_seconds(1, 2, "O0", "none", 32), 0.18 * 2, 1e-12);  // above 16: 0.18 x 2
  EXPECT_LT(c.fwd_bwd_seconds(1, 2, "O2", "none", 8), 0);                   // not measured
}

TEST(Calibration, JsonRoundTripIsExactAndMissingFieldsAreNamed) {
  Calibration c = calibration();
  c.compute[0].params_work_backward = 12345;  // optional fields: written when measured
  c.compute[0].early_grads = {"lm_head.weight", "model.norm.weight"};
  const nlohmann::json j = calibration_to_json(c);
  const Calibration back = calibration_from_json(j, "test");
  EXPECT_EQ(calibration_to_json(back), j);
  EXPECT_EQ(back.compute[0].params_work_backward, 12345);
  EXPECT_EQ(back.compute[0].early_grads, c.compute[0].early_grads);
  EXPECT_FALSE(j["compute"][1].contains("params_work_backward"));  // not measured: absent, read back as -1
  EXPECT_EQ(back.compute[1].params_work_backward, -1);
  EXPECT_TRUE(back.compute[1].early_grads.empty());
  // the lockstep steps: written and read back; a calibration without them (older) has none
  c.sync.push_back({"dp", 2, 1, "O2", 4, 0.25, 0.0125});
  c.sync.push_back({"tp", 2, 1, "O0", 16, 0.5, 0.003});
  const nlohmann::json js = calibration_to_json(c);
  const Calibration sb = calibration_from_json(js, "test");
  EXPECT_EQ(calibration_to_json(sb), js);
  ASSERT_EQ(sb.sync.size(), 2u);
  EXPECT_EQ(sb.sync[1].kind, "tp");
  EXPECT_EQ(sb.sync[0].update_s, 0.0125);
  nlohmann::json old_file = js;
  old_file.erase("sync");
  EXPECT_TRUE(calibration_from_json(old_file, "test").sync.empty());
  nlohmann::json bad_kind = js;
  bad_kind["sync"][0]["kind"] = "pp";
  EXPECT_THROW(calibration_from_json(bad_kind, "test"), ConfigError);
  nlohmann::json bad = j;
  bad["compute"][1].erase("update_s");
  try {
    calibration_from_json(bad, "cal.json");
    FAIL() << "a point without update_s was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("compute[1]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("update_s"), std::string::npos) << e.what();
  }
  EXPECT_THROW(calibration_from_json(nlohmann::json{{"format", "other"}}, "x"), ConfigError);
}

TEST(Calibration, RefusesAnotherModel) {
  const Calibration c = calibration();
  EXPECT_EQ(calibration_mismatch(c, recipe()), "");
  train::Recipe r = recipe();
  r.model.n_layer = 6;
  const std::string diff = calibration_mismatch(c, r);
  EXPECT_NE(diff.find("model.n_layer: 4 (calibrated) vs 6"), std::string::npos) << diff;
}

TEST(Planner, OneRankStepIsTheMeasuredMicroStepsPlusTheUpdate) {
  const Calibration c = calibration();
  train::Recipe r = recipe();
  r.run.threads = 2;
  r.train.batch_size = 8, r.train.accumulation = 2;
  const Prediction p = predict(r, c, machine());
  ASSERT_TRUE(p.feasible) << p.reason;
  EXPECT_NEAR(p.compute_s, 2 * (0.01 * 8 + 0.02), 1e-12);
  EXPECT_NEAR(p.update_s, 0.005, 1e-12);
  EXPECT_EQ(p.comm_s, 0.0);
  EXPECT_NEAR(p.step_s, 0.2 + 0.005, 1e-12);
  EXPECT_NEAR(p.items_per_s, 16 * 128 / 0.205, 1e-6);
  // fp32 flat buffers: params and grads 4 B x 17408, AdamW's two states the same again
  const int64_t flat = 4 * (1024 + 4 * 4096);
  EXPECT_EQ(p.peak[size_t(MemTag::Params)], flat);
  EXPECT_EQ(p.peak[size_t(MemTag::Grads)], flat);
  EXPECT_EQ(p.peak[size_t(MemTag::Optimizer)], 2 * flat);
  EXPECT_EQ(p.peak[size_t(MemTag::Activations)], 8 * 1000);  // the point at 8 rows
}

TEST(Planner, DataParallelAddsTheBucketAllreducesOfTheAlphaBetaFit) {
  const Calibration c = calibration();
  train::Recipe r = recipe();
  r.parallel.dp = 2, r.train.batch_size = 8, r.run.threads = 1;
  r.parallel.bucket_mb = 0.03125;  // 32 KiB buckets: 69632 gradient bytes make 3
  const Prediction p = predict(r, c, machine());
  ASSERT_TRUE(p.feasible) << p.reason;
  const double grad_bytes = 4.0 * (1024 + 4 * 4096);
  const double buckets = 3, per_bucket = std::floor(grad_bytes / buckets);
  const double expect_comm = buckets * (1e-4 + 1e-9 * per_bucket) + (1e-4 + 1e-9 * 8);  // + the gradient norm
  EXPECT_NEAR(p.comm_s, expect_comm, 1e-12);
  EXPECT_NEAR(p.compute_s, 0.02 * 8 + 0.03, 1e-12);  // the 2-rank launch's point, 1 thread
  EXPECT_NEAR(p.update_s, 0.008, 1e-12);
  // ZeRO-1: the update runs on half the parameters; reduce-scatters, then one allgather
  r.parallel.zero = 1;
  const Prediction z = predict(r, c, machine());
  ASSERT_TRUE(z.feasible) << z.reason;
  EXPECT_NEAR(z.update_s, 0.004, 1e-12);
  EXPECT_NEAR(z.comm_s, buckets * (1e-4 + 1e-9 * per_bucket) + (1e-4 + 1e-9 * grad_bytes) + (1e-4 + 1e-9 * 8), 1e-12);
}

// When the plan's ranks x threads fill the calibrated machine's cores, its collectives run
// beside the compute: the fits timed beside a compute load apply; with cores to spare, the idle ones.
TEST(Planner, CollectivesBesideAComputeLoadWhenTheComputeFillsTheCores) {
  Calibration c = calibration();
  CommFit busy;
  busy.alpha_s = 5e-4, busy.beta_s_per_byte = 3e-9;
  for (const auto& [k, f] : c.comm[2].fits) c.comm[2].busy_fits[k] = busy;
  c.comm[2].busy_threads = 1;
  train::Recipe r = recipe();
  r.parallel.dp = 2, r.train.batch_size = 8, r.run.threads = 1;
  r.parallel.bucket_mb = 0.03125;  // 3 buckets, as above
  const double grad_bytes = 4.0 * (1024 + 4 * 4096), buckets = 3, per_bucket = std::floor(grad_bytes / buckets);
  const Prediction full = predict(r, c, machine());  // 2 ranks x 1 thread on 2 cores
  ASSERT_TRUE(full.feasible) << full.reason;
  EXPECT_NEAR(full.comm_s, buckets * (5e-4 + 3e-9 * per_bucket) + (5e-4 + 3e-9 * 8), 1e-12);
  c.cores = 4;  // the same launch with two cores idle
  const Prediction spare = predict(r, c, machine());
  ASSERT_TRUE(spare.feasible) << spare.reason;
  EXPECT_NEAR(spare.comm_s, buckets * (1e-4 + 1e-9 * per_bucket) + (1e-4 + 1e-9 * 8), 1e-12);
}

// Ranks in lockstep: the calibration's measured data-parallel step (ZeRO-0) and tensor-parallel
// step give the ratio of what the step took to what the model predicts for it, and every dp or
// tp plan of that launch and level has its micro-steps scaled by it (linear between the measured
// rows, flat beyond). Expected values: the ratios built into the points, by the algebra of the
// model's own prediction at those points.
TEST(Planner, LockstepStepsScaleTheDataAndTensorParallelMicroSteps) {
  Calibration c = calibration();
  const Cluster cl = machine();
  train::Recipe r = recipe();
  r.parallel.dp = 2, r.train.batch_size = 8, r.run.threads = 1;
  r.parallel.bucket_mb = 0.03125;  // 3 buckets of the 69632 gradient bytes
  const double grad_bytes = 4.0 * (1024 + 4 * 4096), per_bucket = std::floor(grad_bytes / 3);
  const double comm0 = 3 * (1e-4 + 1e-9 * per_bucket) + (1e-4 + 1e-9 * 8);  // ZeRO-0's buckets + the norm
  auto fb2 = [](double rows) { return 0.02 * rows + 0.03; };                // the 2-rank compute points
  // measured dp steps: ratio 1.2 at 4 rows, 1.1 at 16 (update 0.02 of each, the point's update 0.008)
  c.sync.push_back({"dp", 2, 1, "O0", 4, 1.2 * fb2(4) + 0.008 + comm0 - 0.02, 0.02});
  c.sync.push_back({"dp", 2, 1, "O0", 16, 1.1 * fb2(16) + 0.008 + comm0 - 0.02, 0.02});
  const double act16 = 16.0 * 128 * 256 * 4;
  const double tp_model16 = fb2(16) / 2 + (4 * 4 + 2) * (1e-4 + 1e-9 * act16);
  c.sync.push_back({"tp", 2, 1, "O0", 16, 1.3 * tp_model16, 0.004});

  const Prediction dp = predict(r, c, cl);
  ASSERT_TRUE(dp.feasible) << dp.reason;
  const double f8 = 1.2 + (1.1 - 1.2) * (8.0 - 4.0) / (16.0 - 4.0);
  EXPECT_NEAR(dp.sync_factor, f8, 1e-12);
  EXPECT_NEAR(dp.compute_s, fb2(8) * f8, 1e-12);
  EXPECT_NEAR(dp.comm_s, comm0, 1e-12);  // the communication and the update as without the points
  EXPECT_NEAR(dp.update_s, 0.008, 1e-12);
  r.parallel.zero = 1;  // ZeRO-1/2: ZeRO-0's ratio on their micro-steps
  const Prediction z1 = predict(r, c, cl);
  ASSERT_TRUE(z1.feasible) << z1.reason;
  EXPECT_NEAR(z1.compute_s, fb2(8) * f8, 1e-12);
  r.parallel.zero = 3;  // ZeRO-3 without a point of its own: ZeRO-0's too
  const Prediction z3 = predict(r, c, cl);
  ASSERT_TRUE(z3.feasible) << z3.reason;
  EXPECT_NEAR(z3.compute_s, fb2(8) * f8, 1e-12);
  // with one: its ratio, less ZeRO-3's update share (half) and its priced gathers and reduce-scatters
  // (5 units, each gathered twice and reduce-scattered once, of their 4-byte gradients; + the norm)
  {
    Calibration c3 = c;
    auto unit_comm = [](double bytes) { return 1e-4 + 1e-9 * bytes; };
    const double comm3 = 5 * (3 * unit_comm(std::floor(grad_bytes / 5))) + unit_comm(8);
    c3.sync.push_back({"zero3", 2, 1, "O0", 8, 1.4 * fb2(8) + 0.004 + comm3 - 0.01, 0.01});
    const Prediction q = predict(r, c3, cl);
    ASSERT_TRUE(q.feasible) << q.reason;
    EXPECT_NEAR(q.sync_factor, 1.4, 1e-12);
    EXPECT_NEAR(q.comm_s, comm3, 1e-12);
    EXPECT_NEAR(q.compute_s, 1.4 * fb2(8), 1e-12);
  }
  r.parallel.zero = 0, r.train.batch_size = 2, r.train.accumulation = 4;  // below the measured rows: flat
  const Prediction acc = predict(r, c, cl);
  ASSERT_TRUE(acc.feasible) << acc.reason;
  EXPECT_NEAR(acc.compute_s, 4 * fb2(2) * 1.2, 1e-12);

  train::Recipe t = recipe();
  t.parallel.tp = 2, t.run.threads = 1;  // 16 rows: the tp point's ratio
  const Prediction tp = predict(t, c, cl);
  ASSERT_TRUE(tp.feasible) << tp.reason;
  EXPECT_NEAR(tp.sync_factor, 1.3, 1e-12);
  EXPECT_NEAR(tp.compute_s, 1.3 * tp_model16, 1e-12);

  // not in lockstep over the whole launch, or no point at the level: unscaled
  train::Recipe one = recipe();
  one.run.threads = 2;
  const Prediction p1 = predict(one, c, cl);
  ASSERT_TRUE(p1.feasible) << p1.reason;
  EXPECT_EQ(p1.sync_factor, 1.0);
  EXPECT_NEAR(p1.compute_s, 0.01 * 16 + 0.02, 1e-12);
  train::Recipe pp = recipe();
  pp.parallel.pp = 2, pp.parallel.microbatches = 4, pp.run.threads = 1;
  const Prediction with = predict(pp, c, cl), without = predict(pp, calibration(), cl);
  ASSERT_TRUE(with.feasible) << with.reason;
  EXPECT_EQ(with.sync_factor, 1.0);
  EXPECT_EQ(with.compute_s, without.compute_s);
  for (SyncPoint& sp : c.sync) sp.level = "O2";
  const Prediction other = predict(t, c, cl);
  ASSERT_TRUE(other.feasible) << other.reason;
  EXPECT_EQ(other.sync_factor, 1.0);
  EXPECT_NEAR(other.compute_s, tp_model16, 1e-12);
}

// ZeRO-3's parameters and gradients from the dry step's working copies and early gradients
// (train::MemoryInputs): the working copies alive in the backward sit beside the two gathered
// block units, the step's peak of them beside none; the head's early gradient (wte, in the last
// bucket to fire) lives outside the buckets until that one fires. Expected values: the layout
// algebra, bytes as the allocator rounds them.
TEST(Planner, ZeroThreeHoldsTheBackwardsWorkingCopiesBesideThePairAndTheHeadsGradientOutside) {
  Calibration c = calibration();
  const int64_t V = 16384;  // a large embeddings+head unit, so that its window is the largest
  c.units[0].params[0].second = V;
  c.units_zero3[0].params[0].second = V;
  c.parameters = V + 4 * 4096;
  train::Recipe r = recipe();
  r.parallel.dp = 2, r.parallel.zero = 3, r.run.threads = 1, r.train.batch_size = 8;
  auto held = [](int64_t floats) { return int64_t(Allocator::round_size(size_t(4 * floats))); };
  const int64_t shard = held((V + 4 * 4096) / 2), unit0 = held(V), block = held(4096), pair = 2 * block;
  auto at = [&](int64_t work, int64_t backward, std::vector<std::string> early) {
    for (ComputePoint& pt : c.compute)
      pt.params_work = work, pt.params_work_backward = backward, pt.early_grads = early;
    const Prediction p = predict(r, c, machine());
    EXPECT_TRUE(p.feasible) << p.reason;
    return p;
  };
  // copies alive in the backward beside the pair, more than the step's peak beside no block
  Prediction p = at(40000, 20000, {});
  EXPECT_EQ(p.peak[size_t(MemTag::Params)], shard + unit0 + pair + 20000);
  // the step's peak (the head's copy with no block gathered) the larger
  p = at(40000, 1000, {});
  EXPECT_EQ(p.peak[size_t(MemTag::Params)], shard + unit0 + 40000);
  // not measured (an older calibration): the peak beside the pair, an upper bound
  p = at(40000, -1, {});
  EXPECT_EQ(p.peak[size_t(MemTag::Params)], shard + unit0 + pair + 40000);
  // gradients: buckets fire h.3, h.2, h.1, h.0, embeddings+head; with the communication thread
  // 2 to 3 consecutive alive. The window ending at the last bucket holds wte's early gradient too.
  EXPECT_EQ(p.peak_low[size_t(MemTag::Grads)], shard + std::max(pair, block + unit0));
  p = at(40000, -1, {"transformer.wte.weight"});
  EXPECT_EQ(p.peak_low[size_t(MemTag::Grads)], shard + block + unit0 + held(V));
  EXPECT_EQ(p.peak[size_t(MemTag::Grads)], shard + pair + unit0 + held(V));
  // a parameter of the first bucket (armed before the backward) gets no gradient of its own
  p = at(40000, -1, {"transformer.h.3.w"});
  EXPECT_EQ(p.peak_low[size_t(MemTag::Grads)], shard + block + unit0);
}

TEST(Planner, GpipeOfEqualStagesTakesMPlusPMinusOneSlots) {
  Calibration c = calibration();
  // one block: F 1 ms, B 2 ms (input) + 1 ms (weight); no head cost; measured at 4 rows
  c.stages.push_back({2, 1, "O0", 4, 0.001, 0.002, 0.001, 0, 0, 0});
  // make the whole micro-batch at 4 rows agree with 4 blocks x 4 ms, so no rescaling happens
  for (ComputePoint& pt : c.compute)
    if (pt.ranks == 2 && pt.rows == 4) pt.fwd_bwd_s = 0.016;
  for (auto& [k, f] : c.comm[2].fits) f.alpha_s = 0, f.beta_s_per_byte = 0;  // free hops
  train::Recipe r = recipe();
  r.parallel.pp = 2, r.parallel.microbatches = 4, r.parallel.schedule = "gpipe", r.run.threads = 1;
  const Prediction p = predict(r, c, machine());
  ASSERT_TRUE(p.feasible) << p.reason;
  // 2 stages of 2 blocks: F = 2 ms, B = 6 ms per stage and micro-batch; GPipe: (m + p - 1) x (F + B)
  EXPECT_NEAR(p.compute_s, (4 + 2 - 1) * (0.002 + 0.006), 1e-9);
  EXPECT_NEAR(p.bubble, (2 - 1) / 4.0, 1e-9);  // (makespan - ideal) / ideal = (p - 1) / m
  EXPECT_TRUE(p.memory_approximate);
}

TEST(Planner, TensorParallelHalvesTheMicroBatchAndAddsItsAllreduces) {
  train::Recipe r = recipe();
  r.parallel.tp = 2, r.run.threads = 1;
  // half the micro-batch plus the allreduces (4 per block + 2) of 16 rows
  const Prediction q = predict(r, calibration(), machine());
  const double act = 16.0 * 128 * 256 * 4;
  EXPECT_NEAR(q.compute_s, (0.02 * 16 + 0.03) / 2 + (4 * 4 + 2) * (1e-4 + 1e-9 * act), 1e-12);
}

// Mesh points made from a known stage model, per pp rank i: activations F + f s r + t r + u b and
// params P + f W (f micro-batches of r rows in flight, b rows in the batch; MeshPoint's comment),
// measured as calibrate does (GPipe (16, 2), (16, 4), (8, 2); 1F1B (16, 4): f = min(m, 2 - i)).
// The planner must recover the model from them: its prediction of plans it never saw is the
// model's value, exactly.
struct Stage {
  double F, s, t, u, P, W;
  int64_t grads, optim;
};
const std::vector<Stage> kStages = {{3e6, 6.5e6, 1e6, 1.3e5, 1.4e7, 2e6, 1 << 22, 1 << 23},
                                    {8e6, 4.4e6, 1.3e5, 1.3e5, 7e6, 1e6, 1 << 21, 1 << 22}};
MeshPoint::Rank modelled(const Stage& st, double f, double r, double b) {
  MeshPoint::Rank k;
  k.peak[size_t(MemTag::Activations)] = int64_t(std::llround(st.F + f * st.s * r + st.t * r + st.u * b));
  k.peak[size_t(MemTag::Params)] = int64_t(std::llround(st.P + f * st.W));
  k.peak[size_t(MemTag::Grads)] = st.grads;
  k.peak[size_t(MemTag::Optimizer)] = st.optim;
  for (int64_t v : k.peak) k.total += v;
  return k;
}
MeshPoint mesh_point(const std::string& sched, int64_t m, int64_t rows) {
  MeshPoint q;
  q.tp = 1, q.pp = 2, q.schedule = sched, q.microbatches = m, q.threads = 1, q.rows = rows;
  for (int i = 0; i < 2; ++i) {
    const double f = sched == "gpipe" ? double(m) : std::min(double(m), 2.0 - i);
    q.ranks.push_back(modelled(kStages[size_t(i)], f, double(rows) / double(m), double(rows)));
  }
  return q;
}

TEST(Planner, PipelineMemoryFromFourMeshPointsIsTheStageModel) {
  Calibration c = calibration();
  c.mesh = {mesh_point("gpipe", 2, 16), mesh_point("gpipe", 4, 16), mesh_point("gpipe", 2, 8),
            mesh_point("1f1b", 4, 16)};
  MeshPoint tp;  // tp 2 at 16 rows: activations 4e7 on each rank, scaled by the rows
  tp.tp = 2, tp.threads = 1, tp.rows = 16;
  for (int i = 0; i < 2; ++i) {
    MeshPoint::Rank k;
    k.peak[size_t(MemTag::Activations)] = 40000000, k.peak[size_t(MemTag::Params)] = 1 << 20;
    k.total = 40000000 + (1 << 20) + 4096;
    tp.ranks.push_back(k);
  }
  c.mesh.push_back(tp);
  {  // the calibration file keeps them
    const nlohmann::json j = calibration_to_json(c);
    EXPECT_EQ(calibration_to_json(calibration_from_json(j, "test")), j);
  }
  struct Case {
    std::string sched;
    int64_t m, b, acc;
    std::vector<double> f;  // in flight per rank
  };
  for (const Case& k : {Case{"1f1b", 8, 16, 1, {2, 1}}, Case{"gpipe", 8, 16, 1, {8, 8}}, Case{"1f1b", 2, 8, 2, {2, 1}},
                        Case{"1f1b", 16, 16, 1, {2, 1}}}) {
    SCOPED_TRACE(k.sched + " m " + std::to_string(k.m) + " b " + std::to_string(k.b));
    train::Recipe r = recipe();
    r.parallel.pp = 2, r.parallel.microbatches = k.m, r.parallel.schedule = k.sched, r.run.threads = 1;
    r.train.batch_size = k.b, r.train.accumulation = k.acc;
    const Prediction p = predict(r, c, machine());
    ASSERT_TRUE(p.feasible) << p.reason;
    EXPECT_FALSE(p.memory_approximate);
    std::vector<MeshPoint::Rank> want;
    for (int i = 0; i < 2; ++i)
      want.push_back(modelled(kStages[size_t(i)], k.f[size_t(i)], double(k.b) / double(k.m), double(k.b)));
    const MeshPoint::Rank& busiest = want[0].total >= want[1].total ? want[0] : want[1];
    for (int t = 0; t < kNumMemTags; ++t)
      EXPECT_NEAR(double(p.peak[size_t(t)]), double(busiest.peak[size_t(t)]), 2.0) << mem_tag_name(MemTag(t));
    EXPECT_NEAR(double(p.peak_total), double(busiest.total), 4.0);
  }
  {  // tp: the activations follow the rows of the micro-step
    train::Recipe r = recipe();
    r.parallel.tp = 2, r.run.threads = 1, r.train.batch_size = 8, r.train.accumulation = 2;
    const Prediction p = predict(r, c, machine());
    ASSERT_TRUE(p.feasible) << p.reason;
    EXPECT_FALSE(p.memory_approximate);
    EXPECT_EQ(p.peak[size_t(MemTag::Activations)], 20000000);
    EXPECT_EQ(p.peak_total, 20000000 + (1 << 20) + 4096);
  }
  {  // what the points do not cover is the modelled split, marked approximate
    train::Recipe r = recipe();
    r.parallel.pp = 2, r.parallel.microbatches = 4, r.parallel.schedule = "zb-h1", r.run.threads = 1;
    EXPECT_TRUE(predict(r, c, machine()).memory_approximate) << "ZB-H1's deferred weight gradients";
    r.parallel.schedule = "1f1b";
    EXPECT_FALSE(predict(r, c, machine()).memory_approximate);
    c.mesh.erase(c.mesh.begin() + 3);  // no 1F1B point: the whole-batch term is unknown
    const Prediction p = predict(r, c, machine());
    ASSERT_TRUE(p.feasible) << p.reason;
    EXPECT_TRUE(p.memory_approximate);
  }
}

TEST(Planner, RejectsWithTheReason) {
  const Calibration c = calibration();
  train::Recipe r = recipe();
  r.run.threads = 2;
  r.precision.level = "O2";
  Prediction p = predict(r, c, machine());
  EXPECT_FALSE(p.feasible);
  EXPECT_NE(p.reason.find("not calibrated"), std::string::npos) << p.reason;
  r = recipe();
  r.parallel.pp = 8, r.run.threads = 1;
  p = predict(r, c, machine());
  EXPECT_FALSE(p.feasible);
  EXPECT_NE(p.reason.find("nodes"), std::string::npos) << p.reason;  // 8 ranks on one 2-rank node
  Cluster small = machine();
  small.memory_per_rank = 1 << 16;
  r = recipe();
  r.run.threads = 2;
  p = predict(r, c, small);
  EXPECT_FALSE(p.feasible);
  EXPECT_NE(p.reason.find("per rank"), std::string::npos) << p.reason;
  EXPECT_GT(p.peak_total, int64_t(1) << 16);  // what it would need, for the "least memory" message
}

TEST(Planner, EnumeratesEveryLayoutOfTheGlobalBatchAndAppliesTheBest) {
  const Calibration c = calibration();
  train::Recipe r = recipe();
  const std::vector<Prediction> ps = enumerate_plans(r, c, machine());
  ASSERT_FALSE(ps.empty());
  ASSERT_TRUE(ps.front().feasible);
  for (size_t i = 1; i < ps.size() && ps[i].feasible; ++i) EXPECT_GE(ps[i - 1].items_per_s, ps[i].items_per_s);
  for (const Prediction& p : ps) EXPECT_EQ(p.plan.batch_size * p.plan.accumulation * p.plan.dp, 16) << p.plan.label();
  const train::Recipe applied = apply_plan(r, ps.front().plan);
  train::validate_recipe(applied, "applied");
  EXPECT_EQ(applied.parallel.dp, ps.front().plan.dp);
  EXPECT_EQ(applied.train.batch_size, ps.front().plan.batch_size);
  // the applied recipe predicts as the enumerated plan did
  const Prediction again = predict(applied, c, machine());
  EXPECT_NEAR(again.step_s, ps.front().step_s, 1e-12);
}

TEST(Cluster, ParsesADescribedClusterAndNamesBadKeys) {
  const Cluster cl = parse_cluster(R"(
[cluster]
name = "8 nodes"
nodes = 8
ranks_per_node = 1
cores_per_node = 2
memory_per_rank_gb = 24
[cluster.intra]
latency_us = 1
gbps = 100
[cluster.inter]
latency_us = 20
gbps = 25
)",
                                   "c.toml");
  EXPECT_EQ(cl.nodes, 8);
  EXPECT_EQ(cl.memory_per_rank, int64_t(24) << 30);
  EXPECT_DOUBLE_EQ(cl.inter.bytes_per_s, 25e9 / 8);
  EXPECT_DOUBLE_EQ(cl.inter.latency_s, 20e-6);
  try {
    parse_cluster("[cluster]\nnodez = 2\n[cluster.intra]\ngbps = 1\n", "c.toml");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("nodez"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nodes"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_cluster("[cluster]\nnodes = 2\n[cluster.intra]\ngbps = 1\n", "c.toml"), ConfigError);  // no inter
}

TEST(Cluster, DescribedLinksGiveRingCosts) {
  const Calibration c = calibration();
  Cluster cl = parse_cluster(
      "[cluster]\nnodes = 2\nranks_per_node = 1\ncores_per_node = 2\n[cluster.intra]\ngbps = 80\n"
      "[cluster.inter]\nlatency_us = 10\ngbps = 8\n",
      "c.toml");
  train::Recipe r = recipe();
  r.parallel.dp = 2, r.train.batch_size = 8, r.run.threads = 2;
  r.parallel.bucket_mb = 1.0;  // one bucket
  const Prediction p = predict(r, c, cl);
  ASSERT_TRUE(p.feasible) << p.reason;
  // ring allreduce over 2 nodes: 2 (P - 1) latencies + 2 (P - 1) / P x bytes / bandwidth, for the
  // gradients and for the 8-byte norm
  const double bw = 8e9 / 8, grads = 4.0 * (1024 + 4 * 4096);
  const double expect = (2 * 1e-5 + grads / bw) + (2 * 1e-5 + 8 / bw);
  EXPECT_NEAR(p.comm_s, expect, 1e-12);
  EXPECT_NEAR(p.compute_s, 0.01 * 8 + 0.02, 1e-12);  // one rank per node: the 1-rank, 2-thread points
}

}  // namespace
}  // namespace brigade::plan
