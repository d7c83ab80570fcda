// Host-side launch planning for the CUDA runtime: grid sizes, attention tile shapes, the
// scratch each kernel borrows from the context's workspace, and argument checks.
//
// Header-only plain C++17 with no CUDA headers, so that the Catch2 unit tests (tests/unit/) compile it with
// the host compiler and check every choice on a machine without a GPU. tally_rt.cuh calls these
// functions before each launch; a choice made here is the choice the kernel runs with.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

namespace rt {
namespace cuda_plan {

/// Threads per block of the elementwise (grid-stride) kernels.
constexpr int kElementwiseThreads = 256;
/// The most blocks an elementwise launch uses; a grid-stride loop covers the rest.
constexpr int64_t kMaxElementwiseBlocks = 65535LL * 8;
/// Workspace a cuBLASLt matmul may use on sm_90 (NVIDIA recommends 32 MiB for Hopper).
constexpr int64_t kMatmulWorkspaceBytes = 32LL << 20;
/// Workspace the runtime asks for in total: cuBLASLt's share plus the kernels' scratch.
constexpr int64_t kDefaultWorkspaceBytes = 64LL << 20;
/// Dynamic shared memory one block may opt into on sm_90 (227 KiB).
constexpr int64_t kMaxSharedBytesSm90 = 227LL * 1024;

/// A 1-D launch: blocks × threads.
struct Launch1D {
  int64_t blocks = 0;
  int threads = 0;
};

/// The grid of a grid-stride elementwise kernel over n elements: enough blocks to give each
/// thread one element, capped at kMaxElementwiseBlocks; n = 0 gives 0 blocks (launch nothing).
Launch1D elementwise(int64_t n);

/// Threads per block of a one-block-per-row kernel (norms, softmax, cross-entropy): a multiple
/// of 32 between 32 and 1024, about one thread per 4 columns, so short rows do not idle warps.
int rowThreads(int64_t cols);

/// How a column reduction (norm weight gradients: Σ over rows of a [rows, cols] product) is split:
/// `chunks` row ranges of `rowsPerChunk` rows each reduce into an fp32 scratch [chunks, cols],
/// and a second kernel sums the chunks. chunks ≥ 1; the scratch fits in `scratchBytes`.
struct ColumnReducePlan {
  int64_t chunks = 0;
  int64_t rowsPerChunk = 0;
  int64_t scratchBytes = 0;  ///< chunks · cols · 4 · (number of reduced outputs)
  bool ok = false;           ///< false: cols too wide for the scratch (the caller reports it)
};
/// outputs = 1 (RMS norm: dw) or 2 (layer norm: dw and db).
ColumnReducePlan columnReduce(int64_t rows, int64_t cols, int outputs, int64_t scratchBytes);

/// Scratch of the embedding backward's counting sort: counts [vocab], offsets [vocab + 1],
/// row order [rows], as int32 (fp32 accumulation happens per vocabulary row in registers).
int64_t embeddingScratchBytes(int64_t rows, int64_t vocab);

/// Tile shape of the fused attention kernels (fp32 arithmetic in shared memory).
/// Forward and dQ: `rowsPerWarp` query rows per warp, `warps` warps, keys in tiles of 32.
/// dK/dV: `kvWarps` warps, each owning 32 keys; query rows in tiles of `qTile`.
struct AttentionTiles {
  int chunks = 0;            ///< ceil(head_dim / 32): head elements per lane
  int warps = 0;
  int rowsPerWarp = 0;
  int64_t fwdSharedBytes = 0;
  int64_t dqSharedBytes = 0;
  int kvWarps = 0;
  int qTile = 0;
  int64_t kvSharedBytes = 0;
  bool ok = false;
  std::string why;  ///< when !ok: the reason, for the error message
};
/// head_dim between 1 and 256 (each lane of a warp holds ceil(head_dim / 32) elements).
AttentionTiles attentionTiles(int64_t headDim, int64_t sharedLimit = kMaxSharedBytesSm90);
/// Shared memory of the forward kernel: a query tile [warps·rowsPerWarp, hd] and a key and a
/// value tile [32, hd + 1] (the +1 keeps a lane-per-key walk free of bank conflicts).
int64_t attentionFwdShared(int64_t headDim, int warps, int rowsPerWarp);
/// Shared memory of the dQ kernel: query and dO tiles [rows, hd], key and value tiles [32, hd + 1].
int64_t attentionDqShared(int64_t headDim, int warps, int rowsPerWarp);
/// Shared memory of the dK/dV kernel for a tile shape.
int64_t attentionKvShared(int64_t headDim, int kvWarps, int qTile);
/// Shared memory of the tensor-core attention forward (head size 64 or 128): Q, K, V tiles of
/// 64 rows × (hd + 8) 16-bit values; per warp S [16][68] fp32, P [16][72] 16-bit, O [16][hd + 4] fp32.
int64_t attentionTcShared(int64_t headDim);
/// Scratch of the attention backward: D = rowsum(dO ∘ O) in fp32 [B, H, S].
int64_t attentionScratchBytes(int64_t B, int64_t H, int64_t S);

/// Checks a matmul's arguments as cuBLASLt will see them (row-major, see tally_rt.cuh); returns
/// "" when they are valid, else what is wrong (leading dimension too small, negative size…).
std::string checkMatmul(bool transA, bool transB, int64_t M, int64_t N, int64_t K, int64_t lda,
                        int64_t ldb, int64_t ldc, int64_t batch);

/// Checks attention's shape arguments; "" when valid.
std::string checkAttention(int64_t B, int64_t S, int64_t Skv, int64_t H, int64_t Hkv, int64_t hd);

/// Checks attention's row strides (rt::AttnRows: 0 = dense, else at least the width H·hd for q,
/// Hkv·hd for k and v); "" when valid. Call after checkAttention.
std::string checkAttentionRows(int64_t H, int64_t Hkv, int64_t hd, int64_t qRow, int64_t kRow, int64_t vRow);

/// The column-major problem cuBLASLt solves for a row-major C = op(A)·op(B): C^T = op(B)^T·op(A)^T.
/// `aRows/aCols` etc. are the column-major layouts of the matrices passed as Lt's A (our B) and
/// Lt's B (our A).
struct LtProblem {
  int64_t m = 0, n = 0, k = 0;
  bool transA = false, transB = false;  ///< Lt's op on its A (our B) and its B (our A)
  int64_t aRows = 0, aCols = 0, lda = 0;
  int64_t bRows = 0, bCols = 0, ldb = 0;
  int64_t cRows = 0, cCols = 0, ldc = 0;
};
LtProblem rowMajorToLt(bool transA, bool transB, int64_t M, int64_t N, int64_t K, int64_t lda,
                       int64_t ldb, int64_t ldc);

// ---- definitions ---------------------------------------------------------------------------

/// ⌈a / b⌉ for a ≥ 0, b > 0.
inline int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline Launch1D elementwise(int64_t n) {
  Launch1D l;
  l.threads = kElementwiseThreads;
  l.blocks = n <= 0 ? 0 : std::min(ceilDiv(n, kElementwiseThreads), kMaxElementwiseBlocks);
  return l;
}

inline int rowThreads(int64_t cols) {
  int64_t t = ceilDiv(std::max<int64_t>(cols, 1), 4);
  t = ceilDiv(t, 32) * 32;
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(t, 32), 1024));
}

inline ColumnReducePlan columnReduce(int64_t rows, int64_t cols, int outputs, int64_t scratchBytes) {
  ColumnReducePlan p;
  if (rows <= 0 || cols <= 0 || outputs <= 0) {
    p.ok = rows == 0 || cols == 0;  // nothing to reduce is fine; negative sizes are not
    return p;
  }
  // Each chunk is one block row of the grid; 256 chunks fill an H100 for any width.
  int64_t rowsPerChunk = std::max<int64_t>(32, ceilDiv(rows, 256));
  const int64_t perChunk = cols * 4 * outputs;
  if (perChunk > scratchBytes) return p;
  const int64_t maxChunks = scratchBytes / perChunk;
  while (ceilDiv(rows, rowsPerChunk) > maxChunks) rowsPerChunk *= 2;
  p.rowsPerChunk = rowsPerChunk;
  p.chunks = ceilDiv(rows, rowsPerChunk);
  p.scratchBytes = p.chunks * perChunk;
  p.ok = true;
  return p;
}

inline int64_t embeddingScratchBytes(int64_t rows, int64_t vocab) {
  // counts[vocab] + offsets[vocab + 1] + cursor[vocab] + order[rows], int32 each, 256-B aligned parts.
  auto align = [](int64_t b) { return ceilDiv(b, 256) * 256; };
  return align(vocab * 4) + align((vocab + 1) * 4) + align(vocab * 4) + align(rows * 4);
}

inline int64_t attentionFwdShared(int64_t headDim, int warps, int rowsPerWarp) {
  const int64_t rows = int64_t(warps) * rowsPerWarp;
  return 4 * (rows * headDim + 32 * (headDim + 1) + 32 * headDim);
}

inline int64_t attentionDqShared(int64_t headDim, int warps, int rowsPerWarp) {
  const int64_t rows = int64_t(warps) * rowsPerWarp;
  return 4 * (2 * rows * headDim + 2 * 32 * (headDim + 1));
}

inline int64_t attentionKvShared(int64_t headDim, int kvWarps, int qTile) {
  const int64_t keys = int64_t(kvWarps) * 32;
  // K, V, dK, dV [keys, hd + 1]; Q, dO [qTile, hd]; lse, D [qTile].
  return 4 * (4 * keys * (headDim + 1) + 2 * int64_t(qTile) * headDim + 2 * int64_t(qTile));
}

inline AttentionTiles attentionTiles(int64_t headDim, int64_t sharedLimit) {
  AttentionTiles t;
  if (headDim < 1 || headDim > 256) {
    t.why = "head_dim " + std::to_string(headDim) + " is outside 1..256";
    return t;
  }
  t.chunks = static_cast<int>(ceilDiv(headDim, 32));
  // Registers hold chunks · rowsPerWarp output accumulators per lane: at most 32.
  t.warps = 4;
  t.rowsPerWarp = t.chunks <= 4 ? 8 : 4;
  t.fwdSharedBytes = attentionFwdShared(headDim, t.warps, t.rowsPerWarp);
  t.dqSharedBytes = attentionDqShared(headDim, t.warps, t.rowsPerWarp);
  // The dK/dV kernel: as many 32-key warps (4, 2, 1) as fit with a 32-row query tile.
  t.qTile = 32;
  for (int kw : {4, 2, 1}) {
    if (attentionKvShared(headDim, kw, t.qTile) <= sharedLimit) {
      t.kvWarps = kw;
      break;
    }
  }
  t.kvSharedBytes = t.kvWarps ? attentionKvShared(headDim, t.kvWarps, t.qTile) : 0;
  if (!t.kvWarps || t.fwdSharedBytes > sharedLimit || t.dqSharedBytes > sharedLimit) {
    t.why = "head_dim " + std::to_string(headDim) + " needs more shared memory than " +
            std::to_string(sharedLimit) + " bytes";
    return t;
  }
  t.ok = true;
  return t;
}

inline int64_t attentionTcShared(int64_t headDim) {
  return 3 * 64 * (headDim + 8) * 2 + 4 * 16 * 68 * 4 + 4 * 16 * 72 * 2 + 4 * 16 * (headDim + 4) * 4;
}

inline int64_t attentionScratchBytes(int64_t B, int64_t H, int64_t S) {
  return ceilDiv(B * H * S * 4, 256) * 256;
}

inline std::string checkMatmul(bool transA, bool transB, int64_t M, int64_t N, int64_t K, int64_t lda,
                        int64_t ldb, int64_t ldc, int64_t batch) {
  if (M < 0 || N < 0 || K < 0 || batch < 0)
    return "negative size (M=" + std::to_string(M) + ", N=" + std::to_string(N) +
           ", K=" + std::to_string(K) + ", batch=" + std::to_string(batch) + ")";
  // Row-major: the leading dimension is at least the number of columns as stored.
  const int64_t aCols = transA ? M : K, bCols = transB ? K : N;
  if (lda < std::max<int64_t>(aCols, 1))
    return "lda " + std::to_string(lda) + " < " + std::to_string(aCols) + " columns of A";
  if (ldb < std::max<int64_t>(bCols, 1))
    return "ldb " + std::to_string(ldb) + " < " + std::to_string(bCols) + " columns of B";
  if (ldc < std::max<int64_t>(N, 1))
    return "ldc " + std::to_string(ldc) + " < " + std::to_string(N) + " columns of C";
  return "";
}

inline std::string checkAttention(int64_t B, int64_t S, int64_t Skv, int64_t H, int64_t Hkv, int64_t hd) {
  if (B < 0 || S < 0 || Skv < 0) return "negative batch or sequence length";
  if (H <= 0 || Hkv <= 0) return "head counts must be positive";
  if (H % Hkv != 0)
    return "query heads " + std::to_string(H) + " are not a multiple of kv heads " +
           std::to_string(Hkv);
  if (B > INT32_MAX / std::max<int64_t>(H, 1))
    return "B·H exceeds the grid's y dimension";
  AttentionTiles t = attentionTiles(hd);
  if (!t.ok) return t.why;
  return "";
}

inline std::string checkAttentionRows(int64_t H, int64_t Hkv, int64_t hd, int64_t qRow, int64_t kRow, int64_t vRow) {
  if (hd <= 0 || H > INT64_MAX / hd) return "H·hd overflows int64";
  const int64_t qw = H * hd, kw = Hkv * hd;
  const struct { const char* name; int64_t row, width; } all[] = {{"q", qRow, qw}, {"k", kRow, kw}, {"v", vRow, kw}};
  for (const auto& x : all)
    if (x.row != 0 && x.row < x.width)
      return std::string(x.name) + " row stride " + std::to_string(x.row) + " is smaller than its width " +
             std::to_string(x.width);
  return "";
}

inline LtProblem rowMajorToLt(bool transA, bool transB, int64_t M, int64_t N, int64_t K, int64_t lda,
                       int64_t ldb, int64_t ldc) {
  LtProblem p;
  p.m = N;
  p.n = M;
  p.k = K;
  // Our B, row-major [K, N] (or [N, K] when transposed), is column-major [N, K] ([K, N]).
  p.transA = transB;
  p.aRows = transB ? K : N;
  p.aCols = transB ? N : K;
  p.lda = ldb;
  // Our A, row-major [M, K] (or [K, M]), is column-major [K, M] ([M, K]).
  p.transB = transA;
  p.bRows = transA ? M : K;
  p.bCols = transA ? K : M;
  p.ldb = lda;
  p.cRows = N;
  p.cCols = M;
  p.ldc = ldc;
  return p;
}

}  // namespace cuda_plan
}  // namespace rt
