// Interconnect calibration: timing loops over dist::ProcessGroup's collectives, the
// constrained alpha-beta least-squares fit, and the JSON form; see comm_bench.h.
#include "brigade/plan/comm_bench.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>

#include "brigade/core/error.h"
#include "brigade/core/json_number.h"
#include "brigade/core/tensor.h"
#include "brigade/core/thread_clock.h"
#include "brigade/ops/gemm.h"

extern char** environ;

namespace brigade::plan {

namespace {

using Points = std::vector<std::pair<int64_t, double>>;

double sse(const Points& p, double a, double b) {
  double s = 0;
  for (const auto& [x, y] : p) {
    const double r = y - a - b * double(x);
    s += r * r;
  }
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

const char* env_or_null(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

// The launcher as the environment tells it (see CommCalibration::launcher).
std::string detect_launcher(int group_size) {
  std::string s;
  if (const char* np = env_or_null("OMPI_COMM_WORLD_SIZE")) {
    s = std::string("mpirun -np ") + np;
    if (const char* local = env_or_null("OMPI_COMM_WORLD_LOCAL_SIZE"))
      s += std::string(", ") + local + " ranks on this node";
  } else if (env_or_null("PMIX_RANK")) {
    s = "PMIx launcher, " + std::to_string(group_size) + " ranks";
  } else if (env_or_null("PMI_RANK")) {
    s = "PMI launcher (mpiexec or srun), " + std::to_string(group_size) + " ranks";
  } else {
    return "none (one process)";
  }
  // The MCA settings that change how messages move: transports (btl, pml, mtl), collective and
  // one-sided components (coll, osc), polling (mpi_yield_when_idle) and binding. mpirun itself
  // exports dozens of other OMPI_MCA_* variables (job ids, URIs, session dirs) to every rank.
  static const char* const kTransport[] = {
      "btl", "pml", "mtl", "coll", "osc", "mpi_yield_when_idle", "hwloc_base_binding_policy"};
  std::vector<std::string> mca;
  for (char** e = environ; e && *e; ++e) {
    if (std::strncmp(*e, "OMPI_MCA_", 9) != 0) continue;
    const char* name = *e + 9;
    for (const char* t : kTransport)
      if (std::strncmp(name, t, std::strlen(t)) == 0) {
        mca.emplace_back(*e);
        break;
      }
  }
  std::sort(mca.begin(), mca.end());
  if (!mca.empty()) {
    s += " (";
    for (size_t i = 0; i < mca.size(); ++i) s += (i ? ", " : "") + mca[i];
    s += ")";
  }
  return s;
}

// Reading: every failure names the field's path inside the calibration object.
[[noreturn]] void bad(const std::string& path, const std::string& want) {
  throw ConfigError(fmt::format(
      "interconnect calibration: field '{}' {}; re-run `brigade calibrate` under the launcher you train with, "
      "or fix the file",
      path, want));
}
const nlohmann::json& field(const nlohmann::json& obj, const std::string& name, const std::string& path) {
  if (!obj.contains(name)) bad(path, "is missing");
  return obj.at(name);
}
double nonneg_number(const nlohmann::json& v, const std::string& path) {
  if (!v.is_number()) bad(path, "must be a number >= 0, got " + v.dump());
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < 0) bad(path, "must be a finite number >= 0, got " + v.dump());
  return d;
}
int64_t integer_in(const nlohmann::json& v, int64_t lo, int64_t hi, const std::string& path) {
  const auto i = json_int64(v);
  if (!i || *i < lo || *i > hi) bad(path, fmt::format("must be a whole number in [{}, {}], got {}", lo, hi, v.dump()));
  return *i;
}

}  // namespace

double CommFit::seconds(int64_t bytes) const { return alpha_s + beta_s_per_byte * double(bytes); }

double CommFit::interpolate(int64_t bytes) const {
  if (points.empty()) return seconds(bytes);
  Points p = points;
  std::sort(p.begin(), p.end());
  if (bytes <= p.front().first) return p.front().second;
  if (bytes >= p.back().first) return p.back().second * double(bytes) / double(std::max<int64_t>(1, p.back().first));
  for (size_t i = 1; i < p.size(); ++i)
    if (bytes <= p[i].first) {
      const double x0 = double(p[i - 1].first), x1 = double(p[i].first);
      return p[i - 1].second + (p[i].second - p[i - 1].second) * (double(bytes) - x0) / (x1 - x0);
    }
  return p.back().second;
}

CommFit fit_alpha_beta(const Points& points) {
  BRIGADE_CHECK(!points.empty(), ConfigError, "alpha-beta fit: no points to fit (measure at least one size)");
  for (const auto& [x, y] : points)
    BRIGADE_CHECK(x >= 0 && std::isfinite(y), ConfigError,
                  "alpha-beta fit: point ({} bytes, {} s) is invalid: sizes must be >= 0 and times finite", x, y);
  CommFit f;
  f.points = points;
  const double n = double(points.size());
  double mx = 0, my = 0;
  for (const auto& [x, y] : points) mx += double(x) / n, my += y / n;
  // Centred sums: better conditioned than the raw normal equations at sizes ~1e7.
  double sxx = 0, sxy = 0, rxx = 0, rxy = 0;
  for (const auto& [x, y] : points) {
    const double dx = double(x) - mx;
    sxx += dx * dx, sxy += dx * (y - my);
    rxx += double(x) * double(x), rxy += double(x) * y;
  }
  if (sxx == 0) {  // one size only: no slope to fit
    f.alpha_s = std::max(0.0, my);
    return f;
  }
  {
    const double b = sxy / sxx, a = my - b * mx;
    if (a >= 0 && b >= 0) {
      f.alpha_s = a, f.beta_s_per_byte = b;
      return f;
    }
  }
  // The unconstrained optimum is outside alpha, beta >= 0: the constrained one lies on an edge
  // (alpha = 0 or beta = 0); take each edge's optimum and keep the better.
  const double a_only = std::max(0.0, my);
  const double b_only = std::max(0.0, rxy / rxx);  // rxx > 0: some size is not 0
  if (sse(points, 0.0, b_only) < sse(points, a_only, 0.0))
    f.beta_s_per_byte = b_only;
  else
    f.alpha_s = a_only;
  return f;
}

const CommFit& CommCalibration::fit(const std::string& key) const {
  const auto it = fits.find(key);
  if (it != fits.end()) return it->second;
  std::string have;
  for (const auto& [k, v] : fits) have += (have.empty() ? "" : ", ") + k;
  if (fits.empty())
    throw ConfigError(fmt::format(
        "interconnect calibration has no fit for '{}': it holds none (measured with {} rank(s), launcher '{}'); "
        "communication is only measured with at least 2 ranks: run `brigade calibrate` under mpirun -np 2 or more",
        key, ranks, launcher));
  throw ConfigError(fmt::format("interconnect calibration has no fit for '{}'; it has: {}", key, have));
}

CommCalibration measure_comm(dist::ProcessGroup& pg, const CommBenchOptions& o) {
  BRIGADE_CHECK(!o.bytes.empty(), ConfigError, "communication benchmark: the list of sizes is empty");
  for (const int64_t b : o.bytes)
    BRIGADE_CHECK(b > 0 && b % 4 == 0, ConfigError,
                  "communication benchmark: size {} bytes is not a positive multiple of 4 (buffers are fp32)", b);
  BRIGADE_CHECK(o.reps >= 1, ConfigError, "communication benchmark: reps = {}; it must be >= 1", o.reps);
  BRIGADE_CHECK(o.warmup >= 0, ConfigError, "communication benchmark: warmup = {}; it must be >= 0", o.warmup);
  BRIGADE_CHECK(o.busy_threads >= 0, ConfigError, "communication benchmark: busy_threads = {}; it must be >= 0",
                o.busy_threads);

  CommCalibration c;
  c.ranks = pg.size();
  c.launcher = detect_launcher(pg.size());
  c.reps = o.reps, c.warmup = o.warmup;
  if (pg.size() == 1) return c;

  const int P = pg.size(), me = pg.rank();
  const int64_t max_n = *std::max_element(o.bytes.begin(), o.bytes.end()) / 4;
  // Zeros: sums stay zero, so no rep runs into denormals or infinities.
  std::vector<float> in(size_t(max_n), 0.0f), out(size_t(max_n), 0.0f);
  constexpr int kTag = 7;

  using Op = std::function<void(int64_t n)>;  // one collective on n floats
  auto allreduce = [&](dist::AllreduceAlgo a) -> Op { return [&, a](int64_t n) { pg.allreduce(in.data(), n, a); }; };
  auto reduce_scatter = [&](dist::AllreduceAlgo a) -> Op {
    return [&, a](int64_t n) { pg.reduce_scatter(in.data(), out.data(), dist::ProcessGroup::even_counts(n, P), a); };
  };
  const Op allgather = [&](int64_t n) {
    const auto counts = dist::ProcessGroup::even_counts(n, P);
    int64_t off = 0;
    for (int r = 0; r < me; ++r) off += counts[size_t(r)];
    pg.allgather(out.data() + off, out.data(), counts);  // in place, as ZeRO gathers its parameters
  };
  const Op sendrecv = [&](int64_t n) {
    if (me == 0) pg.send(in.data(), n * 4, 1, kTag);
    if (me == 1) pg.recv(in.data(), n * 4, 0, kTag);
  };
  using A = dist::AllreduceAlgo;
  const std::vector<std::pair<std::string, Op>> ops = {
      {"allreduce/mpi", allreduce(A::Mpi)},
      {"allreduce/ring", allreduce(A::Ring)},
      {"allreduce/tree", allreduce(A::Tree)},
      {"reduce_scatter/mpi", reduce_scatter(A::Mpi)},
      {"reduce_scatter/ring", reduce_scatter(A::Ring)},
      {"reduce_scatter/tree", reduce_scatter(A::Tree)},
      {"allgather", allgather},
      {"sendrecv", sendrecv},
  };
  std::vector<double> times(size_t(o.reps));
  // cpu: time each collective by the CPU its calling thread used (clock_gettime's thread clock;
  // the kernel's copies included) instead of the wall clock.
  auto measure = [&](std::map<std::string, CommFit>& fits, bool cpu) {
    for (const auto& [key, op] : ops) {
      Points pts;
      for (const int64_t bytes : o.bytes) {
        const int64_t n = bytes / 4;
        for (int w = 0; w < o.warmup; ++w) {
          pg.barrier();
          op(n);
        }
        for (int r = 0; r < o.reps; ++r) {
          pg.barrier();
          const auto t0 = std::chrono::steady_clock::now();
          const double c0 = cpu ? thread_cpu_seconds() : 0.0;
          op(n);
          times[size_t(r)] = cpu ? thread_cpu_seconds() - c0
                                 : std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
        pg.allreduce_max(times.data(), o.reps);  // each rep's slowest rank
        pts.emplace_back(bytes, median(times));
      }
      fits[key] = fit_alpha_beta(pts);
    }
  };
  measure(c.fits, false);
  if (o.busy_threads > 0) {
    // The load: fp32 GEMMs of a transformer block's shape (512 x 768 by 768 x 768), on their own
    // thread with busy_threads OpenMP threads, for as long as the collectives are timed.
    std::atomic<bool> stop{false};
    std::thread load([&stop, n = o.busy_threads] {
      omp_set_num_threads(n);
      const Tensor a = Tensor::full({512, 768}, 0.5, DType::F32), b = Tensor::full({768, 768}, 0.25, DType::F32);
      while (!stop.load(std::memory_order_relaxed)) (void)ops::matmul(a, b);
    });
    try {
      measure(c.busy_fits, true);
    } catch (...) {
      stop = true;
      load.join();
      throw;
    }
    stop = true;
    load.join();
    c.busy_threads = o.busy_threads;
  }
  return c;
}

nlohmann::json comm_to_json(const CommCalibration& c) {
  auto fits_json = [](const std::map<std::string, CommFit>& fits) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [key, f] : fits) {
      nlohmann::json pts = nlohmann::json::array();
      for (const auto& [b, s] : f.points) pts.push_back({b, s});
      out[key] = {{"alpha_s", f.alpha_s}, {"beta_s_per_byte", f.beta_s_per_byte}, {"points", pts}};
    }
    return out;
  };
  nlohmann::json j{{"ranks", c.ranks},
                   {"launcher", c.launcher},
                   {"reps", c.reps},
                   {"warmup", c.warmup},
                   {"fits", fits_json(c.fits)}};
  if (c.busy_threads > 0) {
    j["busy_threads"] = c.busy_threads;
    j["busy_fits"] = fits_json(c.busy_fits);
  }
  return j;
}

CommCalibration comm_from_json(const nlohmann::json& j) {
  if (!j.is_object()) bad("(top level)", "must be a JSON object, got " + std::string(j.type_name()));
  CommCalibration c;
  c.ranks = int(integer_in(field(j, "ranks", "ranks"), 1, INT32_MAX, "ranks"));
  const auto& l = field(j, "launcher", "launcher");
  if (!l.is_string()) bad("launcher", "must be a string, got " + l.dump());
  c.launcher = l.get<std::string>();
  c.reps = int(integer_in(field(j, "reps", "reps"), 0, INT32_MAX, "reps"));
  c.warmup = int(integer_in(field(j, "warmup", "warmup"), 0, INT32_MAX, "warmup"));
  auto read_fits = [](const nlohmann::json& fits, const std::string& name, std::map<std::string, CommFit>& out) {
    if (!fits.is_object()) bad(name, "must be an object (collective name -> fit), got " + fits.dump());
    for (const auto& [key, fj] : fits.items()) {
      const std::string p = name + "." + key;
      if (!fj.is_object()) bad(p, "must be an object with alpha_s, beta_s_per_byte and points");
      CommFit f;
      f.alpha_s = nonneg_number(field(fj, "alpha_s", p + ".alpha_s"), p + ".alpha_s");
      f.beta_s_per_byte = nonneg_number(field(fj, "beta_s_per_byte", p + ".beta_s_per_byte"), p + ".beta_s_per_byte");
      const auto& pts = field(fj, "points", p + ".points");
      if (!pts.is_array()) bad(p + ".points", "must be an array of [bytes, seconds] pairs");
      for (size_t i = 0; i < pts.size(); ++i) {
        const std::string pp = fmt::format("{}.points[{}]", p, i);
        if (!pts[i].is_array() || pts[i].size() != 2) bad(pp, "must be a [bytes, seconds] pair, got " + pts[i].dump());
        f.points.emplace_back(integer_in(pts[i][0], 0, INT64_MAX, pp + "[0]"), nonneg_number(pts[i][1], pp + "[1]"));
      }
      out[key] = std::move(f);
    }
  };
  read_fits(field(j, "fits", "fits"), "fits", c.fits);
  if (j.contains("busy_threads")) {  // absent in a calibration that did not measure them
    c.busy_threads = int(integer_in(j.at("busy_threads"), 1, INT32_MAX, "busy_threads"));
    read_fits(field(j, "busy_fits", "busy_fits"), "busy_fits", c.busy_fits);
  }
  return c;
}

}  // namespace brigade::plan
