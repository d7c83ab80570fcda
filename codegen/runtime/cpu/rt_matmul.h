// tally CPU runtime: batched matmul through OpenBLAS. C is split into tiles run on the OpenMP
// threads, each tile one single-threaded cblas_sgemm / cblas_dgemm call (fp32, fp64); for bf16
// and fp16 each tile converts its operands to fp32 in blocks of 512 along K, accumulates in fp32
// over all of K, and rounds C to the storage type once at the end.
#pragma once

#include "rt_ctx.h"

#include <cblas.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <type_traits>

namespace rt {
namespace detail {

/// Checks matmul's sizes and leading dimensions (row-major: op(A) is M×K, op(B) K×N, C M×N).
inline void check_matmul(bool transA, bool transB, int64_t M, int64_t N, int64_t K, int64_t lda,
                         int64_t sA, int64_t ldb, int64_t sB, int64_t ldc, int64_t sC, int64_t batch) {
  require_sizes("matmul", {M, N, K, batch});
  int64_t colsA = transA ? M : K, colsB = transB ? K : N;
  require(lda >= std::max<int64_t>(1, colsA), "matmul", [&] { return "lda = " + std::to_string(lda) + " is below A's row length " + std::to_string(colsA); });
  require(ldb >= std::max<int64_t>(1, colsB), "matmul", [&] { return "ldb = " + std::to_string(ldb) + " is below B's row length " + std::to_string(colsB); });
  require(ldc >= std::max<int64_t>(1, N), "matmul", [&] { return "ldc = " + std::to_string(ldc) + " is below N = " + std::to_string(N); });
  require(sA >= 0 && sB >= 0 && sC >= 0, "matmul", "negative batch stride");
  require(batch <= 1 || sC > 0, "matmul", "a batched C needs a nonzero batch stride");
  const int64_t lim = INT32_MAX;   // OpenBLAS takes int sizes
  require(M <= lim && N <= lim && K <= lim && lda <= lim && ldb <= lim && ldc <= lim, "matmul",
          "a size or leading dimension exceeds 2^31-1");
}

inline void gemm(bool tA, bool tB, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, tA ? CblasTrans : CblasNoTrans, tB ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A,
              static_cast<int>(lda), B, static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}
inline void gemm(bool tA, bool tB, int64_t M, int64_t N, int64_t K, float alpha, const double* A,
                 int64_t lda, const double* B, int64_t ldb, float beta, double* C, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, tA ? CblasTrans : CblasNoTrans, tB ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A,
              static_cast<int>(lda), B, static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}

/// OpenBLAS runs single-threaded under this runtime: matmul splits C into tiles and runs them on
/// the OpenMP threads (one thread pool for every kernel; OpenBLAS's own pthreads pool competing
/// with spinning OpenMP threads made 16-bit matmuls several times slower).
inline void blas_single_threaded() {
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}

} // namespace detail

/// OpenBLAS's pthread build starts its own worker pool when the library loads, before the
/// runtime can turn it off (blas_single_threaded), and those workers spin for a while: on a
/// machine with few cores they time-share a core with the OpenMP threads, and calls made in the
/// first fraction of a second came out up to 400x slower (a whole step up to 60x; the first
/// calibration matmul 4-8 ms instead of 0.02 ms, 2 calibrations in 3 on 2 cores). A program
/// linking this runtime calls this first thing in main: without OPENBLAS_NUM_THREADS in the
/// environment it sets it to 1 and executes itself again, so the pool is never started. Returns
/// only when already set (or when the restart failed: then it runs as it is).
inline void restart_with_single_threaded_blas(char **argv) {
  if (!std::getenv("OPENBLAS_NUM_THREADS") && setenv("OPENBLAS_NUM_THREADS", "1", 1) == 0)
    execv("/proc/self/exe", argv);
}

namespace detail {

/// One C tile [m0, m0+mb) × [n0, n0+nb) of one batch entry.
/// fp32/fp64: sgemm/dgemm on the sub-matrices. bf16/fp16: K in blocks of 512, each block of op(A)
/// and op(B) converted to fp32 in its memory order (keeping its transpose), accumulated in an fp32
/// tile, rounded to T once at the end.
template <class T>
void gemm_tile(bool tA, bool tB, int64_t m0, int64_t mb, int64_t n0, int64_t nb, int64_t K, float alpha,
               const T* A, int64_t lda, const T* B, int64_t ldb, float beta, T* C, int64_t ldc,
               const T* bias = nullptr) {
  const T* At = tA ? A + m0 : A + m0 * lda;
  const T* Bt = tB ? B + n0 * ldb : B + n0;
  T* Ct = C + m0 * ldc + n0;
  if constexpr (std::is_same<T, float>::value || std::is_same<T, double>::value) {
    gemm(tA, tB, mb, nb, K, alpha, At, lda, Bt, ldb, beta, Ct, ldc);
    if (bias)  // the epilogue: C + bias, as the separate add computes it
      for (int64_t i = 0; i < mb; ++i)
        for (int64_t j = 0; j < nb; ++j) Ct[i * ldc + j] = store<T>(load(Ct[i * ldc + j]) + load(bias[n0 + j]));
  } else {
    constexpr int64_t KB = 512;
    static thread_local std::vector<float> af, bf, cf;
    float* Cf = scratch(cf, mb * nb);
    for (int64_t i = 0; i < mb; ++i)
      for (int64_t j = 0; j < nb; ++j) Cf[i * nb + j] = beta == 0.0f ? 0.0f : beta * load(Ct[i * ldc + j]);
    for (int64_t k0 = 0; k0 < K; k0 += KB) {
      const int64_t kb = std::min(KB, K - k0);
      float* Af = scratch(af, mb * kb);
      float* Bf = scratch(bf, kb * nb);
      if (!tA) {
        for (int64_t i = 0; i < mb; ++i)
          for (int64_t k = 0; k < kb; ++k) Af[i * kb + k] = load(At[i * lda + (k0 + k)]);
      } else {
        for (int64_t k = 0; k < kb; ++k)
          for (int64_t i = 0; i < mb; ++i) Af[k * mb + i] = load(At[(k0 + k) * lda + i]);
      }
      if (!tB) {
        for (int64_t k = 0; k < kb; ++k)
          for (int64_t j = 0; j < nb; ++j) Bf[k * nb + j] = load(Bt[(k0 + k) * ldb + j]);
      } else {
        for (int64_t j = 0; j < nb; ++j)
          for (int64_t k = 0; k < kb; ++k) Bf[j * kb + k] = load(Bt[j * ldb + (k0 + k)]);
      }
      gemm(tA, tB, mb, nb, kb, alpha, Af, tA ? mb : kb, Bf, tB ? kb : nb, 1.0f, Cf, nb);
    }
    if (bias)  // the epilogue: the bias added in fp32, C rounded once (cuBLASLt's)
      for (int64_t i = 0; i < mb; ++i)
        for (int64_t j = 0; j < nb; ++j) Cf[i * nb + j] += load(bias[n0 + j]);
    for (int64_t i = 0; i < mb; ++i)
      for (int64_t j = 0; j < nb; ++j) Ct[i * ldc + j] = store<T>(Cf[i * nb + j]);
  }
}

/// The tiles of C over the OpenMP threads (matmul, matmul_bias).
template <class T>
void matmul_tiles(Ctx& ctx, bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
                  int64_t lda, int64_t sA, const T* B, int64_t ldb, int64_t sB, float beta, T* C, int64_t ldc,
                  int64_t sC, int64_t batch, const T* bias) {
  if (M == 0 || N == 0 || batch == 0) return;
  blas_single_threaded();
  // Tiles of C: start at 256 × 1024 and halve the larger side until there are at least two
  // tiles per thread (or the tiles reach 32 × 64).
  const int nt = ctx.nthreads();
  int64_t tm = std::min<int64_t>(M, 256), tn = std::min<int64_t>(N, 1024);
  auto tiles = [&]() { return batch * ((M + tm - 1) / tm) * ((N + tn - 1) / tn); };
  while (tiles() < 2 * nt && (tm > 32 || tn > 64)) {
    if (tn > 64 && (tn >= 2 * tm || tm <= 32)) tn = (tn + 1) / 2;
    else tm = (tm + 1) / 2;
  }
  const int64_t gm = (M + tm - 1) / tm, gn = (N + tn - 1) / tn, total = tiles();
  // On the team only above 128³ multiply-adds. Measured on the 2-vCPU EPYC VM (one thread / two,
  // fp32): 32 x 192 x 64 7.9 / 13.3 us, 64 x 256 x 64 18.9 / 22.4 us, 64 x 256 x 256 74.9 / 54.9
  // us, 256 x 768 x 768 2.45 / 1.38 ms: the team's start and join (2.7 us) and tiles of a few
  // rows cost more than the second core gives below about 2M (a 64 x 8 x 4 weight gradient
  // took 3.97 us on two threads, 0.3 on one). The estimate's rule too (passes/KernelTime.cpp,
  // forkingCalls; kForkMatmulWork in ir/Target.h).
  const bool threaded = total > 1 && static_cast<double>(batch) * M * N * K > 2097152.0;
  detail::region(nt, threaded, [&] {
#pragma omp for schedule(dynamic, 1)
  for (int64_t t = 0; t < total; ++t) {
    const int64_t b = t / (gm * gn), i = (t / gn) % gm, j = t % gn;
    const int64_t m0 = i * tm, n0 = j * tn;
    gemm_tile<T>(transA, transB, m0, std::min(tm, M - m0), n0, std::min(tn, N - n0), K, alpha, A + b * sA, lda,
                 B + b * sB, ldb, beta, C + b * sC, ldc, bias);
  }
  });
}

} // namespace detail

/// C[b] = alpha · op(A[b]) @ op(B[b]) + beta · C[b] for b < batch (row-major; op = transpose when
/// trans*; lda/ldb/ldc leading dimensions; sA/sB/sC batch strides in elements, 0 = broadcast).
template <class T>
void matmul(Ctx& ctx, bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
            const T* A, int64_t lda, int64_t sA, const T* B, int64_t ldb, int64_t sB, float beta,
            T* C, int64_t ldc, int64_t sC, int64_t batch) {
  detail::KernelScope ks(ctx, "matmul");
  detail::check_matmul(transA, transB, M, N, K, lda, sA, ldb, sB, ldc, sC, batch);
  detail::matmul_tiles<T>(ctx, transA, transB, M, N, K, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, batch,
                          nullptr);
}

/// C = op(A) @ op(B) + bias, bias[N] added to every row (the generated step's matmul followed by
/// a bias add, fused as cuBLASLt's bias epilogue): the bias is added to each fp32 tile before
/// C is stored (fp32: exactly the separate add; 16-bit: C rounded once instead of twice).
template <class T>
void matmul_bias(Ctx& ctx, bool transA, bool transB, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda,
                 const T* B, int64_t ldb, const T* bias, T* C, int64_t ldc) {
  detail::KernelScope ks(ctx, "matmul_bias");
  detail::check_matmul(transA, transB, M, N, K, lda, 0, ldb, 0, ldc, 0, 1);
  detail::require(bias != nullptr || N == 0, "matmul_bias", "the bias must not be null");
  detail::matmul_tiles<T>(ctx, transA, transB, M, N, K, 1.0f, A, lda, 0, B, ldb, 0, 0.0f, C, ldc, 0, 1, bias);
}

} // namespace rt
