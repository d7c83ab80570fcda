// Data parallelism for generated CPU steps: the processes of one data-parallel group and the
// collectives the step runs over them. Built with TALLY_MPI (the generated CMakeLists.txt
// defines it, and links MPI, only for a plan on several processes) these are MPI calls on
// the N processes `mpirun -np N` started; without it the group is this one process and
// nothing is called. A plan of one kind of parallelism runs its collectives on MPI_COMM_WORLD;
// data × tensor and data × pipeline (issue 39 item 4) split the world into tensor, pipeline
// and data groups (split_groups, by the plan's rank order): the tensor-parallel all-reduces run
// on the rank's tensor group, the pipeline's sends between the stages of its pipeline group,
// the gradient reduction and ZeRO's collectives on its data group (there as counted rings,
// dp_all_reduce, dp_reduce_scatter and dp_all_gather; ZeRO-1's rings with data parallelism
// alone too). Every collective works
// in place on a region of the memory plan (the gradients), so a step allocates nothing for
// communication; each is timed as a kernel (ctx.timer) under the op class the step set
// ("communication").
//
// Element types: float is MPI_FLOAT with MPI_SUM; rt::bf16 and rt::f16 travel as 16-bit
// words (MPI_UINT16_T) and are summed by a user-defined MPI operation that adds in fp32 and
// rounds to nearest even, as the kernels store them.
#pragma once

#include "cpu/tally_rt.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef TALLY_MPI
#include "driver/tally_mpi.h"
#endif

namespace tally_comm {

#ifdef TALLY_MPI

using tally_mpi::rank;
using tally_mpi::size;
using tally_mpi::sum;
using tally_mpi::gather_counts; // the ranks' byte counts, outside the timed steps
using tally_mpi::merge;         // --save's pieces, bitwise or

/// A group of ranks the collectives run over: its communicator, this rank's place in it, its
/// size, and which count of sent bytes its transfers add to (kData, kTensor, kPipeline).
enum SentKind { kData = 0, kTensor = 1, kPipeline = 2, kKinds = 3 };
struct Group {
  MPI_Comm comm;
  int rank, size;
  SentKind kind;
};

namespace detail {

using tally_mpi::check;

inline Group &data_group() {
  static Group g{MPI_COMM_WORLD, tally_mpi::rank(), tally_mpi::size(), kData};
  return g;
}
inline Group &tensor_group() {
  static Group g{MPI_COMM_WORLD, tally_mpi::rank(), tally_mpi::size(), kTensor};
  return g;
}
/// The ranks of one pipeline, rank s of it running stage s: the pipeline's sends and receives
/// name their peers by stage.
inline Group &pipeline_group() {
  static Group g{MPI_COMM_WORLD, tally_mpi::rank(), tally_mpi::size(), kPipeline};
  return g;
}

inline int count(int64_t n, const char *what) {
  if (n < 0 || n > INT_MAX)
    throw std::runtime_error(std::string(what) + ": " + std::to_string(n) +
                             " elements do not fit one MPI call (at most 2^31 - 1)");
  return static_cast<int>(n);
}

/// in[i] + inout[i] in fp32, rounded back to T (bf16, f16): the sum of 16-bit gradients.
template <class T> void sum16(void *in, void *inout, int *len, MPI_Datatype *) {
  const T *a = static_cast<const T *>(in);
  T *b = static_cast<T *>(inout);
  for (int i = 0; i < *len; ++i)
    b[i] = rt::store<T>(rt::load(a[i]) + rt::load(b[i]));
}

template <class T> struct Type;
template <> struct Type<float> {
  static MPI_Datatype type() { return MPI_FLOAT; }
  static MPI_Op sum() { return MPI_SUM; }
};
template <class T> struct Type16 {
  static MPI_Datatype type() { return MPI_UINT16_T; }
  static MPI_Op sum() {
    static MPI_Op op = [] {
      MPI_Op o;
      check(MPI_Op_create(&sum16<T>, 1, &o), "MPI_Op_create");
      return o;
    }();
    return op;
  }
};
template <> struct Type<rt::bf16> : Type16<rt::bf16> {};
template <> struct Type<rt::f16> : Type16<rt::f16> {};

/// Rank r's part of elements [begin, end) when rank r owns [r·shard, (r+1)·shard): the counts
/// and displacements (from begin) of every rank, contiguous and in rank order.
inline void parts(int64_t begin, int64_t end, int64_t shard, int ranks, std::vector<int> &counts,
                  std::vector<int> &displs) {
  counts.assign(static_cast<size_t>(ranks), 0);
  displs.assign(static_cast<size_t>(ranks), 0);
  for (int r = 0; r < ranks; ++r) {
    int64_t lo = std::max(begin, r * shard), hi = std::min(end, (r + 1) * shard);
    counts[r] = count(std::max<int64_t>(0, hi - lo), "a gradient bucket");
    displs[r] = count(std::max<int64_t>(0, std::min(lo, end) - begin), "a gradient bucket");
  }
}

} // namespace detail

/// Starts MPI (before anything else reads argv).
inline void init(int *argc, char ***argv) { detail::check(MPI_Init(argc, argv), "MPI_Init"); }
inline void finalize() { MPI_Finalize(); }

/// Data × tensor and data × pipeline (issue 39 item 4): this process is tensor rank `tr` of `t`,
/// data rank `dr` of `d` and pipeline stage `pr` of `p` (the plan's rank order, kLayout); the
/// ranks that differ only in their tensor rank form its tensor group (ordered by tensor rank),
/// those that differ only in their data rank its data group, those that differ only in their
/// stage its pipeline. With one kind of parallelism every group stays MPI_COMM_WORLD.
inline void split_groups(int tr, int t, int dr, int d, int pr = 0, int p = 1) {
  if ((t > 1) + (d > 1) + (p > 1) < 2)
    return;
  // One communicator per group: the colour is the rank's other two coordinates, the key its own.
  auto split = [](int colour, int key, int want, SentKind kind, Group &into, const char *name) {
    MPI_Comm c;
    detail::check(MPI_Comm_split(MPI_COMM_WORLD, colour, key, &c), "MPI_Comm_split");
    int n = 0, me = 0;
    MPI_Comm_size(c, &n);
    MPI_Comm_rank(c, &me);
    if (n != want || me != key)
      throw std::runtime_error(std::string("the ") + name + " group does not match the plan's rank order (" +
                               std::to_string(n) + " ranks, not " + std::to_string(want) + ")");
    into = {c, key, n, kind};
  };
  split(dr * p + pr, tr, t, kTensor, detail::tensor_group(), "tensor");
  split(tr * p + pr, dr, d, kData, detail::data_group(), "data");
  split(dr * t + tr, pr, p, kPipeline, detail::pipeline_group(), "pipeline");
}
/// This rank's place in its tensor and data groups, and their sizes.
inline int tensor_rank() { return detail::tensor_group().rank; }
inline int data_rank() { return detail::data_group().rank; }
inline int data_size() { return detail::data_group().size; }

/// Waits until every rank gets here (timed apart from the collectives, so that their time is
/// the transfer and not the wait for a slower rank's backward).
inline void barrier(rt::Ctx &ctx) {
  rt::detail::KernelScope ks(ctx, "barrier");
  detail::check(MPI_Barrier(detail::data_group().comm), "MPI_Barrier");
}

/// Sums elements [begin, end) of `region` over the ranks, in place (one bucket).
template <class T> void all_reduce(rt::Ctx &ctx, T *region, int64_t begin, int64_t end) {
  rt::detail::KernelScope ks(ctx, "all_reduce");
  detail::check(MPI_Allreduce(MPI_IN_PLACE, region + begin, detail::count(end - begin, "all_reduce"),
                              detail::Type<T>::type(), detail::Type<T>::sum(), detail::data_group().comm),
                "MPI_Allreduce");
}

namespace detail {
/// The reductions started and not yet waited for, by bucket.
inline std::vector<MPI_Request> &pending() {
  static std::vector<MPI_Request> r;
  return r;
}
} // namespace detail

/// Starts summing elements [begin, end) of `region` over the ranks, in place (bucket `slot`),
/// and returns: the backward goes on while MPI moves it (as far as MPI progresses it: without
/// a progress thread most of the transfer happens in all_reduce_wait). Every rank starts the
/// same buckets in the same order.
template <class T> void all_reduce_start(rt::Ctx &ctx, T *region, int64_t begin, int64_t end, int slot) {
  rt::detail::KernelScope ks(ctx, "all_reduce_start");
  std::vector<MPI_Request> &p = detail::pending();
  if (p.size() <= static_cast<size_t>(slot))
    p.resize(static_cast<size_t>(slot) + 1, MPI_REQUEST_NULL);
  detail::check(MPI_Iallreduce(MPI_IN_PLACE, region + begin, detail::count(end - begin, "all_reduce_start"),
                               detail::Type<T>::type(), detail::Type<T>::sum(), detail::data_group().comm, &p[slot]),
                "MPI_Iallreduce");
}

/// Waits for every reduction all_reduce_start began.
inline void all_reduce_wait(rt::Ctx &ctx) {
  rt::detail::KernelScope ks(ctx, "all_reduce_wait");
  std::vector<MPI_Request> &p = detail::pending();
  detail::check(MPI_Waitall(static_cast<int>(p.size()), p.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
}

/// ZeRO: every rank's part of elements [begin, end) of `region` copied to every rank, in place,
/// by MPI_Allgatherv: --dump-grads's gather, outside the step's counted traffic (the step's own
/// ZeRO-1 collectives are the counted rings dp_reduce_scatter and dp_all_gather below).
template <class T> void all_gather(rt::Ctx &ctx, T *region, int64_t begin, int64_t end, int64_t shard) {
  rt::detail::KernelScope ks(ctx, "all_gather");
  std::vector<int> counts, displs;
  const Group &g = detail::data_group();
  detail::parts(begin, end, shard, g.size, counts, displs);
  detail::check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, region + begin, counts.data(), displs.data(),
                               detail::Type<T>::type(), g.comm),
                "MPI_Allgatherv");
}

// ---- ZeRO 2 and 3: one tensor's pieces, rank r owning elements [r·c, min(n, (r+1)·c)) ------
// Rings of point-to-point transfers (MPI_Sendrecv), as NCCL's ring algorithm moves them: a
// reduce-scatter or an all-gather over N ranks takes N - 1 steps, in each of which every rank
// sends one piece to the next rank and receives one from the previous. Every byte a rank hands
// to MPI is counted (sent_bytes), so the step's traffic is measured, not derived.

namespace detail {
/// The bytes sent since the last reset, by SentKind.
inline int64_t &sent(SentKind k) {
  static int64_t n[kKinds] = {0, 0, 0};
  return n[k];
}
/// The receive buffer of the reduce-scatter: one piece, grown to the largest (the only memory
/// the collectives allocate; MPI's own buffers aside).
inline std::vector<uint8_t> &scratch() {
  static std::vector<uint8_t> s;
  return s;
}
/// Piece k of elements [b, n) in pieces of c, piece k being [k·c, (k + 1)·c) clipped to [b, n):
/// [lo, hi). b = 0 for one tensor's pieces; b > 0 for a bucket [b, n) of a region that ZeRO-1
/// cuts into shards of c from its start (dp_reduce_scatter, dp_all_gather).
inline int64_t pieceLo(int64_t n, int64_t c, int k, int64_t b = 0) { return std::min<int64_t>(n, std::max(b, k * c)); }
inline int64_t pieceHi(int64_t n, int64_t c, int k, int64_t b = 0) {
  return std::min<int64_t>(n, std::max(b, (k + 1) * c));
}
/// The ring's piece size over group g for n elements: c = ⌈n/N⌉ (rank r's piece is
/// [pieceLo, pieceHi) of r).
inline int64_t ringChunk(const Group &g, int64_t n) { return n / g.size + (n % g.size != 0); }
/// One step of a ring in group `g`: to and from are ranks of the group.
template <class T>
void sendrecv(const Group &g, const T *out, int64_t nout, int to, T *in, int64_t nin, int from) {
  sent(g.kind) += nout * static_cast<int64_t>(sizeof(T));
  check(MPI_Sendrecv(out, count(nout, "a piece"), Type<T>::type(), to, 7, in, count(nin, "a piece"),
                     Type<T>::type(), from, 7, g.comm, MPI_STATUS_IGNORE),
        "MPI_Sendrecv");
}
} // namespace detail

/// Bytes this rank handed to MPI in the counted collectives since the last reset: in all, or
/// those of one kind (the data group's, the tensor group's, the pipeline's sends).
inline int64_t sent_bytes(SentKind k) { return detail::sent(k); }
inline int64_t sent_bytes() { return sent_bytes(kData) + sent_bytes(kTensor) + sent_bytes(kPipeline); }
inline void reset_sent_bytes() {
  for (int k = 0; k < kKinds; ++k)
    detail::sent(static_cast<SentKind>(k)) = 0;
}

namespace detail {

/// The reduce-scatter half of a ring over pieces of c elements of the n in `buf` (those from b
/// on; pieceLo): N - 1 steps,
/// each sending a partly summed piece to the next rank and adding the one received from the
/// previous; afterwards this rank's piece of `buf` holds the sum over the ranks.
template <class T> void ring_reduce_scatter(const Group &g, T *buf, int64_t n, int64_t c, int64_t b = 0) {
  const int N = g.size, r = g.rank;
  std::vector<uint8_t> &sc = scratch();
  if (sc.size() < static_cast<size_t>(c) * sizeof(T))
    sc.resize(static_cast<size_t>(c) * sizeof(T));
  T *in = reinterpret_cast<T *>(sc.data());
  for (int k = 0; k < N - 1; ++k) {
    int out = ((r - k - 1) % N + N) % N, got = ((r - k - 2) % N + N) % N;
    int64_t olo = pieceLo(n, c, out, b), ohi = pieceHi(n, c, out, b);
    int64_t glo = pieceLo(n, c, got, b), ghi = pieceHi(n, c, got, b);
    sendrecv(g, buf + olo, ohi - olo, (r + 1) % N, in, ghi - glo, (r + N - 1) % N);
    for (int64_t i = 0; i < ghi - glo; ++i)
      buf[glo + i] = rt::store<T>(rt::load(buf[glo + i]) + rt::load(in[i]));
  }
}

/// The all-gather half: N - 1 steps passing each rank's piece round the ring, after which every
/// piece of `buf` holds its owner's values on every rank.
template <class T> void ring_all_gather(const Group &g, T *buf, int64_t n, int64_t c, int64_t b = 0) {
  const int N = g.size, r = g.rank;
  for (int k = 0; k < N - 1; ++k) {
    int out = ((r - k) % N + N) % N, got = ((r - k - 1) % N + N) % N;
    int64_t olo = pieceLo(n, c, out, b), ohi = pieceHi(n, c, out, b);
    int64_t glo = pieceLo(n, c, got, b), ghi = pieceHi(n, c, got, b);
    sendrecv(g, buf + olo, ohi - olo, (r + 1) % N, buf + glo, ghi - glo, (r + N - 1) % N);
  }
}

} // namespace detail

/// ZeRO 2 and 3: `buf` holds this rank's n-element gradient of one tensor (one micro-batch,
/// already divided by the ranks); the ring sums it over the ranks into this rank's piece of
/// `buf`, which is then added into `dst` (the rank's piece in the grads region, which sums the
/// micro-batches). Rank r sends the N - 1 pieces other than its own, partly summed.
template <class T> void reduce_scatter_piece(rt::Ctx &ctx, T *buf, int64_t n, int64_t c, T *dst) {
  rt::detail::KernelScope ks(ctx, "reduce_scatter");
  const Group &g = detail::data_group();
  detail::ring_reduce_scatter(g, buf, n, c);
  int64_t lo = detail::pieceLo(n, c, g.rank), hi = detail::pieceHi(n, c, g.rank);
  for (int64_t i = 0; i < hi - lo; ++i)
    dst[i] = rt::store<T>(rt::load(dst[i]) + rt::load(buf[lo + i]));
}

/// ZeRO 2 and 3: every rank's piece of one n-element tensor into `buf` on every rank. This
/// rank's piece is copied into place from `src` first (null: it is in place already). Rank r
/// sends its own piece and the N - 2 it receives before the last.
template <class T> void all_gather_piece(rt::Ctx &ctx, T *buf, int64_t n, int64_t c, const T *src) {
  rt::detail::KernelScope ks(ctx, "all_gather");
  const Group &g = detail::data_group();
  int64_t lo = detail::pieceLo(n, c, g.rank), hi = detail::pieceHi(n, c, g.rank);
  if (src && hi > lo)
    std::memcpy(buf + lo, src, sizeof(T) * static_cast<size_t>(hi - lo));
  detail::ring_all_gather(g, buf, n, c);
}

namespace detail {
/// A ring all-reduce of the n elements of `buf` over group `g`, in place, as NCCL's: a
/// reduce-scatter of pieces of c = ⌈n/N⌉ elements, after which rank r holds the whole sum of
/// piece r, then an all-gather of the summed pieces, so every rank ends with the same bits.
/// Rank r sends 2(N - 1) pieces, counted in sent_bytes under the group's kind.
template <class T> void ring_all_reduce(const Group &g, T *buf, int64_t n) {
  const int64_t c = ringChunk(g, n);
  ring_reduce_scatter(g, buf, n, c);
  ring_all_gather(g, buf, n, c);
}
} // namespace detail

/// Tensor parallel: sums the n elements of `buf` over the rank's tensor group, in place
/// (Megatron's forward all-reduce after a row-parallel matmul, and the backward one of a
/// column-parallel input's gradient): a counted ring (detail::ring_all_reduce).
template <class T> void tp_all_reduce(rt::Ctx &ctx, T *buf, int64_t n) {
  rt::detail::KernelScope ks(ctx, "all_reduce");
  detail::ring_all_reduce(detail::tensor_group(), buf, n);
}

// ---- sequence parallelism (Korthikanti et al. 2022; Megatron-LM tensor_parallel/mappings.py) --
// A tensor split along the sequence is held as rows × chunk elements on each rank: the rows are
// the dimensions before the sequence (the micro-batch's sequences), a chunk the rank's 1/t of one
// row's tokens. Its whole form is rows × (t·chunk), rank k's chunk of row i at (i·t + k)·chunk.
// The gather and the reduce-scatter are rings (N - 1 steps, each rank sending one rank's chunks
// of every row, packed), counted in sent_bytes under the tensor group: (N - 1)·rows·chunk
// elements each, what the estimate prices for an all-gather or reduce-scatter of the whole.

namespace detail {
/// Buffers outside the arena, grown to the largest use: 0 and 1 the gathered inputs, 2 an op's
/// whole output before its reduce-scatter, 3 and 4 a ring step's packed chunks.
inline std::vector<uint8_t> &sequence_buffer(int k) {
  static std::vector<uint8_t> b[5];
  return b[k];
}
} // namespace detail

/// Buffer k (0-4) of n elements, outside the arena (Megatron keeps its gathered inputs in a
/// global memory buffer, outside the activations' count, likewise).
template <class T> T *sp_scratch(int k, int64_t n) {
  std::vector<uint8_t> &b = detail::sequence_buffer(k);
  if (b.size() < static_cast<size_t>(n) * sizeof(T))
    b.resize(static_cast<size_t>(n) * sizeof(T));
  return reinterpret_cast<T *>(b.data());
}

/// The whole tensor from every rank's shard: `full` (rows × t·chunk) gets each rank's chunks.
template <class T> void tp_seq_all_gather(rt::Ctx &ctx, const T *shard, T *full, int64_t rows, int64_t chunk) {
  rt::detail::KernelScope ks(ctx, "all_gather");
  const Group &g = detail::tensor_group();
  const int N = g.size, r = g.rank;
  auto at = [&](int k, int64_t i) { return full + (i * N + k) * chunk; };
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(at(r, i), shard + i * chunk, sizeof(T) * static_cast<size_t>(chunk));
  T *out = sp_scratch<T>(3, rows * chunk), *in = sp_scratch<T>(4, rows * chunk);
  for (int k = 0; k < N - 1; ++k) {
    int send = ((r - k) % N + N) % N, got = ((r - k - 1) % N + N) % N;
    for (int64_t i = 0; i < rows; ++i)
      std::memcpy(out + i * chunk, at(send, i), sizeof(T) * static_cast<size_t>(chunk));
    detail::sendrecv(g, out, rows * chunk, (r + 1) % N, in, rows * chunk, (r + N - 1) % N);
    for (int64_t i = 0; i < rows; ++i)
      std::memcpy(at(got, i), in + i * chunk, sizeof(T) * static_cast<size_t>(chunk));
  }
}

/// The sum over the ranks of `full` (rows × t·chunk, each rank's partial sums), this rank's
/// chunks of it into `shard` (added when `accumulate`). `full` is overwritten.
template <class T>
void tp_seq_reduce_scatter(rt::Ctx &ctx, T *full, T *shard, int64_t rows, int64_t chunk, bool accumulate) {
  rt::detail::KernelScope ks(ctx, "reduce_scatter");
  const Group &g = detail::tensor_group();
  const int N = g.size, r = g.rank;
  auto at = [&](int k, int64_t i) { return full + (i * N + k) * chunk; };
  T *out = sp_scratch<T>(3, rows * chunk), *in = sp_scratch<T>(4, rows * chunk);
  for (int k = 0; k < N - 1; ++k) {
    int send = ((r - k - 1) % N + N) % N, got = ((r - k - 2) % N + N) % N;
    for (int64_t i = 0; i < rows; ++i)
      std::memcpy(out + i * chunk, at(send, i), sizeof(T) * static_cast<size_t>(chunk));
    detail::sendrecv(g, out, rows * chunk, (r + 1) % N, in, rows * chunk, (r + N - 1) % N);
    for (int64_t i = 0; i < rows; ++i) {
      T *dst = at(got, i);
      for (int64_t j = 0; j < chunk; ++j)
        dst[j] = rt::store<T>(rt::load(dst[j]) + rt::load(in[i * chunk + j]));
    }
  }
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < chunk; ++j)
      shard[i * chunk + j] = rt::store<T>((accumulate ? rt::load(shard[i * chunk + j]) : 0) + rt::load(at(r, i)[j]));
}

/// This rank's chunks of a whole tensor every rank computed alike (Megatron's scatter to the
/// sequence-parallel region: no communication), into `shard` (added when `accumulate`).
template <class T> void tp_seq_slice(rt::Ctx &ctx, const T *full, T *shard, int64_t rows, int64_t chunk, bool accumulate) {
  rt::detail::KernelScope ks(ctx, "shard_copy");
  const Group &g = detail::tensor_group();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < chunk; ++j) {
      const T v = full[(i * g.size + g.rank) * chunk + j];
      shard[i * chunk + j] = accumulate ? rt::store<T>(rt::load(shard[i * chunk + j]) + rt::load(v)) : v;
    }
}

/// Data × tensor and data × pipeline: sums elements [begin, end) of `region` (a bucket of the
/// gradients) over the rank's data group, in place, as a counted ring (detail::ring_all_reduce),
/// so that the bytes each rank sends to its data group are measured beside its tensor group's
/// or its pipeline's. (Data parallelism
/// alone keeps MPI_Allreduce, all_reduce above.)
template <class T> void dp_all_reduce(rt::Ctx &ctx, T *region, int64_t begin, int64_t end) {
  rt::detail::KernelScope ks(ctx, "all_reduce");
  detail::ring_all_reduce(detail::data_group(), region + begin, end - begin);
}

/// ZeRO-1 (data alone, data × tensor, data × pipeline): reduce_scatter over the rank's data
/// group as a counted ring: elements
/// [begin, end) of `region` summed, rank r's part of them (those of [r·shard, (r+1)·shard)) left
/// summed on rank r, in place. Rank r sends the bucket less its own part, so over the buckets
/// of a region of N·shard elements it sends (N - 1)·shard, as the estimate prices.
template <class T> void dp_reduce_scatter(rt::Ctx &ctx, T *region, int64_t begin, int64_t end, int64_t shard) {
  rt::detail::KernelScope ks(ctx, "reduce_scatter");
  detail::ring_reduce_scatter(detail::data_group(), region, end, shard, begin);
}

/// ZeRO-1: all_gather over the rank's data group as a counted ring: every rank's
/// part of elements [begin, end) of `region` copied to every rank, in place. Rank r sends the
/// bucket less the part of rank r + 1 (the last it receives): (N - 1)·shard over a region.
template <class T> void dp_all_gather(rt::Ctx &ctx, T *region, int64_t begin, int64_t end, int64_t shard) {
  rt::detail::KernelScope ks(ctx, "all_gather");
  detail::ring_all_gather(detail::data_group(), region, end, shard, begin);
}

// ---- pipeline parallelism: point-to-point between stage ranks -------------------------------
// A chunk's forward sends its boundary activations to the next stage's rank and its backward
// their gradients to the previous one, each an MPI_Isend whose bytes are counted (sent_bytes);
// the receiving rank waits in MPI_Recv (its idle time when the sender is behind: the step
// times it under the op class "bubble"). A send's buffer is in the sending chunk's slot, which
// the next unit in that slot waits for first (pp_wait); tags are unique per boundary,
// direction and micro-batch within a step.

namespace detail {
/// The sends not yet waited for, by slot key.
inline std::vector<std::pair<int64_t, MPI_Request>> &pp_pending() {
  static std::vector<std::pair<int64_t, MPI_Request>> r;
  return r;
}
/// The tag of the shared gradients' exchange (and kSharedTag - 1 of the wait before it): above
/// every boundary tag (< 2·stages·micro-batches ≤ 32767 - 2, PipelineStep.cpp).
constexpr int kSharedTag = 32767;
} // namespace detail

/// Sends n elements of `buf` to rank `to` (tag `tag`), not waiting; `key`: the slot it is in.
template <class T> void pp_send(rt::Ctx &ctx, const T *buf, int64_t n, int to, int tag, int64_t key) {
  rt::detail::KernelScope ks(ctx, "send");
  detail::sent(kPipeline) += n * static_cast<int64_t>(sizeof(T));
  MPI_Request r;
  detail::check(MPI_Isend(buf, detail::count(n, "pp_send"), detail::Type<T>::type(), to, tag,
                          detail::pipeline_group().comm, &r),
                "MPI_Isend");
  detail::pp_pending().push_back({key, r});
}

/// Receives n elements into `buf` from rank `from` (tag `tag`), waiting for them.
template <class T> void pp_recv(rt::Ctx &ctx, T *buf, int64_t n, int from, int tag) {
  rt::detail::KernelScope ks(ctx, "recv");
  detail::check(MPI_Recv(buf, detail::count(n, "pp_recv"), detail::Type<T>::type(), from, tag,
                         detail::pipeline_group().comm, MPI_STATUS_IGNORE),
                "MPI_Recv");
}

// Tensor x pipeline (Megatron's scatter/gather, Narayanan et al. 2021 §4.1; p2p_communication.py
// `scatter_gather_tensors_in_pipeline`): a boundary tensor is alike on every rank of the
// sending stage's tensor group, so tensor rank r sends only its piece r (elements [r·c, (r+1)·c),
// c = n/t) to the same tensor rank of the next stage, which all-gathers the pieces over its
// tensor group (a counted ring: (t - 1)·c elements sent per rank).

/// Sends this rank's tensor piece of the n elements of `buf` (pp_send).
template <class T> void pp_send_piece(rt::Ctx &ctx, const T *buf, int64_t n, int to, int tag, int64_t key) {
  const Group &g = detail::tensor_group();
  const int64_t c = detail::ringChunk(g, n);
  const int64_t lo = detail::pieceLo(n, c, g.rank), hi = detail::pieceHi(n, c, g.rank);
  pp_send(ctx, buf + lo, hi - lo, to, tag, key);
}

/// Receives this rank's tensor piece of the n elements of `buf` (pp_recv), in place.
template <class T> void pp_recv_piece(rt::Ctx &ctx, T *buf, int64_t n, int from, int tag) {
  const Group &g = detail::tensor_group();
  const int64_t c = detail::ringChunk(g, n);
  const int64_t lo = detail::pieceLo(n, c, g.rank), hi = detail::pieceHi(n, c, g.rank);
  pp_recv(ctx, buf + lo, hi - lo, from, tag);
}

/// Every tensor rank's piece of the n elements of `buf` onto every rank of the tensor group, in place.
template <class T> void tp_all_gather(rt::Ctx &ctx, T *buf, int64_t n) {
  rt::detail::KernelScope ks(ctx, "all_gather");
  const Group &g = detail::tensor_group();
  detail::ring_all_gather(g, buf, n, detail::ringChunk(g, n));
}

/// Waits for the sends from slot `key` (every send when key < 0).
inline void pp_wait(rt::Ctx &ctx, int64_t key) {
  auto &p = detail::pp_pending();
  std::vector<MPI_Request> wait;
  for (size_t i = 0; i < p.size();)
    if (key < 0 || p[i].first == key) {
      wait.push_back(p[i].second);
      p[i] = p.back();
      p.pop_back();
    } else {
      ++i;
    }
  if (wait.empty())
    return;
  rt::detail::KernelScope ks(ctx, "send_wait");
  detail::check(MPI_Waitall(static_cast<int>(wait.size()), wait.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
}
inline void pp_wait_all(rt::Ctx &ctx) { pp_wait(ctx, -1); }

/// Waits until rank `peer` gets here too (a message of no bytes each way).
inline void pp_sync(rt::Ctx &ctx, int peer) {
  rt::detail::KernelScope ks(ctx, "wait");
  detail::check(MPI_Sendrecv(nullptr, 0, MPI_BYTE, peer, detail::kSharedTag - 1, nullptr, 0, MPI_BYTE, peer,
                             detail::kSharedTag - 1, detail::pipeline_group().comm, MPI_STATUS_IGNORE),
                "MPI_Sendrecv");
}

/// A parameter two stages hold (a tied head's weight): each rank sends its n-element gradient to
/// `peer` and adds the peer's, so both hold the sum with the same bits (a + b = b + a).
template <class T> void pp_sum_with(rt::Ctx &ctx, T *buf, int64_t n, int peer) {
  rt::detail::KernelScope ks(ctx, "all_reduce");
  std::vector<uint8_t> &sc = detail::scratch();
  if (sc.size() < static_cast<size_t>(n) * sizeof(T))
    sc.resize(static_cast<size_t>(n) * sizeof(T));
  T *in = reinterpret_cast<T *>(sc.data());
  detail::sent(kPipeline) += n * static_cast<int64_t>(sizeof(T));
  detail::check(MPI_Sendrecv(buf, detail::count(n, "pp_sum_with"), detail::Type<T>::type(), peer, detail::kSharedTag,
                             in, detail::count(n, "pp_sum_with"), detail::Type<T>::type(), peer, detail::kSharedTag,
                             detail::pipeline_group().comm, MPI_STATUS_IGNORE),
                "MPI_Sendrecv");
  for (int64_t i = 0; i < n; ++i)
    buf[i] = rt::store<T>(rt::load(buf[i]) + rt::load(in[i]));
}

/// Every rank's k values (rank order), gathered outside the timed steps (the per-rank rows).
inline std::vector<double> gather_values(const std::vector<double> &mine) {
  std::vector<double> all(mine.size() * static_cast<size_t>(size()), 0);
  detail::check(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, all.data(),
                              static_cast<int>(mine.size()), MPI_DOUBLE, MPI_COMM_WORLD),
                "MPI_Allgather");
  return all;
}

#else // one process: the group is this process alone

inline void init(int *, char ***) {}
inline void finalize() {}
inline int rank() { return 0; }
inline int size() { return 1; }
inline double sum(double x) { return x; }
inline void sum(float *, int64_t) {}
inline void merge(uint8_t *, int64_t) {}
template <class T> void tp_all_reduce(rt::Ctx &, T *, int64_t) {}
enum SentKind { kData = 0, kTensor = 1, kPipeline = 2, kKinds = 3 };
inline void split_groups(int, int, int, int, int = 0, int = 1) {}
inline int tensor_rank() { return 0; }
inline int data_rank() { return 0; }
inline int data_size() { return 1; }
inline int64_t sent_bytes(SentKind) { return 0; }
inline int64_t sent_bytes() { return 0; }
inline void reset_sent_bytes() {}
inline std::vector<int64_t> gather_counts(int64_t mine) { return {mine}; }
inline std::vector<double> gather_values(const std::vector<double> &mine) { return mine; }

#endif

/// ZeRO: copies `bytes` between two regions (a shard of the parameters into the gradients
/// region before the gather, the gathered parameters back), timed as a kernel.
inline void copy(rt::Ctx &ctx, void *dst, const void *src, int64_t bytes) {
  rt::detail::KernelScope ks(ctx, "shard_copy");
  if (bytes > 0)
    std::memcpy(dst, src, static_cast<size_t>(bytes));
}

} // namespace tally_comm
