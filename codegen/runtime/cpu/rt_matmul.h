// tally CPU runtime: batched matmul through OpenBLAS. fp32 and fp64 go straight to
// cblas_sgemm / cblas_dgemm; bf16 and fp16 operands are converted to fp32 in blocks (256 rows of
// C × 512 of K at a time), multiplied by sgemm with fp32 accumulation over all of K, and C is
// rounded to the storage type once at the end.
#pragma once

#include "rt_ctx.h"

#include <cblas.h>

#include <algorithm>

namespace rt {
namespace detail {

/// Checks matmul's sizes and leading dimensions (row-major: op(A) is M×K, op(B) K×N, C M×N).
inline void check_matmul(bool transA, bool transB, int64_t M, int64_t N, int64_t K, int64_t lda,
                         int64_t sA, int64_t ldb, int64_t sB, int64_t ldc, int64_t sC, int64_t batch) {
  require_sizes("matmul", {M, N, K, batch});
  int64_t colsA = transA ? M : K, colsB = transB ? K : N;
  require(lda >= std::max<int64_t>(1, colsA), "matmul", "lda = " + std::to_string(lda) + " is below A's row length " + std::to_string(colsA));
  require(ldb >= std::max<int64_t>(1, colsB), "matmul", "ldb = " + std::to_string(ldb) + " is below B's row length " + std::to_string(colsB));
  require(ldc >= std::max<int64_t>(1, N), "matmul", "ldc = " + std::to_string(ldc) + " is below N = " + std::to_string(N));
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

/// One 16-bit matmul (a single batch entry) through fp32 blocks.
template <class T>
void gemm16(Ctx& ctx, bool tA, bool tB, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
            int64_t lda, const T* B, int64_t ldb, float beta, T* C, int64_t ldc) {
  constexpr int64_t MB = 256, KB = 512;
  static thread_local std::vector<float> af, bf, cf;
  const int nt = ctx.nthreads();
  for (int64_t m0 = 0; m0 < M; m0 += MB) {
    const int64_t mb = std::min(MB, M - m0);
    float* Cf = scratch(cf, mb * N);
    if (beta != 0.0f || K == 0) {
#pragma omp parallel for num_threads(nt) schedule(static) if (mb * N > 16384)
      for (int64_t i = 0; i < mb; ++i)
        for (int64_t j = 0; j < N; ++j)
          Cf[i * N + j] = beta == 0.0f ? 0.0f : beta * load(C[(m0 + i) * ldc + j]);
    }
    for (int64_t k0 = 0; k0 < K; k0 += KB) {
      const int64_t kb = std::min(KB, K - k0);
      float* Af = scratch(af, mb * kb);
      float* Bf = scratch(bf, kb * N);
#pragma omp parallel num_threads(nt) if (mb * kb + kb * N > 16384)
      {
#pragma omp for schedule(static) nowait
        for (int64_t i = 0; i < mb; ++i)
          for (int64_t k = 0; k < kb; ++k)
            Af[i * kb + k] = load(tA ? A[(k0 + k) * lda + (m0 + i)] : A[(m0 + i) * lda + (k0 + k)]);
#pragma omp for schedule(static)
        for (int64_t k = 0; k < kb; ++k)
          for (int64_t j = 0; j < N; ++j)
            Bf[k * N + j] = load(tB ? B[j * ldb + (k0 + k)] : B[(k0 + k) * ldb + j]);
      }
      float b = (k0 == 0) ? (beta == 0.0f ? 0.0f : 1.0f) : 1.0f;   // beta already applied to Cf
      gemm(false, false, mb, N, kb, alpha, Af, kb, Bf, N, b, Cf, N);
    }
#pragma omp parallel for num_threads(nt) schedule(static) if (mb * N > 16384)
    for (int64_t i = 0; i < mb; ++i)
      for (int64_t j = 0; j < N; ++j) C[(m0 + i) * ldc + j] = store<T>(Cf[i * N + j]);
  }
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
  if (M == 0 || N == 0) return;
  for (int64_t b = 0; b < batch; ++b) {
    const T* Ab = A + b * sA;
    const T* Bb = B + b * sB;
    T* Cb = C + b * sC;
    if constexpr (std::is_same<T, float>::value || std::is_same<T, double>::value) {
      detail::gemm(transA, transB, M, N, K, alpha, Ab, lda, Bb, ldb, beta, Cb, ldc);
    } else {
      detail::gemm16(ctx, transA, transB, M, N, K, alpha, Ab, lda, Bb, ldb, beta, Cb, ldc);
    }
  }
}

} // namespace rt
