// CUDA runtime: per-row kernels (softmax, layer norm, RMS norm, cross-entropy), the embedding,
// and matmul through cuBLASLt. One block per row; the norm weight gradients reduce columns in
// two stages through fp32 scratch in the context's workspace (launch.h: columnReduce).
#pragma once

#include "elementwise.cuh"

#include <type_traits>

namespace rt {
namespace cu {

inline unsigned rowsGrid(const char* kernel, const char* where, int64_t rows) {
  if (rows > INT32_MAX) fail(kernel, where, "more than 2^31 rows");
  return static_cast<unsigned>(rows);
}

template <class T> __global__ void softmaxFwdKernel(const T* x, T* y, int64_t cols) {
  __shared__ float sh[32];
  const T* xr = x + blockIdx.x * cols;
  T* yr = y + blockIdx.x * cols;
  float m = -m_inf<float>();
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, load(xr[c]));
  m = blockMax(m, sh);
  float s = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += m_exp(load(xr[c]) - m);
  s = blockSum(s, sh);
  const float inv = 1.f / s;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = store<T>(m_exp(load(xr[c]) - m) * inv);
}

template <class T>
__global__ void softmaxBwdKernel(const T* y, const T* dy, T* dx, int64_t cols, bool accumulate) {
  __shared__ float sh[32];
  const int64_t base = blockIdx.x * cols;
  float dot = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dot += load(y[base + c]) * load(dy[base + c]);
  dot = blockSum(dot, sh);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    put(dx + base + c, softmax_grad(load(y[base + c]), load(dy[base + c]), dot), accumulate);
}

/// The prologue of a norm without one.
struct NoPrologue {
  __device__ void operator()(int64_t) const {}
};

/// Layer norm (hasMean) or RMS norm forward, one block per row. Statistics in two passes (fp32).
/// With a prologue (the step's fused elementwise run that computes x), the block first runs it
/// on every element of its row, which writes the row of x, then normalises it.
template <class T, bool LAYER, class F = NoPrologue>
__global__ void normFwdKernel(const T* x, const T* w, const T* b, T* y, float* mean, float* rstd,
                              int64_t cols, float eps, F pro = F()) {
  __shared__ float sh[32];
  const int64_t base = blockIdx.x * cols;
  if (!std::is_same<F, NoPrologue>::value) {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) pro(base + c);
    __syncthreads(); // the row of x, written by the block's threads, is visible to all of them
  }
  float mu = 0.f;
  if (LAYER) {
    float s = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += load(x[base + c]);
    mu = blockSum(s, sh) / static_cast<float>(cols);
  }
  float v = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = load(x[base + c]) - mu;
    v += d * d;
  }
  const float r = norm_rstd(blockSum(v, sh) / static_cast<float>(cols), eps);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float xv = load(x[base + c]), wv = w ? load(w[c]) : 1.f;  // w null: layer norm without a weight
    y[base + c] = store<T>(LAYER ? layer_norm_y(xv, mu, r, wv, b ? load(b[c]) : 0.f) : rms_norm_y(xv, r, wv));
  }
  if (threadIdx.x == 0) {
    if (LAYER) mean[blockIdx.x] = mu;
    rstd[blockIdx.x] = r;
  }
}

/// Norm input gradient, one block per row.
template <class T, bool LAYER>
__global__ void normBwdDxKernel(const T* x, const T* w, const float* mean, const float* rstd, const T* dy,
                                T* dx, int64_t cols, bool accumulate) {
  __shared__ float sh[32];
  const int64_t base = blockIdx.x * cols;
  const float mu = LAYER ? mean[blockIdx.x] : 0.f, r = rstd[blockIdx.x];
  float sg = 0.f, sgx = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float g = (w ? load(w[c]) : 1.f) * load(dy[base + c]);
    sg += g;
    sgx += g * (load(x[base + c]) - mu) * r;
  }
  const float inv = 1.f / static_cast<float>(cols);
  const float mg = LAYER ? blockSum(sg, sh) * inv : 0.f;
  const float mgx = blockSum(sgx, sh) * inv;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float g = (w ? load(w[c]) : 1.f) * load(dy[base + c]);
    const float xhat = (load(x[base + c]) - mu) * r;
    put(dx + base + c, LAYER ? layer_norm_dx(xhat, g, mg, mgx, r) : rms_norm_dx(xhat, g, mgx, r), accumulate);
  }
}

/// Stage 1 of dw (and db): partial column sums over a chunk of rows into part[chunk, cols]
/// (and part[chunks + chunk, cols] for db). grid = (column blocks, chunks).
template <class T, bool LAYER>
__global__ void normBwdDwKernel(const T* x, const float* mean, const float* rstd, const T* dy, float* part,
                                int64_t rows, int64_t cols, int64_t rowsPerChunk, int64_t chunks, bool withDb) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  const int64_t r0 = blockIdx.y * rowsPerChunk, r1 = min(rows, r0 + rowsPerChunk);
  float dw = 0.f, db = 0.f;
  for (int64_t r = r0; r < r1; ++r) {
    const float g = load(dy[r * cols + c]);
    const float xhat = (load(x[r * cols + c]) - (LAYER ? mean[r] : 0.f)) * rstd[r];
    dw += g * xhat;
    db += g;
  }
  part[blockIdx.y * cols + c] = dw;
  if (withDb) part[(chunks + blockIdx.y) * cols + c] = db;
}

/// Stage 2: dw[c] += Σ_chunks part (one rounding to the storage type).
template <class T>
__global__ void columnFinishKernel(const float* part, int64_t chunks, int64_t cols, T* out) {
  TALLY_GRID_STRIDE(c, cols) {
    float s = 0.f;
    for (int64_t k = 0; k < chunks; ++k) s += part[k * cols + c];
    out[c] = store<T>(load(out[c]) + s);
  }
}

/// Cross-entropy forward, one block per row: lse[row], and the row's loss (0 for ignored rows)
/// into rowLoss[row] (scratch) for a deterministic final sum.
template <class T>
__global__ void ceFwdRowKernel(const T* logits, const int32_t* labels, float* lse, float* rowLoss, int64_t V,
                               int64_t ld) {
  __shared__ float sh[32];
  const T* xr = logits + blockIdx.x * ld;
  float m = -m_inf<float>();
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x) m = fmaxf(m, load(xr[c]));
  m = blockMax(m, sh);
  float s = 0.f;
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x) s += m_exp(load(xr[c]) - m);
  s = blockSum(s, sh);
  if (threadIdx.x == 0) {
    const float l = m + m_log(s);
    lse[blockIdx.x] = l;
    const int32_t y = labels[blockIdx.x];
    if (y != kIgnoreLabel && (y < 0 || y >= V)) {
      printf("tally cuda runtime: cross_entropy_fwd: label %d of row %lld is outside 0..%lld\n", y,
             static_cast<long long>(blockIdx.x), static_cast<long long>(V - 1));
      __trap();
    }
    rowLoss[blockIdx.x] = y == kIgnoreLabel ? 0.f : cross_entropy_row_loss(l, load(xr[y]));
  }
}

/// loss = Σ rowLoss / count of rows with a label (one block).
static __global__ void ceFinishKernel(const float* rowLoss, const int32_t* labels, int64_t rows, float* loss) {
  __shared__ float sh[32];
  float s = 0.f, n = 0.f;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    s += rowLoss[r];
    n += labels[r] != kIgnoreLabel ? 1.f : 0.f;
  }
  s = blockSum(s, sh);
  n = blockSum(n, sh);
  if (threadIdx.x == 0) *loss = s / n;  // no labelled row: 0/0 = NaN, as PyTorch
}

/// Count of labelled rows into *count (one block).
static __global__ void ceCountKernel(const int32_t* labels, int64_t rows, float* count) {
  __shared__ float sh[32];
  float n = 0.f;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) n += labels[r] != kIgnoreLabel ? 1.f : 0.f;
  n = blockSum(n, sh);
  if (threadIdx.x == 0) *count = n;
}

template <class T>
__global__ void ceBwdKernel(const T* logits, const int32_t* labels, const float* lse, const float* dloss,
                            const float* count, T* dlogits, int64_t V, int64_t ld, bool accumulate) {
  const int64_t base = blockIdx.x * ld;
  const int32_t y = labels[blockIdx.x];
  const float l = lse[blockIdx.x];
  const float k = y == kIgnoreLabel ? 0.f : *dloss / *count;
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x)
    put(dlogits + base + c, cross_entropy_dlogit(load(logits[base + c]), l, c == y, k), accumulate);
  for (int64_t c = V + threadIdx.x; c < ld; c += blockDim.x)  // a padded head's columns: 0
    put(dlogits + base + c, 0.f, accumulate);
}

template <class T>
__global__ void embeddingFwdKernel(const int32_t* ids, const T* w, T* out, int64_t rows, int64_t d, int64_t vocab) {
  TALLY_GRID_STRIDE(e, rows * d) {
    const int64_t r = e / d, c = e % d;
    const int32_t id = ids[r];
    if (id < 0 || id >= vocab) {
      printf("tally cuda runtime: embedding_fwd: id %d of row %lld is outside 0..%lld\n", id,
             static_cast<long long>(r), static_cast<long long>(vocab - 1));
      __trap();
    }
    out[e] = w[int64_t(id) * d + c];
  }
}

// Embedding backward as a counting sort: histogram of ids, exclusive scan into offsets, rows
// scattered into per-id buckets, then one block per id sums its bucket's dy rows in fp32 and adds
// the sum to dw once. The order of rows inside a bucket follows atomics, so the fp32 sum's
// rounding may differ between runs in the last bits; dw is rounded to its storage type once.
static __global__ void embHistKernel(const int32_t* ids, int64_t rows, int64_t vocab, int32_t* counts) {
  TALLY_GRID_STRIDE(r, rows) {
    const int32_t id = ids[r];
    if (id < 0 || id >= vocab) {
      printf("tally cuda runtime: embedding_bwd: id %d of row %lld is outside 0..%lld\n", id,
             static_cast<long long>(r), static_cast<long long>(vocab - 1));
      __trap();
    }
    atomicAdd(counts + id, 1);
  }
}
/// Exclusive scan of counts into offsets[0..vocab] and cursor (one block of 1024 threads).
static __global__ void embScanKernel(const int32_t* counts, int64_t vocab, int32_t* offsets, int32_t* cursor) {
  __shared__ int32_t part[1024];
  const int64_t per = (vocab + blockDim.x - 1) / blockDim.x;
  const int64_t b = threadIdx.x * per, e = min(vocab, b + per);
  int32_t s = 0;
  for (int64_t i = b; i < e; ++i) s += counts[i];
  part[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t run = 0;
    for (unsigned t = 0; t < blockDim.x; ++t) {
      const int32_t c = part[t];
      part[t] = run;
      run += c;
    }
    offsets[vocab] = run;
  }
  __syncthreads();
  int32_t run = part[threadIdx.x];
  for (int64_t i = b; i < e; ++i) {
    offsets[i] = run;
    cursor[i] = run;
    run += counts[i];
  }
}
static __global__ void embScatterKernel(const int32_t* ids, int64_t rows, int32_t* cursor, int32_t* order) {
  TALLY_GRID_STRIDE(r, rows) order[atomicAdd(cursor + ids[r], 1)] = static_cast<int32_t>(r);
}
template <class T>
__global__ void embAccumulateKernel(const int32_t* offsets, const int32_t* order, const T* dy, T* dw, int64_t d) {
  const int64_t id = blockIdx.x;
  const int32_t b = offsets[id], e = offsets[id + 1];
  if (b == e) return;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float s = 0.f;
    for (int32_t k = b; k < e; ++k) s += load(dy[int64_t(order[k]) * d + c]);
    dw[id * d + c] = store<T>(load(dw[id * d + c]) + s);
  }
}

// ---- matmul ----------------------------------------------------------------------------------

template <class T> struct LtType;
template <> struct LtType<float> { static constexpr cudaDataType_t value = CUDA_R_32F; };
template <> struct LtType<bf16> { static constexpr cudaDataType_t value = CUDA_R_16BF; };
template <> struct LtType<f16> { static constexpr cudaDataType_t value = CUDA_R_16F; };

/// The largest power of two ≤ 256 dividing the address (cuBLASLt's alignment preference).
inline int alignmentOf(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && (a % al) != 0) al /= 2;
  return al;
}

inline cublasLtMatrixLayout_t ltLayout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld,
                                       int64_t batch, int64_t stride, const char* where) {
  cublasLtMatrixLayout_t l = nullptr;
  checkLt(cublasLtMatrixLayoutCreate(&l, t, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld),
          "cublasLtMatrixLayoutCreate", "matmul", where);
  if (batch > 1) {
    const int32_t bc = static_cast<int32_t>(batch);
    checkLt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc),
            "cublasLtMatrixLayoutSetAttribute(batch count)", "matmul", where);
    checkLt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
            "cublasLtMatrixLayoutSetAttribute(batch stride)", "matmul", where);
  }
  return l;
}

}  // namespace cu

// ---- the API ---------------------------------------------------------------------------------

template <class T> void softmax_fwd(Ctx& ctx, const T* x, T* y, int64_t rows, int64_t cols) {
  cu::launch(ctx, "softmax_fwd", cu::softmaxFwdKernel<T>, dim3(cu::rowsGrid("softmax_fwd", ctx.where, rows)),
             cuda_plan::rowThreads(cols), 0, x, y, cols);
}

template <class T>
void softmax_bwd(Ctx& ctx, const T* y, const T* dy, T* dx, int64_t rows, int64_t cols, bool accumulate) {
  cu::launch(ctx, "softmax_bwd", cu::softmaxBwdKernel<T>, dim3(cu::rowsGrid("softmax_bwd", ctx.where, rows)),
             cuda_plan::rowThreads(cols), 0, y, dy, dx, cols, accumulate);
}

template <class T>
void layer_norm_fwd(Ctx& ctx, const T* x, const T* w, const T* b, T* y, float* mean, float* rstd, int64_t rows,
                    int64_t cols, float eps) {
  if (!w && b) cu::fail("layer_norm_fwd", ctx.where, "a bias needs a weight (w is null, b is not)");
  cu::launch(ctx, "layer_norm_fwd", cu::normFwdKernel<T, true>,
             dim3(cu::rowsGrid("layer_norm_fwd", ctx.where, rows)), cuda_plan::rowThreads(cols), 0, x, w, b, y,
             mean, rstd, cols, eps, cu::NoPrologue{});
}

/// layer_norm_fwd after `pro` (a __host__ __device__ functor of the generated step) has computed
/// and written each row of x in the same kernel.
template <class T, class F>
void layer_norm_fwd_fused(Ctx& ctx, const F& pro, const T* x, const T* w, const T* b, T* y, float* mean, float* rstd,
                          int64_t rows, int64_t cols, float eps) {
  if (!w && b) cu::fail("fused", ctx.where, "a bias needs a weight (w is null, b is not)");
  cu::launch(ctx, "fused", cu::normFwdKernel<T, true, F>, dim3(cu::rowsGrid("fused", ctx.where, rows)),
             cuda_plan::rowThreads(cols), 0, x, w, b, y, mean, rstd, cols, eps, pro);
}

namespace cu {
template <class T, bool LAYER>
void normBwd(Ctx& ctx, const char* k, const T* x, const T* w, const float* mean, const float* rstd, const T* dy,
             T* dx, T* dw, T* db, int64_t rows, int64_t cols, bool accumulate) {
  if (dx)
    launch(ctx, k, normBwdDxKernel<T, LAYER>, dim3(rowsGrid(k, ctx.where, rows)), cuda_plan::rowThreads(cols), 0,
           x, w, mean, rstd, dy, dx, cols, accumulate);
  // dw and db may each be null (API.md): that gradient is not needed.
  const bool withDb = LAYER && db != nullptr;
  if (!dw && !withDb) return;
  const cuda_plan::ColumnReducePlan plan =
      cuda_plan::columnReduce(rows, cols, withDb ? 2 : 1, static_cast<int64_t>(ctx.workspaceBytes));
  if (!plan.ok) fail(k, ctx.where, "workspace too small for the weight gradient of " + std::to_string(cols) + " columns");
  if (plan.chunks == 0) return;
  float* part = static_cast<float*>(scratch(ctx, k, plan.scratchBytes));
  const dim3 grid(static_cast<unsigned>((cols + 255) / 256), static_cast<unsigned>(plan.chunks));
  launch(ctx, k, normBwdDwKernel<T, LAYER>, grid, 256, 0, x, mean, rstd, dy, part, rows, cols, plan.rowsPerChunk,
         plan.chunks, withDb);
  if (dw) launch(ctx, k, columnFinishKernel<T>, grid1(cols), kThreads, 0, part, plan.chunks, cols, dw);
  if (withDb)
    launch(ctx, k, columnFinishKernel<T>, grid1(cols), kThreads, 0, part + plan.chunks * cols, plan.chunks, cols, db);
}
}  // namespace cu

template <class T>
void layer_norm_bwd(Ctx& ctx, const T* x, const T* w, const float* mean, const float* rstd, const T* dy, T* dx,
                    T* dw, T* db, int64_t rows, int64_t cols, bool accumulate) {
  if (!w && (dw || db)) cu::fail("layer_norm_bwd", ctx.where, "a norm without a weight (w null) has no dw or db");
  cu::normBwd<T, true>(ctx, "layer_norm_bwd", x, w, mean, rstd, dy, dx, dw, db, rows, cols, accumulate);
}

template <class T>
void rms_norm_fwd(Ctx& ctx, const T* x, const T* w, T* y, float* rstd, int64_t rows, int64_t cols, float eps) {
  cu::launch(ctx, "rms_norm_fwd", cu::normFwdKernel<T, false>, dim3(cu::rowsGrid("rms_norm_fwd", ctx.where, rows)),
             cuda_plan::rowThreads(cols), 0, x, w, static_cast<const T*>(nullptr), y, static_cast<float*>(nullptr),
             rstd, cols, eps, cu::NoPrologue{});
}

/// rms_norm_fwd after `pro` has computed and written each row of x (layer_norm_fwd_fused).
template <class T, class F>
void rms_norm_fwd_fused(Ctx& ctx, const F& pro, const T* x, const T* w, T* y, float* rstd, int64_t rows, int64_t cols,
                        float eps) {
  cu::launch(ctx, "fused", cu::normFwdKernel<T, false, F>, dim3(cu::rowsGrid("fused", ctx.where, rows)),
             cuda_plan::rowThreads(cols), 0, x, w, static_cast<const T*>(nullptr), y, static_cast<float*>(nullptr),
             rstd, cols, eps, pro);
}

template <class T>
void rms_norm_bwd(Ctx& ctx, const T* x, const T* w, const float* rstd, const T* dy, T* dx, T* dw, int64_t rows,
                  int64_t cols, bool accumulate) {
  cu::normBwd<T, false>(ctx, "rms_norm_bwd", x, w, static_cast<const float*>(nullptr), rstd, dy, dx, dw,
                        static_cast<T*>(nullptr), rows, cols, accumulate);
}

template <class T>
void cross_entropy_fwd(Ctx& ctx, const T* logits, const int32_t* labels, float* loss, float* lse, int64_t rows,
                       int64_t V, int64_t ld = 0) {
  const char* k = "cross_entropy_fwd";
  float* rowLoss = static_cast<float*>(cu::scratch(ctx, k, rows * 4));
  cu::launch(ctx, k, cu::ceFwdRowKernel<T>, dim3(cu::rowsGrid(k, ctx.where, rows)), 1024, 0, logits, labels, lse,
             rowLoss, V, ld > V ? ld : V);
  cu::launch(ctx, k, cu::ceFinishKernel, dim3(1), 1024, 0, rowLoss, labels, rows, loss);
}

template <class T>
void cross_entropy_bwd(Ctx& ctx, const T* logits, const int32_t* labels, const float* lse, const float* dloss,
                       T* dlogits, int64_t rows, int64_t V, bool accumulate, int64_t ld = 0) {
  const char* k = "cross_entropy_bwd";
  float* count = static_cast<float*>(cu::scratch(ctx, k, 4));
  cu::launch(ctx, k, cu::ceCountKernel, dim3(1), 1024, 0, labels, rows, count);
  cu::launch(ctx, k, cu::ceBwdKernel<T>, dim3(cu::rowsGrid(k, ctx.where, rows)), 1024, 0, logits, labels, lse, dloss,
             static_cast<const float*>(count), dlogits, V, ld > V ? ld : V, accumulate);
}

template <class T>
void embedding_fwd(Ctx& ctx, const int32_t* ids, const T* w, T* out, int64_t rows, int64_t d, int64_t vocab) {
  cu::launch(ctx, "embedding_fwd", cu::embeddingFwdKernel<T>, cu::grid1(rows * d), cu::kThreads, 0, ids, w, out,
             rows, d, vocab);
}

template <class T>
void embedding_bwd(Ctx& ctx, const int32_t* ids, const T* dy, T* dw, int64_t rows, int64_t d, int64_t vocab) {
  const char* k = "embedding_bwd";
  if (vocab > INT32_MAX || rows > INT32_MAX) cu::fail(k, ctx.where, "more than 2^31 rows or ids");
  if (rows == 0 || vocab == 0) return;
  char* s = static_cast<char*>(cu::scratch(ctx, k, cuda_plan::embeddingScratchBytes(rows, vocab)));
  auto align = [](int64_t b) { return (b + 255) / 256 * 256; };
  int32_t* counts = reinterpret_cast<int32_t*>(s);
  int32_t* offsets = reinterpret_cast<int32_t*>(s + align(vocab * 4));
  int32_t* cursor = reinterpret_cast<int32_t*>(s + align(vocab * 4) + align((vocab + 1) * 4));
  int32_t* order = reinterpret_cast<int32_t*>(s + 2 * align(vocab * 4) + align((vocab + 1) * 4));
  cu::check(cudaMemsetAsync(counts, 0, vocab * 4, ctx.stream), "cudaMemsetAsync", k, ctx.where);
  cu::launch(ctx, k, cu::embHistKernel, cu::grid1(rows), cu::kThreads, 0, ids, rows, vocab, counts);
  cu::launch(ctx, k, cu::embScanKernel, dim3(1), 1024, 0, static_cast<const int32_t*>(counts), vocab, offsets, cursor);
  cu::launch(ctx, k, cu::embScatterKernel, cu::grid1(rows), cu::kThreads, 0, ids, rows, cursor, order);
  cu::launch(ctx, k, cu::embAccumulateKernel<T>, dim3(static_cast<unsigned>(vocab)),
             static_cast<int>(std::min<int64_t>(std::max<int64_t>((d + 31) / 32 * 32, 32), 256)), 0,
             static_cast<const int32_t*>(offsets), static_cast<const int32_t*>(order), dy, dw, d);
}

namespace cu {
/// matmul and matmul_bias: one cuBLASLt problem; with `bias`, the bias epilogue
/// (CUBLASLT_EPILOGUE_BIAS: D = op(A)·op(B) + bias broadcast over D's columns in the
/// column-major view, which are the rows of the row-major C, so bias[N] is added to each row).
template <class T>
void matmulLt(Ctx& ctx, const char* k, bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
              const T* A, int64_t lda, int64_t sA, const T* B, int64_t ldb, int64_t sB, float beta, T* C, int64_t ldc,
              int64_t sC, int64_t batch, const T* bias) {
  const std::string bad = cuda_plan::checkMatmul(transA, transB, M, N, K, lda, ldb, ldc, batch);
  if (!bad.empty()) cu::fail(k, ctx.where, bad);
  if (M == 0 || N == 0 || batch == 0) return;
  if (batch > INT32_MAX) cu::fail(k, ctx.where, "batch exceeds 2^31");
  if (K == 0) {  // C = beta · C, row by row (C may have ldc > N)
    if (bias) cu::fail(k, ctx.where, "an empty product (K = 0) with a bias epilogue");
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t r = 0; r < M; ++r) {
        T* c = C + b * sC + r * ldc;
        if (beta == 0.f) fill(ctx, c, 0.f, N);
        else if (beta != 1.f) scale(ctx, c, beta, N);
      }
    return;
  }
  const cuda_plan::LtProblem p = cuda_plan::rowMajorToLt(transA, transB, M, N, K, lda, ldb, ldc);
  const cudaDataType_t t = cu::LtType<T>::value;
  const int alA = cu::alignmentOf(B), alB = cu::alignmentOf(A), alC = cu::alignmentOf(C);
  const size_t wsBytes = std::min<size_t>(ctx.workspaceBytes, cuda_plan::kMatmulWorkspaceBytes);
  char key[320];
  std::snprintf(key, sizeof key, "%d|%d%d|%lld,%lld,%lld|%lld,%lld,%lld|%lld,%lld,%lld|%lld|%d,%d,%d|%zu|%s",
                static_cast<int>(t), transA, transB, (long long)M, (long long)N, (long long)K, (long long)lda,
                (long long)ldb, (long long)ldc, (long long)sA, (long long)sB, (long long)sC, (long long)batch, alA,
                alB, alC, wsBytes, bias ? "bias" : "");
  auto it = ctx.plans.find(key);
  if (it == ctx.plans.end()) {
    cu::LtPlan plan;
    cu::checkLt(cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate", k,
                ctx.where);
    const cublasOperation_t opA = p.transA ? CUBLAS_OP_T : CUBLAS_OP_N, opB = p.transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    cu::checkLt(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof opA),
                "cublasLtMatmulDescSetAttribute(transa)", k, ctx.where);
    cu::checkLt(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof opB),
                "cublasLtMatmulDescSetAttribute(transb)", k, ctx.where);
    if (bias) {  // the bias has D's type (cuBLASLt's default for non-fp8 D)
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      cu::checkLt(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
                  "cublasLtMatmulDescSetAttribute(epilogue)", k, ctx.where);
      const void* b0 = bias;  // the heuristic sees a bias; each call sets its own pointer below
      cu::checkLt(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b0, sizeof b0),
                  "cublasLtMatmulDescSetAttribute(bias)", k, ctx.where);
    }
    plan.a = cu::ltLayout(t, p.aRows, p.aCols, p.lda, batch, sB, ctx.where);
    plan.b = cu::ltLayout(t, p.bRows, p.bCols, p.ldb, batch, sA, ctx.where);
    plan.c = cu::ltLayout(t, p.cRows, p.cCols, p.ldc, batch, sC, ctx.where);
    cublasLtMatmulPreference_t pref = nullptr;
    cu::checkLt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate", k, ctx.where);
    const uint64_t ws = wsBytes;
    const uint32_t a1 = alA, a2 = alB, a3 = alC;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a1, sizeof a1);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &a2, sizeof a2);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &a3, sizeof a3);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &a3, sizeof a3);
    cublasLtMatmulHeuristicResult_t h{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(ctx.lt, plan.op, plan.a, plan.b, plan.c, plan.c, pref, 1, &h, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
      cublasLtMatmulDescDestroy(plan.op);
      cublasLtMatrixLayoutDestroy(plan.a);
      cublasLtMatrixLayoutDestroy(plan.b);
      cublasLtMatrixLayoutDestroy(plan.c);
      cu::fail(k, ctx.where, "cuBLASLt has no algorithm for " + std::string(key) + " (status " +
                                 std::to_string(static_cast<int>(st)) + ")");
    }
    plan.algo = h.algo;
    plan.workspace = h.workspaceSize;
    it = ctx.plans.emplace(key, plan).first;
  }
  const cu::LtPlan& plan = it->second;
  if (bias) {
    const void* b = bias;
    cu::checkLt(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof b),
                "cublasLtMatmulDescSetAttribute(bias)", k, ctx.where);
  }
  const int tk = cu::timeBegin(ctx, k);
  cu::checkLt(cublasLtMatmul(ctx.lt, plan.op, &alpha, B, plan.a, A, plan.b, &beta, C, plan.c, C, plan.c, &plan.algo,
                             ctx.workspace, plan.workspace, ctx.stream),
              "cublasLtMatmul", k, ctx.where);
  cu::checkLaunch(ctx, k);
  cu::timeEnd(ctx, tk, k);
}
}  // namespace cu

/// C[b] = alpha · op(A[b]) · op(B[b]) + beta · C[b] (row-major) through cuBLASLt with fp32
/// accumulation (CUBLAS_COMPUTE_32F; no TF32 for fp32 inputs, so fp32 results match the CPU's).
template <class T>
void matmul(Ctx& ctx, bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
            int64_t lda, int64_t sA, const T* B, int64_t ldb, int64_t sB, float beta, T* C, int64_t ldc, int64_t sC,
            int64_t batch) {
  cu::matmulLt(ctx, "matmul", transA, transB, M, N, K, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, batch,
               static_cast<const T*>(nullptr));
}

/// C = op(A) · op(B) + bias (bias[N] added to every row), one product: cuBLASLt's bias epilogue.
template <class T>
void matmul_bias(Ctx& ctx, bool transA, bool transB, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda,
                 const T* B, int64_t ldb, const T* bias, T* C, int64_t ldc) {
  if (!bias && N > 0) cu::fail("matmul_bias", ctx.where, "the bias must not be null");
  cu::matmulLt(ctx, "matmul_bias", transA, transB, M, N, K, 1.f, A, lda, 0, B, ldb, 0, 0.f, C, ldc, 0, 1, bias);
}

}  // namespace rt
