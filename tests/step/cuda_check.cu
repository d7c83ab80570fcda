// tests/step/cuda_check: the CUDA runtime against the CPU runtime, kernel by kernel, on a GPU.
// Runs every case of cuda_check_cases.h on both runtimes (fp32 and bf16, the same random inputs),
// prints a table (kernel, dtype, output, max abs / rel error, tolerance, pass/fail) and exits 1
// on any failure. Then times attention and matmul at GPT-2 sizes (CUDA events, median of N) and
// prints achieved TFLOP/s. --json FILE writes everything as JSON (scripts/gpu-validate reads it).
//
// Build (one command, from the repository root; scripts/gpu-validate runs exactly this):
//   nvcc -std=c++17 -O2 -arch=sm_90 -I. -Xcompiler -fopenmp $(pkg-config --cflags --libs openblas) \
//        tests/step/cuda_check*.cu tests/step/cuda_instantiate.cu tests/step/cuda_check_cpu.cpp \
//        -lcublasLt -lcudnn -o build/cuda_check
// (scripts/gpu-validate compiles the same files as separate objects in parallel, then links.)
// Translation units: cuda_check.cu (this: comparison, table, JSON), cuda_check_f32.cu and
// cuda_check_bf16.cu (the cases on the GPU; bf16 also cuDNN's fused attention, "<case> [cudnn]", and the timings), cuda_instantiate.cu (fp16
// and every copy pair, compiled only), cuda_check_cpu.cpp (the cases on the CPU runtime).
// Usage: build/cuda_check [--dtype f32|bf16|all] [--iters N] [--no-bench] [--json FILE]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include "tests/step/cuda_check_gpu.cuh"

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
      std::vector<tally_check::CaseResult> gpu =
          dt == "bf16" ? cuda_check::runGpuBf16(ctx) : cuda_check::runGpuF32(ctx);
      std::vector<tally_check::CaseResult> cpu = cpu_check::runAll(dt);
      // The reference of "<case> [tc]" and "<case> [cudnn]" is the CPU's "<case>".
      for (const tally_check::CaseResult& g : gpu) {
        std::string ref = g.kernel;
        for (const char* engine : {" [tc]", " [cudnn]"}) {
          const size_t n = std::strlen(engine);
          if (ref.size() > n && ref.compare(ref.size() - n, n, engine) == 0) ref = ref.substr(0, ref.size() - n);
        }
        if (!g.error.empty()) {
          rows.push_back(Row{g.kernel, dt, "-", 0, 0, 0, false, g.error});
          allPass = false;
          continue;
        }
        const tally_check::CaseResult* c = nullptr;
        for (const tally_check::CaseResult& x : cpu)
          if (x.kernel == ref) c = &x;
        if (!c) {
          rows.push_back(Row{g.kernel, dt, "-", 0, 0, 0, false, "no CPU case " + ref});
          allPass = false;
          continue;
        }
        for (const auto& kv : c->out) {
          auto it = g.out.find(kv.first);
          Row r = it == g.out.end() ? Row{g.kernel, dt, kv.first, 0, 0, 0, false, "missing on the GPU"}
                                    : compare(g.kernel, dt, kv.first, it->second, kv.second);
          allPass = allPass && r.pass;
          rows.push_back(r);
        }
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

  std::vector<cuda_check::Bench> benches;
  if (bench && error.empty()) {
    try {
      rt::Ctx ctx;
      ctx.init();
      benches = cuda_check::runBenchmarks(ctx, iters);
      std::printf("\n%-60s %10s %10s   (median of %d runs)\n", "timed kernel", "ms", "TFLOP/s", iters);
      for (const cuda_check::Bench& b : benches) std::printf("%-60s %10.3f %10.1f\n", b.name.c_str(), b.medianMs, b.tflops);
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
      const cuda_check::Bench& b = benches[i];
      f << "  {\"name\": \"" << jsonEscape(b.name) << "\", \"median_ms\": " << num(b.medianMs)
        << ", \"flops\": " << num(b.flops) << ", \"tflops\": " << num(b.tflops) << "}"
        << (i + 1 < benches.size() ? ",\n" : "\n");
    }
    f << " ]}\n";
  }
  return allPass ? 0 : 1;
}
