// tests/step/cuda_check, bf16 half: the cases in bf16 on the GPU, and the timed kernels.
#include "tests/step/cuda_check_gpu.cuh"

#include <algorithm>
#include <cstdio>

namespace cuda_check {

std::vector<tally_check::CaseResult> runGpuBf16(rt::Ctx& ctx) {
  Mem m(ctx.stream);
  std::vector<tally_check::CaseResult> r = runCases<rt::bf16>(ctx, m, "bf16");
  // Again with the tensor-core attention forward; its attention results are compared with the
  // same CPU cases under the name "<case> [tc]" (head sizes other than 64/128 stay scalar).
  ctx.attentionTensorCores = true;
  std::vector<tally_check::CaseResult> tc = runCases<rt::bf16>(ctx, m, "bf16");
  ctx.attentionTensorCores = false;
  for (tally_check::CaseResult& c : tc)
    if (c.kernel.rfind("attention", 0) == 0 &&
        (c.kernel.find("hd64") != std::string::npos || c.kernel.find("hd128") != std::string::npos)) {
      c.kernel += " [tc]";
      r.push_back(std::move(c));
    }
  // cuDNN's fused attention (issue 38) on the cases it takes: "<case> [cudnn]".
  for (tally_check::CaseResult& c : runCudnnCases<rt::bf16>(ctx, m, "bf16")) r.push_back(std::move(c));
  return r;
}

/// Median time of `iters` runs of f (after 2 warm-up runs), CUDA events on the context's stream.
template <class F> double medianMs(rt::Ctx& ctx, int iters, F&& f) {
  f();
  f();
  std::vector<float> t;
  cudaEvent_t a, b;
  rt::cu::check(cudaEventCreate(&a), "cudaEventCreate", "bench", "");
  rt::cu::check(cudaEventCreate(&b), "cudaEventCreate", "bench", "");
  for (int i = 0; i < iters; ++i) {
    cudaEventRecord(a, ctx.stream);
    f();
    cudaEventRecord(b, ctx.stream);
    rt::cu::check(cudaEventSynchronize(b), "cudaEventSynchronize", "bench", "");
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

/// Uniform values in [-scale, scale) from Philox stream `stream`: timed kernels read random
/// data, since constant or zero inputs run faster (METHOD.md: a bf16 product 13% faster on
/// zeros on an H200 here).
template <class T> __global__ void randomFillKernel(T* x, int64_t n, uint64_t stream, float scale) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] = T((2.f * rt::philox_uniform(2026, stream, static_cast<uint64_t>(i)) - 1.f) * scale);
}

template <class T> void randomFill(rt::Ctx& ctx, T* x, int64_t n, uint64_t stream, float scale) {
  const int threads = 256;
  randomFillKernel<T><<<static_cast<unsigned>((n + threads - 1) / threads), threads, 0, ctx.stream>>>(x, n, stream, scale);
  rt::cu::check(cudaGetLastError(), "randomFillKernel", "bench", "");
}

std::vector<Bench> runBenchmarks(rt::Ctx& ctx, int iters) {
  using T = rt::bf16;
  std::vector<Bench> out;
  struct MM { const char* name; int64_t M, N, K; };
  // GPT-2's products, then the sweeps that test a GEMM time model by shape (docs/validation.md,
  // "Matmul efficiency by shape"): squares (fixed costs), K at fixed M and N (the output's
  // store against the main loop), few rows (decode, small experts), and the products of
  // Korthikanti et al.'s 175B at tensor 8, micro-batch 1 (the validation runs' shapes).
  const MM mms[] = {{"matmul bf16 16384x2304x768 (qkv)", 16384, 2304, 768},
                    {"matmul bf16 16384x3072x768 (fc)", 16384, 3072, 768},
                    {"matmul bf16 16384x768x3072 (proj)", 16384, 768, 3072},
                    {"matmul bf16 16384x50257x768 (lm head)", 16384, 50257, 768},
                    {"matmul bf16 16384x50304x768 (lm head, padded)", 16384, 50304, 768},
                    {"matmul bf16 512x512x512 (square)", 512, 512, 512},
                    {"matmul bf16 1024x1024x1024 (square)", 1024, 1024, 1024},
                    {"matmul bf16 2048x2048x2048 (square)", 2048, 2048, 2048},
                    {"matmul bf16 4096x4096x4096 (square)", 4096, 4096, 4096},
                    {"matmul bf16 8192x8192x8192 (square)", 8192, 8192, 8192},
                    {"matmul bf16 16384x4096x256 (K sweep)", 16384, 4096, 256},
                    {"matmul bf16 16384x4096x512 (K sweep)", 16384, 4096, 512},
                    {"matmul bf16 16384x4096x1024 (K sweep)", 16384, 4096, 1024},
                    {"matmul bf16 16384x4096x2048 (K sweep)", 16384, 4096, 2048},
                    {"matmul bf16 16384x4096x4096 (K sweep)", 16384, 4096, 4096},
                    {"matmul bf16 16384x4096x8192 (K sweep)", 16384, 4096, 8192},
                    {"matmul bf16 16x4096x4096 (few rows)", 16, 4096, 4096},
                    {"matmul bf16 128x4096x4096 (few rows)", 128, 4096, 4096},
                    {"matmul bf16 512x4096x4096 (few rows)", 512, 4096, 4096},
                    {"matmul bf16 2048x4608x12288 (175B t8 qkv)", 2048, 4608, 12288},
                    {"matmul bf16 2048x12288x1536 (175B t8 proj)", 2048, 12288, 1536},
                    {"matmul bf16 2048x6144x12288 (175B t8 fc)", 2048, 6144, 12288},
                    {"matmul bf16 2048x12288x6144 (175B t8 fc2)", 2048, 12288, 6144}};
  uint64_t stream = 1;
  for (const MM& c : mms) {
    Mem m(ctx.stream); // each product's buffers are freed before the next one's
    T* A = m.zeros<T>(c.M * c.K);
    T* B = m.zeros<T>(c.K * c.N);
    T* C = m.zeros<T>(c.M * c.N);
    randomFill<T>(ctx, A, c.M * c.K, stream++, 1.f);
    randomFill<T>(ctx, B, c.K * c.N, stream++, 1.f);
    const double ms = medianMs(ctx, iters, [&] {
      rt::matmul<T>(ctx, false, false, c.M, c.N, c.K, 1.f, A, c.K, 0, B, c.N, 0, 0.f, C, c.N, 0, 1);
    });
    const double fl = 2.0 * c.M * c.N * c.K;
    out.push_back({c.name, ms, fl / (ms * 1e-3) / 1e12, fl});
  }
  {  // Issue 38 item 4: GPT-2's head as the generated step runs it (the tied embedding [V, D]
     // read transposed, logits [rows, ldc]): V = 50257 with rows of 50257 (unaligned), the same
     // product with the logits' rows padded to 50304 (every leading dimension on 16 bytes, the
     // extent still 50257), and the vocabulary padded to 50304 (zero rows, nanoGPT's).
    struct Head { const char* name; int64_t N, ldc; };
    const Head heads[] = {{"matmul bf16 16384x50257x768 (lm head, tied W^T)", 50257, 50257},
                          {"matmul bf16 16384x50257x768 (lm head, tied W^T, ldc 50304)", 50257, 50304},
                          {"matmul bf16 16384x50304x768 (lm head, tied W^T, padded)", 50304, 50304}};
    const int64_t M = 16384, K = 768;
    Mem m(ctx.stream);
    T* A = m.zeros<T>(M * K);
    T* W = m.zeros<T>(50304 * K);
    T* C = m.zeros<T>(M * 50304);
    randomFill<T>(ctx, A, M * K, stream++, 1.f);
    randomFill<T>(ctx, W, 50304 * K, stream++, 1.f);
    for (const Head& h : heads) {
      const double ms = medianMs(ctx, iters, [&] {
        rt::matmul<T>(ctx, false, true, M, h.N, K, 1.f, A, K, 0, W, K, 0, 0.f, C, h.ldc, 0, 1);
      });
      const double fl = 2.0 * M * h.N * K;
      out.push_back({h.name, ms, fl / (ms * 1e-3) / 1e12, fl});
    }
  }
  Mem m(ctx.stream);
  struct AT { const char* name; int64_t B, S, H, hd; };
  const AT ats[] = {{"attention bf16 causal B16 S1024 H12 hd64 (GPT-2 124M)", 16, 1024, 12, 64},
                    {"attention bf16 causal B16 S1024 H16 hd64 (350M)", 16, 1024, 16, 64},
                    {"attention bf16 causal B4 S2048 H16 hd128", 4, 2048, 16, 128}};
  for (const AT& c : ats) {
    const int64_t n = c.B * c.S * c.H * c.hd;
    T* q = m.zeros<T>(n);
    T* k = m.zeros<T>(n);
    T* v = m.zeros<T>(n);
    T* o = m.zeros<T>(n);
    T* dO = m.zeros<T>(n);
    T* dq = m.zeros<T>(n);
    T* dk = m.zeros<T>(n);
    T* dv = m.zeros<T>(n);
    float* lse = m.zeros<float>(c.B * c.H * c.S);
    randomFill<T>(ctx, q, n, stream++, 1.f);
    randomFill<T>(ctx, k, n, stream++, 1.f);
    randomFill<T>(ctx, v, n, stream++, 1.f);
    randomFill<T>(ctx, dO, n, stream++, 0.01f);
    // Causal attention forward: 2 matmuls of B·H·S²·hd, half of them masked: 2·B·H·S²·hd FLOPs.
    const double fwd = 2.0 * c.B * c.H * double(c.S) * c.S * c.hd;
    const double msF = medianMs(ctx, iters, [&] {
      rt::attention_fwd<T>(ctx, q, k, v, o, lse, nullptr, c.B, c.S, c.S, c.H, c.H, c.hd, 0.f, true, 0.f, 0, 0);
    });
    out.push_back({std::string(c.name) + " fwd", msF, fwd / (msF * 1e-3) / 1e12, fwd});
    ctx.attentionTensorCores = true;
    const double msT = medianMs(ctx, iters, [&] {
      rt::attention_fwd<T>(ctx, q, k, v, o, lse, nullptr, c.B, c.S, c.S, c.H, c.H, c.hd, 0.f, true, 0.f, 0, 0);
    });
    ctx.attentionTensorCores = false;
    out.push_back({std::string(c.name) + " fwd [tc]", msT, fwd / (msT * 1e-3) / 1e12, fwd});
    // Backward counted as 2.5 × forward (5 matmuls against 2; FlashAttention's convention).
    const double msB = medianMs(ctx, iters, [&] {
      rt::attention_bwd<T>(ctx, q, k, v, o, lse, nullptr, dO, dq, dk, dv, c.B, c.S, c.S, c.H, c.H, c.hd, 0.f, true,
                           0.f, 0, 0, false);
    });
    out.push_back({std::string(c.name) + " bwd", msB, 2.5 * fwd / (msB * 1e-3) / 1e12, 2.5 * fwd});
    try {  // cuDNN's fused attention on the same inputs (issue 38); its failure is a line, not the end
      const double msDF = medianMs(ctx, iters, [&] {
        rt::attention_fwd_cudnn<T>(ctx, q, k, v, o, lse, nullptr, c.B, c.S, c.S, c.H, c.H, c.hd, 0.f, true, 0.f, 0, 0);
      });
      out.push_back({std::string(c.name) + " fwd [cudnn]", msDF, fwd / (msDF * 1e-3) / 1e12, fwd});
      const double msDB = medianMs(ctx, iters, [&] {
        rt::attention_bwd_cudnn<T>(ctx, q, k, v, o, lse, nullptr, dO, dq, dk, dv, c.B, c.S, c.S, c.H, c.H, c.hd, 0.f,
                                   true, 0.f, 0, 0, false);
      });
      out.push_back({std::string(c.name) + " bwd [cudnn]", msDB, 2.5 * fwd / (msDB * 1e-3) / 1e12, 2.5 * fwd});
    } catch (const std::exception& e) {
      std::printf("cuDNN attention benchmark %s: %s\n", c.name, e.what());
    }
  }
  return out;
}

}  // namespace cuda_check
