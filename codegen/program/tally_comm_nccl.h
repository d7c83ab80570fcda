// Data, tensor and pipeline parallelism for generated CUDA steps: the same functions as
// driver/tally_comm.h (the CPU steps' MPI collectives), over NCCL on the step's stream. Built
// with TALLY_NCCL (the generated CMakeLists.txt defines it, and links MPI and NCCL, only for a
// plan on several processes): the N
// processes are the ones `mpirun -np N` started, one per GPU (a process takes the GPU of its
// rank among the processes of its node); MPI starts them and hands rank 0's ncclUniqueId to the
// others, NCCL moves the gradients. Without TALLY_NCCL the group is this one process.
//
// Every collective works in place on a region of the memory plan (the gradients) and is timed
// with CUDA events like a kernel, under the op path the step set (ctx.where). NCCL sums bf16 and
// fp16 gradients in their own type. ZeRO-1's reduce-scatter and all-gather over the shards
// (uneven where a bucket crosses a shard boundary) are grouped ncclReduce / ncclBroadcast calls,
// one per rank's part.
//
// Tensor parallel (issue 39 item 7): tp_all_reduce is an ncclAllReduce on the tensor group's
// communicator (the world with tensor parallelism alone; split_groups cuts it with
// ncclCommSplit by tally_comm.h's rule). Pipeline parallel: pp_send / pp_recv are ncclSend /
// ncclRecv, which NCCL pairs between two ranks in issue order (no tags) and which block a
// stream until the peer takes part. A send is therefore held back until this rank's next
// receive and issued with it in one ncclGroupStart/End (Megatron's send_forward_recv_backward
// and send_backward_recv_forward), or alone before its slot is written again (pp_wait) or at
// the end of the schedule (pp_wait_all). The byte counters are tally_comm.h's: the bytes a
// ring all-reduce sends (NCCL picks its own algorithm; the count is the ring's, which the
// estimate prices) and every pipeline send's bytes, by group. Under a replayed CUDA graph the
// region's counts are those of its capture (count_replay).
#pragma once

#include "cuda/tally_rt.cuh"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef TALLY_NCCL
#include "driver/tally_mpi.h"

#include <nccl.h>
#endif

namespace tally_comm {

/// Which count of sent bytes a transfer adds to (tally_comm.h's kinds).
enum SentKind { kData = 0, kTensor = 1, kPipeline = 2, kKinds = 3 };

#ifdef TALLY_NCCL

using tally_mpi::rank;
using tally_mpi::size;
using tally_mpi::sum; // the loss, the overflow check's Σg² of ZeRO shards, master shards for --save
using tally_mpi::gather_counts; // the ranks' byte counts, outside the timed steps
using tally_mpi::merge;         // --save's pieces, bitwise or

namespace detail {

inline void nccl(ncclResult_t r, const char *what, const char *where = "") {
  if (r != ncclSuccess)
    throw std::runtime_error(std::string(what) + " failed" + (where && *where ? std::string(" at '") + where + "'" : "") +
                             ": " + ncclGetErrorString(r));
}

inline ncclComm_t &comm() {
  static ncclComm_t c = nullptr;
  return c;
}

inline int &localRank() {
  static int r = 0;
  return r;
}

template <class T> ncclDataType_t type();
template <> inline ncclDataType_t type<float>() { return ncclFloat32; }
template <> inline ncclDataType_t type<rt::bf16>() { return ncclBfloat16; }
template <> inline ncclDataType_t type<rt::f16>() { return ncclFloat16; }

} // namespace detail

/// Starts MPI (before anything else reads argv) and finds this process's rank among the
/// processes of its node: the GPU it uses (device()).
inline void init(int *argc, char ***argv) {
  tally_mpi::check(MPI_Init(argc, argv), "MPI_Init");
  MPI_Comm node;
  tally_mpi::check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
              "MPI_Comm_split_type");
  tally_mpi::check(MPI_Comm_rank(node, &detail::localRank()), "MPI_Comm_rank(node)");
  MPI_Comm_free(&node);
}
/// The GPU of this process: its rank among its node's processes.
inline int device() { return detail::localRank(); }

/// A group of ranks the collectives run over: its communicator, this rank's place in it, its
/// size, and which count of sent bytes its transfers add to (tally_comm.h's Group).
struct Group {
  ncclComm_t comm;
  int rank, size;
  SentKind kind;
  bool owned; ///< split from the world (destroyed by finalize)
};

namespace detail {
inline Group &data_group() {
  static Group g{nullptr, 0, 1, kData, false};
  return g;
}
inline Group &tensor_group() {
  static Group g{nullptr, 0, 1, kTensor, false};
  return g;
}
} // namespace detail

/// The NCCL communicator of all ranks; call once the process's device is current. Both groups
/// start as the world.
inline void start() {
  ncclUniqueId id;
  if (rank() == 0)
    detail::nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  tally_mpi::check(MPI_Bcast(&id, static_cast<int>(sizeof id), MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast(ncclUniqueId)");
  detail::nccl(ncclCommInitRank(&detail::comm(), size(), id, rank()), "ncclCommInitRank");
  detail::data_group() = {detail::comm(), rank(), size(), kData, false};
  detail::tensor_group() = {detail::comm(), rank(), size(), kTensor, false};
}

/// Data × tensor, after start(): this process is tensor rank `tr` of `t` and data rank `dr` of
/// `d` (the plan's rank order); the ranks of one data rank form its tensor group (ordered by
/// tensor rank), those of one tensor rank its data group, each split from the world with
/// ncclCommSplit (color, key) as tally_comm.h's MPI_Comm_split. One kind alone: the world.
inline void split_groups(int tr, int t, int dr, int d) {
  if (t <= 1 || d <= 1)
    return;
  ncclComm_t tc = nullptr, dc = nullptr;
  detail::nccl(ncclCommSplit(detail::comm(), dr, tr, &tc, nullptr), "ncclCommSplit(tensor group)");
  detail::nccl(ncclCommSplit(detail::comm(), tr, dr, &dc, nullptr), "ncclCommSplit(data group)");
  int tn = 0, dn = 0, trank = 0, drank = 0;
  detail::nccl(ncclCommCount(tc, &tn), "ncclCommCount");
  detail::nccl(ncclCommCount(dc, &dn), "ncclCommCount");
  detail::nccl(ncclCommUserRank(tc, &trank), "ncclCommUserRank");
  detail::nccl(ncclCommUserRank(dc, &drank), "ncclCommUserRank");
  if (tn != t || dn != d || trank != tr || drank != dr)
    throw std::runtime_error("the tensor and data groups do not match the plan's rank order (tensor group of " +
                             std::to_string(tn) + ", data group of " + std::to_string(dn) + ")");
  detail::tensor_group() = {tc, tr, t, kTensor, true};
  detail::data_group() = {dc, dr, d, kData, true};
}
/// This rank's place in its tensor and data groups, and their sizes.
inline int tensor_rank() { return detail::tensor_group().rank; }
inline int data_rank() { return detail::data_group().rank; }
inline int data_size() { return detail::data_group().size; }

inline void finalize() {
  for (Group *g : {&detail::tensor_group(), &detail::data_group()})
    if (g->owned) {
      ncclCommDestroy(g->comm);
      g->owned = false;
    }
  if (detail::comm()) {
    ncclCommDestroy(detail::comm());
    detail::comm() = nullptr;
  }
  MPI_Finalize();
}

// ---- the counts of sent bytes (tally_comm.h's sent_bytes) ----------------------------------

namespace detail {
/// The bytes sent since the last reset, by SentKind; and those counted while the step's stream
/// was being captured into its CUDA graph (each replay sends them again: count_replay).
inline int64_t &sent(SentKind k) {
  static int64_t n[kKinds] = {0, 0, 0};
  return n[k];
}
inline int64_t &captured(SentKind k) {
  static int64_t n[kKinds] = {0, 0, 0};
  return n[k];
}
inline void count(rt::Ctx &ctx, SentKind k, int64_t bytes) {
  sent(k) += bytes;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  rt::cu::check(cudaStreamIsCapturing(ctx.stream, &st), "cudaStreamIsCapturing", "sent bytes", ctx.where);
  if (st == cudaStreamCaptureStatusActive)
    captured(k) += bytes;
}
/// The elements rank r of N sends in a ring all-reduce of n elements (tally_comm.h's
/// ring_all_reduce: pieces of c = ⌈n/N⌉, N - 1 reduce-scatter steps sending piece r - k - 1,
/// N - 1 all-gather steps sending piece r - k).
inline int64_t ringSent(int64_t n, int N, int r) {
  const int64_t c = n / N + (n % N != 0);
  auto piece = [&](int k) {
    int q = (k % N + N) % N;
    return std::min<int64_t>(n, std::max<int64_t>(0, (q + 1) * c)) - std::min<int64_t>(n, q * c);
  };
  int64_t total = 0;
  for (int k = 0; k < N - 1; ++k)
    total += piece(r - k - 1) + piece(r - k);
  return total;
}
} // namespace detail

/// Bytes this rank sent since the last reset: in all, or of one kind (data, tensor, pipeline).
inline int64_t sent_bytes(SentKind k) { return detail::sent(k); }
inline int64_t sent_bytes() { return sent_bytes(kData) + sent_bytes(kTensor) + sent_bytes(kPipeline); }
inline void reset_sent_bytes() {
  for (int k = 0; k < kKinds; ++k)
    detail::sent(static_cast<SentKind>(k)) = 0;
}
/// A replay of the step's graph (StepGraph::on_replay): the captured transfers' bytes again.
inline void count_replay() {
  for (int k = 0; k < kKinds; ++k)
    detail::sent(static_cast<SentKind>(k)) += detail::captured(static_cast<SentKind>(k));
}

/// Waits until every rank's stream has finished its backward (timed apart from the
/// collectives, so their time is the transfer and not the wait for a slower rank).
inline void barrier(rt::Ctx &ctx) {
  rt::cu::check(cudaStreamSynchronize(ctx.stream), "cudaStreamSynchronize", "barrier", ctx.where);
  tally_mpi::check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
}

/// Sums elements [begin, end) of `region` over the ranks, in place (one bucket), on the stream.
template <class T> void all_reduce(rt::Ctx &ctx, T *region, int64_t begin, int64_t end) {
  if (end <= begin)
    return;
  const int t = rt::cu::timeBegin(ctx, "all_reduce");
  detail::nccl(ncclAllReduce(region + begin, region + begin, static_cast<size_t>(end - begin), detail::type<T>(),
                             ncclSum, detail::comm(), ctx.stream),
               "ncclAllReduce", ctx.where);
  rt::cu::timeEnd(ctx, t, "all_reduce");
}

namespace detail {
/// The stream the overlapped reductions run on, and the events that order it with the step's.
struct Overlap {
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr, done = nullptr;
};
inline Overlap &overlap(rt::Ctx &ctx) {
  static Overlap o;
  if (!o.stream) {
    rt::cu::check(cudaStreamCreateWithFlags(&o.stream, cudaStreamNonBlocking), "cudaStreamCreate", "all_reduce_start",
                  ctx.where);
    rt::cu::check(cudaEventCreateWithFlags(&o.ready, cudaEventDisableTiming), "cudaEventCreate", "all_reduce_start",
                  ctx.where);
    rt::cu::check(cudaEventCreateWithFlags(&o.done, cudaEventDisableTiming), "cudaEventCreate", "all_reduce_start",
                  ctx.where);
  }
  return o;
}
} // namespace detail

/// Starts summing elements [begin, end) of `region` over the ranks, in place (one bucket), on a
/// stream of its own once the step's stream has written it: the backward's kernels go on
/// meanwhile. Every rank starts the same buckets in the same order (NCCL's requirement).
template <class T> void all_reduce_start(rt::Ctx &ctx, T *region, int64_t begin, int64_t end, int /*slot*/) {
  if (end <= begin)
    return;
  detail::Overlap &o = detail::overlap(ctx);
  rt::cu::check(cudaEventRecord(o.ready, ctx.stream), "cudaEventRecord", "all_reduce_start", ctx.where);
  rt::cu::check(cudaStreamWaitEvent(o.stream, o.ready, 0), "cudaStreamWaitEvent", "all_reduce_start", ctx.where);
  detail::nccl(ncclAllReduce(region + begin, region + begin, static_cast<size_t>(end - begin), detail::type<T>(),
                             ncclSum, detail::comm(), o.stream),
               "ncclAllReduce", ctx.where);
}

/// Makes the step's stream wait for every reduction all_reduce_start began (the update reads
/// the sums). Its time is the part of the reductions the backward did not hide.
inline void all_reduce_wait(rt::Ctx &ctx) {
  detail::Overlap &o = detail::overlap(ctx);
  const int t = rt::cu::timeBegin(ctx, "all_reduce_wait");
  rt::cu::check(cudaEventRecord(o.done, o.stream), "cudaEventRecord", "all_reduce_wait", ctx.where);
  rt::cu::check(cudaStreamWaitEvent(ctx.stream, o.done, 0), "cudaStreamWaitEvent", "all_reduce_wait", ctx.where);
  rt::cu::timeEnd(ctx, t, "all_reduce_wait");
}

namespace detail {
/// One grouped NCCL call per rank's non-empty part of [begin, end) (rank r owns elements
/// [r·shard, (r+1)·shard); the parts are uneven where a bucket crosses a shard), timed as
/// `kernel`: call(rank, first element, count).
template <class F>
void eachPart(rt::Ctx &ctx, const char *kernel, int64_t begin, int64_t end, int64_t shard, F call) {
  const int t = rt::cu::timeBegin(ctx, kernel);
  nccl(ncclGroupStart(), "ncclGroupStart", ctx.where);
  for (int r = 0, n = size(); r < n; ++r) {
    int64_t lo = std::max(begin, r * shard), hi = std::min(end, (r + 1) * shard);
    if (hi > lo)
      call(r, lo, static_cast<size_t>(hi - lo));
  }
  nccl(ncclGroupEnd(), "ncclGroupEnd", ctx.where);
  rt::cu::timeEnd(ctx, t, kernel);
}
} // namespace detail

/// ZeRO: sums elements [begin, end) of `region` over the ranks, leaving on each rank only its
/// own part summed, in place: one ncclReduce per rank's part, rooted at that rank.
template <class T> void reduce_scatter(rt::Ctx &ctx, T *region, int64_t begin, int64_t end, int64_t shard) {
  detail::eachPart(ctx, "reduce_scatter", begin, end, shard, [&](int r, int64_t at, size_t count) {
    detail::nccl(ncclReduce(region + at, region + at, count, detail::type<T>(), ncclSum, r, detail::comm(), ctx.stream),
                 "ncclReduce", ctx.where);
  });
}

/// ZeRO: every rank's part of elements [begin, end) of `region` copied to every rank, in place:
/// one ncclBroadcast per part from its rank.
template <class T> void all_gather(rt::Ctx &ctx, T *region, int64_t begin, int64_t end, int64_t shard) {
  detail::eachPart(ctx, "all_gather", begin, end, shard, [&](int r, int64_t at, size_t count) {
    detail::nccl(ncclBroadcast(region + at, region + at, count, detail::type<T>(), r, detail::comm(), ctx.stream),
                 "ncclBroadcast", ctx.where);
  });
}

// ---- tensor parallel --------------------------------------------------------------------

/// Tensor parallel: sums the n elements of `buf` over the rank's tensor group, in place, on the
/// step's stream (Megatron's forward all-reduce after a row-parallel matmul, and the backward
/// one of a column-parallel input's gradient); counted as a ring sends it.
template <class T> void tp_all_reduce(rt::Ctx &ctx, T *buf, int64_t n) {
  if (n <= 0)
    return;
  const Group &g = detail::tensor_group();
  detail::count(ctx, g.kind, detail::ringSent(n, g.size, g.rank) * static_cast<int64_t>(sizeof(T)));
  const int t = rt::cu::timeBegin(ctx, "all_reduce");
  detail::nccl(ncclAllReduce(buf, buf, static_cast<size_t>(n), detail::type<T>(), ncclSum, g.comm, ctx.stream),
               "ncclAllReduce", ctx.where);
  rt::cu::timeEnd(ctx, t, "all_reduce");
}

// ---- pipeline parallel: point-to-point between stage ranks (see the banner) ------------------

namespace detail {
/// A send held back until this rank's next receive (or its slot's reuse, or the schedule's end).
struct HeldSend {
  const void *buf;
  size_t count;
  ncclDataType_t type;
  int to;
  int64_t key;
};
inline std::vector<HeldSend> &held() {
  static std::vector<HeldSend> h;
  return h;
}
/// Issues the held sends (of slot `key`; every one when key < 0), inside the caller's group.
inline bool issueHeld(rt::Ctx &ctx, int64_t key) {
  std::vector<HeldSend> &h = held();
  bool any = false;
  for (size_t i = 0; i < h.size();)
    if (key < 0 || h[i].key == key) {
      nccl(ncclSend(h[i].buf, h[i].count, h[i].type, h[i].to, comm(), ctx.stream), "ncclSend", ctx.where);
      h.erase(h.begin() + static_cast<std::ptrdiff_t>(i));
      any = true;
    } else {
      ++i;
    }
  return any;
}
/// The receive buffer of pp_sum_with: device memory grown to the largest shared gradient (the
/// only memory the collectives allocate, outside the timed region after the first step).
inline void *scratch(rt::Ctx &ctx, size_t bytes) {
  static void *p = nullptr;
  static size_t have = 0;
  if (bytes > have) {
    rt::cu::check(cudaStreamSynchronize(ctx.stream), "cudaStreamSynchronize", "pp_sum_with", ctx.where);
    if (p)
      rt::cu::check(cudaFree(p), "cudaFree", "pp_sum_with", ctx.where);
    rt::cu::check(cudaMalloc(&p, bytes), "cudaMalloc", "pp_sum_with", ctx.where);
    have = bytes;
  }
  return p;
}
} // namespace detail

/// Sends n elements of `buf` to rank `to`: counted now, issued with this rank's next receive
/// (grouped) or before slot `key` is written again. `tag`: the CPU step's MPI tag; NCCL pairs a
/// pair's transfers in issue order instead, which the 1F1B order keeps.
template <class T> void pp_send(rt::Ctx &ctx, const T *buf, int64_t n, int to, int /*tag*/, int64_t key) {
  detail::count(ctx, kPipeline, n * static_cast<int64_t>(sizeof(T)));
  detail::held().push_back({buf, static_cast<size_t>(n), detail::type<T>(), to, key});
}

/// Receives n elements into `buf` from rank `from`, on the stream, in one group with the sends
/// held back (both directions at once, so neither rank's stream waits for the other's).
template <class T> void pp_recv(rt::Ctx &ctx, T *buf, int64_t n, int from, int /*tag*/) {
  const int t = rt::cu::timeBegin(ctx, "recv");
  detail::nccl(ncclGroupStart(), "ncclGroupStart", ctx.where);
  detail::issueHeld(ctx, -1);
  detail::nccl(ncclRecv(buf, static_cast<size_t>(n), detail::type<T>(), from, detail::comm(), ctx.stream), "ncclRecv",
               ctx.where);
  detail::nccl(ncclGroupEnd(), "ncclGroupEnd", ctx.where);
  rt::cu::timeEnd(ctx, t, "recv");
}

/// Issues the held sends from slot `key` (every one when key < 0) before it is written again;
/// the stream orders them before the writes.
inline void pp_wait(rt::Ctx &ctx, int64_t key) {
  bool any = false;
  for (const detail::HeldSend &h : detail::held())
    any = any || key < 0 || h.key == key;
  if (!any)
    return;
  const int t = rt::cu::timeBegin(ctx, "send");
  detail::nccl(ncclGroupStart(), "ncclGroupStart", ctx.where);
  detail::issueHeld(ctx, key);
  detail::nccl(ncclGroupEnd(), "ncclGroupEnd", ctx.where);
  rt::cu::timeEnd(ctx, t, "send");
}
inline void pp_wait_all(rt::Ctx &ctx) { pp_wait(ctx, -1); }

/// Waits until rank `peer` gets here too: this rank's stream drained, then a message of no
/// bytes each way on the host (MPI).
inline void pp_sync(rt::Ctx &ctx, int peer) {
  rt::cu::check(cudaStreamSynchronize(ctx.stream), "cudaStreamSynchronize", "pp_sync", ctx.where);
  tally_mpi::check(MPI_Sendrecv(nullptr, 0, MPI_BYTE, peer, 32766, nullptr, 0, MPI_BYTE, peer, 32766, MPI_COMM_WORLD,
                                MPI_STATUS_IGNORE),
                   "MPI_Sendrecv");
}

/// A parameter two stages hold (a tied head's weight): each rank sends its n-element gradient to
/// `peer` and receives the peer's (one group), then adds it, so both hold the sum with the same
/// bits (a + b = b + a).
template <class T> void pp_sum_with(rt::Ctx &ctx, T *buf, int64_t n, int peer) {
  if (n <= 0)
    return;
  T *in = static_cast<T *>(detail::scratch(ctx, static_cast<size_t>(n) * sizeof(T)));
  detail::count(ctx, kPipeline, n * static_cast<int64_t>(sizeof(T)));
  const int t = rt::cu::timeBegin(ctx, "all_reduce");
  detail::nccl(ncclGroupStart(), "ncclGroupStart", ctx.where);
  detail::nccl(ncclSend(buf, static_cast<size_t>(n), detail::type<T>(), peer, detail::comm(), ctx.stream), "ncclSend",
               ctx.where);
  detail::nccl(ncclRecv(in, static_cast<size_t>(n), detail::type<T>(), peer, detail::comm(), ctx.stream), "ncclRecv",
               ctx.where);
  detail::nccl(ncclGroupEnd(), "ncclGroupEnd", ctx.where);
  rt::cu::timeEnd(ctx, t, "all_reduce");
  const int64_t one[1] = {1}, shape[1] = {n};
  rt::binary<T>(ctx, rt::BinOp::Add, buf, one, in, one, buf, shape, 1, false);
}

/// Every rank's k values (rank order), gathered on the host outside the timed steps.
inline std::vector<double> gather_values(const std::vector<double> &mine) {
  std::vector<double> all(mine.size() * static_cast<size_t>(size()), 0);
  tally_mpi::check(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, all.data(),
                                 static_cast<int>(mine.size()), MPI_DOUBLE, MPI_COMM_WORLD),
                   "MPI_Allgather");
  return all;
}

#else // one process: the group is this process alone

inline void init(int *, char ***) {}
inline int rank() { return 0; }
inline int size() { return 1; }
inline int device() { return 0; }
inline void start() {}
inline void finalize() {}
inline double sum(double x) { return x; }
inline void sum(float *, int64_t) {}
inline void merge(uint8_t *, int64_t) {}
template <class T> void tp_all_reduce(rt::Ctx &, T *, int64_t) {}
inline void split_groups(int, int, int, int) {}
inline int tensor_rank() { return 0; }
inline int data_rank() { return 0; }
inline int data_size() { return 1; }
inline int64_t sent_bytes(SentKind) { return 0; }
inline int64_t sent_bytes() { return 0; }
inline void reset_sent_bytes() {}
inline void count_replay() {}
inline std::vector<int64_t> gather_counts(int64_t mine) { return {mine}; }
inline std::vector<double> gather_values(const std::vector<double> &mine) { return mine; }

#endif

/// ZeRO: copies `bytes` between two device regions on the step's stream (a shard of the
/// parameters into the gradients region before the gather, the gathered parameters back).
inline void copy(rt::Ctx &ctx, void *dst, const void *src, int64_t bytes) {
  if (bytes <= 0)
    return;
  const int t = rt::cu::timeBegin(ctx, "shard_copy");
  rt::cu::check(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, ctx.stream),
                "cudaMemcpyAsync", "shard_copy", ctx.where);
  rt::cu::timeEnd(ctx, t, "shard_copy");
}

} // namespace tally_comm
