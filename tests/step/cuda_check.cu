// tests/step/cuda_check: the CUDA runtime against the CPU runtime, kernel by kernel, on a GPU.
// Runs every case of cuda_check_cases.h on both runtimes (fp32 and bf16, the same random inputs),
// prints a table (kernel, dtype, output, max abs / rel error, tolerance, pass/fail) and exits 1
// on any failure. Then times attention and matmul at GPT-2 sizes (CUDA events, median of N) and
// prints achieved TFLOP/s. --json FILE writes everything as JSON (scripts/gpu-validate reads it).
//
// Build (one command, from the repository root; scripts/gpu-validate runs exactly this):
//   nvcc -std=c++17 -O2 -arch=sm_90 -I. tests/step/cuda_check.cu tests/step/cuda_instantiate.cu \
//        tests/step/cuda_check_cpu.cpp \
//        -Xcompiler -fopenmp $(pkg-config --cflags --libs openblas) -lcublasLt -o build/cuda_check
// Usage: build/cuda_check [--dtype f32|bf16|all] [--iters N] [--no-bench] [--json FILE]
#include "codegen/runtime/cuda/tally_rt.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

namespace cuda_check {
/// Device memory for the cases: freed with the Mem; download waits for the context's stream.
class Mem {
 public:
  explicit Mem(cudaStream_t s) : stream_(s) {}
  Mem(const Mem&) = delete;
  ~Mem() {
    for (void* p : blocks_) cudaFree(p);
  }
  template <class T> T* upload(const std::vector<T>& v) {
    T* p = zeros<T>(static_cast<int64_t>(v.size()));
    rt::cu::check(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy", "upload", "");
    return p;
  }
  template <class T> T* zeros(int64_t n) {
    void* p = nullptr;
    rt::cu::check(cudaMalloc(&p, static_cast<size_t>(n) * sizeof(T) + 1), "cudaMalloc", "zeros", "");
    rt::cu::check(cudaMemset(p, 0, static_cast<size_t>(n) * sizeof(T) + 1), "cudaMemset", "zeros", "");
    blocks_.push_back(p);
    return static_cast<T*>(p);
  }
  template <class T> std::vector<T> download(const T* p, int64_t n) {
    rt::cu::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", "download", "");
    std::vector<T> v(static_cast<size_t>(n));
    rt::cu::check(cudaMemcpy(v.data(), p, v.size() * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy", "download", "");
    return v;
  }

 private:
  cudaStream_t stream_;
  std::vector<void*> blocks_;
};
}  // namespace cuda_check

#define TALLY_CHECK_NS cuda_check
#include "tests/step/cuda_check_cases.h"

namespace cpu_check {
std::vector<tally_check::CaseResult> runAll(const std::string& dtype);  // cuda_check_cpu.cpp
}

namespace {

struct Row {
  std::string kernel, dtype, output;
  double maxAbs = 0, maxRel = 0, tol = 0;
  bool pass = false;
  std::string note;
};

/// Tolerance, relative to max(1, max |reference|): fp32 1e-4 (3e-4 for attention), bf16 2^-6
/// (a couple of bf16 ulps: both sides compute in fp32 and round once, but sum in another order).
/// Masks, indices and fills are exact.
double tolerance(const std::string& kernel, const std::string& dtype) {
  if (kernel == "dropout_mask" || kernel == "index_fill_scale") return 0.0;
  if (dtype == "bf16") return 1.0 / 64;
  return kernel.rfind("attention", 0) == 0 ? 3e-4 : 1e-4;
}

Row compare(const std::string& kernel, const std::string& dtype, const std::string& name,
            const std::vector<float>& got, const std::vector<float>& ref) {
  Row r{kernel, dtype, name};
  r.tol = tolerance(kernel, dtype);
  if (got.size() != ref.size()) {
    r.note = "size " + std::to_string(got.size()) + " vs " + std::to_string(ref.size());
    return r;
  }
  double scale = 1.0;
  for (float v : ref)
    if (std::isfinite(v)) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  bool ok = true;
  for (size_t i = 0; i < got.size(); ++i) {
    const double a = got[i], b = ref[i];
    if (a == b || (std::isnan(a) && std::isnan(b))) continue;
    if (!std::isfinite(a) || !std::isfinite(b)) {
      ok = false;
      r.maxAbs = INFINITY;
      if (r.note.empty()) r.note = "element " + std::to_string(i) + ": " + std::to_string(a) + " vs " + std::to_string(b);
      continue;
    }
    const double d = std::fabs(a - b);
    r.maxAbs = std::max(r.maxAbs, d);
    r.maxRel = std::max(r.maxRel, d / scale);
    if (d > r.tol * scale) {
      if (ok) r.note = "first at element " + std::to_string(i) + ": " + std::to_string(a) + " vs " + std::to_string(b);
      ok = false;
    }
  }
  r.pass = ok;
  return r;
}

struct Bench {
  std::string name;
  double medianMs = 0, tflops = 0, flops = 0;
};

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
  cuda_check::Mem m(ctx.stream);
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
    // Backward counted as 2.5 × forward (5 matmuls against 2; FlashAttention's convention).
    const double msB = medianMs(ctx, iters, [&] {
      rt::attention_bwd<T>(ctx, q, k, v, o, lse, nullptr, dO, dq, dk, dv, c.B, c.S, c.S, c.H, c.H, c.hd, 0.f, true,
                           0.f, 0, 0, false);
    });
    out.push_back({std::string(c.name) + " bwd", msB, 2.5 * fwd / (msB * 1e-3) / 1e12, 2.5 * fwd});
  }
  return out;
}

std::string jsonEscape(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (c == '"' || c == '\\') r += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    r += c;
  }
  return r;
}

std::string num(double v) {
  if (!std::isfinite(v)) return "null";
  std::ostringstream o;
  o.precision(6);
  o << v;
  return o.str();
}

}  // namespace

int main(int argc, char** argv) {
  std::string dtypeArg = "all", jsonPath;
  int iters = 10;
  bool bench = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dtype" && i + 1 < argc) dtypeArg = argv[++i];
    else if (a == "--iters" && i + 1 < argc) iters = std::max(1, std::atoi(argv[++i]));
    else if (a == "--no-bench") bench = false;
    else if (a == "--json" && i + 1 < argc) jsonPath = argv[++i];
    else {
      std::fprintf(stderr, "usage: cuda_check [--dtype f32|bf16|all] [--iters N] [--no-bench] [--json FILE]\n");
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "cuda_check: no CUDA device\n");
    return 2;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("cuda_check on %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);

  std::vector<std::string> dtypes;
  if (dtypeArg == "all") dtypes = {"f32", "bf16"};
  else dtypes = {dtypeArg};

  std::vector<Row> rows;
  bool allPass = true;
  std::string error;
  try {
    rt::Ctx ctx;
    ctx.init();
    ctx.syncEach = true;  // a failing kernel is named at its launch
    for (const std::string& dt : dtypes) {
      cuda_check::Mem m(ctx.stream);
      std::vector<tally_check::CaseResult> gpu =
          dt == "bf16" ? cuda_check::runCases<rt::bf16>(ctx, m, dt) : cuda_check::runCases<float>(ctx, m, dt);
      std::vector<tally_check::CaseResult> cpu = cpu_check::runAll(dt);
      for (size_t c = 0; c < gpu.size() && c < cpu.size(); ++c)
        for (const auto& kv : cpu[c].out) {
          auto it = gpu[c].out.find(kv.first);
          Row r = it == gpu[c].out.end() ? Row{cpu[c].kernel, dt, kv.first, 0, 0, 0, false, "missing on the GPU"}
                                         : compare(cpu[c].kernel, dt, kv.first, it->second, kv.second);
          allPass = allPass && r.pass;
          rows.push_back(r);
        }
    }
  } catch (const std::exception& e) {
    error = e.what();
    allPass = false;
  }

  std::printf("\n%-40s %-5s %-16s %11s %11s %9s  %s\n", "kernel", "dtype", "output", "max abs", "max rel", "tol",
              "result");
  for (const Row& r : rows)
    std::printf("%-40s %-5s %-16s %11.3e %11.3e %9.2e  %s%s%s\n", r.kernel.c_str(), r.dtype.c_str(), r.output.c_str(),
                r.maxAbs, r.maxRel, r.tol, r.pass ? "pass" : "FAIL", r.note.empty() ? "" : "  ", r.note.c_str());
  if (!error.empty()) std::printf("error: %s\n", error.c_str());
  std::printf("%s: %zu outputs compared\n", allPass ? "all passed" : "FAILURES", rows.size());

  std::vector<Bench> benches;
  if (bench && error.empty()) {
    try {
      rt::Ctx ctx;
      ctx.init();
      benches = runBenchmarks(ctx, iters);
      std::printf("\n%-60s %10s %10s   (median of %d runs)\n", "timed kernel", "ms", "TFLOP/s", iters);
      for (const Bench& b : benches) std::printf("%-60s %10.3f %10.1f\n", b.name.c_str(), b.medianMs, b.tflops);
    } catch (const std::exception& e) {
      std::printf("benchmark error: %s\n", e.what());
      error = error.empty() ? std::string("benchmark: ") + e.what() : error;
    }
  }

  if (!jsonPath.empty()) {
    std::ofstream f(jsonPath);
    f << "{\"device\": \"" << jsonEscape(prop.name) << "\", \"pass\": " << (allPass ? "true" : "false")
      << ", \"error\": \"" << jsonEscape(error) << "\", \"iters\": " << iters << ",\n \"checks\": [\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      f << "  {\"kernel\": \"" << r.kernel << "\", \"dtype\": \"" << r.dtype << "\", \"output\": \"" << r.output
        << "\", \"max_abs\": " << num(r.maxAbs) << ", \"max_rel\": " << num(r.maxRel) << ", \"tol\": " << num(r.tol)
        << ", \"pass\": " << (r.pass ? "true" : "false") << ", \"note\": \"" << jsonEscape(r.note) << "\"}"
        << (i + 1 < rows.size() ? ",\n" : "\n");
    }
    f << " ],\n \"timings\": [\n";
    for (size_t i = 0; i < benches.size(); ++i) {
      const Bench& b = benches[i];
      f << "  {\"name\": \"" << jsonEscape(b.name) << "\", \"median_ms\": " << num(b.medianMs)
        << ", \"flops\": " << num(b.flops) << ", \"tflops\": " << num(b.tflops) << "}"
        << (i + 1 < benches.size() ? ",\n" : "\n");
    }
    f << " ]}\n";
  }
  return allPass ? 0 : 1;
}
