// The CPU half of tests/step/cuda_check: runs every case of cuda_check_cases.h on the CPU
// runtime (the reference) and hands the outputs to cuda_check.cu's main. A separate translation
// unit because the two runtimes each define rt::Ctx.
#include "codegen/runtime/cpu/tally_rt.h"

#include <cstring>
#include <memory>

namespace cpu_check {
/// Host memory that lives as long as the Mem.
class Mem {
 public:
  template <class T> T* upload(const std::vector<T>& v) {
    T* p = zeros<T>(static_cast<int64_t>(v.size()));
    if (!v.empty()) std::memcpy(p, v.data(), v.size() * sizeof(T));
    return p;
  }
  template <class T> T* zeros(int64_t n) {
    blocks_.emplace_back(new char[static_cast<size_t>(n) * sizeof(T) + 1]());
    return reinterpret_cast<T*>(blocks_.back().get());
  }
  template <class T> std::vector<T> download(const T* p, int64_t n) { return std::vector<T>(p, p + n); }

 private:
  std::vector<std::unique_ptr<char[]>> blocks_;
};
}  // namespace cpu_check

#define TALLY_CHECK_NS cpu_check
#include "tests/step/cuda_check_cases.h"

namespace cpu_check {
/// Every case on the CPU runtime for dtype "f32" or "bf16".
std::vector<tally_check::CaseResult> runAll(const std::string& dtype) {
  rt::Ctx ctx;
  Mem m;
  if (dtype == "bf16") return runCases<rt::bf16>(ctx, m, dtype);
  if (dtype == "f16") return runCases<rt::f16>(ctx, m, dtype);
  return runCases<float>(ctx, m, dtype);
}
}  // namespace cpu_check
