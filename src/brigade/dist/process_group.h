// Process groups over MPI communicators, collectives with selectable allreduce
// algorithms, and a device mesh with named axes (dp, tp, pp).
//
// MPI is optional at run time: `brigade train` started without a launcher is one
// process and never calls MPI_Init (Env::init sees no launcher environment). Then
// ProcessGroup::world() is a one-rank group whose collectives are local copies.
// Under `mpirun` Env::init calls MPI_Init_thread (MPI_THREAD_MULTIPLE requested,
// at least MPI_THREAD_SERIALIZED required: the trainer's communication thread and
// the main thread never call MPI at the same time).
//
// Reduction orders (fixed, so results are reproducible run to run):
//   mpi   MPI_Allreduce / MPI_Reduce_scatter / MPI_Allgatherv: the library's own
//         algorithm (OpenMPI picks by size; deterministic for a fixed size and np).
//   ring  reduce-scatter + allgather over point-to-point (Patarasuk & Yuan 2009).
//         The buffer is split into P chunks (chunk i = counts[i] elements; even split
//         for allreduce, remainder to the first chunks). In reduce-scatter step s
//         (s = 0..P-2) rank r sends its partial of chunk (r - s - 1) mod P to rank
//         r + 1 and adds the partial received from rank r - 1 to chunk (r - s - 2) mod P
//         as acc = received + local; after P-1 steps rank r holds chunk r summed in the order
//         ((x[r+1] + x[r+2]) + ...) + x[r] (ranks mod P). Allgather then circulates the
//         reduced chunks. Bytes sent per rank: 2 (P-1)/P x buffer bytes (allreduce).
//   tree  binomial-tree reduce to rank 0 then binomial broadcast. In round k
//         (mask = 2^k) a rank with bit k set sends its partial to rank - mask and is
//         done; the receiver computes acc = acc + received. Bytes sent per rank: the
//         buffer once in the reduce (non-root), plus once per child in the broadcast.
//         reduce_scatter: the same reduce of the full buffer to rank 0 (into a
//         temporary), then rank 0 sends every other rank its slice point to point
//         (bytes: the buffer once on non-roots; sum(counts) - counts[0] on rank 0).
// All sums are in fp32 (float buffers) or fp64 (double buffers).
//
// A group of size 1 (every group without MPI) makes no MPI call in a collective and
// counts no bytes. No single MPI call carries more than 2^30 elements: larger
// transfers go in pieces. MPI_Reduce_scatter and MPI_Allgatherv count in ints: a
// count or displacement above INT_MAX makes reduce_scatter(Mpi) a ConfigError
// (use ring or tree) and allgather take the ring allgather instead. A group is used
// by one thread at a time (MPI_THREAD_SERIALIZED).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace brigade::dist {

// MPI lifetime for the process.
struct Env {
  // Initializes MPI if this process was started by a launcher (OMPI_COMM_WORLD_SIZE,
  // PMIX_RANK or PMI_RANK set) and not already initialized; otherwise does nothing.
  static void init(int* argc, char*** argv);
  // MPI was initialized by init() (or init() ran under a launcher and found MPI
  // already initialized by someone else); false again after finalize().
  static bool using_mpi();
  static int world_rank();  // 0 without MPI (kept after finalize())
  static int world_size();  // 1 without MPI (kept after finalize())
  // Ends every rank of the job with `code` (stdio flushed; MPI_Abort under MPI,
  // std::_Exit otherwise).
  [[noreturn]] static void abort(int code);
  static void finalize();  // MPI_Finalize if init() initialized MPI
};

enum class AllreduceAlgo { Mpi, Ring, Tree };
// "mpi" | "ring" | "tree"; anything else is a ConfigError that lists the choices.
AllreduceAlgo allreduce_algo_from_name(const std::string& name);
const char* allreduce_algo_name(AllreduceAlgo a);

class ProcessGroup {
 public:
  // All processes (MPI_COMM_WORLD), or a one-rank group without MPI. Each call returns
  // a new (non-owning) group object with its own bytes_sent counter; not collective.
  static std::shared_ptr<ProcessGroup> world();
  ~ProcessGroup();  // frees the communicator if this group created it
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // MPI_Comm_split: processes with the same color (>= 0) form a group, ordered by key.
  // Collective over this group.
  std::shared_ptr<ProcessGroup> split(int color, int key) const;

  // Sum over ranks, in place. n may be 0. Every rank passes the same n.
  void allreduce(float* data, int64_t n, AllreduceAlgo algo = AllreduceAlgo::Mpi);
  void allreduce(double* data, int64_t n);  // library algorithm; for metrics and norms
  // Max over ranks, in place (e.g. "did any rank overflow").
  void allreduce_max(double* data, int64_t n);
  // in: sum(counts) elements (same layout on every rank); out: this rank's counts[rank()]
  // elements of the sum, i.e. elements [sum(counts[0..rank)), +counts[rank]). counts may
  // contain zeros. Ring uses the ring reduce-scatter; tree reduces to rank 0 and scatters.
  // `out` must not overlap `in`, except that it may be exactly in's own slot
  // (in + sum(counts[0..rank))). `in` is not modified (unless out is its slot).
  void reduce_scatter(const float* in, float* out, const std::vector<int64_t>& counts,
                      AllreduceAlgo algo = AllreduceAlgo::Mpi);
  // in: counts[rank()] elements; out: sum(counts) elements, rank i's at offset
  // sum(counts[0..i)). `in` may alias its own slot in `out` (in place).
  void allgather(const float* in, float* out, const std::vector<int64_t>& counts);
  void broadcast(void* data, int64_t bytes, int root);
  // Blocking point-to-point. The receiver must ask for exactly the bytes sent (fewer
  // arriving is an InternalError); tags are in [0, 32000) (higher ones are reserved
  // for the collectives); sending to or receiving from oneself is an InternalError.
  // A zero-byte send is still a message.
  void send(const void* data, int64_t bytes, int dst, int tag);
  void recv(void* data, int64_t bytes, int src, int tag);
  // Non-blocking send (the same message as send(), in the same pieces): returns at once;
  // `data` must stay valid and unchanged until wait_sends(). Pipeline stages send this way,
  // so two neighbours sending to each other at once cannot deadlock.
  void isend(const void* data, int64_t bytes, int dst, int tag);
  void wait_sends();  // completes every isend of this group
  void barrier();

  // Bytes this rank has sent through this group's point-to-point algorithms
  // (ring, tree, send) plus, for library collectives, the payload handed to MPI
  // (counted as: allreduce n, reduce_scatter sum(counts), allgather counts[rank]*(size-1),
  // broadcast bytes on the root). Exact for ring/tree/send; for library
  // collectives it is the nominal payload, not the wire traffic.
  int64_t bytes_sent() const { return bytes_sent_; }
  void reset_bytes_sent() { bytes_sent_ = 0; }

  // Even split of n elements into size() counts, remainder to the first ranks.
  static std::vector<int64_t> even_counts(int64_t n, int parts);

 private:
  ProcessGroup(void* comm, bool owned);
  void* comm_ = nullptr;  // MPI_Comm (as void* so this header needs no mpi.h); null without MPI
  bool owned_ = false;
  int rank_ = 0, size_ = 1;
  int64_t bytes_sent_ = 0;
  std::vector<void*> pending_;  // MPI_Request handles of isend() (as void*, see comm_)
};

// The world arranged as a grid with named axes. Rank layout (tp fastest, then dp,
// then pp): world_rank = (pp_idx * dp + dp_idx) * tp + tp_idx. The group for an
// axis holds the ranks that differ only in that axis.
class DeviceMesh {
 public:
  // dp * tp * pp must equal world->size() (ConfigError naming both otherwise).
  DeviceMesh(std::shared_ptr<ProcessGroup> world, int dp, int tp, int pp);
  enum Axis { DP = 0, TP = 1, PP = 2 };
  int size(Axis a) const { return sizes_[a]; }
  int coord(Axis a) const { return coords_[a]; }
  ProcessGroup& group(Axis a) const { return *groups_[a]; }
  std::shared_ptr<ProcessGroup> group_ptr(Axis a) const { return groups_[a]; }
  ProcessGroup& world() const { return *world_; }

 private:
  std::shared_ptr<ProcessGroup> world_;
  int sizes_[3] = {1, 1, 1}, coords_[3] = {0, 0, 0};
  std::shared_ptr<ProcessGroup> groups_[3];
};

}  // namespace brigade::dist
