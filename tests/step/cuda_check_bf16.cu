// tests/step/cuda_check, bf16 half: the cases in bf16 on the GPU, and the timed kernels.
#include "tests/step/cuda_check_gpu.cuh"

#include <algorithm>

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

std::vector<Bench> runBenchmarks(rt::Ctx& ctx, int iters) {
  using T = rt::bf16;
  std::vector<Bench> out;
  Mem m(ctx.stream);
  struct MM { const char* name; int64_t M, N, K; };
  const MM mms[] = {{"matmul bf16 16384x2304x768 (qkv)", 16384, 2304, 768},
                    {"matmul bf16 16384x3072x768 (fc)", 16384, 3072, 768},
                    {"matmul bf16 16384x768x3072 (proj)", 16384, 768, 3072},
                    {"matmul bf16 16384x50257x768 (lm head)", 16384, 50257, 768}};
  for (const MM& c : mms) {
    T* A = m.zeros<T>(c.M * c.K);
    T* B = m.zeros<T>(c.K * c.N);
    T* C = m.zeros<T>(c.M * c.N);
    rt::fill<T>(ctx, A, 0.01f, c.M * c.K);
    rt::fill<T>(ctx, B, 0.02f, c.K * c.N);
    const double ms = medianMs(ctx, iters, [&] {
      rt::matmul<T>(ctx, false, false, c.M, c.N, c.K, 1.f, A, c.K, 0, B, c.N, 0, 0.f, C, c.N, 0, 1);
    });
    const double fl = 2.0 * c.M * c.N * c.K;
    out.push_back({c.name, ms, fl / (ms * 1e-3) / 1e12, fl});
  }
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
    rt::fill<T>(ctx, q, 0.1f, n);
    rt::fill<T>(ctx, k, 0.2f, n);
    rt::fill<T>(ctx, v, 0.3f, n);
    rt::fill<T>(ctx, dO, 0.01f, n);
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
  }
  return out;
}

}  // namespace cuda_check
