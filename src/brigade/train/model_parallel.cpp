// Tensor and pipeline parallelism for any task with Stages; see model_parallel.h.
#include "brigade/train/model_parallel.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <sstream>

#include <fstream>
#include <nlohmann/json.hpp>
#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/nn/layers.h"
#include "brigade/ops/ops.h"
#include "brigade/parallel/tensor_parallel.h"
#include "brigade/train/executor.h"
#include "brigade/train/registry.h"
#include "brigade/train/stage_timing.h"
#include "brigade/train/trainer.h"

namespace brigade::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// Frees a parameter of the whole model that this rank does not hold: it becomes an empty
// (0-element) tensor, so memory accounting shows what the rank really keeps.
void release_parameter(nn::Module& root, const std::map<std::string, nn::Module*>& modules, const std::string& name) {
  const size_t dot = name.rfind('.');
  nn::Module* owner = &root;  // a parameter of the model itself has no dot
  if (dot != std::string::npos) {
    auto it = modules.find(name.substr(0, dot));
    BRIGADE_CHECK(it != modules.end(), InternalError, "model parallel: no module holds parameter {}", name);
    owner = it->second;
  }
  owner->set_parameter(dot == std::string::npos ? name : name.substr(dot + 1),
                       Tensor::empty({0}, DType::F32, MemTag::Params));
}

// Row offsets of n rows cut into m micro-batches as evenly as possible (the first n % m get one more).
std::vector<int64_t> cut_rows(int64_t n, int m) {
  std::vector<int64_t> lo(size_t(m) + 1, 0);
  for (int i = 0; i < m; ++i) lo[size_t(i) + 1] = lo[size_t(i)] + n / m + (i < n % m ? 1 : 0);
  return lo;
}

}  // namespace

ModelParallel::ModelParallel(const Recipe& r, Task& task, const Stages& stages,
                             std::shared_ptr<dist::ProcessGroup> world,
                             const std::function<void(const std::string&)>& say)
    : r_(r), model_(task.model()), stages_(stages), world_(std::move(world)) {
  const int dp = int(r.parallel.dp), tp = int(r.parallel.tp), pp = int(r.parallel.pp);
  mesh_ = std::make_unique<dist::DeviceMesh>(world_, dp, tp, pp);
  dp_group_ = mesh_->group_ptr(dist::DeviceMesh::DP);
  tp_group_ = mesh_->group_ptr(dist::DeviceMesh::TP);
  pp_group_ = mesh_->group_ptr(dist::DeviceMesh::PP);
  nn::Module& model = model_;

  // 0. where every parameter lives: its block, or before the blocks (embed), or after them (head)
  const auto blocks = nn::find_blocks(model);
  BRIGADE_CHECK(int64_t(blocks.size()) == stages.num_blocks && stages.num_blocks >= 1, InternalError,
                "model parallel: the task's stages name {} blocks, the model has {} nn::Blocks", stages.num_blocks,
                blocks.size());
  const nn::NamedTensors params = model.named_parameters();
  int64_t first_block_at = -1, last_block_at = -1;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string& name = params[i].first;
    full_shapes_.emplace_back(name, params[i].second.shape());
    int64_t b = -1;
    for (size_t k = 0; k < blocks.size() && b < 0; ++k)
      if (name.rfind(blocks[k].first + ".", 0) == 0) b = int64_t(k);
    place_[name] = b;
    if (b >= 0) {
      if (first_block_at < 0) first_block_at = int64_t(i);
      last_block_at = int64_t(i);
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    int64_t& at = place_[params[i].first];
    if (at >= 0) continue;
    BRIGADE_CHECK(int64_t(i) < first_block_at || int64_t(i) > last_block_at, InternalError,
                  "model parallel: parameter {} is registered between the model's blocks, so no pipeline stage can "
                  "own it",
                  params[i].first);
    at = int64_t(i) < first_block_at ? kEmbed : kHead;
  }
  for (const auto& [name, p] : params)
    if (std::find(stages.tied.begin(), stages.tied.end(), name) != stages.tied.end()) tied_.push_back(name);
  BRIGADE_CHECK(tied_.size() == stages.tied.size(), InternalError,
                "model parallel: a tied parameter of the task's stages is not a parameter of the model");

  // 1. tensor parallel
  BRIGADE_CHECK(tp == 1 || !stages.tp_plan.empty(), ConfigError,
                "{}: parallel.tp = {}: model.type = \"{}\" declares no tensor-parallel plan; use parallel.dp", r.path,
                tp, r.model.type);
  layout_ = parallel::apply_tensor_parallel(model, stages.tp_plan, tp_group_);

  // 2. the pipeline: schedule, virtual stages, the cut
  const int64_t L = stages.num_blocks, M = r.parallel.microbatches, Bm = r.train.batch_size / M;
  const Shape act = stages.hidden(Bm);  // (Bm, T, C)
  BRIGADE_CHECK(act.size() >= 2 && shape_numel(act) > 0, InternalError, "model parallel: stage activations {}",
                shape_str(act));
  // Estimated forward FLOPs of one micro-batch on this rank (the backward costs about twice as
  // much): 2 per parameter per token for a GEMM (this rank's part of a split one), 4 N T C for
  // a block's attention scores and values (split by heads), nothing for an embedding lookup.
  const double C = double(act.back()), N = double(shape_numel(act)) / C, T = act.size() >= 3 ? double(act[1]) : 1.0;
  std::set<std::string> lookups;
  for (auto& [path, m] : model.named_modules())
    if (dynamic_cast<nn::Embedding*>(m)) lookups.insert(path + ".weight");
  std::vector<double> block_cost(size_t(L), 4.0 * N * T * C / tp);
  double first_extra = 0.0, last_extra = 0.0;
  for (const auto& [name, shape] : full_shapes_) {
    const parallel::TpSplit& sp = layout_.split(name);
    const double flops = 2.0 * N * double(shape_numel(shape)) / (sp.sharded ? tp : 1);
    const int64_t at = place_.at(name);
    if (at >= 0) block_cost[size_t(at)] += flops;
    if ((at == kHead || tied(name)) && !(lookups.count(name) && !tied(name))) last_extra += flops;
    if (at == kEmbed && !lookups.count(name)) first_extra += flops;
  }
  double f_block = block_cost[0], bi_block = block_cost[0], w_block = block_cost[0];
  double f_last = last_extra, bi_last = last_extra, w_last = last_extra;
  const std::string& sched = r.parallel.schedule;
  if (sched == "dynamic" && pp > 1) {
    // Measured per-micro-batch times of one block and of the head on this rank (medians,
    // averaged over every rank), through the task's stages on a synthetic micro-batch, so the
    // simulator compares the schedules on real costs.
    const StageTimes st =
        measure_stage_times(model, stages, task.synthetic_batch(r.run.seed, Bm), act, precision_policy(r.precision));
    f_block = st.block_f, bi_block = st.block_bi, w_block = st.block_w;
    f_last = st.head_f, bi_last = st.head_bi, w_last = st.head_w;
    double t[6] = {f_block, bi_block, w_block, f_last, bi_last, w_last};
    world_->allreduce(t, 6);
    for (double& v : t) v /= double(world_->size());
    f_block = t[0], bi_block = t[1], w_block = t[2], f_last = t[3], bi_last = t[4], w_last = t[5];
    std::fill(block_cost.begin(), block_cost.end(), f_block + bi_block + w_block);
    last_extra = f_last + bi_last + w_last;
    first_extra = 0.0;
  }
  // per-stage costs of the model cut into pp x v stages (for ZB-H1's W placement and `dynamic`)
  auto costs_for = [&](const std::vector<int64_t>& b) {
    parallel::PipeCosts c;
    const int S = int(b.size()) - 1;
    for (int s = 0; s < S; ++s) {
      double blk = 0.0;
      for (int64_t i = b[size_t(s)]; i < b[size_t(s) + 1]; ++i) blk += block_cost[size_t(i)];
      const double share = blk / block_cost[0];  // blocks of this stage, in units of block 0
      c.forward.push_back(share * f_block + (s == S - 1 ? f_last : 0.0));
      c.backward_input.push_back(share * bi_block + (s == S - 1 ? bi_last : 0.0));
      c.backward_weight.push_back(share * w_block + (s == S - 1 ? w_last : 0.0));
    }
    return c;
  };
  auto bounds_for = [&](int S) {
    if (!r.parallel.stage_layers.empty())
      return parallel::stage_bounds_from_list(parse_count_list("parallel.stage_layers", r.parallel.stage_layers), S, L);
    return parallel::partition_layers(block_cost, S, first_extra, last_extra);
  };
  parallel::PipePlan plan;
  if (sched == "dynamic" && pp > 1) {
    std::vector<int> vs;
    if (M % pp == 0)
      for (int v = 2; v <= int(r.parallel.virtual_stages); ++v)
        if (int64_t(v) * pp <= L) vs.push_back(v);
    parallel::PipeChoice choice = parallel::choose_pipe_plan(pp, int(M), vs, int(r.parallel.max_in_flight),
                                                             [&](int v) { return costs_for(bounds_for(pp * v)); });
    plan = choice.plan;
    choice_table_ = choice.table;
  } else {
    const parallel::PipeSchedule kind =
        sched == "dynamic" ? parallel::PipeSchedule::OneFOneB : parallel::pipe_schedule_from_name(sched);
    const int v = kind == parallel::PipeSchedule::Interleaved ? int(r.parallel.virtual_stages) : 1;
    plan = parallel::build_pipe_plan(kind, pp, int(M), v, costs_for(bounds_for(pp * v)));
  }
  bounds_ = bounds_for(plan.stages());
  const int S = plan.stages(), me = pp_group_->rank();
  first_ = me == plan.rank_of(0);
  last_ = me == plan.rank_of(S - 1);
  reports_loss_ = last_ && tp_group_->rank() == 0;
  exec_ = std::make_unique<parallel::PipelineExecutor>(plan, *pp_group_, act);

  // 3. keep this rank's parameters, free the others
  std::map<std::string, nn::Module*> modules;
  for (auto& [path, m] : model.named_modules()) modules[path] = m;
  for (auto& [name, p] : model.named_parameters()) {
    const bool mine = owner_pp(name) == me || (tied(name) && last_);  // the head's copy of a tied parameter
    if (mine)
      local_.emplace_back(name, p);
    else
      release_parameter(model, modules, name);
  }
  if (!choice_table_.empty()) say("pipeline schedule (dynamic), candidates:\n" + choice_table_);
}

bool ModelParallel::tied(const std::string& name) const {
  return std::find(tied_.begin(), tied_.end(), name) != tied_.end();
}

std::vector<parallel::ParamUnit> ModelParallel::units() const {
  parallel::ParamUnit u;
  u.name = fmt::format("pp{}.tp{}", pp_group_->rank(), tp_group_->rank());
  u.params = local_;
  return {u};
}

std::vector<parallel::PipeChunk> ModelParallel::chunks(const Batch& b, const std::vector<int64_t>& rows,
                                                       const std::vector<double>& weight, const amp::Policy& policy,
                                                       Metrics* train, Metrics* eval) {
  const parallel::PipePlan& plan = exec_->plan();
  const int p = plan.p, S = plan.stages(), me = pp_group_->rank();
  std::vector<parallel::PipeChunk> out;
  for (int c = 0; c < plan.v; ++c) {
    const int s = c * p + me;
    const int64_t lo = bounds_[size_t(s)], hi = bounds_[size_t(s) + 1];
    out.push_back({[this, s, S, lo, hi, b, rows, weight, policy, train, eval](int mb, const Tensor& in) {
      amp::AutocastScope autocast(policy);
      Batch part = b.narrow(rows[size_t(mb)], rows[size_t(mb) + 1] - rows[size_t(mb)]);
      if (stages_.count) part.count = stages_.count(part);
      Tensor x = s == 0 ? stages_.embed(part) : in;  // (Bm, T, C)
      x = stages_.blocks(x, lo, hi, part);
      if (s != S - 1) return x;
      if (eval) {  // the forward only: score, and hand the executor a zero loss
        stages_.score(x, part, *eval);
        return Tensor::zeros({}, DType::F32);
      }
      Tensor loss = stages_.head(x, part, *train);
      return weight.empty() ? loss : fn::mul_scalar(loss, weight[size_t(mb)]);  // its share of the batch's mean
    }});
  }
  return out;
}

double ModelParallel::train_batch(const Batch& b, double loss_scale, const amp::Policy& policy, Metrics& train) {
  const int m = exec_->plan().m;
  BRIGADE_CHECK(b.rows == r_.train.batch_size, InternalError, "model parallel: a training batch of {} rows, not {}",
                b.rows, r_.train.batch_size);
  const std::vector<int64_t> rows = cut_rows(b.rows, m);
  // Micro-batches holding different item counts (masked tokens): each one's mean loss counts
  // with its share of the batch's items (m x count / total, as the scale is loss_scale / m).
  std::vector<double> weight;
  if (stages_.count) {
    std::vector<double> counts;
    double total = 0.0;
    for (int mb = 0; mb < m; ++mb) {
      counts.push_back(double(stages_.count(b.narrow(rows[size_t(mb)], rows[size_t(mb) + 1] - rows[size_t(mb)]))));
      total += counts.back();
    }
    for (double c : counts) weight.push_back(total > 0 ? double(m) * c / total : 0.0);
  }
  last_step_ = exec_->run(chunks(b, rows, weight, policy, &train, nullptr), loss_scale / double(m), /*train=*/true);
  return reports_loss_ ? last_step_.loss_sum / double(m) : 0.0;
}

void ModelParallel::eval_batch(const Batch& b, const amp::Policy& policy, Metrics& eval) {
  const int m = exec_->plan().m;
  const std::vector<int64_t> rows = cut_rows(b.rows, m);
  const amp::Policy used = stages_.score_in_fp32 ? amp::Policy{} : policy;
  (void)exec_->run(chunks(b, rows, {}, used, nullptr, &eval), 1.0, /*train=*/false,
                   [&](int mb) { return stages_.hidden(rows[size_t(mb) + 1] - rows[size_t(mb)]); });
}

void ModelParallel::sync_tied_gradients() {
  if (pp_group_->size() == 1 || first_ == last_) return;
  const int first = exec_->plan().rank_of(0), last = exec_->plan().rank_of(exec_->plan().stages() - 1);
  int k = 0;
  for (const std::string& name : tied_) {
    Tensor w;
    for (auto& [n, p] : local_)
      if (n == name) w = p;
    BRIGADE_CHECK(w.defined(), InternalError, "tied parameter {} missing on pp rank {}", name, pp_group_->rank());
    Tensor g = w.grad();
    if (!g.defined()) {  // the stage's backward never reached it: a zero gradient
      w.set_grad(Tensor::zeros(w.shape(), DType::F32));
      g = w.grad();
    }
    const int64_t bytes = g.nbytes();
    const int tag = 31999 - k++;
    if (last_) {  // send ours, receive the sum
      pp_group_->send(g.raw_data(), bytes, first, tag);
      pp_group_->recv(g.raw_data(), bytes, first, tag);
    } else {  // first: add the head's gradient to the embedding's, send the sum back
      Tensor other = Tensor::empty(g.shape(), DType::F32, MemTag::Workspace);
      pp_group_->recv(other.raw_data(), bytes, last, tag);
      ops::add_(g, other);
      pp_group_->send(g.raw_data(), bytes, last, tag);
    }
  }
}

double ModelParallel::clip_grad_norm(parallel::DataParallel& dp, double max_norm, dist::ProcessGroup& ctrl) const {
  // Count each distinct gradient element once over the mesh: ZeRO-0 replicas only on dp rank 0,
  // tp-replicated parameters only on tp rank 0, tied parameters only on the first stage.
  const bool dp_counts = dp.zero() >= 1 || mesh_->coord(dist::DeviceMesh::DP) == 0;
  const bool tp0 = tp_group_->rank() == 0;
  double sq = 0.0;
  for (auto& [name, p] : dp.optimizer_params()) {
    if (!dp_counts || (!tp0 && parallel::tp_replicated(layout_, name)) || (tied(name) && !first_)) continue;
    const Tensor g = p.grad();
    if (g.defined()) sq += ops::sum_squares(g);
  }
  ctrl.allreduce(&sq, 1);
  const double norm = std::sqrt(sq);
  if (max_norm > 0.0 && norm > max_norm)
    for (auto& [name, p] : dp.optimizer_params())
      if (p.grad().defined()) ops::mul_scalar_(p.grad(), max_norm / (norm + 1e-6));  // as torch's clip_grad_norm_
  return norm;
}

int ModelParallel::owner_pp(const std::string& name) const {
  const parallel::PipePlan& plan = exec_->plan();
  const int64_t b = place_.at(name);
  if (b >= 0) {
    const int s = int(std::upper_bound(bounds_.begin(), bounds_.end(), b) - bounds_.begin()) - 1;
    return plan.rank_of(s);
  }
  if (b == kEmbed || tied(name)) return plan.rank_of(0);
  return plan.rank_of(plan.stages() - 1);
}

nn::NamedTensors ModelParallel::gather_full() {
  const int tp = tp_group_->size(), dpn = dp_group_->size();
  const bool dp0 = mesh_->coord(dist::DeviceMesh::DP) == 0;
  std::map<std::string, Tensor> local;
  for (auto& [name, p] : local_) local[name] = p;
  nn::NamedTensors out;
  int tag = 0;
  for (const auto& [name, shape] : full_shapes_) {
    const int owner = owner_pp(name);
    const int owner_world = (owner * dpn + 0) * tp + 0;  // (pp, dp 0, tp 0)
    Tensor full;
    if (dp0 && pp_group_->rank() == owner) {
      const Tensor mine = local.at(name);
      full = tp > 1 ? parallel::tp_gather_param(layout_, name, mine, *tp_group_) : mine.contiguous();
      if (world_->rank() == owner_world && owner_world != 0)
        world_->send(full.raw_data(), full.nbytes(), 0, tag % 32000);
    }
    if (world_->rank() == 0) {
      if (owner_world != 0) {
        full = Tensor::empty(shape, DType::F32, MemTag::Other);
        world_->recv(full.raw_data(), full.nbytes(), owner_world, tag % 32000);
      }
      BRIGADE_CHECK(full.shape() == shape, InternalError, "gathered {} as {}, expected {}", name, full.str(),
                    shape_str(shape));
      out.emplace_back(name, full);
    }
    ++tag;
  }
  return out;
}

ModelParallel::PipeReport ModelParallel::report() {
  PipeReport rep;
  const int p = pp_group_->size();
  // every pp rank's events, as (rank, op, stage, mb, start, end) rows summed into one buffer
  std::vector<double> counts(size_t(p), 0.0);
  counts[size_t(pp_group_->rank())] = double(last_step_.events.size());
  pp_group_->allreduce(counts.data(), p);
  int64_t total = 0, before = 0;
  for (int i = 0; i < p; ++i) {
    if (i < pp_group_->rank()) before += int64_t(counts[size_t(i)]);
    total += int64_t(counts[size_t(i)]);
  }
  std::vector<double> rows(size_t(total) * 6 + size_t(p) * 3, 0.0);
  for (size_t i = 0; i < last_step_.events.size(); ++i) {
    const parallel::PipeEvent& e = last_step_.events[i];
    double* row = rows.data() + (size_t(before) + i) * 6;
    row[0] = e.rank, row[1] = double(int(e.action.op)), row[2] = e.action.stage, row[3] = e.action.mb;
    row[4] = e.start, row[5] = e.end;
  }
  double* tail = rows.data() + size_t(total) * 6 + size_t(pp_group_->rank()) * 3;
  tail[0] = last_step_.busy, tail[1] = last_step_.makespan, tail[2] = last_step_.peak_in_flight;
  pp_group_->allreduce(rows.data(), int64_t(rows.size()));
  std::vector<double> busy, span;
  const parallel::PipePlan& plan = exec_->plan();
  parallel::PipeCosts measured;
  measured.forward.assign(size_t(plan.stages()), 0.0);
  measured.backward_input.assign(size_t(plan.stages()), 0.0);
  measured.backward_weight.assign(size_t(plan.stages()), 0.0);
  for (int64_t i = 0; i < total; ++i) {
    const double* row = rows.data() + size_t(i) * 6;
    parallel::PipeEvent e{int(row[0]), {parallel::PipeOp(int(row[1])), int(row[2]), int(row[3])}, row[4], row[5]};
    rep.events.push_back(e);
    const double d = (e.end - e.start) / double(plan.m);  // mean per micro-batch
    const size_t s = size_t(e.action.stage);
    if (e.action.op == parallel::PipeOp::Forward) measured.forward[s] += d;
    if (e.action.op == parallel::PipeOp::Backward || e.action.op == parallel::PipeOp::BackwardInput)
      measured.backward_input[s] += d;
    if (e.action.op == parallel::PipeOp::BackwardWeight) measured.backward_weight[s] += d;
  }
  for (int i = 0; i < p; ++i) {
    const double* t = rows.data() + size_t(total) * 6 + size_t(i) * 3;
    busy.push_back(t[0]);
    span.push_back(t[1]);
    rep.peak_in_flight.push_back(int(t[2]));
  }
  rep.measured_bubble = parallel::measured_bubble(busy, span);
  rep.predicted_bubble = parallel::simulate_pipe_plan(plan, measured).bubble;
  return rep;
}

std::string ModelParallel::describe() const {
  const parallel::PipePlan& plan = exec_->plan();
  std::string stages;
  for (size_t s = 0; s + 1 < bounds_.size(); ++s)
    stages += fmt::format("{}{}", s ? "," : "", bounds_[s + 1] - bounds_[s]);
  return fmt::format(
      "model parallel: dp {} x tp {} x pp {} | {} micro-batches of {} rows | schedule {}{} | blocks per "
      "stage {}",
      mesh_->size(dist::DeviceMesh::DP), mesh_->size(dist::DeviceMesh::TP), mesh_->size(dist::DeviceMesh::PP), plan.m,
      r_.train.batch_size / plan.m, parallel::pipe_schedule_name(plan.kind),
      plan.v > 1 ? fmt::format(" (v = {})", plan.v) : "", stages);
}

// ---------------------------------------------------------------- optimizer state per rank

namespace {
std::string mp_optimizer_file(int rank, int world) {
  return fmt::format("optimizer-mp-{}-of-{}.safetensors", rank, world);
}
std::string mesh_tag(const ModelParallel& mp) {
  std::string b;
  for (int64_t x : mp.stage_bounds()) b += fmt::format("{}{}", b.empty() ? "" : ",", x);
  return fmt::format("dp{}.tp{}.pp{}.v{}.bounds{}", mp.mesh().size(dist::DeviceMesh::DP),
                     mp.mesh().size(dist::DeviceMesh::TP), mp.mesh().size(dist::DeviceMesh::PP), mp.plan().v, b);
}
}  // namespace

void write_mp_optimizer(const std::string& tmp, const ModelParallel& mp, const optim::Optimizer& opt) {
  const int rank = mp.mesh().world().rank(), world = mp.mesh().world().size();
  ckpt::save_safetensors((fs::path(tmp) / mp_optimizer_file(rank, world)).string(), opt.state_tensors(),
                         {{"mesh", mesh_tag(mp)}, {"steps", std::to_string(opt.steps())}});
}

void read_mp_optimizer(const std::string& dir, const ModelParallel& mp, optim::Optimizer& opt, int64_t steps) {
  const int rank = mp.mesh().world().rank(), world = mp.mesh().world().size();
  const fs::path path = fs::path(dir) / mp_optimizer_file(rank, world);
  BRIGADE_CHECK(fs::exists(path), CheckpointError,
                "--resume: {} is missing; a model-parallel run resumes only from a checkpoint of the same mesh "
                "({} processes) — was it saved by a run with other parallel.dp / tp / pp?",
                path.string(), world);
  ckpt::SafetensorsReader in(path.string());
  const std::string want = mesh_tag(mp), saved = in.metadata("mesh").value_or("?");
  BRIGADE_CHECK(saved == want, CheckpointError,
                "--resume: {} was saved on mesh {} but this run is {}; resume with the same parallel.* settings",
                path.string(), saved, want);
  for (auto& [name, t] : opt.state_tensors()) in.get_into(name, t);
  opt.set_steps(steps);
}

// ---------------------------------------------------------------- the step executor

namespace {

class ModelParallelExecutor : public StepExecutor {
 public:
  ModelParallelExecutor(const Recipe& r, Task& task, const Stages& stages, std::shared_ptr<dist::ProcessGroup> world,
                        const std::function<void(const std::string&)>& say)
      : r_(r), mp_(r, task, stages, std::move(world), say) {}
  std::vector<parallel::ParamUnit> units(int) override { return mp_.units(); }
  std::shared_ptr<dist::ProcessGroup> dp_group() override { return mp_.dp_group(); }
  Shard shard() override {
    return {mp_.mesh().coord(dist::DeviceMesh::DP), mp_.mesh().size(dist::DeviceMesh::DP), mp_.dp_group().get()};
  }
  bool communicate_in_backward() const override { return false; }
  double train_micro(Task&, const Batch& b, int64_t, double factor, double weight, const amp::Policy& policy,
                     Metrics& train_metrics, const std::function<void()>& after_forward) override {
    Metrics mine;
    const double v = mp_.train_batch(b, factor, policy, mine);
    if (after_forward) after_forward();
    if (mp_.reports_loss()) train_metrics.merge(mine);
    return weight != 1.0 ? v * weight : v;
  }
  void finish_backward() override { mp_.sync_tied_gradients(); }
  std::function<double(double)> clip(parallel::DataParallel& dp, dist::ProcessGroup& ctrl) override {
    return [this, &dp, &ctrl](double max_norm) { return mp_.clip_grad_norm(dp, max_norm, ctrl); };
  }
  Task::Scorer scorer(Task&, const amp::Policy& policy) override {
    return [this, policy](const Batch& b, Metrics& m) { mp_.eval_batch(b, policy, m); };
  }
  bool reports() const override { return mp_.reports_loss(); }
  bool holds_shards() const override { return true; }
  nn::NamedTensors gather_full() override { return mp_.gather_full(); }
  std::string describe() const override { return mp_.describe(); }
  void write_optimizer(const std::string& tmp, const optim::Optimizer& opt) const override {
    write_mp_optimizer(tmp, mp_, opt);
  }
  void read_optimizer(const std::string& dir, optim::Optimizer& opt, int64_t steps) const override {
    read_mp_optimizer(dir, mp_, opt, steps);
  }
  void report(const std::string& out_dir, const std::string& run_name,
              const std::function<void(const std::string&)>& say) override {
    if (r_.parallel.pp <= 1) return;
    const ModelParallel::PipeReport rep = mp_.report();  // collective: the last step's measured timeline
    if (mp_.mesh().world().rank() != 0) return;
    const fs::path dir(out_dir);
    nlohmann::json pj{{"schedule", std::string(parallel::pipe_schedule_name(mp_.plan().kind))},
                      {"pp", mp_.plan().p},
                      {"virtual_stages", mp_.plan().v},
                      {"microbatches", mp_.plan().m},
                      {"stage_bounds", mp_.stage_bounds()},
                      {"measured_bubble", rep.measured_bubble},
                      {"predicted_bubble", rep.predicted_bubble},
                      {"peak_in_flight", rep.peak_in_flight}};
    std::ofstream(dir / "pipeline.json") << pj.dump(2) << '\n';
    parallel::write_pipe_timeline_svg((dir / "pipeline.svg").string(), rep.events, mp_.plan().p,
                                      fmt::format("{}: {} schedule, measured (last step, pp rank rows)", run_name,
                                                  parallel::pipe_schedule_name(mp_.plan().kind)));
    std::string peaks;
    for (int v : rep.peak_in_flight) peaks += fmt::format("{}{}", peaks.empty() ? "" : " ", v);
    say(
        fmt::format("pipeline: bubble measured {:.1f}% | predicted from the measured stage times {:.1f}% | "
                    "micro-batches in flight per pp rank {} | timeline {}",
                    100.0 * rep.measured_bubble, 100.0 * rep.predicted_bubble, peaks, (dir / "pipeline.svg").string()));
  }

 private:
  Recipe r_;
  ModelParallel mp_;
};

}  // namespace

std::unique_ptr<StepExecutor> make_model_parallel_executor(const Recipe& r, Task& task,
                                                           std::shared_ptr<dist::ProcessGroup> world,
                                                           const std::function<void(const std::string&)>& say) {
  const Stages* stages = task.stages();
  BRIGADE_CHECK(stages != nullptr, ConfigError,
                "{}: parallel.tp and parallel.pp are built for {}; model.type = \"{}\" is not: use parallel.dp", r.path,
                model_types_with(&Capabilities::pipeline_parallel), r.model.type);
  return std::make_unique<ModelParallelExecutor>(r, task, *stages, std::move(world), say);
}

}  // namespace brigade::train
