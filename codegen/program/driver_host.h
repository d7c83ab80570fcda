// Host-side helpers shared by the drivers of generated steps (driver_cpu.cpp and
// driver_cuda.cu): flags, the safetensors dtypes, parameter initialisation (--init or the
// default from Philox seeds), the batches (--data or random data from the same seeds), writing
// parameters and gradients, peak resident memory and JSON numbers. Each driver includes it
// once, after the runtime header and tally_step.h; the regions these helpers read and write
// are passed in (the CPU driver's own regions, the CUDA driver's host copies).
#pragma once

#include "common/tally_driver.h"
#include "common/tally_init.h"
#include "common/tally_safetensors.h"
#include "driver/driver_args.h"
#include "driver/tally_step.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef __CUDACC__
#define kThreadsNote " (ignored)"
#else
#define kThreadsNote ""
#endif

namespace tally_step {
namespace {

/// --allow-nonfinite: train on through a NaN or infinite loss and write non-finite weights.
bool allowNonfinite = false;

[[noreturn]] void usage(const std::string &why) {
  std::fprintf(stderr,
               "tally_step: %s\nusage: tally_step [--steps N] [--warmup W] [--threads T" kThreadsNote "] [--seed S]\n"
               "       [--init W.safetensors] [--data D.safetensors] [--save OUT.safetensors]\n"
               "       [--dump-grads G.safetensors] [--trace T.json] [--allow-nonfinite] [--no-graph]\n",
               why.c_str());
  std::exit(2);
}

/// The command line (driver_args.h), or the usage message and exit 2.
Args parse(int argc, char **argv) {
  try {
    Args a = parseArgs(argc, argv);
    allowNonfinite = a.allowNonfinite;
    return a;
  } catch (const ArgsError &e) {
    usage(e.what());
  }
}

[[noreturn]] void die(const std::string &why) {
  std::fprintf(stderr, "tally_step: error: %s\n", why.c_str());
  std::exit(1);
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
double normal(uint64_t seed, uint64_t stream, uint64_t e) { return rt::philox_normal(seed, stream, e); }

bool isFloatDtype(const std::string &d) { return d == "F32" || d == "F64" || d == "BF16" || d == "F16"; }
bool isIntDtype(const std::string &d) { return d == "I32" || d == "I64"; }

/// "[1, 2, 3]": the index of flat element j of a tensor of `shape` (messages).
std::string indexText(const std::vector<int64_t> &shape, int64_t j) {
  std::vector<int64_t> idx(shape.size(), 0);
  for (size_t k = shape.size(); k-- > 0;) {
    if (shape[k] > 0) {
      idx[k] = j % shape[k];
      j /= shape[k];
    }
  }
  return shapeText(idx.data(), static_cast<int>(idx.size()));
}

/// The entry `name` of `file` (read from `path`, the value of `flag`), checked against the
/// model before any of its data is read: present, of the shape `want` and of a dtype of the
/// right kind (a float for float tensors, I32 or I64 for integer ones). Dies naming the tensor.
const rt::st::Entry &checkedEntry(const rt::st::File &file, const std::string &path, const char *name,
                                  const std::vector<int64_t> &want, const std::string &modelDtype, const char *what,
                                  const std::string &shapeHint) {
  const rt::st::Entry *e = file.find(name);
  if (!e)
    die(path + " has no tensor " + name);
  if (e->shape != want)
    die(path + ": " + name + " is " + shapeText(e->shape.data(), static_cast<int>(e->shape.size())) + ", the " + what +
        " is " + shapeText(want.data(), static_cast<int>(want.size())) + shapeHint);
  bool wantInt = modelDtype == "I32";
  if (wantInt ? !isIntDtype(e->dtype) : !isFloatDtype(e->dtype))
    die(path + ": " + name + " has dtype " + e->dtype + ", but the model's " +
        (std::string(what) == "model's" ? "parameter" : "input") + " is " +
        modelDtype + (wantInt ? " (integer ids: give I32 or I64)" : " (a float: give F32, F64, BF16 or F16)"));
  return *e;
}

/// Reads a checked entry's values as doubles, dying on a NaN or infinity (naming the tensor
/// and the element) and on integer values outside int32.
[[noreturn]] void dieNonfinite(const std::string &path, const char *name, const rt::st::Entry &e, int64_t j, double v) {
  die(path + ": " + name + " holds " + (std::isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf") + " at index " +
      indexText(e.shape, j) + " (element " + std::to_string(j) + "): the step trains on finite values only");
}

std::vector<double> checkedValues(const rt::st::File &file, const rt::st::Entry &e, const std::string &path,
                                  const char *name) {
  std::vector<uint8_t> raw = file.bytes(e);
  int64_t n = static_cast<int64_t>(raw.size() / dtypeBytes(e.dtype));
  std::vector<double> out(static_cast<size_t>(n));
  bool isInt = isIntDtype(e.dtype);
  for (int64_t j = 0; j < n; ++j) {
    double v = loadAs(e.dtype, raw.data(), j);
    if (!std::isfinite(v))
      dieNonfinite(path, name, e, j, v);
    if (isInt && (v < -2147483648.0 || v > 2147483647.0))
      die(path + ": " + name + " holds " + std::to_string(static_cast<int64_t>(v)) + " at index " +
          indexText(e.shape, j) + ", outside the 32-bit ids the step reads");
    out[static_cast<size_t>(j)] = v;
  }
  return out;
}

/// Stores v as element j of a region of dtype d, dying when a finite value overflows it (a
/// float beyond a 16-bit type's range).
[[noreturn]] void dieOutOfRange(const std::string &path, const char *name, int64_t j, double v, const std::string &d) {
  die(path + ": " + name + " element " + std::to_string(j) + " is " + std::to_string(v) + ", beyond the range of " +
      d + ", the model's dtype");
}

void storeChecked(const std::string &d, uint8_t *p, int64_t j, double v, const std::string &path, const char *name) {
  storeAs(d, p, j, v);
  if (std::isfinite(v) && !std::isfinite(loadAs(d, p, j)))
    dieOutOfRange(path, name, j, v, d);
}

/// --init's values of parameter p (entry e, its shape and float dtype checked) into its params
/// slot and fp32 master: the tensor is read once (straight into the region when its dtype is the
/// model's), then decoded, checked and stored in parallel chunks with one dtype dispatch per
/// chunk, not per element. The values and the errors are those of checkedValues + storeChecked
/// element by element: the tensor's first non-finite value, else its first value beyond the
/// model dtype's range (each chunk finds its first; the lowest index wins). False, writing
/// nothing, for a model dtype other than F32/BF16/F16 or a master other than F32.
bool initFromFile(const Args &a, const rt::st::File &file, const rt::st::Entry &e, const ParamInfo &p, Memory &into) {
  const std::string dt = p.t.dtype, src = e.dtype;
  const bool f32 = dt == "F32", bf16 = dt == "BF16", f16 = dt == "F16";
  if ((!f32 && !bf16 && !f16) || (p.master >= 0 && std::string(kLayout.masterDtype) != "F32") || !isFloatDtype(src))
    return false;
  const int64_t n = p.t.numel, kChunk = 4096;
  uint8_t *params = into.params + p.offset;
  float *master = p.master >= 0 ? reinterpret_cast<float *>(into.master + p.master) : nullptr;
  const bool same = src == dt;
  std::vector<uint8_t> raw;
  if (same)
    file.read_into(e, params);
  else
    raw = file.bytes(e);
  const uint8_t *in = same ? params : raw.data();
  const int kind = src == "F32" ? 0 : src == "F64" ? 1 : src == "BF16" ? 2 : 3;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<int64_t> nonfinite(static_cast<size_t>(chunks), n), outOfRange(static_cast<size_t>(chunks), n);
#ifdef _OPENMP
  const int threads = a.threads > 0 ? static_cast<int>(a.threads) : omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(threads) if (n > kChunk)
#endif
  for (int64_t k = 0; k < chunks; ++k) {
    double v[kChunk];
    const int64_t c = k * kChunk, len = std::min(kChunk, n - c);
    if (kind == 1) {
      std::memcpy(v, in + 8 * c, static_cast<size_t>(len) * 8);
    } else if (kind == 0) {
      for (int64_t j = 0; j < len; ++j) {
        float f;
        std::memcpy(&f, in + 4 * (c + j), 4);
        v[j] = f;
      }
    } else {
      for (int64_t j = 0; j < len; ++j) {
        uint16_t b;
        std::memcpy(&b, in + 2 * (c + j), 2);
        v[j] = kind == 2 ? rt::float_from_bf16_bits(b) : rt::float_from_f16_bits(b);
      }
    }
    int64_t bad = len;
    for (int64_t j = 0; j < len; ++j)
      bad = std::isfinite(v[j]) || bad < len ? bad : j;
    if (bad < len) {
      nonfinite[static_cast<size_t>(k)] = c + bad;
      continue;
    }
    if (!same) {
      int64_t range = len;
      for (int64_t j = 0; j < len; ++j) {
        const float f = static_cast<float>(v[j]);
        bool inf;
        if (f32) {
          std::memcpy(params + 4 * (c + j), &f, 4);
          inf = !std::isfinite(f);
        } else {
          const uint16_t b = bf16 ? rt::bf16_bits_from_float(f) : rt::f16_bits_from_float(f);
          std::memcpy(params + 2 * (c + j), &b, 2);
          inf = bf16 ? (b & 0x7f80) == 0x7f80 : (b & 0x7c00) == 0x7c00;
        }
        range = inf && range == len ? j : range;
      }
      if (range < len)
        outOfRange[static_cast<size_t>(k)] = c + range;
    }
    if (master)
      for (int64_t j = 0; j < len; ++j)
        master[c + j] = static_cast<float>(v[j]);
  }
  const int64_t firstNonfinite = *std::min_element(nonfinite.begin(), nonfinite.end());
  if (firstNonfinite < n)
    dieNonfinite(a.init, p.t.name, e, firstNonfinite, loadAs(src, in, firstNonfinite));
  const int64_t firstOut = *std::min_element(outOfRange.begin(), outOfRange.end());
  if (firstOut < n)
    dieOutOfRange(a.init, p.t.name, firstOut, loadAs(src, in, firstOut), dt);
  return true;
}

/// The default normal(0, 0.02) initialisation of parameter p, in parallel chunks of floats from
/// rt::philox_normal_floats (bit for bit the values 0.02 · normal(seed, 1000 + index, j) rounded
/// to float, which is what storeAs wrote one element at a time): false, writing nothing, for a
/// dtype it does not handle (then the caller stores element by element).
bool normalFast(const Args &a, const ParamInfo &p, int index, Memory &into) {
  const std::string dt = p.t.dtype;
  const bool f32 = dt == "F32", bf16 = dt == "BF16", f16 = dt == "F16";
  if ((!f32 && !bf16 && !f16) || (p.master >= 0 && std::string(kLayout.masterDtype) != "F32"))
    return false;
  const uint64_t stream = 1000 + static_cast<uint64_t>(index);
  const int64_t n = p.t.numel, kChunk = 8192;
  uint8_t *params = into.params + p.offset;
  float *master = p.master >= 0 ? reinterpret_cast<float *>(into.master + p.master) : nullptr;
  const uint64_t seed = a.seed;
#ifdef _OPENMP
  const int threads = a.threads > 0 ? static_cast<int>(a.threads) : omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(threads) if (n > kChunk)
#endif
  for (int64_t c = 0; c < n; c += kChunk) {
    float buf[kChunk];
    const int64_t len = std::min(kChunk, n - c);
    rt::philox_normal_floats(seed, stream, static_cast<uint64_t>(c), len, 0.02, buf);
    if (f32) {
      std::memcpy(params + 4 * c, buf, static_cast<size_t>(len) * 4);
    } else {
      uint16_t *out = reinterpret_cast<uint16_t *>(params) + c;
      for (int64_t j = 0; j < len; ++j)
        out[j] = bf16 ? rt::bf16_bits_from_float(buf[j]) : rt::f16_bits_from_float(buf[j]);
    }
    if (master)
      std::memcpy(master + c, buf, static_cast<size_t>(len) * 4);
  }
  return true;
}

/// Fills the params (and master) regions of `into` from --init or the default initialisation.
/// With --init every tensor of the file is checked against the model (names, shapes, dtypes)
/// before any data is read. `table`: the parameters' offsets (kLayout's, or a whole model's
/// under ZeRO 2 and 3: WholeModel).
void initParams(const Args &a, Memory &into, const ParamInfo *table = kLayout.params) {
  std::vector<double> values;
  rt::st::File file;
  std::vector<const rt::st::Entry *> entries(static_cast<size_t>(kLayout.nparams), nullptr);
  if (!a.init.empty()) {
    file = rt::st::File::read(a.init);
    for (const std::string &n : file.names()) {
      bool known = false;
      for (int i = 0; i < kLayout.nparams; ++i)
        known = known || n == kLayout.params[i].t.name;
      if (!known)
        die(a.init + " has tensor " + n + ", which is not a parameter of the model");
    }
    for (int i = 0; i < kLayout.nparams; ++i) {
      const ParamInfo &p = kLayout.params[i];
      entries[i] = &checkedEntry(file, a.init, p.t.name, std::vector<int64_t>(p.t.shape, p.t.shape + p.t.rank),
                                 p.t.dtype, "model's", "");
    }
  }
  for (int i = 0; i < kLayout.nparams; ++i) {
    const ParamInfo &p = table[i];
    if (entries[i] && initFromFile(a, file, *entries[i], p, into)) {
      continue;
    } else if (entries[i]) {
      values = checkedValues(file, *entries[i], a.init, p.t.name);
    } else if (p.init == Init::Normal002 && normalFast(a, p, i, into)) {
      continue;
    } else {
      values.assign(static_cast<size_t>(p.t.numel), 0.0);
      for (int64_t j = 0; j < p.t.numel; ++j)
        values[j] = p.init == Init::Normal002 ? 0.02 * normal(a.seed, 1000 + static_cast<uint64_t>(i), j)
                    : p.init == Init::Ones    ? 1.0
                                              : 0.0;
    }
    for (int64_t j = 0; j < p.t.numel; ++j) {
      storeChecked(p.t.dtype, into.params + p.offset, j, values[j], a.init, p.t.name);
      if (p.master >= 0)
        storeAs(kLayout.masterDtype, into.master + p.master, j, values[j]);
    }
  }
}

/// Every batch of each input (one unless --data holds several), in the data region's dtype.
std::vector<std::vector<uint8_t>> batchData;
int64_t batches = 1;   ///< batches in batchData; step i trains on batch i mod batches
int64_t currentBatch = 0;

/// --data: every input's entry, checked against the plan before any data is read. A batched
/// input is [k × batch, ...]: k batches, step i reading batch i mod k, with the same k for
/// every batched input (the first one's).
std::vector<const rt::st::Entry *> checkedData(const rt::st::File &file, const std::string &path) {
  std::vector<const rt::st::Entry *> entries(static_cast<size_t>(kLayout.ninputs), nullptr);
  bool batchesSet = false;
  for (const std::string &n : file.names()) {
    bool known = false;
    for (int i = 0; i < kLayout.ninputs; ++i)
      known = known || n == kLayout.inputs[i].t.name;
    if (!known)
      die(path + " has tensor " + n + ", which is not an input of the model");
  }
  for (int i = 0; i < kLayout.ninputs; ++i) {
    const InputInfo &in = kLayout.inputs[i];
    std::vector<int64_t> want(in.t.shape, in.t.shape + in.t.rank);
    if (in.batched) {
      const rt::st::Entry *e = file.find(in.t.name);
      if (!batchesSet && e && !e->shape.empty() && e->shape[0] > 0 && e->shape[0] % kLayout.batch == 0) {
        batches = e->shape[0] / kLayout.batch;
        batchesSet = true;
      }
      want[0] = batches * kLayout.batch;
    }
    std::string hint = in.batched ? " (" + std::to_string(batches) + " batch" + (batches == 1 ? "" : "es") + " of " +
                                        std::to_string(kLayout.batch) +
                                        " rows: every batched input holds the same whole number of batches)"
                                  : "";
    entries[i] = &checkedEntry(file, path, in.t.name, want, in.t.dtype, "plan's batch", hint);
  }
  return entries;
}

void loadData(const Args &a) {
  rt::st::File file;
  std::vector<const rt::st::Entry *> entries;
  if (!a.data.empty()) {
    file = rt::st::File::read(a.data);
    entries = checkedData(file, a.data);
  }
  batchData.resize(static_cast<size_t>(kLayout.ninputs));
  for (int i = 0; i < kLayout.ninputs; ++i) {
    const InputInfo &in = kLayout.inputs[i];
    int64_t copies = in.batched ? kLayout.batch / kLayout.microBatch : 1; // every rank's micro-batches
    if (!a.data.empty() && in.batched)
      copies *= batches;
    size_t eb = dtypeBytes(in.t.dtype);
    std::vector<uint8_t> &out = batchData[i];
    bool isInt = std::string(in.t.dtype) == "I32";
    int64_t total = in.t.numel * copies;
    out.assign(static_cast<size_t>(total) * eb, 0);
    if (!a.data.empty()) {
      std::vector<double> values = checkedValues(file, *entries[i], a.data, in.t.name);
      if (static_cast<int64_t>(values.size()) != total)
        die(a.data + ": " + in.t.name + " holds " + std::to_string(values.size()) + " values, the plan reads " +
            std::to_string(total));
      for (int64_t j = 0; j < total; ++j)
        storeChecked(in.t.dtype, out.data(), j, values[j], a.data, in.t.name);
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

/// Why the run stops at a non-finite loss (step is 1-based).
std::string nonfiniteLoss(int64_t step, double loss) {
  return "step " + std::to_string(step) + ": the loss is " + (std::isnan(loss) ? "NaN" : "infinite") +
         "; stopping without writing --save or --dump-grads (the weights, the data or the learning rate "
         "diverged; --allow-nonfinite trains on)";
}

/// The first of `n` gradients of the grads region's dtype at `g` that is NaN or infinite (its
/// exponent bits all ones), or -1: the driver's check before each update (issue 43). Bit tests,
/// no float arithmetic, over the OpenMP threads when n is large.
int64_t firstNonfiniteGradient(const uint8_t *g, int64_t n) {
  const std::string d = kLayout.gradsDtype;
  int64_t first = n;
  if (d == "F32") {
#pragma omp parallel for reduction(min : first) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) {
      uint32_t b;
      std::memcpy(&b, g + 4 * i, 4);
      if ((b & 0x7F800000u) == 0x7F800000u && i < first)
        first = i;
    }
  } else { // BF16 or F16
    const uint16_t mask = d == "BF16" ? 0x7F80 : 0x7C00;
#pragma omp parallel for reduction(min : first) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) {
      uint16_t b;
      std::memcpy(&b, g + 2 * i, 2);
      if ((b & mask) == mask && i < first)
        first = i;
    }
  }
  return first < n ? first : -1;
}

/// Which gradient element `i` of the grads region (laid out as kLayout.params says: one rank
/// holding every gradient whole) is and what it holds, e.g. "the gradient of fc2.weight holds
/// +Inf at index [3, 0]"; "" when no parameter's gradient covers it.
std::string gradientAt(const uint8_t *g, int64_t i) {
  const int64_t at = i * static_cast<int64_t>(dtypeBytes(kLayout.gradsDtype));
  for (int k = 0; k < kLayout.nparams; ++k) {
    const ParamInfo &p = kLayout.params[k];
    const int64_t bytes = p.t.numel * static_cast<int64_t>(dtypeBytes(kLayout.gradsDtype));
    if (p.grad < 0 || at < p.grad || at >= p.grad + bytes)
      continue;
    const int64_t j = (at - p.grad) / static_cast<int64_t>(dtypeBytes(kLayout.gradsDtype));
    const double v = loadAs(kLayout.gradsDtype, g + p.grad, j);
    return std::string("the gradient of ") + p.t.name + " holds " + (std::isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf") +
           " at index " + indexText(std::vector<int64_t>(p.t.shape, p.t.shape + p.t.rank), j);
  }
  return "";
}

/// Why the run stops at non-finite gradients (step is 1-based; `where` from gradientAt, or "").
std::string nonfiniteGradients(int64_t step, const std::string &where) {
  return "step " + std::to_string(step) + ": the gradient norm is not finite" + (where.empty() ? "" : " (" + where + ")") +
         "; stopping without writing --save or --dump-grads "
         "(the weights, the data or the learning rate diverged; --allow-nonfinite trains on)";
}

/// Writes every parameter (or its gradient) as F32 into a safetensors file (`table`: as
/// initParams's).
void writeTensors(const std::string &path, bool grads, const Memory &from, const ParamInfo *table = kLayout.params) {
  rt::st::Writer w;
  std::vector<std::vector<float>> keep;
  for (int i = 0; i < kLayout.nparams; ++i) {
    const ParamInfo &p = table[i];
    if (grads && p.grad < 0)
      continue;
    std::vector<float> v(static_cast<size_t>(p.t.numel));
    for (int64_t j = 0; j < p.t.numel; ++j) {
      double x = grads        ? loadAs(kLayout.gradsDtype, from.grads + p.grad, j) / kLayout.lossScale
                 : p.master >= 0 ? loadAs(kLayout.masterDtype, from.master + p.master, j)
                                 : loadAs(p.t.dtype, from.params + p.offset, j);
      v[j] = static_cast<float>(x);
      if (!std::isfinite(v[j]) && !allowNonfinite)
        die(std::string(grads ? "the gradient of " : "") + p.t.name + " holds " +
            (std::isnan(v[j]) ? "NaN" : "an infinity") + " at index " +
            indexText(std::vector<int64_t>(p.t.shape, p.t.shape + p.t.rank), j) + "; not writing " + path +
            " (--allow-nonfinite writes it anyway)");
    }
    keep.push_back(std::move(v));
    w.add(p.t.name, "F32", std::vector<int64_t>(p.t.shape, p.t.shape + p.t.rank), keep.back().data(),
          keep.back().size() * sizeof(float));
  }
  w.write(path);
}

/// Rank q's tensor rank and data rank, by the plan's rank order (kLayout's strides; the
/// tensor group innermost by default: q % tensor and q / tensor).
inline int tensorRankOf(int64_t q) { return static_cast<int>(q / kLayout.tensorStride % kLayout.tensor); }
inline int dataRankOf(int64_t q) { return static_cast<int>(q / kLayout.dataStride % kLayout.ranks); }

/// ZeRO: the whole fp32 master (the grads region's element order, kLayout.ranks × shard
/// elements), of which a rank's master region holds elements [rank·shard, (rank+1)·shard).
size_t wholeMasterBytes() { return static_cast<size_t>(kLayout.ranks * kLayout.shard) * sizeof(float); }
bool shardedMaster() { return kLayout.shard > 0 && kLayout.masterBytes > 0; }

/// ZeRO 2 and 3 (kLayout.zero ≥ 2): rank r holds elements [r·c, min(n, (r+1)·c)) of each
/// tensor of n elements, c = ⌈n / ranks⌉, at the tensor's offset in the grads, master and
/// optimizer regions (and under ZeRO 3 the params region). WholeModel is every parameter, its
/// gradient and master copy whole, in host memory laid out one after the other, for the
/// initialisation, --save and --dump-grads (outside the timed steps).
struct WholeModel {
  std::vector<ParamInfo> table;
  std::vector<uint8_t> params, grads, master;
  Memory mem{};
  WholeModel() {
    size_t p = 0, g = 0, m = 0;
    auto next = [](size_t &at, size_t bytes) {
      size_t off = at;
      at += (bytes + 255) / 256 * 256;
      return static_cast<int64_t>(off);
    };
    for (int i = 0; i < kLayout.nparams; ++i) {
      ParamInfo q = kLayout.params[i];
      size_t n = static_cast<size_t>(q.t.numel);
      q.offset = next(p, n * dtypeBytes(q.t.dtype));
      if (q.grad >= 0)
        q.grad = next(g, n * dtypeBytes(kLayout.gradsDtype));
      if (q.master >= 0)
        q.master = next(m, n * sizeof(float));
      table.push_back(q);
    }
    params.assign(p, 0);
    grads.assign(g, 0);
    master.assign(m, 0);
    mem.params = params.data();
    mem.grads = grads.data();
    mem.master = master.data();
  }
  /// For each parameter i of this rank's layout: move(shard, whole, element bytes, sharded) for
  /// its gradient (grads), or for its value and master copy, `shard` in `shards` (this rank's
  /// regions) and `whole` in this whole model; `sharded` says whether ZeRO splits that state
  /// (gradients and master copies always, the values under ZeRO 3). `move` is made per
  /// parameter by part(i); a parameter the rank does not hold (offset < 0) is skipped.
  template <class Part> void eachState(Memory &shards, bool grads, Part part) {
    for (int i = 0; i < kLayout.nparams; ++i) {
      const ParamInfo &s = kLayout.params[i], &w = table[static_cast<size_t>(i)];
      if (s.offset < 0)
        continue;
      auto move = part(i);
      if (grads) {
        if (s.grad >= 0)
          move(shards.grads + s.grad, mem.grads + w.grad, dtypeBytes(kLayout.gradsDtype), true);
        continue;
      }
      move(shards.params + s.offset, mem.params + w.offset, dtypeBytes(s.t.dtype), kLayout.zero >= 3);
      if (s.master >= 0)
        move(shards.master + s.master, mem.master + w.master, sizeof(float), true);
    }
  }
  /// Tensor parallel (kLayout.tensor > 1): copies tensor rank `tr`'s cut of each parameter
  /// (ParamInfo::tpDim, tpParts), and of its gradient or master copy, between `shards` (its
  /// regions) and this whole model. A parameter whole on every rank is copied from the
  /// shards by tensor rank 0 only, so that `merge` assembles every byte from one rank. Under
  /// data × tensor with ZeRO 2 and 3 a state ZeRO splits holds data rank `dr`'s piece of that
  /// cut (elements [dr·c, min(m, (dr+1)·c)) of the cut's m, c = ⌈m / ranks⌉, as the memory plan
  /// lays the rank's tensors out), which every data rank copies; the rest is data rank 0's.
  /// Under ZeRO-1 with a separate master copy `shards.master` is the cut's whole master (the
  /// cut's grads region's element order, zero outside this data rank's shard: part() cuts the
  /// shard from it), so every data rank contributes its shard of each master copy to the merge.
  void tensorCuts(Memory &shards, int tr, int dr, bool grads, bool toShards) {
    const int64_t t = kLayout.tensor, d = kLayout.ranks;
    const bool masterShards = kLayout.zero == 1 && !grads && shardedMaster();
    eachState(shards, grads, [&](int i) {
      const ParamInfo &s = kLayout.params[i];
      // The cut's elements between `cut` (the cut as the rank's region lays it out) and `whole`.
      auto cutMove = [=](uint8_t *cut, uint8_t *whole, size_t eb, bool toCut) {
        if (s.tpDim < 0) {
          std::memcpy(toCut ? cut : whole, toCut ? whole : cut, static_cast<size_t>(s.t.numel) * eb);
          return;
        }
        int64_t outer = 1, inner = 1, size = s.t.shape[s.tpDim];
        for (int k = 0; k < s.tpDim; ++k)
          outer *= s.t.shape[k];
        for (int k = s.tpDim + 1; k < s.t.rank; ++k)
          inner *= s.t.shape[k];
        int64_t chunk = size / (s.tpParts * t), local = size / t;
        size_t run = static_cast<size_t>(chunk * inner) * eb;
        for (int64_t o = 0; o < outer; ++o)
          for (int64_t p = 0; p < s.tpParts; ++p) {
            uint8_t *a = cut + static_cast<size_t>((o * local + p * chunk) * inner) * eb;
            uint8_t *b = whole + static_cast<size_t>((o * size + (p * t + tr) * chunk) * inner) * eb;
            std::memcpy(toCut ? a : b, toCut ? b : a, run);
          }
      };
      return [=](uint8_t *shard, uint8_t *whole, size_t eb, bool split) {
        const bool piece = split && kLayout.zero >= 2;
        // Into the whole model each byte comes from one rank: tensor rank 0 for a whole
        // parameter, data rank 0 for what every data rank holds alike (under ZeRO-1 the master
        // copies' shards are each data rank's own: zero elsewhere, as `merge` needs).
        if (!toShards && ((s.tpDim < 0 && tr != 0) || (!piece && !(split && masterShards) && dr != 0)))
          return;
        if (!piece)
          return cutMove(shard, whole, eb, toShards);
        const int64_t m = s.tpDim < 0 ? s.t.numel : s.t.numel / t, c = m / d + (m % d != 0);
        const int64_t lo = std::min<int64_t>(m, dr * c), len = std::min<int64_t>(m - lo, c);
        std::vector<uint8_t> cut(static_cast<size_t>(m) * eb, 0);
        if (toShards)
          cutMove(cut.data(), whole, eb, true);
        uint8_t *at = cut.data() + static_cast<size_t>(lo) * eb;
        if (len > 0)
          std::memcpy(toShards ? shard : at, toShards ? at : shard, static_cast<size_t>(len) * eb);
        if (!toShards)
          cutMove(cut.data(), whole, eb, false);
      };
    });
  }
  /// Copies the parameters this rank holds (offset ≥ 0: all of them, or under pipeline
  /// parallelism its stage's), and their gradients or master copies, between `shards` (its
  /// regions) and this whole model: whole, or under ZeRO 2 and 3 a state ZeRO splits as data
  /// rank `dr`'s piece of it (the gradients and master copies, under ZeRO 3 the values too). A
  /// parameter two stages hold has the same bytes on both, so `merge` keeps them.
  void ownParts(Memory &shards, int dr, bool grads, bool toShards) {
    eachState(shards, grads, [&](int i) {
      const int64_t n = kLayout.params[i].t.numel, c = (n + kLayout.ranks - 1) / kLayout.ranks;
      const int64_t lo = std::min<int64_t>(n, dr * c), len = std::min<int64_t>(n - lo, c);
      return [=](uint8_t *shard, uint8_t *whole, size_t eb, bool split) {
        const bool piece = split && kLayout.zero >= 2;
        uint8_t *at = whole + (piece ? lo : 0) * static_cast<int64_t>(eb);
        const size_t bytes = static_cast<size_t>(piece ? len : n) * eb;
        if (bytes > 0)
          std::memcpy(toShards ? shard : at, toShards ? at : shard, bytes);
      };
    });
  }
  /// Rank `rank`'s part of the model: its tensor-parallel cuts (under tensor x pipeline those of
  /// its stage's parameters: eachState skips the others; under data × tensor with ZeRO 2 and 3
  /// its data rank's pieces of them), its stage's parameters, or its ZeRO 2 and 3 pieces.
  void part(Memory &shards, int rank, bool grads, bool toShards) {
    if ((kLayout.tensor > 1 || kLayout.pipeline > 1) && kLayout.zero == 1 && !grads && shardedMaster()) {
      // Data × tensor or data × pipeline, ZeRO-1 with a separate master: the rank's master
      // region is its data rank's shard of its tensor cut's (or its stage's) whole master
      // (kLayout.ranks × shard elements, in that cut's or stage's grads region's order), as its
      // optimizer region is of the optimizer state.
      std::vector<float> cut(wholeMasterBytes() / sizeof(float), 0.0f);
      float *mine = cut.data() + dataRankOf(rank) * kLayout.shard;
      const size_t bytes = static_cast<size_t>(kLayout.shard) * sizeof(float);
      Memory m = shards;
      m.master = reinterpret_cast<uint8_t *>(cut.data());
      if (!toShards)
        std::memcpy(mine, shards.master, bytes);
      if (kLayout.tensor > 1)
        tensorCuts(m, tensorRankOf(rank), dataRankOf(rank), grads, toShards);
      else
        ownParts(m, dataRankOf(rank), grads, toShards);
      if (toShards)
        std::memcpy(shards.master, mine, bytes);
      return;
    }
    if (kLayout.tensor > 1)
      tensorCuts(shards, tensorRankOf(rank), dataRankOf(rank), grads, toShards);
    else
      ownParts(shards, dataRankOf(rank), grads, toShards);
  }
  /// Every rank's pieces on every rank: each byte is held by one rank and zero on the others,
  /// so `merge` (a bitwise or over the ranks) assembles them.
  void merge(void (*merge)(uint8_t *, int64_t), bool grads) {
    for (std::vector<uint8_t> *v : grads ? std::vector<std::vector<uint8_t> *>{&this->grads}
                                         : std::vector<std::vector<uint8_t> *>{&params, &master})
      merge(v->data(), static_cast<int64_t>(v->size()));
  }
};

/// The parameters into `into` (--init or the default) and, under ZeRO, rank `rank`'s master
/// shard cut from the whole initialisation, so every rank starts from the same weights.
void initialiseRank(const Args &args, Memory &into, int rank) {
  if (kLayout.zero >= 2 || kLayout.tensor > 1 || kLayout.pipeline > 1) {
    WholeModel w;
    initParams(args, w.mem, w.table.data());
    w.part(into, rank, false, true);
    return;
  }
  if (!shardedMaster()) {
    initParams(args, into);
    return;
  }
  std::vector<float> whole(wholeMasterBytes() / sizeof(float), 0.0f);
  Memory m = into;
  m.master = reinterpret_cast<uint8_t *>(whole.data());
  initParams(args, m);
  std::memcpy(into.master, whole.data() + rank * kLayout.shard, static_cast<size_t>(kLayout.shard) * sizeof(float));
}

/// --save: rank 0 writes the weights of `from` (host memory); under ZeRO the master shards are
/// summed into a whole master first by `sum` over the ranks (each element is held by one rank,
/// the others add zeros). Every rank calls it.
void saveRank(const Args &args, const Memory &from, int rank, void (*sum)(float *, int64_t),
              void (*merge)(uint8_t *, int64_t) = nullptr) {
  if ((kLayout.zero >= 2 || kLayout.tensor > 1 || kLayout.pipeline > 1) && merge) {
    WholeModel w;
    Memory m = from;
    w.part(m, rank, false, false);
    w.merge(merge, false);
    if (rank == 0)
      writeTensors(args.save, false, w.mem, w.table.data());
    return;
  }
  if (!shardedMaster()) {
    if (rank == 0)
      writeTensors(args.save, false, from);
    return;
  }
  std::vector<float> whole(wholeMasterBytes() / sizeof(float), 0.0f);
  std::memcpy(whole.data() + rank * kLayout.shard, from.master, static_cast<size_t>(kLayout.shard) * sizeof(float));
  sum(whole.data(), static_cast<int64_t>(whole.size()));
  Memory m = from;
  m.master = reinterpret_cast<uint8_t *>(whole.data());
  if (rank == 0)
    writeTensors(args.save, false, m);
}

/// --dump-grads under ZeRO 2 and 3: every rank's pieces of the gradients assembled by `merge`
/// and written by rank 0. Every rank calls it.
void dumpPieces(const std::string &path, const Memory &from, int rank, void (*merge)(uint8_t *, int64_t)) {
  WholeModel w;
  Memory m = from;
  w.part(m, rank, true, false);
  w.merge(merge, true);
  if (rank == 0)
    writeTensors(path, true, w.mem, w.table.data());
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

/// Step i (0-based) of the run is timed: the first args.warmup steps are not.
bool timedStep(const Args &a, int64_t i) { return i >= a.warmup; }

/// Whether timed step `i`'s kernels are timed one by one (the CPU driver): every other timed
/// step, the last one included (its trace needs them), or the only one. A kernel's timer reads
/// the clock twice and records the call, ~0.1 us on the 2-vCPU VM (kvm-clock reads 27 ns): a
/// third of a toy MLP's 9 us step. The step time is the median of the steps not profiled; the
/// kernels' times are per profiled step ("kernel_steps").
bool profiledStep(const Args &a, int64_t i) {
  return timedStep(a, i) && ((a.steps - 1 - i) % 2 == 0 || a.steps - a.warmup == 1);
}

/// A progress line on stderr while stepping ("step 3/10 (warm-up, untimed)"), rewritten in
/// place at the first step and then at most every 0.2 s (outside the timed region: the drivers
/// call it before starting a step's clock); only when stderr is a terminal, so logs and tests
/// stay clean. done() clears it.
struct Progress {
  bool on = ::isatty(2) != 0;
  double last = -1;
  void step(const Args &a, int64_t i) {
    if (!on)
      return;
    double now = rt::now_seconds();
    if (last >= 0 && now - last < 0.2)
      return;
    last = now;
    std::fprintf(stderr, "\r\033[Ktally_step: step %lld/%lld%s", static_cast<long long>(i + 1),
                 static_cast<long long>(a.steps), timedStep(a, i) ? "" : " (warm-up, untimed)");
    std::fflush(stderr);
  }
  void done() const {
    if (on)
      std::fputs("\r\033[K", stderr);
  }
};

/// /proc/loadavg's 1-minute figure, or NaN where it cannot be read.
double loadAverage1m() {
  std::ifstream f("/proc/loadavg");
  double v = 0;
  return f >> v ? v : NAN;
}

/// The median of `v` (the mean of the middle two for an even count); NaN when empty.
double medianOf(std::vector<double> v) {
  if (v.empty())
    return NAN;
  std::sort(v.begin(), v.end());
  size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

/// The timed steps in the report, shared by both drivers: "step_s" (the median), "step_times",
/// then "timed_steps", "step_min_s", "step_max_s", the 1-minute load average just after the
/// last step and the cores online (`tally run` warns when the spread or the load makes the
/// comparison with the estimate unreliable). Each line ends with ",\n". `unprofiled`, when
/// given and not empty: the times of the timed steps whose kernels were not timed (the CPU
/// driver's, profiledStep), which step_s and its minimum and maximum are taken from.
std::string timingJson(const std::vector<double> &times, const std::vector<double> *unprofiled = nullptr) {
  std::vector<double> sorted = unprofiled && !unprofiled->empty() ? *unprofiled : times;
  std::sort(sorted.begin(), sorted.end());
  std::string out = "  \"step_s\": " + num(medianOf(sorted)) + ",\n  \"step_times\": [";
  for (size_t i = 0; i < times.size(); ++i)
    out += (i ? ", " : "") + num(times[i]);
  out += "],\n  \"timed_steps\": " + std::to_string(times.size()) + ",\n";
  out += "  \"step_min_s\": " + num(sorted.empty() ? NAN : sorted.front()) + ",\n";
  out += "  \"step_max_s\": " + num(sorted.empty() ? NAN : sorted.back()) + ",\n";
  out += "  \"load_average\": " + num(loadAverage1m()) + ",\n";
  out += "  \"cores\": " + std::to_string(std::max<long>(1, ::sysconf(_SC_NPROCESSORS_ONLN))) + ",\n";
  return out;
}

/// The run JSON's "sent_bytes" (every rank's bytes in the last step) and "sent_bytes_by_group"
/// lines; `groups` holds one vector per kind of tally_comm's counts (data, tensor, pipeline).
/// Both drivers write them so.
inline std::string sentBytesJson(const std::vector<int64_t> &ranks, const std::vector<int64_t> *groups) {
  std::string out = "  \"sent_bytes\": [";
  for (size_t r = 0; r < ranks.size(); ++r)
    out += (r ? ", " : "") + std::to_string(ranks[r]);
  out += "],\n  \"sent_bytes_by_group\": {";
  const char *names[] = {"data", "tensor", "pipeline"};
  for (int k = 0; k < 3; ++k) {
    out += std::string(k ? "], " : "") + "\"" + names[k] + "\": [";
    for (size_t r = 0; r < groups[k].size(); ++r)
      out += (r ? ", " : "") + std::to_string(groups[k][r]);
  }
  return out + "]},\n";
}

} // namespace
} // namespace tally_step

#undef kThreadsNote
