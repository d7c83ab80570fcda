// The driver of a generated CUDA training step (the same file for every model; `tally build
// --backend cuda` copies it next to step.cu). It allocates exactly the regions of the step's
// memory plan (kLayout) with one cudaMalloc each, fills the parameters on the host (--init, or
// the CPU driver's default initialisation from the same Philox seeds) and copies them over,
// reads the batch (--data, or random data from the same seeds), runs warm-up and timed steps
// timed with CUDA events (each step, and each kernel through the runtime's event pool), and
// prints the CPU driver's JSON object plus the device's memory: the peak in use
// (cudaMemGetInfo), the CUDA context and the runtime's cuBLASLt/scratch workspace on their own
// lines. Every CUDA call here is checked; the runtime checks its own (the op path in ctx.where).
// The host-side helpers (flags, safetensors, initialisation, data) are copied from driver_cpu.cpp
// with the host copies of the regions in place of the regions: keep the two in step.
#include "cuda/tally_rt.cuh"

#include "common/tally_driver.h"
#include "common/tally_safetensors.h"
#include "driver/tally_step.h"
#include "driver/tally_step_cuda.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

using namespace tally_step;

namespace tally_step {
float *device_scalars = nullptr;
}

namespace {

struct Args {
  int64_t steps = 10, warmup = 2, threads = 0;
  uint64_t seed = 1;
  std::string init, data, save, dumpGrads;
};

[[noreturn]] void usage(const std::string &why) {
  std::fprintf(stderr,
               "tally_step: %s\nusage: tally_step [--steps N] [--warmup W] [--threads T (ignored)] [--seed S]\n"
               "       [--init W.safetensors] [--data D.safetensors] [--save OUT.safetensors]\n"
               "       [--dump-grads G.safetensors]\n",
               why.c_str());
  std::exit(2);
}

int64_t integer(const char *flag, const char *v, int64_t lo) {
  char *end = nullptr;
  errno = 0;
  long long x = std::strtoll(v, &end, 10);
  if (errno || !end || *end || x < lo)
    usage(std::string(flag) + " takes an integer >= " + std::to_string(lo) + ", not '" + v + "'");
  return x;
}

Args parse(int argc, char **argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    if (i + 1 >= argc)
      usage("missing value after " + f);
    const char *v = argv[++i];
    if (f == "--steps")
      a.steps = integer("--steps", v, 1);
    else if (f == "--warmup")
      a.warmup = integer("--warmup", v, 0);
    else if (f == "--threads")
      a.threads = integer("--threads", v, 0);
    else if (f == "--seed")
      a.seed = static_cast<uint64_t>(integer("--seed", v, 0));
    else if (f == "--init")
      a.init = v;
    else if (f == "--data")
      a.data = v;
    else if (f == "--save")
      a.save = v;
    else if (f == "--dump-grads")
      a.dumpGrads = v;
    else
      usage("unknown flag " + f);
  }
  return a;
}

[[noreturn]] void die(const std::string &why) {
  std::fprintf(stderr, "tally_step: error: %s\n", why.c_str());
  std::exit(1);
}

/// Where the driver writes and reads tensors: host copies of the params, master and grads
/// regions (the device regions are filled from them and read back into them).
Memory host;

/// The bytes of a region as allocated: at least 1, rounded up to 256.
size_t regionBytes(int64_t bytes) { return static_cast<size_t>((std::max<int64_t>(bytes, 1) + 255) / 256 * 256); }

uint8_t *hostRegion(int64_t bytes) { return static_cast<uint8_t *>(std::calloc(regionBytes(bytes), 1)); }

/// Every CUDA call of the driver is checked: a failure ends the run naming the call.
void check(cudaError_t e, const char *what) {
  if (e != cudaSuccess)
    die(std::string("CUDA: ") + what + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

/// One region of device memory: one cudaMalloc of the planned bytes (rounded up to 256), zeroed.
uint8_t *deviceRegion(int64_t bytes, const char *name) {
  void *p = nullptr;
  check(cudaMalloc(&p, regionBytes(bytes)), (std::string("cudaMalloc(") + name + ")").c_str());
  check(cudaMemset(p, 0, regionBytes(bytes)), (std::string("cudaMemset(") + name + ")").c_str());
  return static_cast<uint8_t *>(p);
}

size_t dtypeBytes(const std::string &d) {
  if (d == "F32" || d == "I32")
    return 4;
  if (d == "BF16" || d == "F16")
    return 2;
  if (d == "F64" || d == "I64")
    return 8;
  if (d == "U8")
    return 1;
  return 0;
}

/// Element i of a buffer of dtype d as a double (floats and integers).
double loadAs(const std::string &d, const uint8_t *p, int64_t i) {
  if (d == "F32") {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  }
  if (d == "F64") {
    double v;
    std::memcpy(&v, p + 8 * i, 8);
    return v;
  }
  if (d == "BF16" || d == "F16") {
    uint16_t b;
    std::memcpy(&b, p + 2 * i, 2);
    return d == "BF16" ? rt::float_from_bf16_bits(b) : rt::float_from_f16_bits(b);
  }
  if (d == "I32") {
    int32_t v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  }
  if (d == "I64") {
    int64_t v;
    std::memcpy(&v, p + 8 * i, 8);
    return static_cast<double>(v);
  }
  return 0;
}

/// Stores v as element i of a buffer of dtype d (rounding to nearest even for 16-bit floats).
void storeAs(const std::string &d, uint8_t *p, int64_t i, double v) {
  if (d == "F32") {
    float f = static_cast<float>(v);
    std::memcpy(p + 4 * i, &f, 4);
  } else if (d == "BF16") {
    uint16_t b = rt::bf16_bits_from_float(static_cast<float>(v));
    std::memcpy(p + 2 * i, &b, 2);
  } else if (d == "F16") {
    uint16_t b = rt::f16_bits_from_float(static_cast<float>(v));
    std::memcpy(p + 2 * i, &b, 2);
  } else if (d == "I32") {
    int32_t x = static_cast<int32_t>(v);
    std::memcpy(p + 4 * i, &x, 4);
  }
}

std::string shapeText(const int64_t *s, int rank) {
  std::string out = "[";
  for (int i = 0; i < rank; ++i)
    out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

/// normal(0, 1) from two Philox uniforms (Box–Muller), element e of stream `stream`.
double normal(uint64_t seed, uint64_t stream, uint64_t e) {
  double u1 = 1.0 - rt::philox_uniform(seed, stream, 2 * e);
  double u2 = rt::philox_uniform(seed, stream, 2 * e + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

void initParams(const Args &a) {
  std::vector<double> values;
  rt::st::File file;
  if (!a.init.empty())
    file = rt::st::File::read(a.init);
  for (int i = 0; i < kLayout.nparams; ++i) {
    const ParamInfo &p = kLayout.params[i];
    values.assign(static_cast<size_t>(p.t.numel), 0.0);
    if (!a.init.empty()) {
      const rt::st::Entry *e = file.find(p.t.name);
      if (!e)
        die(a.init + " has no tensor " + p.t.name);
      if (e->shape != std::vector<int64_t>(p.t.shape, p.t.shape + p.t.rank))
        die(a.init + ": " + p.t.name + " is " + shapeText(e->shape.data(), static_cast<int>(e->shape.size())) +
            ", the model's is " + shapeText(p.t.shape, p.t.rank));
      if (dtypeBytes(e->dtype) == 0 || e->dtype == "U8")
        die(a.init + ": " + p.t.name + " has dtype " + e->dtype + ", not a float");
      const uint8_t *src = file.data(*e);
      for (int64_t j = 0; j < p.t.numel; ++j)
        values[j] = loadAs(e->dtype, src, j);
    } else {
      for (int64_t j = 0; j < p.t.numel; ++j)
        values[j] = p.init == Init::Normal002 ? 0.02 * normal(a.seed, 1000 + static_cast<uint64_t>(i), j)
                    : p.init == Init::Ones    ? 1.0
                                              : 0.0;
    }
    for (int64_t j = 0; j < p.t.numel; ++j) {
      storeAs(p.t.dtype, host.params + p.offset, j, values[j]);
      if (p.master >= 0)
        storeAs(kLayout.masterDtype, host.master + p.master, j, values[j]);
    }
  }
  if (!a.init.empty())
    for (const std::string &n : file.names()) {
      bool known = false;
      for (int i = 0; i < kLayout.nparams; ++i)
        known = known || n == kLayout.params[i].t.name;
      if (!known && n != "__metadata__")
        die(a.init + " has tensor " + n + ", which is not a parameter of the model");
    }
}

/// Every batch of each input (one unless --data holds several), in the data region's dtype.
std::vector<std::vector<uint8_t>> batchData;
int64_t batches = 1;   ///< batches in batchData; step i trains on batch i mod batches
int64_t currentBatch = 0;

void loadData(const Args &a) {
  rt::st::File file;
  if (!a.data.empty())
    file = rt::st::File::read(a.data);
  batchData.resize(static_cast<size_t>(kLayout.ninputs));
  bool batchesSet = false;
  for (int i = 0; i < kLayout.ninputs; ++i) {
    const InputInfo &in = kLayout.inputs[i];
    int64_t copies = in.batched ? kLayout.microSteps : 1;
    std::vector<int64_t> want(in.t.shape, in.t.shape + in.t.rank);
    if (in.batched)
      want[0] = kLayout.batch;
    size_t eb = dtypeBytes(in.t.dtype);
    std::vector<uint8_t> &out = batchData[i];
    bool isInt = std::string(in.t.dtype) == "I32";
    if (!a.data.empty()) {
      const rt::st::Entry *e = file.find(in.t.name);
      if (!e)
        die(a.data + " has no tensor " + in.t.name);
      // [k × batch, ...]: k batches, step i reading batch i mod k.
      std::vector<int64_t> got = e->shape;
      if (in.batched && !batchesSet && !got.empty() && got[0] > 0 && got[0] % kLayout.batch == 0) {
        batches = got[0] / kLayout.batch;
        batchesSet = true;
      }
      if (in.batched && !got.empty() && got[0] == batches * kLayout.batch)
        got[0] = kLayout.batch;
      if (got != want)
        die(a.data + ": " + in.t.name + " is " + shapeText(e->shape.data(), static_cast<int>(e->shape.size())) +
            ", the plan's batch is " + shapeText(want.data(), static_cast<int>(want.size())) +
            (in.batched ? " (or a whole number of batches, the same number for every input)" : ""));
      copies *= in.batched ? batches : 1;
    }
    int64_t total = in.t.numel * copies;
    out.assign(static_cast<size_t>(total) * eb, 0);
    if (!a.data.empty()) {
      const rt::st::Entry *e = file.find(in.t.name);
      bool fileInt = e->dtype == "I32" || e->dtype == "I64";
      if (fileInt != isInt)
        die(a.data + ": " + in.t.name + " has dtype " + e->dtype + ", the model's input is " + in.t.dtype);
      const uint8_t *src = file.data(*e);
      for (int64_t j = 0; j < total; ++j) {
        double v = loadAs(e->dtype, src, j);
        if (isInt && (v < -1 || v >= static_cast<double>(in.vocab) * 1e9))
          die(a.data + ": " + in.t.name + " holds " + std::to_string(v));
        storeAs(in.t.dtype, out.data(), j, v);
      }
    } else {
      for (int64_t j = 0; j < total; ++j) {
        double v = isInt ? std::floor(rt::philox_uniform(a.seed, 2000 + static_cast<uint64_t>(i), j) *
                                      static_cast<double>(in.vocab))
                         : normal(a.seed, 3000 + static_cast<uint64_t>(i), j);
        storeAs(in.t.dtype, out.data(), j, v);
      }
    }
  }
}

void loadMicroBatch(int64_t m) {
  for (int i = 0; i < kLayout.ninputs; ++i) {
    const InputInfo &in = kLayout.inputs[i];
    size_t bytes = static_cast<size_t>(in.t.numel) * dtypeBytes(in.t.dtype);
    size_t from = in.batched ? static_cast<size_t>(currentBatch * kLayout.microSteps + m) * bytes : 0;
    check(cudaMemcpy(mem.data + in.offset, batchData[i].data() + from, bytes, cudaMemcpyHostToDevice),
          "cudaMemcpy(data)");
  }
}

/// Writes every parameter (or its gradient) as F32 into a safetensors file.
void writeTensors(const std::string &path, bool grads) {
  rt::st::Writer w;
  std::vector<std::vector<float>> keep;
  for (int i = 0; i < kLayout.nparams; ++i) {
    const ParamInfo &p = kLayout.params[i];
    if (grads && p.grad < 0)
      continue;
    std::vector<float> v(static_cast<size_t>(p.t.numel));
    for (int64_t j = 0; j < p.t.numel; ++j) {
      double x = grads        ? loadAs(kLayout.gradsDtype, host.grads + p.grad, j) / kLayout.lossScale
                 : p.master >= 0 ? loadAs(kLayout.masterDtype, host.master + p.master, j)
                                 : loadAs(p.t.dtype, host.params + p.offset, j);
      v[j] = static_cast<float>(x);
    }
    keep.push_back(std::move(v));
    w.add(p.t.name, "F32", std::vector<int64_t>(p.t.shape, p.t.shape + p.t.rank), keep.back().data(),
          keep.back().size() * sizeof(float));
  }
  w.write(path);
}

/// Kernel milliseconds and calls by (op class, kernel), summed over the timed steps.
std::map<std::pair<std::string, std::string>, std::pair<int64_t, double>> profile;
std::map<std::string, std::string> classOfPath;

void record(const std::vector<rt::cu::KernelTime> &times) {
  for (const rt::cu::KernelTime &t : times) {
    auto c = classOfPath.find(t.where);
    auto &e = profile[{c == classOfPath.end() ? std::string("other") : c->second, t.kernel}];
    e.first += 1;
    e.second += t.ms / 1000.0;
  }
}

int64_t peakResidentBytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream is(line.substr(6));
      int64_t kb = 0;
      is >> kb;
      return kb * 1024;
    }
  return -1;
}

std::string num(double v) {
  if (!std::isfinite(v))
    return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

Args args;

/// Device memory in use now (total - free, every process on the device); the least free seen.
size_t deviceTotal = 0, leastFree = SIZE_MAX;
size_t deviceUsed() {
  size_t freeBytes = 0, total = 0;
  check(cudaMemGetInfo(&freeBytes, &total), "cudaMemGetInfo");
  deviceTotal = total;
  leastFree = std::min(leastFree, freeBytes);
  return total - freeBytes;
}

void download(uint8_t *dst, const uint8_t *src, int64_t bytes, const char *what) {
  if (bytes > 0)
    check(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost), what);
}

void dumpGradients() {
  if (args.dumpGrads.empty())
    return;
  download(host.grads, mem.grads, kLayout.gradsBytes, "cudaMemcpy(grads to host)");
  writeTensors(args.dumpGrads, true);
}

} // namespace

int main(int argc, char **argv) {
  args = parse(argc, argv);
  int devices = 0;
  cudaError_t probe = cudaGetDeviceCount(&devices);
  if (probe != cudaSuccess || devices == 0)
    die(std::string("no CUDA device found (cudaGetDeviceCount: ") +
        (probe != cudaSuccess ? std::string(cudaGetErrorName(probe)) + ": " + cudaGetErrorString(probe)
                              : std::string("0 devices")) +
        "); the CUDA step needs an NVIDIA GPU");
  try {
    check(cudaSetDevice(0), "cudaSetDevice(0)");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    check(cudaFree(nullptr), "cudaFree(nullptr) (creating the context)");
    const size_t contextBytes = deviceUsed(); // the context, and whatever other processes hold

    mem.arena = deviceRegion(kLayout.arenaBytes, "arena");
    mem.params = deviceRegion(kLayout.paramsBytes, "params");
    mem.grads = deviceRegion(kLayout.gradsBytes, "grads");
    mem.master = deviceRegion(kLayout.masterBytes, "master");
    mem.optimizer = deviceRegion(kLayout.optimizerBytes, "optimizer");
    mem.data = deviceRegion(kLayout.dataBytes, "data");
    check(cudaMalloc(reinterpret_cast<void **>(&device_scalars), 256), "cudaMalloc(scalars)");
    host.params = hostRegion(kLayout.paramsBytes);
    host.master = hostRegion(kLayout.masterBytes);
    host.grads = hostRegion(kLayout.gradsBytes);
    if (!host.params || !host.master || !host.grads)
      die("cannot allocate the host copies of the regions");
    initParams(args);
    check(cudaMemcpy(mem.params, host.params, regionBytes(kLayout.paramsBytes), cudaMemcpyHostToDevice),
          "cudaMemcpy(params)");
    check(cudaMemcpy(mem.master, host.master, regionBytes(kLayout.masterBytes), cudaMemcpyHostToDevice),
          "cudaMemcpy(master)");
    loadData(args);
    for (int i = 0; i < kNumOpSites; ++i)
      classOfPath[kOpSites[i].path] = kOpSites[i].op_class;

    rt::Ctx ctx;
    ctx.init();
    deviceUsed();
    cudaEvent_t start = nullptr, stop = nullptr;
    check(cudaEventCreate(&start), "cudaEventCreate");
    check(cudaEventCreate(&stop), "cudaEventCreate");

    std::vector<double> losses, times;
    int64_t skipped = 0, total = args.warmup + args.steps;
    for (int64_t i = 0; i < total; ++i) {
      const bool timed = i >= args.warmup;
      ctx.timing = timed;
      ctx.resetTimes();
      currentBatch = i % batches;
      bool last = i + 1 == total, updated = true;
      uint64_t seed = (args.seed << 32) + static_cast<uint64_t>(i * kLayout.microSteps);
      check(cudaEventRecord(start, ctx.stream), "cudaEventRecord(step start)");
      double loss = train_step(ctx, i + 1, seed, loadMicroBatch, last ? dumpGradients : nullptr, &updated);
      check(cudaEventRecord(stop, ctx.stream), "cudaEventRecord(step stop)");
      check(cudaEventSynchronize(stop), "cudaEventSynchronize(step stop)");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime(step)");
      losses.push_back(loss);
      if (timed) {
        times.push_back(ms / 1000.0);
        record(ctx.collectTimes());
      }
      skipped += updated ? 0 : 1;
      deviceUsed();
    }
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    if (!args.save.empty()) {
      download(host.params, mem.params, kLayout.paramsBytes, "cudaMemcpy(params to host)");
      download(host.master, mem.master, kLayout.masterBytes, "cudaMemcpy(master to host)");
      writeTensors(args.save, false);
    }
    const size_t workspace = ctx.workspaceBytes;
    check(cudaEventDestroy(start), "cudaEventDestroy");
    check(cudaEventDestroy(stop), "cudaEventDestroy");

    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    size_t h = sorted.size() / 2;
    double median = sorted.size() % 2 ? sorted[h] : (sorted[h - 1] + sorted[h]) / 2;
    std::string out = "{\n  \"backend\": \"cuda\",\n";
    out += "  \"model\": \"" + rt::json_escape(kLayout.model) + "\",\n";
    out += "  \"plan\": \"" + rt::json_escape(kLayout.plan) + "\",\n";
    out += "  \"device\": \"" + rt::json_escape(prop.name) + "\",\n";
    out += "  \"steps\": " + std::to_string(args.steps) + ",\n  \"warmup\": " + std::to_string(args.warmup) + ",\n";
    out += "  \"step_s\": " + num(median) + ",\n  \"step_times\": [";
    for (size_t i = 0; i < times.size(); ++i)
      out += (i ? ", " : "") + num(times[i]);
    out += "],\n  \"arena_bytes\": " + std::to_string(kLayout.arenaBytes) + ",\n";
    out += "  \"regions\": {\"params\": " + std::to_string(kLayout.paramsBytes) + ", \"grads\": " +
           std::to_string(kLayout.gradsBytes) + ", \"master\": " + std::to_string(kLayout.masterBytes) +
           ", \"optimizer\": " + std::to_string(kLayout.optimizerBytes) + ", \"data\": " + std::to_string(kLayout.dataBytes) +
           "},\n";
    out += "  \"peak_bytes\": " + std::to_string(deviceTotal - leastFree) + ",\n";
    out += "  \"device_total_bytes\": " + std::to_string(deviceTotal) + ",\n";
    out += "  \"context_bytes\": " + std::to_string(contextBytes) + ",\n";
    out += "  \"workspace_bytes\": " + std::to_string(workspace) + ",\n";
    out += "  \"host_peak_bytes\": " + std::to_string(peakResidentBytes()) + ",\n";
    out += "  \"model_flops\": " + num(kLayout.modelFlops) + ",\n";
    out += "  \"skipped_steps\": " + std::to_string(skipped) + ",\n  \"kernels\": [";
    bool first = true;
    for (const auto &[key, v] : profile) {
      out += std::string(first ? "\n" : ",\n") + "    {\"name\": \"" + rt::json_escape(key.second) +
             "\", \"op_class\": \"" + rt::json_escape(key.first) + "\", \"calls\": " + std::to_string(v.first) +
             ", \"total_s\": " + num(v.second) + "}";
      first = false;
    }
    out += "\n  ],\n  \"loss\": [";
    for (size_t i = 0; i < losses.size(); ++i)
      out += (i ? ", " : "") + num(losses[i]);
    out += "]\n}\n";
    std::fputs(out.c_str(), stdout);
    return 0;
  } catch (const std::exception &e) {
    die(e.what());
  }
}
