// MPI lifetime (Env), process groups and their collectives (library, ring and tree
// algorithms), and the device mesh. The algorithms, their reduction order and the
// bytes_sent accounting are documented in process_group.h; this file follows them
// step for step.
//
// Implementation notes:
// - A group of size 1 (including every group without MPI) makes no MPI call in any
//   collective: allreduce and broadcast are no-ops, reduce_scatter and allgather copy.
// - Nothing is sent as one MPI call of more than detail::message_limits().piece
//   elements (default 1 << 30, below INT_MAX): transfers are split into pieces, and
//   both sides derive the same split from the (globally known) counts.
// - Ring steps post every piece as MPI_Irecv/MPI_Isend and wait for all, so the
//   ring cannot deadlock whatever the message size; tree steps are blocking sends
//   and receives that always pair a sender with a rank already waiting for it.
// - Internal point-to-point traffic uses tags from kFirstInternalTag up; user
//   send/recv tags must be below it. Collectives on one communicator are called in
//   the same order by every rank, and MPI does not let messages with the same
//   (source, tag, communicator) overtake each other, so successive collectives
//   cannot mix their messages.
#include "brigade/dist/process_group.h"

#include <mpi.h>

#include <sys/prctl.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/dist/limits.h"
#include "brigade/dist/watchdog.h"

namespace brigade::dist {

namespace {

// ---- process-wide MPI state, owned by Env ----
bool g_initialized_by_us = false;  // Env::init called MPI_Init_thread
bool g_active = false;             // MPI is in use by this process (see Env::using_mpi)
int g_world_rank = 0;
int g_world_size = 1;

detail::MessageLimits g_limits{int64_t{1} << 30, INT_MAX};

// MPI guarantees MPI_TAG_UB >= 32767; user tags live below kFirstInternalTag.
constexpr int kFirstInternalTag = 32000;
constexpr int kTagRingReduceScatter = kFirstInternalTag + 0;
constexpr int kTagRingAllgather = kFirstInternalTag + 1;
constexpr int kTagTreeReduce = kFirstInternalTag + 2;
constexpr int kTagTreeBroadcast = kFirstInternalTag + 3;
constexpr int kTagTreeScatter = kFirstInternalTag + 4;

// The tree receives into a staging buffer of at most this many elements, so its
// extra memory stays bounded for large buffers (messages are split to match).
constexpr int64_t kTreeStage = int64_t{1} << 24;

// MPI_Comm is a pointer in Open MPI and an int in MPICH; both fit in a void*.
static_assert(sizeof(MPI_Comm) <= sizeof(void*), "MPI_Comm must fit in the header's void* slot");
MPI_Comm as_comm(void* p) {
  MPI_Comm c;
  std::memcpy(&c, &p, sizeof c);
  return c;
}
void* from_comm(MPI_Comm c) {
  void* p = nullptr;
  std::memcpy(&p, &c, sizeof c);
  return p;
}

// memcpy of n floats; an empty shard may have a null buffer (an empty vector's data()), which
// memcpy must not be given even with a zero size.
void copy_floats(float* dst, const float* src, int64_t n) {
  if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw InternalError(fmt::format("{} failed: {}", what, std::string(msg, static_cast<size_t>(len))));
}

// Waits for MPI requests without keeping a core busy: tests for kSpin, then sleeps between tests
// (growing to kMaxSleep). MPI's blocking calls spin in their progress loop for as long as the
// peer is late; on a machine whose cores the compute threads fill (every rank's communication
// thread shares them), that spinning is taken from the compute of this rank or another. The
// data of a large transfer is moved by the test calls themselves (or by the kernel's single
// copy), so the sleeps cost at most kMaxSleep per step of an algorithm.
constexpr auto kSpin = std::chrono::microseconds(500);
constexpr long kMaxSleepNs = 100'000;

// BRIGADE_MPI_WAIT: "poll" (the default, above) or "block" (MPI_Waitall: MPI's own spinning
// wait, for measuring the difference).
bool blocking_waits() {
  static const bool b = [] {
    const char* v = std::getenv("BRIGADE_MPI_WAIT");
    if (!v || !*v || std::string_view(v) == "poll") return false;
    if (std::string_view(v) == "block") return true;
    throw ConfigError(fmt::format(
        "environment variable BRIGADE_MPI_WAIT = '{}': must be 'poll' (the default) or 'block'; unset it or fix it",
        v));
  }();
  return b;
}

void wait_requests(MPI_Request* reqs, int n, MPI_Status* statuses, const char* what) {
  if (blocking_waits()) {
    check_mpi(MPI_Waitall(n, reqs, statuses), what);
    return;
  }
  int done = 0;
  check_mpi(MPI_Testall(n, reqs, &done, statuses), what);
  if (done) return;
  const auto t0 = std::chrono::steady_clock::now();
  // Linux lets a sleep overshoot by the thread's timer slack (50 µs by default); sleeps this
  // short need it small.
  thread_local const bool slack_set = prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL) == 0;
  (void)slack_set;
  long sleep_ns = 5'000;
  for (;;) {
    check_mpi(MPI_Testall(n, reqs, &done, statuses), what);
    if (done) return;
    if (std::chrono::steady_clock::now() - t0 < kSpin) continue;
    const timespec ts{0, sleep_ns};
    nanosleep(&ts, nullptr);
    sleep_ns = std::min(kMaxSleepNs, 2 * sleep_ns);
  }
}
void wait_request(MPI_Request* req, const char* what) { wait_requests(req, 1, MPI_STATUSES_IGNORE, what); }

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

// MPI_Init has run and MPI_Finalize has not.
bool mpi_live() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown level";
  }
}

void check_thread_level(int provided) {
  BRIGADE_CHECK(provided >= MPI_THREAD_SERIALIZED, InternalError,
                "MPI provides thread support {} but Brigade needs at least MPI_THREAD_SERIALIZED "
                "(MPI_THREAD_MULTIPLE requested); use an MPI library built with thread support",
                thread_level_name(provided));
}

int mod(int64_t x, int p) { return static_cast<int>(((x % p) + p) % p); }

// Offsets of the chunks given by counts (prefix sums); offs[i] = sum(counts[0..i)).
std::vector<int64_t> offsets_of(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offs(counts.size());
  int64_t acc = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    offs[i] = acc;
    acc += counts[i];
  }
  return offs;
}

bool overlaps(const void* a, int64_t abytes, const void* b, int64_t bbytes) {
  if (abytes <= 0 || bbytes <= 0) return false;
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + static_cast<uintptr_t>(bbytes) && pb < pa + static_cast<uintptr_t>(abytes);
}

// What a collective needs to know about its group.
struct Comm {
  MPI_Comm comm;
  int rank;
  int size;
  int64_t& bytes_sent;
};

// Blocking send of n elements of `type` (elem bytes each) in pieces of at most `piece`.
// With at_least_one, a zero-length transfer is still one (empty) message.
void send_pieces(const Comm& c, const void* data, int64_t n, MPI_Datatype type, int elem, int dst, int tag,
                 int64_t piece, bool at_least_one = false) {
  const char* p = static_cast<const char*>(data);
  int64_t off = 0;
  do {
    if (n == 0 && !at_least_one) break;
    const int count = static_cast<int>(std::min(piece, n - off));
    MPI_Request req;
    check_mpi(MPI_Isend(p + off * elem, count, type, dst, tag, c.comm, &req), "MPI_Isend");
    wait_request(&req, "MPI_Isend");
    off += count;
  } while (off < n);
}

// Blocking receive of exactly n elements sent by send_pieces with the same piece size.
void recv_pieces(const Comm& c, void* data, int64_t n, MPI_Datatype type, int elem, int src, int tag, int64_t piece,
                 bool at_least_one = false) {
  char* p = static_cast<char*>(data);
  int64_t off = 0;
  do {
    if (n == 0 && !at_least_one) break;
    const int count = static_cast<int>(std::min(piece, n - off));
    MPI_Status st;
    MPI_Request req;
    check_mpi(MPI_Irecv(p + off * elem, count, type, src, tag, c.comm, &req), "MPI_Irecv");
    wait_requests(&req, 1, &st, "MPI_Irecv");
    int got = 0;
    MPI_Get_count(&st, type, &got);
    BRIGADE_CHECK(got == count, InternalError,
                  "recv from rank {} (tag {}): expected {} elements in this message, got {}; sender and "
                  "receiver must agree on the size",
                  src, tag, count, got);
    off += count;
  } while (off < n);
}

// Sends ns elements to dst and receives nr elements from src at the same time
// (all pieces posted non-blocking, then waited for), so a ring of these cannot deadlock.
void exchange(const Comm& c, const float* sbuf, int64_t ns, int dst, float* rbuf, int64_t nr, int src, int tag) {
  const int64_t piece = g_limits.piece;
  std::vector<MPI_Request> reqs;
  reqs.reserve(static_cast<size_t>((ns + piece - 1) / piece + (nr + piece - 1) / piece));
  for (int64_t off = 0; off < nr; off += piece) {
    reqs.emplace_back();
    check_mpi(
        MPI_Irecv(rbuf + off, static_cast<int>(std::min(piece, nr - off)), MPI_FLOAT, src, tag, c.comm, &reqs.back()),
        "MPI_Irecv");
  }
  for (int64_t off = 0; off < ns; off += piece) {
    reqs.emplace_back();
    check_mpi(
        MPI_Isend(sbuf + off, static_cast<int>(std::min(piece, ns - off)), MPI_FLOAT, dst, tag, c.comm, &reqs.back()),
        "MPI_Isend");
  }
  wait_requests(reqs.data(), static_cast<int>(reqs.size()), MPI_STATUSES_IGNORE, "ring exchange");
  c.bytes_sent += ns * static_cast<int64_t>(sizeof(float));
}

// ---- ring (see process_group.h) ----

// Ring reduce-scatter: out (counts[rank] elements) = sum over ranks of chunk `rank`
// of in, in the order ((x[r+1] + x[r+2]) + ...) + x[r]. `in` is only read; out may
// be exactly in + offs[rank] (chunk `rank` of in is read only in the last step,
// element by element before the same element of out is written). size >= 2.
void ring_reduce_scatter(const Comm& c, const float* in, float* out, const std::vector<int64_t>& counts,
                         const std::vector<int64_t>& offs) {
  const int P = c.size, r = c.rank;
  const int next = mod(r + 1, P), prev = mod(r - 1, P);
  const int64_t max_count = *std::max_element(counts.begin(), counts.end());
  std::vector<float> buf_a(static_cast<size_t>(max_count)), buf_b(static_cast<size_t>(max_count));
  float* recv = buf_a.data();
  float* spare = buf_b.data();
  const float* send = nullptr;
  for (int s = 0; s < P - 1; ++s) {
    const int cs = mod(int64_t{r} - s - 1, P);  // chunk sent: the one accumulated in step s - 1
    const int cr = mod(int64_t{r} - s - 2, P);  // chunk received and accumulated now
    if (s == 0) send = in + offs[cs];           // (step 0 sends this rank's own input)
    exchange(c, send, counts[cs], next, recv, counts[cr], prev, kTagRingReduceScatter);
    const float* local = in + offs[cr];
    float* acc = (s == P - 2) ? out : recv;  // last step: cr == r, the result
    const int64_t n = counts[cr];
    for (int64_t i = 0; i < n; ++i) acc[i] = recv[i] + local[i];
    send = recv;
    std::swap(recv, spare);
  }
}

// Ring allgather in place: rank r's chunk is at data + offs[r]; in step s rank r
// sends chunk (r - s) to r + 1 and receives chunk (r - s - 1) from r - 1. size >= 2.
void ring_allgather(const Comm& c, float* data, const std::vector<int64_t>& counts, const std::vector<int64_t>& offs) {
  const int P = c.size, r = c.rank;
  const int next = mod(r + 1, P), prev = mod(r - 1, P);
  for (int s = 0; s < P - 1; ++s) {
    const int cs = mod(int64_t{r} - s, P), cr = mod(int64_t{r} - s - 1, P);
    exchange(c, data + offs[cs], counts[cs], next, data + offs[cr], counts[cr], prev, kTagRingAllgather);
  }
}

// ---- binomial tree (see process_group.h) ----

// The mask at which rank r hands its partial to its parent (its lowest set bit);
// for rank 0, the first power of two >= size. r's children are r + m for every
// power of two m < tree_top(r) with r + m < size.
int tree_top(int r, int size) {
  if (r != 0) return r & -r;
  int m = 1;
  while (m < size) m <<= 1;
  return m;
}
bool tree_has_children(int r, int size) { return tree_top(r, size) > 1 && r + 1 < size; }

int64_t tree_piece() { return std::min(g_limits.piece, kTreeStage); }

// Binomial reduce to rank 0. `in` is this rank's contribution; a rank with children
// accumulates acc = acc + received into `acc` (n elements; may equal in; unused on
// leaves), then sends its partial to its parent. On rank 0 the sum ends in acc.
void tree_reduce(const Comm& c, const float* in, float* acc, int64_t n) {
  const int P = c.size, r = c.rank;
  const int64_t piece = tree_piece();
  const float* partial = in;  // becomes acc at the first receive
  std::vector<float> stage;
  for (int m = 1; m < P; m <<= 1) {
    if (r & m) {
      send_pieces(c, partial, n, MPI_FLOAT, sizeof(float), r - m, kTagTreeReduce, piece);
      c.bytes_sent += n * static_cast<int64_t>(sizeof(float));
      return;
    }
    if (r + m >= P) continue;
    if (stage.empty()) {
      if (acc != in) copy_floats(acc, in, n);
      partial = acc;
      stage.resize(static_cast<size_t>(std::min(n, piece)));
    }
    for (int64_t off = 0; off < n; off += piece) {
      const int64_t k = std::min(piece, n - off);
      recv_pieces(c, stage.data(), k, MPI_FLOAT, sizeof(float), r + m, kTagTreeReduce, piece);
      float* a = acc + off;
      for (int64_t i = 0; i < k; ++i) a[i] = a[i] + stage[static_cast<size_t>(i)];
    }
  }
}

// Binomial broadcast from rank 0, in place: receive from the parent, then send to
// the children, largest subtree first.
void tree_broadcast(const Comm& c, float* data, int64_t n) {
  const int P = c.size, r = c.rank;
  const int64_t piece = tree_piece();
  const int top = tree_top(r, P);
  if (r != 0) recv_pieces(c, data, n, MPI_FLOAT, sizeof(float), r - top, kTagTreeBroadcast, piece);
  for (int m = top >> 1; m >= 1; m >>= 1) {
    if (r + m >= P) continue;
    send_pieces(c, data, n, MPI_FLOAT, sizeof(float), r + m, kTagTreeBroadcast, piece);
    c.bytes_sent += n * static_cast<int64_t>(sizeof(float));
  }
}

// Library allreduce (sum or max) in place, in pieces.
void library_allreduce(const Comm& c, void* data, int64_t n, MPI_Datatype type, int elem, MPI_Op op) {
  char* p = static_cast<char*>(data);
  for (int64_t off = 0; off < n; off += g_limits.piece) {
    const int count = static_cast<int>(std::min(g_limits.piece, n - off));
    MPI_Request req;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, p + off * elem, count, type, op, c.comm, &req), "MPI_Iallreduce");
    wait_request(&req, "MPI_Iallreduce");
  }
  c.bytes_sent += n * elem;
}

void check_counts(const std::vector<int64_t>& counts, int size, const char* fn) {
  BRIGADE_CHECK(static_cast<int64_t>(counts.size()) == size, InternalError,
                "{}: counts has {} entries but the group has {} ranks", fn, counts.size(), size);
  for (size_t i = 0; i < counts.size(); ++i)
    BRIGADE_CHECK(counts[i] >= 0, InternalError, "{}: counts[{}] = {} is negative", fn, i, counts[i]);
}

// The layout of a reduce_scatter or allgather between a full buffer (every rank's slot, `total`
// floats) and this rank's slot buffer (`mine` floats), from the per-rank counts (checked): the slot
// offsets, and whether the slot buffer is this rank's own slot of the full one. Any other overlap
// of the two is an InternalError naming them (full_name, slot_name).
struct SlotLayout {
  std::vector<int64_t> offs;
  int64_t total = 0, mine = 0;
  bool own_slot = false;
};
SlotLayout slot_layout(const std::vector<int64_t>& counts, int size, int rank, const float* full, const float* slot,
                       const char* fn, const char* full_name, const char* slot_name) {
  check_counts(counts, size, fn);
  SlotLayout l;
  l.offs = offsets_of(counts);
  l.total = l.offs.back() + counts.back();
  const size_t r = static_cast<size_t>(rank);
  l.mine = counts[r];
  l.own_slot = slot == full + l.offs[r];
  BRIGADE_CHECK(l.own_slot || !overlaps(full, l.total * 4, slot, l.mine * 4), InternalError,
                "{}: {} overlaps {} other than at this rank's own slot", fn, slot_name, full_name);
  return l;
}

// The checks of a point-to-point call `fn` with `peer` (its role: "destination" or "source"; the
// self-send message says "cannot <self_verb> itself"): a rank of the group other than this one, a
// user tag (below the collectives' internal tags), bytes >= 0.
void check_p2p(const char* fn, const char* role, const char* self_verb, int peer, int tag, int64_t bytes, int rank,
               int size) {
  BRIGADE_CHECK(peer >= 0 && peer < size, InternalError, "{}: {} {} is not a rank of this {}-rank group", fn, role,
                peer, size);
  BRIGADE_CHECK(peer != rank, InternalError, "{}: rank {} cannot {} itself", fn, rank, self_verb);
  BRIGADE_CHECK(tag >= 0 && tag < kFirstInternalTag, InternalError,
                "{}: tag {} is outside [0, {}) (higher tags are reserved for collectives)", fn, tag, kFirstInternalTag);
  BRIGADE_CHECK(bytes >= 0, InternalError, "{}: bytes = {} is negative", fn, bytes);
}

}  // namespace

// ---------------------------------------------------------------- limits (tests)

namespace detail {
MessageLimits message_limits() { return g_limits; }
void set_message_limits(MessageLimits limits) {
  BRIGADE_CHECK(
      limits.piece >= 1 && limits.piece <= INT_MAX && limits.library_max >= 1 && limits.library_max <= INT_MAX,
      InternalError, "set_message_limits: piece ({}) and library_max ({}) must be in [1, INT_MAX]", limits.piece,
      limits.library_max);
  g_limits = limits;
}
}  // namespace detail

// ---------------------------------------------------------------- Env

void Env::init(int* argc, char*** argv) {
  if (g_active) return;
  if (!env_set("OMPI_COMM_WORLD_SIZE") && !env_set("PMIX_RANK") && !env_set("PMI_RANK")) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  BRIGADE_CHECK(!finalized, InternalError, "Env::init: MPI was already finalized and cannot be initialized again");
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    if (provided < MPI_THREAD_SERIALIZED) {
      MPI_Finalize();
      check_thread_level(provided);
    }
    g_initialized_by_us = true;
  } else {
    MPI_Query_thread(&provided);
    check_thread_level(provided);
  }
  g_active = true;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world_size);
}

bool Env::using_mpi() { return g_active; }
int Env::world_rank() { return g_world_rank; }
int Env::world_size() { return g_world_size; }

void Env::abort(int code) {
  std::fflush(nullptr);  // std::_Exit and MPI_Abort do not flush stdio
  if (mpi_live()) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

void Env::finalize() {
  Watchdog::stop();  // its thread makes MPI calls
  if (g_initialized_by_us) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
  g_initialized_by_us = false;
  g_active = false;
}

// ---------------------------------------------------------------- algorithm names

AllreduceAlgo allreduce_algo_from_name(const std::string& name) {
  if (name == "mpi") return AllreduceAlgo::Mpi;
  if (name == "ring") return AllreduceAlgo::Ring;
  if (name == "tree") return AllreduceAlgo::Tree;
  throw ConfigError(fmt::format("parallel.allreduce = '{}': unknown algorithm; use mpi, ring or tree", name));
}

const char* allreduce_algo_name(AllreduceAlgo a) {
  switch (a) {
    case AllreduceAlgo::Mpi: return "mpi";
    case AllreduceAlgo::Ring: return "ring";
    case AllreduceAlgo::Tree: return "tree";
  }
  return "unknown";
}

// ---------------------------------------------------------------- ProcessGroup

ProcessGroup::ProcessGroup(void* comm, bool owned) : comm_(comm), owned_(owned) {
  if (comm_ == nullptr) return;
  check_mpi(MPI_Comm_rank(as_comm(comm_), &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(as_comm(comm_), &size_), "MPI_Comm_size");
}

ProcessGroup::~ProcessGroup() {
  if (owned_ && comm_ != nullptr && mpi_live()) {
    MPI_Comm c = as_comm(comm_);
    MPI_Comm_free(&c);
  }
}

std::shared_ptr<ProcessGroup> ProcessGroup::world() {
  if (!Env::using_mpi()) return std::shared_ptr<ProcessGroup>(new ProcessGroup(nullptr, false));
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(from_comm(MPI_COMM_WORLD), false));
}

std::shared_ptr<ProcessGroup> ProcessGroup::split(int color, int key) const {
  const WatchScope watch("split", size_);  // parallel.timeout_s (watchdog.h)
  BRIGADE_CHECK(color >= 0, InternalError, "ProcessGroup::split: color must be >= 0, got {}", color);
  if (comm_ == nullptr) return std::shared_ptr<ProcessGroup>(new ProcessGroup(nullptr, false));
  MPI_Comm nc = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(as_comm(comm_), color, key, &nc), "MPI_Comm_split");
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(from_comm(nc), true));
}

std::vector<int64_t> ProcessGroup::even_counts(int64_t n, int parts) {
  BRIGADE_CHECK(n >= 0 && parts >= 1, InternalError, "even_counts: need n >= 0 and parts >= 1, got n = {}, parts = {}",
                n, parts);
  std::vector<int64_t> counts(static_cast<size_t>(parts), n / parts);
  for (int64_t i = 0; i < n % parts; ++i) ++counts[static_cast<size_t>(i)];
  return counts;
}

void ProcessGroup::allreduce(float* data, int64_t n, AllreduceAlgo algo) {
  const WatchScope watch("allreduce", size_);  // parallel.timeout_s (watchdog.h)
  BRIGADE_CHECK(n >= 0, InternalError, "allreduce: n = {} is negative", n);
  if (n == 0 || size_ == 1) return;
  const Comm c{as_comm(comm_), rank_, size_, bytes_sent_};
  switch (algo) {
    case AllreduceAlgo::Mpi: library_allreduce(c, data, n, MPI_FLOAT, sizeof(float), MPI_SUM); return;
    case AllreduceAlgo::Ring: {
      const std::vector<int64_t> counts = even_counts(n, size_), offs = offsets_of(counts);
      ring_reduce_scatter(c, data, data + offs[static_cast<size_t>(rank_)], counts, offs);
      ring_allgather(c, data, counts, offs);
      return;
    }
    case AllreduceAlgo::Tree:
      tree_reduce(c, data, data, n);
      tree_broadcast(c, data, n);
      return;
  }
  throw InternalError(fmt::format("allreduce: unknown algorithm {}", static_cast<int>(algo)));
}

void ProcessGroup::allreduce(double* data, int64_t n) {
  const WatchScope watch("allreduce", size_);  // parallel.timeout_s (watchdog.h)
  BRIGADE_CHECK(n >= 0, InternalError, "allreduce: n = {} is negative", n);
  if (n == 0 || size_ == 1) return;
  library_allreduce(Comm{as_comm(comm_), rank_, size_, bytes_sent_}, data, n, MPI_DOUBLE, sizeof(double), MPI_SUM);
}

void ProcessGroup::allreduce_max(double* data, int64_t n) {
  const WatchScope watch("allreduce_max", size_);  // parallel.timeout_s (watchdog.h)
  BRIGADE_CHECK(n >= 0, InternalError, "allreduce_max: n = {} is negative", n);
  if (n == 0 || size_ == 1) return;
  library_allreduce(Comm{as_comm(comm_), rank_, size_, bytes_sent_}, data, n, MPI_DOUBLE, sizeof(double), MPI_MAX);
}

void ProcessGroup::reduce_scatter(const float* in, float* out, const std::vector<int64_t>& counts, AllreduceAlgo algo) {
  const WatchScope watch("reduce_scatter", size_);  // parallel.timeout_s (watchdog.h)
  const auto [offs, total, mine, own_slot] = slot_layout(counts, size_, rank_, in, out, "reduce_scatter", "in", "out");
  if (size_ == 1) {
    if (!own_slot) copy_floats(out, in, mine);
    return;
  }
  if (total == 0) return;
  const Comm c{as_comm(comm_), rank_, size_, bytes_sent_};
  switch (algo) {
    case AllreduceAlgo::Mpi: {
      std::vector<int> icounts(counts.size());
      for (size_t i = 0; i < counts.size(); ++i) {
        BRIGADE_CHECK(counts[i] <= g_limits.library_max, ConfigError,
                      "reduce_scatter: rank {}'s shard has {} elements, more than MPI_Reduce_scatter can count "
                      "({}); use parallel.allreduce = 'ring' or 'tree'",
                      i, counts[i], g_limits.library_max);
        icounts[i] = static_cast<int>(counts[i]);
      }
      std::vector<float> tmp;
      float* dst = out;
      if (own_slot) {  // MPI forbids aliased buffers; MPI_IN_PLACE has another layout
        tmp.resize(static_cast<size_t>(mine));
        dst = tmp.data();
      }
      MPI_Request req;
      check_mpi(MPI_Ireduce_scatter(in, dst, icounts.data(), MPI_FLOAT, MPI_SUM, c.comm, &req), "MPI_Ireduce_scatter");
      wait_request(&req, "MPI_Ireduce_scatter");
      if (own_slot) copy_floats(out, tmp.data(), mine);
      bytes_sent_ += total * static_cast<int64_t>(sizeof(float));
      return;
    }
    case AllreduceAlgo::Ring: ring_reduce_scatter(c, in, out, counts, offs); return;
    case AllreduceAlgo::Tree: {
      // Reduce the full buffer to rank 0 (into a temporary on ranks with children),
      // then rank 0 sends every rank its slice point to point (counted exactly).
      std::vector<float> full(tree_has_children(rank_, size_) ? static_cast<size_t>(total) : 0);
      tree_reduce(c, in, full.data(), total);
      const int64_t piece = tree_piece();
      if (rank_ == 0) {
        for (int q = 1; q < size_; ++q) {
          const size_t qs = static_cast<size_t>(q);
          send_pieces(c, full.data() + offs[qs], counts[qs], MPI_FLOAT, sizeof(float), q, kTagTreeScatter, piece);
          bytes_sent_ += counts[qs] * static_cast<int64_t>(sizeof(float));
        }
        copy_floats(out, full.data(), mine);
      } else {
        recv_pieces(c, out, mine, MPI_FLOAT, sizeof(float), 0, kTagTreeScatter, piece);
      }
      return;
    }
  }
  throw InternalError(fmt::format("reduce_scatter: unknown algorithm {}", static_cast<int>(algo)));
}

void ProcessGroup::allgather(const float* in, float* out, const std::vector<int64_t>& counts) {
  const WatchScope watch("allgather", size_);  // parallel.timeout_s (watchdog.h)
  const auto [offs, total, mine, in_place] = slot_layout(counts, size_, rank_, out, in, "allgather", "out", "in");
  if (!in_place) copy_floats(out + offs[static_cast<size_t>(rank_)], in, mine);
  if (size_ == 1 || total == 0) return;
  const Comm c{as_comm(comm_), rank_, size_, bytes_sent_};
  const int64_t max_count = *std::max_element(counts.begin(), counts.end());
  if (max_count > g_limits.library_max || offs.back() > g_limits.library_max) {
    // MPI_Allgatherv counts and displacements are ints: gather over the ring instead
    // (no arithmetic, so the result is the same; bytes_sent counts the ring's sends).
    ring_allgather(c, out, counts, offs);
    return;
  }
  std::vector<int> icounts(counts.size()), idispls(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) {
    icounts[i] = static_cast<int>(counts[i]);
    idispls[i] = static_cast<int>(offs[i]);
  }
  // Our slot of out already holds our data, so MPI_IN_PLACE serves both cases.
  MPI_Request req;
  check_mpi(
      MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, icounts.data(), idispls.data(), MPI_FLOAT, c.comm, &req),
      "MPI_Iallgatherv");
  wait_request(&req, "MPI_Iallgatherv");
  bytes_sent_ += mine * (size_ - 1) * static_cast<int64_t>(sizeof(float));
}

void ProcessGroup::broadcast(void* data, int64_t bytes, int root) {
  const WatchScope watch("broadcast", size_);  // parallel.timeout_s (watchdog.h)
  BRIGADE_CHECK(root >= 0 && root < size_, InternalError, "broadcast: root {} is not a rank of this {}-rank group",
                root, size_);
  BRIGADE_CHECK(bytes >= 0, InternalError, "broadcast: bytes = {} is negative", bytes);
  if (size_ == 1 || bytes == 0) return;
  char* p = static_cast<char*>(data);
  for (int64_t off = 0; off < bytes; off += g_limits.piece) {
    const int count = static_cast<int>(std::min(g_limits.piece, bytes - off));
    MPI_Request req;
    check_mpi(MPI_Ibcast(p + off, count, MPI_BYTE, root, as_comm(comm_), &req), "MPI_Ibcast");
    wait_request(&req, "MPI_Ibcast");
  }
  if (rank_ == root) bytes_sent_ += bytes;
}

void ProcessGroup::send(const void* data, int64_t bytes, int dst, int tag) {
  const WatchScope watch("send", size_);  // parallel.timeout_s (watchdog.h)
  check_p2p("send", "destination", "send to", dst, tag, bytes, rank_, size_);
  const Comm c{as_comm(comm_), rank_, size_, bytes_sent_};
  send_pieces(c, data, bytes, MPI_BYTE, 1, dst, tag, g_limits.piece, /*at_least_one=*/true);
  bytes_sent_ += bytes;
}

void ProcessGroup::recv(void* data, int64_t bytes, int src, int tag) {
  const WatchScope watch("recv", size_);  // parallel.timeout_s (watchdog.h)
  check_p2p("recv", "source", "receive from", src, tag, bytes, rank_, size_);
  const Comm c{as_comm(comm_), rank_, size_, bytes_sent_};
  recv_pieces(c, data, bytes, MPI_BYTE, 1, src, tag, g_limits.piece, /*at_least_one=*/true);
}

void ProcessGroup::isend(const void* data, int64_t bytes, int dst, int tag) {
  check_p2p("isend", "destination", "send to", dst, tag, bytes, rank_, size_);
  static_assert(sizeof(MPI_Request) <= sizeof(void*), "MPI_Request must fit a pointer");
  const char* p = static_cast<const char*>(data);
  const int64_t piece = g_limits.piece;
  int64_t off = 0;
  do {  // the same pieces as send(), so recv() takes either
    const int count = static_cast<int>(std::min(piece, bytes - off));
    MPI_Request req;
    check_mpi(MPI_Isend(p + off, count, MPI_BYTE, dst, tag, as_comm(comm_), &req), "MPI_Isend");
    void* h = nullptr;
    std::memcpy(&h, &req, sizeof(req));
    pending_.push_back(h);
    off += count;
  } while (off < bytes);
  bytes_sent_ += bytes;
}

void ProcessGroup::wait_sends() {
  const WatchScope watch("wait for sends", size_);  // parallel.timeout_s (watchdog.h)
  for (void* h : pending_) {
    MPI_Request req;
    std::memcpy(&req, &h, sizeof(req));
    wait_request(&req, "MPI_Isend");
  }
  pending_.clear();
}

void ProcessGroup::barrier() {
  const WatchScope watch("barrier", size_);  // parallel.timeout_s (watchdog.h)
  if (size_ == 1) return;
  MPI_Request req;
  check_mpi(MPI_Ibarrier(as_comm(comm_), &req), "MPI_Ibarrier");
  wait_request(&req, "MPI_Ibarrier");
}

// ---------------------------------------------------------------- DeviceMesh

DeviceMesh::DeviceMesh(std::shared_ptr<ProcessGroup> world, int dp, int tp, int pp) : world_(std::move(world)) {
  BRIGADE_CHECK(world_ != nullptr, InternalError, "DeviceMesh: world group is null");
  BRIGADE_CHECK(dp >= 1 && tp >= 1 && pp >= 1, ConfigError,
                "parallel.dp ({}), parallel.tp ({}) and parallel.pp ({}) must all be >= 1", dp, tp, pp);
  const int64_t ranks = int64_t{dp} * tp * pp;
  const int procs = world_->size();
  BRIGADE_CHECK(ranks == procs, ConfigError,
                "parallel.dp ({}) x parallel.tp ({}) x parallel.pp ({}) = {} ranks, but the job has {} process{}; "
                "launch with mpirun -np {} or change parallel.*",
                dp, tp, pp, ranks, procs, procs == 1 ? "" : "es", ranks);
  sizes_[DP] = dp;
  sizes_[TP] = tp;
  sizes_[PP] = pp;
  // world_rank = (pp_idx * dp + dp_idx) * tp + tp_idx
  const int r = world_->rank();
  coords_[TP] = r % tp;
  coords_[DP] = (r / tp) % dp;
  coords_[PP] = r / (tp * dp);
  // Each axis group: same color for ranks equal in the other two coordinates,
  // ordered by the coordinate along the axis.
  groups_[DP] = world_->split(coords_[PP] * tp + coords_[TP], coords_[DP]);
  groups_[TP] = world_->split(coords_[PP] * dp + coords_[DP], coords_[TP]);
  groups_[PP] = world_->split(coords_[DP] * tp + coords_[TP], coords_[PP]);
  for (int a = 0; a < 3; ++a)
    BRIGADE_ASSERT(groups_[a]->size() == sizes_[a] && groups_[a]->rank() == coords_[a],
                   "axis {}: group rank {}/{} but coordinate {}/{}", a, groups_[a]->rank(), groups_[a]->size(),
                   coords_[a], sizes_[a]);
}

}  // namespace brigade::dist
