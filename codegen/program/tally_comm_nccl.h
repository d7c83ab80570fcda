// Data parallelism for generated CUDA steps: the same functions as driver/tally_comm.h (the CPU
// steps' MPI collectives), over NCCL on the step's stream. Built with TALLY_NCCL (the generated
// CMakeLists.txt defines it, and links MPI and NCCL, only for a plan with data > 1): the N
// processes are the ones `mpirun -np N` started, one per GPU (a process takes the GPU of its
// rank among the processes of its node); MPI starts them and hands rank 0's ncclUniqueId to the
// others, NCCL moves the gradients. Without TALLY_NCCL the group is this one process.
//
// Every collective works in place on a region of the memory plan (the gradients) and is timed
// with CUDA events like a kernel, under the op path the step set (ctx.where). NCCL sums bf16 and
// fp16 gradients in their own type. ZeRO-1's reduce-scatter and all-gather over the shards
// (uneven where a bucket crosses a shard boundary) are grouped ncclReduce / ncclBroadcast calls,
// one per rank's part.
#pragma once

#include "cuda/tally_rt.cuh"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>

#ifdef TALLY_NCCL
#include "driver/tally_mpi.h"

#include <nccl.h>
#endif

namespace tally_comm {

#ifdef TALLY_NCCL

using tally_mpi::rank;
using tally_mpi::size;
using tally_mpi::sum; // the loss, the overflow check's Σg² of ZeRO shards, master shards for --save

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

/// The NCCL communicator of all ranks; call once the process's device is current.
inline void start() {
  ncclUniqueId id;
  if (rank() == 0)
    detail::nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  tally_mpi::check(MPI_Bcast(&id, static_cast<int>(sizeof id), MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast(ncclUniqueId)");
  detail::nccl(ncclCommInitRank(&detail::comm(), size(), id, rank()), "ncclCommInitRank");
}

inline void finalize() {
  if (detail::comm()) {
    ncclCommDestroy(detail::comm());
    detail::comm() = nullptr;
  }
  MPI_Finalize();
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

#else // one process: the group is this process alone

inline void init(int *, char ***) {}
inline int rank() { return 0; }
inline int size() { return 1; }
inline int device() { return 0; }
inline void start() {}
inline void finalize() {}
inline double sum(double x) { return x; }
inline void sum(float *, int64_t) {}

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
