// Tests of brigade_dist: every collective and every allreduce algorithm against
// the values algebra predicts, on every rank, for odd and even group sizes (CTest
// runs this binary under mpirun -np 1..4, and once without mpirun as the one-rank
// fallback). Inputs are functions of (rank, index), so each rank can compute every
// other rank's contribution: integer-valued inputs give exact sums to compare
// against, and random non-integer inputs are used to check the documented ring
// and tree summation orders bit for bit by replaying them here.
//
// Every rank runs the same tests in the same order and makes every collective
// call before checking anything (EXPECT_*, never ASSERT_* between collectives), so
// a failing check does not leave the other ranks waiting in a collective.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/dist/limits.h"
#include "brigade/dist/process_group.h"

namespace {

using brigade::ConfigError;
using brigade::InternalError;
using brigade::dist::AllreduceAlgo;
using brigade::dist::DeviceMesh;
using brigade::dist::Env;
using brigade::dist::ProcessGroup;

const AllreduceAlgo kAlgos[] = {AllreduceAlgo::Mpi, AllreduceAlgo::Ring, AllreduceAlgo::Tree};

std::shared_ptr<ProcessGroup> world() { return ProcessGroup::world(); }

// Sizes from the issue: tiny, around the group size, and large and odd.
std::vector<int64_t> test_sizes(int P) { return {0, 1, 2, 3, 7, P - 1, P, P + 1, 1000, 100003}; }

// Even split written out from the header's words (remainder to the first chunks),
// independent of ProcessGroup::even_counts.
std::vector<int64_t> split_evenly(int64_t n, int P) {
  std::vector<int64_t> c(static_cast<size_t>(P));
  for (int i = 0; i < P; ++i) c[static_cast<size_t>(i)] = n / P + (i < n % P ? 1 : 0);
  return c;
}
std::vector<int64_t> prefix(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offs(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) offs[i] = offs[i - 1] + counts[i - 1];
  return offs;
}
int64_t sum_of(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }
int chunk_of(int64_t j, const std::vector<int64_t>& counts) {
  int64_t end = 0;
  for (size_t c = 0; c < counts.size(); ++c) {
    end += counts[c];
    if (j < end) return static_cast<int>(c);
  }
  return -1;
}

// Uneven count patterns for P ranks, with zeros wherever P allows.
std::vector<std::vector<int64_t>> count_patterns(int P) {
  std::vector<std::vector<int64_t>> out;
  std::vector<int64_t> a(static_cast<size_t>(P)), last(static_cast<size_t>(P), 0), zeros(static_cast<size_t>(P), 0),
      first_empty(static_cast<size_t>(P));
  for (int i = 0; i < P; ++i) {
    a[static_cast<size_t>(i)] = (i % 3 == 1) ? 0 : 5 * i + 3;  // zero on ranks 1, 4, ...
    first_empty[static_cast<size_t>(i)] = i;                   // rank 0 gets nothing
  }
  last[static_cast<size_t>(P - 1)] = 1001;  // everything on the last rank
  out.push_back(a);
  out.push_back(last);
  out.push_back(zeros);
  out.push_back(first_empty);
  out.push_back(split_evenly(100003, P));
  return out;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// A non-integer float of varied magnitude (2^-3 .. 2^4), the same on every rank for
// the same (seed, rank, i), so sums of them depend on the order of addition.
float random_value(uint64_t seed, int rank, int64_t i) {
  const uint64_t h = splitmix64(splitmix64(seed * 1000003u + static_cast<uint64_t>(rank)) + static_cast<uint64_t>(i));
  const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
  const int e = static_cast<int>(h & 7u) - 3;
  return std::ldexp(2.0f * u - 1.0f, e);
}

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// Ring order from the header: chunk c summed as ((x[c+1] + x[c+2]) + ...) + x[c].
float ring_replay(const std::function<float(int)>& x, int c, int P) {
  float acc = x((c + 1) % P);
  for (int k = 2; k <= P; ++k) acc = acc + x((c + k) % P);
  return acc;
}
// Tree order from the header: in round k (mask 2^k) every rank with bit k set (and
// still active, i.e. lower bits clear) hands its partial to rank - mask, which
// computes acc = acc + received. Rank 0's partial is the result.
float tree_replay(const std::function<float(int)>& x, int P) {
  std::vector<float> acc(static_cast<size_t>(P));
  for (int q = 0; q < P; ++q) acc[static_cast<size_t>(q)] = x(q);
  for (int m = 1; m < P; m <<= 1)
    for (int q = 0; q < P; ++q)
      if ((q & m) && (q & (m - 1)) == 0)
        acc[static_cast<size_t>(q - m)] = acc[static_cast<size_t>(q - m)] + acc[static_cast<size_t>(q)];
  return acc[0];
}
// Children of rank r in the binomial tree (ranks it receives from in the reduce).
int tree_children(int r, int P) {
  int n = 0;
  for (int m = 1; m < P; m <<= 1) {
    if (r & m) break;
    if (r + m < P) ++n;
  }
  return n;
}

// Runs fn and returns the message of the exception of type E it throws ("" if none).
template <class E>
std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

// Shrinks the message limits for one test and restores them afterwards.
struct LimitsGuard {
  brigade::dist::detail::MessageLimits saved = brigade::dist::detail::message_limits();
  explicit LimitsGuard(brigade::dist::detail::MessageLimits l) { brigade::dist::detail::set_message_limits(l); }
  ~LimitsGuard() { brigade::dist::detail::set_message_limits(saved); }
};

const char* name(AllreduceAlgo a) { return brigade::dist::allreduce_algo_name(a); }

// ------------------------------------------------------------------ environment

TEST(DistEnv, MatchesLauncher) {
  auto w = world();
  const bool launcher = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") || std::getenv("PMI_RANK");
  EXPECT_EQ(Env::using_mpi(), launcher);
  EXPECT_EQ(w->size(), Env::world_size());
  EXPECT_EQ(w->rank(), Env::world_rank());
  EXPECT_GE(w->rank(), 0);
  EXPECT_LT(w->rank(), w->size());
  if (const char* np = std::getenv("OMPI_COMM_WORLD_SIZE")) {
    EXPECT_EQ(w->size(), std::atoi(np));
  }
  if (const char* np = std::getenv("BRIGADE_TEST_EXPECT_NP")) {
    EXPECT_EQ(w->size(), std::atoi(np));
  }
  if (!launcher) {
    EXPECT_EQ(w->size(), 1);
    EXPECT_EQ(w->rank(), 0);
  }
}

TEST(DistEnv, AbortWithoutMpiExitsWithTheCode) {
  if (Env::using_mpi()) GTEST_SKIP() << "under MPI, Env::abort ends the whole job (MPI_Abort)";
  EXPECT_EXIT(Env::abort(3), ::testing::ExitedWithCode(3), "");
}

TEST(DistAlgo, NamesRoundTripAndErrors) {
  EXPECT_EQ(brigade::dist::allreduce_algo_from_name("mpi"), AllreduceAlgo::Mpi);
  EXPECT_EQ(brigade::dist::allreduce_algo_from_name("ring"), AllreduceAlgo::Ring);
  EXPECT_EQ(brigade::dist::allreduce_algo_from_name("tree"), AllreduceAlgo::Tree);
  for (AllreduceAlgo a : kAlgos) EXPECT_EQ(brigade::dist::allreduce_algo_from_name(name(a)), a);
  for (std::string bad : {"x", "", "Ring", "nccl", "tree "}) {
    EXPECT_EQ(message_of<ConfigError>([&] { brigade::dist::allreduce_algo_from_name(bad); }),
              "parallel.allreduce = '" + bad + "': unknown algorithm; use mpi, ring or tree");
  }
}

// Expected counts are written as scalars compared one by one: GCC 12.2 with
// -march=native on AVX-512 hosts miscompiles some 32-byte constants (e.g. a
// std::vector<int64_t> made from {1, 1, 0, 0} comes out as {1, 1, 1, 1}).
void expect_counts(int64_t n, int parts, std::initializer_list<int> want) {
  const std::vector<int64_t> got = ProcessGroup::even_counts(n, parts);
  ASSERT_EQ(got.size(), want.size()) << "n=" << n << " parts=" << parts;
  size_t i = 0;
  for (int w : want) {
    EXPECT_EQ(got[i], w) << "n=" << n << " parts=" << parts << " index " << i;
    ++i;
  }
}

TEST(DistCounts, EvenCounts) {
  expect_counts(10, 3, {4, 3, 3});
  expect_counts(2, 4, {1, 1, 0, 0});
  expect_counts(0, 3, {0, 0, 0});
  expect_counts(12, 4, {3, 3, 3, 3});
  expect_counts(7, 1, {7});
  EXPECT_EQ(ProcessGroup::even_counts(100003, 3), split_evenly(100003, 3));
  EXPECT_THROW(ProcessGroup::even_counts(5, 0), InternalError);
  EXPECT_THROW(ProcessGroup::even_counts(-1, 2), InternalError);
}

// ------------------------------------------------------------------ allreduce

TEST(DistAllreduce, IntegerInputsGiveExactSums) {
  auto w = world();
  const int P = w->size(), R = w->rank();
  for (AllreduceAlgo algo : kAlgos) {
    for (int64_t n : test_sizes(P)) {
      std::vector<float> x(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = static_cast<float>((R + 1) * (i % 97));
      w->allreduce(x.data(), n, algo);
      int64_t bad = 0, first = -1;
      for (int64_t i = 0; i < n; ++i) {
        const float want = static_cast<float>((i % 97) * P * (P + 1) / 2);
        if (x[static_cast<size_t>(i)] != want && bad++ == 0) first = i;
      }
      EXPECT_EQ(bad, 0) << name(algo) << " n=" << n << " first wrong element " << first << " = "
                        << (first >= 0 ? x[static_cast<size_t>(first)] : 0.0f);
    }
  }
}

// Ring and tree: the result equals the documented order replayed from every rank's
// inputs, bit for bit; the library algorithm is checked against the exact sum.
TEST(DistAllreduce, SummationOrderIsTheDocumentedOne) {
  auto w = world();
  const int P = w->size(), R = w->rank();
  for (AllreduceAlgo algo : kAlgos) {
    for (int64_t n : test_sizes(P)) {
      const uint64_t seed = 17 + static_cast<uint64_t>(n);
      std::vector<float> x(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = random_value(seed, R, i);
      w->allreduce(x.data(), n, algo);
      const std::vector<int64_t> counts = split_evenly(n, P);
      int64_t bad = 0, first = -1;
      for (int64_t i = 0; i < n; ++i) {
        auto xi = [&](int q) { return random_value(seed, q, i); };
        const float got = x[static_cast<size_t>(i)];
        bool ok;
        if (algo == AllreduceAlgo::Mpi) {
          double exact = 0, mag = 0;
          for (int q = 0; q < P; ++q) {
            exact += xi(q);
            mag += std::fabs(xi(q));
          }
          ok = std::fabs(got - exact) <= P * mag * 1.2e-7;
        } else if (algo == AllreduceAlgo::Ring) {
          ok = bits(got) == bits(ring_replay(xi, chunk_of(i, counts), P));
        } else {
          ok = bits(got) == bits(tree_replay(xi, P));
        }
        if (!ok && bad++ == 0) first = i;
      }
      EXPECT_EQ(bad, 0) << name(algo) << " n=" << n << " first differing element " << first;
    }
  }
}

// Data-parallel replicas stay identical only if every rank gets the same bits. For
// ring and tree this follows from the algorithms; for the library algorithm it is
// what Open MPI does (checked here so a change of MPI library would show it).
TEST(DistAllreduce, EveryRankGetsTheSameBits) {
  auto w = world();
  const int P = w->size(), R = w->rank();
  for (AllreduceAlgo algo : kAlgos) {
    for (int64_t n : test_sizes(P)) {
      std::vector<float> x(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = random_value(23, R, i);
      w->allreduce(x.data(), n, algo);
      std::vector<float> all(static_cast<size_t>(n * P));
      w->allgather(x.data(), all.data(), std::vector<int64_t>(static_cast<size_t>(P), n));
      int differing = 0;
      for (int q = 1; q < P && n > 0; ++q)
        differing += std::memcmp(all.data(), all.data() + q * n, static_cast<size_t>(n) * sizeof(float)) != 0;
      EXPECT_EQ(differing, 0) << name(algo) << " n=" << n;
    }
  }
}

TEST(DistAllreduce, DoubleSumAndMax) {
  auto w = world();
  const int P = w->size(), R = w->rank();
  for (int64_t n : test_sizes(P)) {
    std::vector<double> s(static_cast<size_t>(n)), mx(static_cast<size_t>(n)), neg(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      s[static_cast<size_t>(i)] = R + 0.5 * static_cast<double>(i);
      mx[static_cast<size_t>(i)] = (i % P == R) ? 100.0 + static_cast<double>(i) : -0.25 - R;
      neg[static_cast<size_t>(i)] = -1.0 - R - static_cast<double>(i);
    }
    w->allreduce(s.data(), n);
    w->allreduce_max(mx.data(), n);
    w->allreduce_max(neg.data(), n);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double d = static_cast<double>(i);
      bad += s[static_cast<size_t>(i)] != P * (P - 1) / 2.0 + 0.5 * d * P;
      bad += mx[static_cast<size_t>(i)] != 100.0 + d;
      bad += neg[static_cast<size_t>(i)] != -1.0 - d;
    }
    EXPECT_EQ(bad, 0) << "n=" << n;
  }
}

// ------------------------------------------------------------------ reduce_scatter

TEST(DistReduceScatter, UnevenCountsAllAlgorithms) {
  auto w = world();
  const int P = w->size(), R = w->rank();
  const size_t r = static_cast<size_t>(R);
  for (AllreduceAlgo algo : kAlgos) {
    for (const auto& counts : count_patterns(P)) {
      const std::vector<int64_t> offs = prefix(counts);
      const int64_t total = sum_of(counts);
      auto value = [](int rank, int64_t j) { return (rank + 1) * (static_cast<float>(j % 97) + 0.5f * (j % 2)); };
      std::vector<float> in(static_cast<size_t>(total));
      for (int64_t j = 0; j < total; ++j) in[static_cast<size_t>(j)] = value(R, j);
      const std::vector<float> in_before = in;
      std::vector<float> out(static_cast<size_t>(counts[r]), -7.0f);
      w->reduce_scatter(in.data(), out.data(), counts, algo);
      // In place: out is this rank's own slot of in.
      std::vector<float> buf = in_before;
      w->reduce_scatter(buf.data(), buf.data() + offs[r], counts, algo);

      int64_t bad = 0, bad_inplace = 0;
      for (int64_t k = 0; k < counts[r]; ++k) {
        const int64_t j = offs[r] + k;
        const float want = static_cast<float>(P * (P + 1) / 2) * (static_cast<float>(j % 97) + 0.5f * (j % 2));
        bad += out[static_cast<size_t>(k)] != want;
        bad_inplace += buf[static_cast<size_t>(j)] != want;
      }
      EXPECT_EQ(bad, 0) << name(algo) << " counts[rank]=" << counts[r] << " total=" << total;
      EXPECT_EQ(bad_inplace, 0) << name(algo) << " in place, total=" << total;
      EXPECT_TRUE(in == in_before) << name(algo) << ": reduce_scatter modified its input";
    }
  }
}

TEST(DistReduceScatter, RingAndTreeOrderBitwise) {
  auto w = world();
  const int P = w->size(), R = w->rank();
  const size_t r = static_cast<size_t>(R);
  for (AllreduceAlgo algo : {AllreduceAlgo::Ring, AllreduceAlgo::Tree}) {
    for (const auto& counts : count_patterns(P)) {
      const std::vector<int64_t> offs = prefix(counts);
      const int64_t total = sum_of(counts);
      const uint64_t seed = 99 + static_cast<uint64_t>(total);
      std::vector<float> in(static_cast<size_t>(total));
      for (int64_t j = 0; j < total; ++j) in[static_cast<size_t>(j)] = random_value(seed, R, j);
      std::vector<float> out(static_cast<size_t>(counts[r]));
      w->reduce_scatter(in.data(), out.data(), counts, algo);
      int64_t bad = 0;
      for (int64_t k = 0; k < counts[r]; ++k) {
        const int64_t j = offs[r] + k;
        auto xj = [&](int q) { return random_value(seed, q, j); };
        const float want = algo == AllreduceAlgo::Ring ? ring_replay(xj, R, P) : tree_replay(xj, P);
        bad += bits(out[static_cast<size_t>(k)]) != bits(want);
      }
      EXPECT_EQ(bad, 0) << name(algo) << " total=" << total;
    }
  }
}

// ------------------------------------------------------------------ allgather

TEST(DistAllgather, UnevenCountsOutOfPlaceAndInPlace) {
  auto w = world();
  const int P = w->size(), R = w->rank();
  const size_t r = static_cast<size_t>(R);
  for (const auto& counts : count_patterns(P)) {
    const std::vector<int64_t> offs = prefix(counts);
    const int64_t total = sum_of(counts);
    auto value = [](int rank, int64_t k) { return static_cast<float>(rank * 100000 + k); };
    std::vector<float> in(static_cast<size_t>(counts[r]));
    for (int64_t k = 0; k < counts[r]; ++k) in[static_cast<size_t>(k)] = value(R, k);
    std::vector<float> out(static_cast<size_t>(total), -1.0f);
    w->allgather(in.data(), out.data(), counts);
    std::vector<float> inplace(static_cast<size_t>(total), -1.0f);
    std::copy(in.begin(), in.end(), inplace.begin() + offs[r]);
    w->allgather(inplace.data() + offs[r], inplace.data(), counts);
    int64_t bad = 0, bad_inplace = 0;
    for (int q = 0; q < P; ++q)
      for (int64_t k = 0; k < counts[static_cast<size_t>(q)]; ++k) {
        const size_t j = static_cast<size_t>(offs[static_cast<size_t>(q)] + k);
        bad += out[j] != value(q, k);
        bad_inplace += inplace[j] != value(q, k);
      }
    EXPECT_EQ(bad, 0) << "total=" << total;
    EXPECT_EQ(bad_inplace, 0) << "in place, total=" << total;
  }
}

// ------------------------------------------------------------------ broadcast, send/recv, barrier

TEST(DistBroadcast, FromEveryRoot) {
  auto w = world();
  const int P = w->size(), R = w->rank();
  const int64_t sizes[] = {0, 1, 13, 4099, 100003};
  auto pattern = [](int root, int64_t j) { return static_cast<uint8_t>((j * 31 + root * 7 + 1) & 0xFF); };
  for (int root = 0; root < P; ++root) {
    w->reset_bytes_sent();
    int64_t bad = 0, total = 0;
    for (int64_t bytes : sizes) {
      std::vector<uint8_t> buf(static_cast<size_t>(bytes));
      for (int64_t j = 0; j < bytes; ++j)
        buf[static_cast<size_t>(j)] = R == root ? pattern(root, j) : static_cast<uint8_t>(~pattern(root, j));
      w->broadcast(buf.data(), bytes, root);
      for (int64_t j = 0; j < bytes; ++j) bad += buf[static_cast<size_t>(j)] != pattern(root, j);
      total += bytes;
    }
    EXPECT_EQ(bad, 0) << "root " << root;
    EXPECT_EQ(w->bytes_sent(), (R == root && P > 1) ? total : 0) << "root " << root;
  }
}

TEST(DistSendRecv, RingOfMessages) {
  auto w = world();
  const int P = w->size(), R = w->rank();
  std::vector<uint8_t> scratch(16);
  EXPECT_THROW(w->send(scratch.data(), 4, R, 0), InternalError);  // to self
  EXPECT_THROW(w->recv(scratch.data(), 4, R, 0), InternalError);
  EXPECT_THROW(w->send(scratch.data(), 4, P, 0), InternalError);  // no such rank
  EXPECT_THROW(w->recv(scratch.data(), 4, -1, 0), InternalError);
  if (P == 1) return;
  EXPECT_THROW(w->send(scratch.data(), 4, (R + 1) % P, 40000), InternalError);  // reserved tag
  EXPECT_THROW(w->send(scratch.data(), 4, (R + 1) % P, -1), InternalError);

  const int next = (R + 1) % P, prev = (R + P - 1) % P;
  auto size_from = [](int rank) { return int64_t{1000} * rank + 17; };
  auto byte = [](int rank, int64_t j) { return static_cast<uint8_t>((rank * 13 + j * 7) & 0xFF); };
  std::vector<uint8_t> mine(static_cast<size_t>(size_from(R))), theirs(static_cast<size_t>(size_from(prev)), 0);
  for (int64_t j = 0; j < size_from(R); ++j) mine[static_cast<size_t>(j)] = byte(R, j);
  uint8_t empty_in = 0, empty_out = 0;
  w->reset_bytes_sent();
  // Even ranks send first, odd ranks receive first: no cycle of blocked senders.
  if (R % 2 == 0) {
    w->send(mine.data(), size_from(R), next, 3);
    w->send(&empty_out, 0, next, 4);
    w->recv(theirs.data(), size_from(prev), prev, 3);
    w->recv(&empty_in, 0, prev, 4);
  } else {
    w->recv(theirs.data(), size_from(prev), prev, 3);
    w->recv(&empty_in, 0, prev, 4);
    w->send(mine.data(), size_from(R), next, 3);
    w->send(&empty_out, 0, next, 4);
  }
  int64_t bad = 0;
  for (int64_t j = 0; j < size_from(prev); ++j) bad += theirs[static_cast<size_t>(j)] != byte(prev, j);
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(w->bytes_sent(), size_from(R));

  // A message shorter than the receiver expects is an error on the receiver.
  if (R == 0) w->send(scratch.data(), 10, 1, 9);
  if (R == 1) {
    EXPECT_THROW(w->recv(scratch.data(), 16, 0, 9), InternalError);
  }
}

TEST(DistBarrier, WaitsForTheSlowestRank) {
  auto w = world();
  const int P = w->size(), R = w->rank();
  w->barrier();  // line everyone up
  const auto t0 = std::chrono::steady_clock::now();
  if (R == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  w->barrier();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (P > 1) {
    EXPECT_GE(ms, 150.0) << "rank " << R << " left the barrier before rank 0 entered it";
  } else {
    EXPECT_GE(ms, 290.0);
  }
}

// ------------------------------------------------------------------ split and mesh

TEST(DistSplit, EvenAndOddRanks) {
  auto w = world();
  const int P = w->size(), R = w->rank();
  auto g = w->split(R % 2, -R);  // reverse order within each parity
  std::vector<int> members;      // world ranks of the group, in group order
  for (int q = P - 1; q >= 0; --q)
    if (q % 2 == R % 2) members.push_back(q);
  const int want_rank = static_cast<int>(std::find(members.begin(), members.end(), R) - members.begin());
  EXPECT_EQ(g->size(), static_cast<int>(members.size()));
  EXPECT_EQ(g->rank(), want_rank);

  std::vector<float> ids(static_cast<size_t>(g->size()), -1.0f);
  const float me = static_cast<float>(R);
  g->allgather(&me, ids.data(), std::vector<int64_t>(static_cast<size_t>(g->size()), 1));
  std::vector<int> got(ids.begin(), ids.end());
  EXPECT_EQ(got, members);

  float member_sum = 0;
  for (int q : members) member_sum += static_cast<float>(q + 1);
  w->reset_bytes_sent();
  for (AllreduceAlgo algo : kAlgos) {
    const int64_t n = 1001;
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = static_cast<float>((R + 1) * (i % 7));
    g->allreduce(x.data(), n, algo);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += x[static_cast<size_t>(i)] != member_sum * static_cast<float>(i % 7);
    EXPECT_EQ(bad, 0) << name(algo);
  }
  EXPECT_EQ(w->bytes_sent(), 0) << "traffic of a subgroup counted on the world group";

  // One group per rank: every collective is local.
  auto self = w->split(R, 0);
  EXPECT_EQ(self->size(), 1);
  EXPECT_EQ(self->rank(), 0);
  std::vector<float> x = {1.5f, 2.5f, 3.5f}, y(3);
  for (AllreduceAlgo algo : kAlgos) self->allreduce(x.data(), 3, algo);
  self->reduce_scatter(x.data(), y.data(), {3}, AllreduceAlgo::Ring);
  EXPECT_EQ(x, (std::vector<float>{1.5f, 2.5f, 3.5f}));
  EXPECT_EQ(y, x);
  self->barrier();
  EXPECT_EQ(self->bytes_sent(), 0);
}

TEST(DistMesh, EveryFactorizationMatchesTheLayout) {
  auto w = world();
  const int P = w->size(), R = w->rank();
  int meshes = 0;
  for (int dp = 1; dp <= P; ++dp)
    for (int tp = 1; tp <= P / dp; ++tp) {
      if (P % (dp * tp) != 0) continue;
      const int pp = P / (dp * tp);
      DeviceMesh mesh(w, dp, tp, pp);
      ++meshes;
      const std::string what = "dp" + std::to_string(dp) + " tp" + std::to_string(tp) + " pp" + std::to_string(pp);
      // world_rank = (pp_idx * dp + dp_idx) * tp + tp_idx
      const int c_tp = R % tp, c_dp = (R / tp) % dp, c_pp = R / (tp * dp);
      auto rank_at = [&](int ip, int id, int it) { return (ip * dp + id) * tp + it; };
      EXPECT_EQ(rank_at(c_pp, c_dp, c_tp), R) << what;
      EXPECT_EQ(mesh.size(DeviceMesh::DP), dp) << what;
      EXPECT_EQ(mesh.size(DeviceMesh::TP), tp) << what;
      EXPECT_EQ(mesh.size(DeviceMesh::PP), pp) << what;
      EXPECT_EQ(mesh.coord(DeviceMesh::DP), c_dp) << what;
      EXPECT_EQ(mesh.coord(DeviceMesh::TP), c_tp) << what;
      EXPECT_EQ(mesh.coord(DeviceMesh::PP), c_pp) << what;
      EXPECT_EQ(&mesh.world(), w.get()) << what;
      // Members of each axis group, in group order: the ranks that differ from this
      // one only in that axis, by their coordinate along it.
      for (DeviceMesh::Axis axis : {DeviceMesh::DP, DeviceMesh::TP, DeviceMesh::PP}) {
        ProcessGroup& g = mesh.group(axis);
        const int n = mesh.size(axis);
        std::vector<float> ids(static_cast<size_t>(g.size()), -1.0f);
        const float me = static_cast<float>(R);
        g.allgather(&me, ids.data(), std::vector<int64_t>(static_cast<size_t>(g.size()), 1));
        std::vector<int> want, got(ids.begin(), ids.end());
        for (int k = 0; k < n; ++k)
          want.push_back(axis == DeviceMesh::DP   ? rank_at(c_pp, k, c_tp)
                         : axis == DeviceMesh::TP ? rank_at(c_pp, c_dp, k)
                                                  : rank_at(k, c_dp, c_tp));
        EXPECT_EQ(g.size(), n) << what << " axis " << axis;
        EXPECT_EQ(g.rank(), mesh.coord(axis)) << what << " axis " << axis;
        EXPECT_EQ(got, want) << what << " axis " << axis;
      }
    }
  int divisors = 0;  // number of (dp, tp, pp) with product P
  for (int a = 1; a <= P; ++a)
    for (int b = 1; b <= P; ++b)
      if (P % (a * b) == 0) ++divisors;
  EXPECT_EQ(meshes, divisors);
}

TEST(DistMesh, ValidationMessages) {
  auto w = world();
  const int P = w->size();
  const std::string procs = std::to_string(P) + (P == 1 ? " process" : " processes");
  EXPECT_EQ(message_of<ConfigError>([&] { DeviceMesh(w, P + 1, 1, 1); }),
            "parallel.dp (" + std::to_string(P + 1) +
                ") x parallel.tp (1) x parallel.pp (1) = " + std::to_string(P + 1) + " ranks, but the job has " +
                procs + "; launch with mpirun -np " + std::to_string(P + 1) + " or change parallel.*");
  EXPECT_EQ(message_of<ConfigError>([&] { DeviceMesh(w, 1, 2, P); }),
            "parallel.dp (1) x parallel.tp (2) x parallel.pp (" + std::to_string(P) + ") = " + std::to_string(2 * P) +
                " ranks, but the job has " + procs + "; launch with mpirun -np " + std::to_string(2 * P) +
                " or change parallel.*");
  EXPECT_EQ(message_of<ConfigError>([&] { DeviceMesh(w, 0, P, 1); }),
            "parallel.dp (0), parallel.tp (" + std::to_string(P) + ") and parallel.pp (1) must all be >= 1");
  EXPECT_THROW(DeviceMesh(w, P, -1, 1), ConfigError);
  EXPECT_NO_THROW(DeviceMesh(w, 1, 1, P));
}

// ------------------------------------------------------------------ bytes_sent

TEST(DistBytesSent, RingAndTreeAreExact) {
  auto w = world();
  const int P = w->size(), R = w->rank();
  const size_t r = static_cast<size_t>(R);
  const int64_t F = sizeof(float);
  const int children = tree_children(R, P);
  for (int64_t n : {int64_t{1000} * P, int64_t{1001} * P + 1}) {
    std::vector<float> x(static_cast<size_t>(n), 1.0f);
    w->reset_bytes_sent();
    w->allreduce(x.data(), n, AllreduceAlgo::Ring);
    const int64_t ring = w->bytes_sent();
    w->reset_bytes_sent();
    w->allreduce(x.data(), n, AllreduceAlgo::Tree);
    const int64_t tree = w->bytes_sent();
    w->reset_bytes_sent();
    w->allreduce(x.data(), n, AllreduceAlgo::Mpi);
    const int64_t lib = w->bytes_sent();
    const std::vector<int64_t> c = split_evenly(n, P);
    // Ring: reduce-scatter sends every chunk but this rank's, allgather every chunk but rank r+1's.
    const int64_t want_ring = P == 1 ? 0 : (2 * n - c[r] - c[static_cast<size_t>((R + 1) % P)]) * F;
    if (n % P == 0) {
      EXPECT_EQ(ring, 2 * (P - 1) * n * F / P) << "n=" << n;
    }
    EXPECT_EQ(ring, want_ring) << "n=" << n;
    // Tree: the buffer once to the parent (non-root), once per child in the broadcast.
    EXPECT_EQ(tree, ((R != 0 ? 1 : 0) + children) * n * F) << "n=" << n;
    EXPECT_EQ(lib, P == 1 ? 0 : n * F) << "n=" << n;
  }
  // reduce_scatter and allgather with uneven counts.
  for (const auto& counts : count_patterns(P)) {
    const int64_t total = sum_of(counts);
    std::vector<float> in(static_cast<size_t>(total), 1.0f), out(static_cast<size_t>(counts[r]));
    int64_t got[3];
    for (int a = 0; a < 3; ++a) {
      w->reset_bytes_sent();
      w->reduce_scatter(in.data(), out.data(), counts, kAlgos[a]);
      got[a] = w->bytes_sent();
    }
    w->reset_bytes_sent();
    std::vector<float> all(static_cast<size_t>(total));
    w->allgather(out.data(), all.data(), counts);
    const int64_t gathered = w->bytes_sent();
    if (P == 1 || total == 0) {
      EXPECT_EQ(got[0] + got[1] + got[2] + gathered, 0);
      continue;
    }
    EXPECT_EQ(got[0], total * F);
    EXPECT_EQ(got[1], (total - counts[r]) * F);
    // Tree: the full buffer to the parent (non-root); the root sends every other rank its slice.
    EXPECT_EQ(got[2], R != 0 ? total * F : (total - counts[0]) * F);
    EXPECT_EQ(gathered, counts[r] * (P - 1) * F);
  }
}

// ------------------------------------------------------------------ argument checks

TEST(DistErrors, MisuseIsAnInternalError) {
  auto w = world();
  const int P = w->size(), R = w->rank();
  std::vector<float> buf(static_cast<size_t>(4 * P + 8), 0.0f), out(8);
  const std::vector<int64_t> fours(static_cast<size_t>(P), 4);
  std::vector<int64_t> wrong_size(static_cast<size_t>(P + 1), 1), negative(static_cast<size_t>(P), 1);
  negative[0] = -1;
  EXPECT_THROW(w->allreduce(buf.data(), -1), InternalError);
  EXPECT_THROW(w->allreduce(buf.data(), -1, AllreduceAlgo::Ring), InternalError);
  EXPECT_THROW(w->reduce_scatter(buf.data(), out.data(), wrong_size), InternalError);
  EXPECT_THROW(w->reduce_scatter(buf.data(), out.data(), negative, AllreduceAlgo::Tree), InternalError);
  EXPECT_THROW(w->allgather(out.data(), buf.data(), wrong_size), InternalError);
  EXPECT_THROW(w->broadcast(buf.data(), 4, P), InternalError);
  EXPECT_THROW(w->broadcast(buf.data(), 4, -1), InternalError);
  // out overlapping in, but not exactly at this rank's slot
  EXPECT_THROW(w->reduce_scatter(buf.data(), buf.data() + 4 * R + 1, fours), InternalError);
  EXPECT_THROW(w->allgather(buf.data() + 4 * R + 1, buf.data(), fours), InternalError);
  EXPECT_THROW(w->split(-1, 0), InternalError);
}

// ------------------------------------------------------------------ multi-message paths

// With tiny message limits every transfer is split into many pieces and the vector
// collectives exceed the library's count limit: results must not change.
TEST(DistPieces, TinyMessageLimitsGiveTheSameResults) {
  auto w = world();
  const int P = w->size(), R = w->rank();
  const size_t r = static_cast<size_t>(R);
  LimitsGuard guard({7, 50});
  for (AllreduceAlgo algo : kAlgos)
    for (int64_t n : {int64_t{1}, int64_t{13}, int64_t{1000}}) {
      std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        x[static_cast<size_t>(i)] = static_cast<float>((R + 1) * (i % 97));
        y[static_cast<size_t>(i)] = random_value(5, R, i);
      }
      w->allreduce(x.data(), n, algo);
      w->allreduce(y.data(), n, algo);
      const std::vector<int64_t> counts = split_evenly(n, P);
      int64_t bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        auto yi = [&](int q) { return random_value(5, q, i); };
        bad += x[static_cast<size_t>(i)] != static_cast<float>((i % 97) * P * (P + 1) / 2);
        const uint32_t got = bits(y[static_cast<size_t>(i)]);
        if (algo == AllreduceAlgo::Ring) bad += got != bits(ring_replay(yi, chunk_of(i, counts), P));
        if (algo == AllreduceAlgo::Tree) bad += got != bits(tree_replay(yi, P));
      }
      EXPECT_EQ(bad, 0) << name(algo) << " n=" << n;
    }

  const std::vector<int64_t> counts = split_evenly(1003, P);  // every count > library_max (50)
  const std::vector<int64_t> offs = prefix(counts);
  const int64_t total = 1003;
  std::vector<float> in(total);
  for (int64_t j = 0; j < total; ++j) in[static_cast<size_t>(j)] = static_cast<float>((R + 1) * (j % 97));
  for (AllreduceAlgo algo : {AllreduceAlgo::Ring, AllreduceAlgo::Tree}) {
    std::vector<float> out(static_cast<size_t>(counts[r]));
    w->reduce_scatter(in.data(), out.data(), counts, algo);
    int64_t bad = 0;
    for (int64_t k = 0; k < counts[r]; ++k)
      bad += out[static_cast<size_t>(k)] != static_cast<float>(((offs[r] + k) % 97) * P * (P + 1) / 2);
    EXPECT_EQ(bad, 0) << name(algo);
  }
  std::vector<float> out(static_cast<size_t>(counts[r]));
  if (P > 1) {
    EXPECT_THROW(w->reduce_scatter(in.data(), out.data(), counts, AllreduceAlgo::Mpi), ConfigError);
  } else {
    EXPECT_NO_THROW(w->reduce_scatter(in.data(), out.data(), counts, AllreduceAlgo::Mpi));
  }

  // allgather above library_max falls back to the ring allgather
  std::vector<float> mine(static_cast<size_t>(counts[r])), all(total, -1.0f);
  for (int64_t k = 0; k < counts[r]; ++k) mine[static_cast<size_t>(k)] = static_cast<float>(R * 100000 + k);
  w->reset_bytes_sent();
  w->allgather(mine.data(), all.data(), counts);
  int64_t bad = 0;
  for (int q = 0; q < P; ++q)
    for (int64_t k = 0; k < counts[static_cast<size_t>(q)]; ++k)
      bad += all[static_cast<size_t>(offs[static_cast<size_t>(q)] + k)] != static_cast<float>(q * 100000 + k);
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(w->bytes_sent(), P == 1 ? 0 : (total - counts[static_cast<size_t>((R + 1) % P)]) * 4);

  // broadcast, doubles and send/recv in pieces
  std::vector<uint8_t> bytes(1000);
  for (size_t j = 0; j < bytes.size(); ++j) bytes[j] = static_cast<uint8_t>(R == P - 1 ? j * 3 : 0);
  w->broadcast(bytes.data(), 1000, P - 1);
  std::vector<double> d(100), m(100);
  for (size_t i = 0; i < d.size(); ++i) {
    d[i] = static_cast<double>(R + 1);
    m[i] = static_cast<double>(R == static_cast<int>(i) % P ? i : 0);
  }
  w->allreduce(d.data(), 100);
  w->allreduce_max(m.data(), 100);
  bad = 0;
  for (size_t j = 0; j < bytes.size(); ++j) bad += bytes[j] != static_cast<uint8_t>(j * 3);
  for (size_t i = 0; i < d.size(); ++i) bad += (d[i] != P * (P + 1) / 2.0) + (m[i] != static_cast<double>(i));
  EXPECT_EQ(bad, 0);
  if (P > 1) {
    std::vector<uint8_t> msg(500), got(500, 0);
    for (size_t j = 0; j < msg.size(); ++j) msg[j] = static_cast<uint8_t>(j + static_cast<size_t>(R));
    const int next = (R + 1) % P, prev = (R + P - 1) % P;
    if (R % 2 == 0) {
      w->send(msg.data(), 500, next, 1);
      w->recv(got.data(), 500, prev, 1);
    } else {
      w->recv(got.data(), 500, prev, 1);
      w->send(msg.data(), 500, next, 1);
    }
    bad = 0;
    for (size_t j = 0; j < got.size(); ++j) bad += got[j] != static_cast<uint8_t>(j + static_cast<size_t>(prev));
    EXPECT_EQ(bad, 0);
  }
}

}  // namespace
