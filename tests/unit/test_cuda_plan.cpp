// Unit tests of the CUDA runtime's host-side planning (codegen/runtime/cuda/launch.h): grid
// sizes, row-kernel widths, the column-reduction split, attention tile shapes and shared memory,
// argument checks, and the row-major → column-major problem handed to cuBLASLt. Expected numbers
// are worked out by hand in the comments; these run on any machine (no GPU, no CUDA headers).
#include <catch.hpp>

#include "codegen/runtime/cuda/launch.h"

#include <vector>

using namespace rt::cuda_plan;

TEST_CASE("cuda plan: elementwise grids cover n with 256 threads, capped", "[cuda]") {
  CHECK(elementwise(0).blocks == 0);
  CHECK(elementwise(1).blocks == 1);
  CHECK(elementwise(1).threads == 256);
  CHECK(elementwise(256).blocks == 1);
  CHECK(elementwise(257).blocks == 2);
  CHECK(elementwise(1000000000000LL).blocks == 65535LL * 8);  // grid-stride covers the rest
}

TEST_CASE("cuda plan: row kernels use about one thread per 4 columns, 32..1024", "[cuda]") {
  CHECK(rowThreads(1) == 32);
  CHECK(rowThreads(100) == 32);     // ceil(100/4) = 25 → one warp
  CHECK(rowThreads(768) == 192);    // 768/4 = 192, a multiple of 32
  CHECK(rowThreads(1000) == 256);   // 250 → 256
  CHECK(rowThreads(50257) == 1024); // 12565 → capped
}

TEST_CASE("cuda plan: column reduction splits rows into chunks that fit the scratch", "[cuda]") {
  // GPT-2 layer norm: 16384 rows × 768, dw and db: 64 rows per chunk → 256 chunks of 6144 B.
  ColumnReducePlan p = columnReduce(16384, 768, 2, 64LL << 20);
  REQUIRE(p.ok);
  CHECK(p.rowsPerChunk == 64);
  CHECK(p.chunks == 256);
  CHECK(p.scratchBytes == 256 * 768 * 4 * 2);
  // Room for 10 chunks only: rows per chunk doubles 64 → 2048, giving 8 chunks.
  p = columnReduce(16384, 768, 2, 6144 * 10);
  REQUIRE(p.ok);
  CHECK(p.rowsPerChunk == 2048);
  CHECK(p.chunks == 8);
  CHECK(p.scratchBytes == 8 * 6144);
  // Few rows: at least 32 per chunk. 40 rows → 2 chunks.
  p = columnReduce(40, 16, 1, 1 << 20);
  REQUIRE(p.ok);
  CHECK(p.rowsPerChunk == 32);
  CHECK(p.chunks == 2);
  // Not even one chunk fits: reported, never launched.
  CHECK_FALSE(columnReduce(10, 1000, 2, 7999).ok);
  CHECK_FALSE(columnReduce(-1, 10, 1, 1 << 20).ok);
}

TEST_CASE("cuda plan: embedding scratch is four 256-byte aligned int32 arrays", "[cuda]") {
  // vocab 50257: 201028 B → 201216; offsets 201032 → 201216; cursor 201216; rows 16384: 65536.
  CHECK(embeddingScratchBytes(16384, 50257) == 201216 * 3 + 65536);
  CHECK(embeddingScratchBytes(1, 1) == 256 * 4);
}

TEST_CASE("cuda plan: attention tiles for head sizes 64, 128, 256", "[cuda]") {
  AttentionTiles t = attentionTiles(64);
  REQUIRE(t.ok);
  CHECK(t.chunks == 2);
  CHECK(t.warps == 4);
  CHECK(t.rowsPerWarp == 8);
  // fwd: 4·(32·64 + 32·65 + 32·64) = 24704; dQ: 4·(2·32·64 + 2·32·65) = 33024.
  CHECK(t.fwdSharedBytes == 24704);
  CHECK(t.dqSharedBytes == 33024);
  // dK/dV with 4 warps (128 keys): 4·(4·128·65 + 2·32·64 + 2·32) = 149760 ≤ 227 KiB.
  CHECK(t.kvWarps == 4);
  CHECK(t.kvSharedBytes == 149760);

  t = attentionTiles(128);
  REQUIRE(t.ok);
  CHECK(t.chunks == 4);
  CHECK(t.fwdSharedBytes == 4 * (32 * 128 + 32 * 129 + 32 * 128));  // 49280: above 48 KiB, opted in
  // 4 warps would need 4·(4·128·129 + 2·32·128 + 64) = 297216 > 232448; 2 warps: 165120.
  CHECK(t.kvWarps == 2);
  CHECK(t.kvSharedBytes == 165120);

  t = attentionTiles(256);
  REQUIRE(t.ok);
  CHECK(t.chunks == 8);
  CHECK(t.rowsPerWarp == 4);  // 8 chunks · 4 rows = 32 accumulators per lane
  CHECK(t.kvWarps == 1);
  CHECK(t.kvSharedBytes == 4 * (4 * 32 * 257 + 2 * 32 * 256 + 64));

  t = attentionTiles(80);  // not a multiple of 32: lanes hold 3 elements, the last partly idle
  REQUIRE(t.ok);
  CHECK(t.chunks == 3);

  CHECK_FALSE(attentionTiles(0).ok);
  CHECK_FALSE(attentionTiles(257).ok);
  CHECK_FALSE(attentionTiles(257).why.empty());
  CHECK_FALSE(attentionTiles(128, 48 * 1024).ok);  // a device with 48 KiB cannot run hd 128
}

TEST_CASE("cuda plan: tensor-core attention shared memory", "[cuda]") {
  // hd 64: Q, K, V 3·64·72·2 = 27648; S 4·16·68·4 = 17408; P 4·16·72·2 = 9216; O 4·16·68·4 = 17408.
  CHECK(attentionTcShared(64) == 27648 + 17408 + 9216 + 17408);
  // hd 128: 3·64·136·2 = 52224; O 4·16·132·4 = 33792: 112640 bytes, two blocks fit in 227 KiB.
  CHECK(attentionTcShared(128) == 52224 + 17408 + 9216 + 33792);
  CHECK(2 * attentionTcShared(128) <= kMaxSharedBytesSm90);
}

TEST_CASE("cuda plan: argument checks name what is wrong", "[cuda]") {
  CHECK(checkMatmul(false, false, 2, 3, 4, 4, 3, 3, 1).empty());
  CHECK(checkMatmul(true, true, 2, 3, 4, 2, 4, 3, 1).empty());  // A stored [K, M], B stored [N, K]
  CHECK(checkMatmul(false, false, 2, 3, 4, 3, 3, 3, 1).find("lda") != std::string::npos);
  CHECK(checkMatmul(false, true, 2, 3, 4, 4, 3, 3, 1).find("ldb") != std::string::npos);
  CHECK(checkMatmul(false, false, 2, 3, 4, 4, 3, 2, 1).find("ldc") != std::string::npos);
  CHECK(checkMatmul(false, false, -1, 3, 4, 4, 3, 3, 1).find("negative") != std::string::npos);
  CHECK(checkAttention(2, 16, 16, 8, 2, 64).empty());
  CHECK(checkAttention(2, 16, 16, 8, 3, 64).find("multiple") != std::string::npos);
  CHECK(checkAttention(2, 16, 16, 0, 0, 64).find("positive") != std::string::npos);
  CHECK(checkAttention(2, 16, 16, 8, 2, 300).find("head_dim") != std::string::npos);
}

namespace {
// Column-major C[m×n] = op(A)·op(B) as cuBLASLt computes it, from an LtProblem.
std::vector<double> ltGemm(const LtProblem& p, const std::vector<double>& A, const std::vector<double>& B,
                           std::vector<double> C) {
  auto a = [&](int64_t i, int64_t k) { return p.transA ? A[k + i * p.lda] : A[i + k * p.lda]; };
  auto b = [&](int64_t k, int64_t j) { return p.transB ? B[j + k * p.ldb] : B[k + j * p.ldb]; };
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j) {
      double s = 0;
      for (int64_t k = 0; k < p.k; ++k) s += a(i, k) * b(k, j);
      C[i + j * p.ldc] = s;
    }
  return C;
}
}  // namespace

TEST_CASE("cuda plan: the column-major problem computes the row-major product", "[cuda]") {
  // Row-major M=2, N=3, K=4 with padded leading dimensions; every transpose combination.
  const int64_t M = 2, N = 3, K = 4;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      const int64_t lda = (ta ? M : K) + 1, ldb = (tb ? K : N) + 2, ldc = N + 1;
      std::vector<double> A((ta ? K : M) * lda), Bm((tb ? N : K) * ldb), C(M * ldc, 0.0);
      for (size_t i = 0; i < A.size(); ++i) A[i] = double(i % 7) - 3;
      for (size_t i = 0; i < Bm.size(); ++i) Bm[i] = double(i % 5) - 2;
      // The row-major reference: C[i][j] = Σ_k opA[i][k] · opB[k][j].
      std::vector<double> ref(M * ldc, 0.0);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double s = 0;
          for (int64_t k = 0; k < K; ++k)
            s += (ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? Bm[j * ldb + k] : Bm[k * ldb + j]);
          ref[i * ldc + j] = s;
        }
      const LtProblem p = rowMajorToLt(ta, tb, M, N, K, lda, ldb, ldc);
      CHECK(p.m == N);
      CHECK(p.n == M);
      CHECK(p.k == K);
      // Lt's A is our B, Lt's B is our A: the swap that turns C^T = op(B)^T·op(A)^T column-major.
      const std::vector<double> got = ltGemm(p, Bm, A, C);
      CHECK(got == ref);
    }
}
