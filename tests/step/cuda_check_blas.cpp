// A plain reference GEMM behind tests/step/cuda_blas_shim/cblas.h, for building cuda_check on a
// machine without OpenBLAS (the CPU runtime's matmul tiles call it from its OpenMP threads).
// Accumulates in double, so the CPU reference is at least as accurate as OpenBLAS's fp32 GEMM.
#include "tests/step/cuda_blas_shim/cblas.h"

#include <cstdint>

namespace {
template <class T>
void gemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, T alpha, const T* A,
          int lda, const T* B, int ldb, T beta, T* C, int ldc) {
  // Column-major C = op(A)·op(B) is row-major Cᵀ = op(B)ᵀ·op(A)ᵀ: swap the operands.
  if (order == CblasColMajor) {
    gemm(CblasRowMajor, tb, ta, N, M, K, alpha, B, ldb, A, lda, beta, C, ldc);
    return;
  }
  const bool tA = ta != CblasNoTrans, tB = tb != CblasNoTrans;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0;
      for (int k = 0; k < K; ++k) {
        const T a = tA ? A[int64_t(k) * lda + i] : A[int64_t(i) * lda + k];
        const T b = tB ? B[int64_t(j) * ldb + k] : B[int64_t(k) * ldb + j];
        s += double(a) * double(b);
      }
      T& c = C[int64_t(i) * ldc + j];
      c = static_cast<T>(double(alpha) * s + (beta == T(0) ? 0.0 : double(beta) * double(c)));
    }
}
}  // namespace

extern "C" {
void cblas_sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
                 const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  gemm<float>(order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void cblas_dgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, double alpha,
                 const double* A, int lda, const double* B, int ldb, double beta, double* C, int ldc) {
  gemm<double>(order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void openblas_set_num_threads(int) {}
}
