// The part of the CBLAS interface the CPU runtime uses (cblas_sgemm, cblas_dgemm,
// openblas_set_num_threads), for building tests/step/cuda_check on a GPU machine without
// OpenBLAS: tests/step/cuda_check_build.sh puts this folder on the include path and compiles
// tests/step/cuda_check_blas.cpp, a plain reference GEMM, instead of linking OpenBLAS.
#pragma once

enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112, CblasConjTrans = 113 };

extern "C" {
/// C = alpha·op(A)·op(B) + beta·C (beta = 0: C is not read), as BLAS sgemm.
void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K,
                 float alpha, const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc);
/// The same in fp64.
void cblas_dgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K,
                 double alpha, const double* A, int lda, const double* B, int ldb, double beta, double* C,
                 int ldc);
/// No threads of its own: does nothing.
void openblas_set_num_threads(int n);
}
