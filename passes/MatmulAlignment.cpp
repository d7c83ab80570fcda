// Matmul alignment: a GPU's tensor-core GEMM kernels load each row of their operands in
// 16-byte pieces, so they need every row to start on a 16-byte boundary. For C[M, N] = A[M, K]
// · B[K, N] (row-major, as the graph holds them) the rows are K elements long (A) and N long
// (B, C); the backward's dA = dC·Bᵀ and dB = Aᵀ·dC have rows of the same two lengths. When K
// or N is not a multiple of 16 bytes / element size (8 in bf16 and fp16, 4 in tf32, 16 in
// fp8), cuBLAS falls back to kernels that load less at a time (NVIDIA, "Matrix Multiplication
// Background User's Guide", "Tensor Core Requirements"). GPT-2's vocabulary, 50,257, is the
// well-known case: its head is the model's largest matmul, and nanoGPT pads it to 50,304.
//
//   unaligned-matmul   warning: a matmul on a GPU target, computed on tensor cores, whose K or
//                      N is not a multiple of 16 bytes and whose forward takes longer than its
//                      launch (a kernel that waits for its launch loses nothing to a slower
//                      kernel: a toy layer of 4 is not worth a warning); one per source
//                      location and length (a repeated block's copies are one), with a note
//                      giving the padded size and, for tally's CUDA step, the time per
//                      micro-batch padding would save (paddingSaves: the products over the
//                      padded length priced as aligned, against their priced unaligned time).
//                      A length of 1 is not unaligned: a product with one output column (a
//                      gate, Linear(d, 1)) or one inner element is a matrix-vector or outer
//                      product, memory-bound, with no tensor-core kernel to fall back from,
//                      and padding it to 64 would do 64 times the work. The LM head that
//                      tally's step pads (passes/HeadPadding.h: --backend cuda, or --pad-head)
//                      has N = V' and is not unaligned; a head the rule refuses (an untied
//                      [d, V] weight) keeps its warning with one more note saying why
//
// Pricing (passes/StepTime.cpp, asRun): only tally's own CUDA step, whose cuBLASLt call was
// measured on such a shape (docs/validation.md, 2026-12-01: 16384 × 50257 × 768 in bf16 at
// 125 TFLOP/s, 0.126 of the H200's peak, against 0.68 for the aligned 16384 × 3072 × 768), runs
// an unaligned matmul at that measured fraction. A framework's loss differs by library and
// version and is not priced: the warning says so.
#include "support/Diagnostics.h"
#include "passes/InstanceNotes.h"
#include "passes/Passes.h"
#include "ir/Units.h"

#include <map>
#include <utility>

namespace tally {

namespace {

/// Elements of `d` in 16 bytes when `d` runs on tensor cores; 0 when it does not (fp32 runs
/// on the CUDA cores, integers and f64 are not checked).
int64_t tensorCoreElements(Dtype d) {
  switch (d) {
  case Dtype::F16:
  case Dtype::BF16:
    return 8;
  case Dtype::TF32:
    return 4;
  case Dtype::FP8E4M3:
  case Dtype::FP8E5M2:
    return 16;
  default:
    return 0;
  }
}

/// The first row length of matmul `i` (K, then N) above 1 that is not a multiple of `per`,
/// as {name, length}; {nullptr, 0} when both are (or are 1: a matrix-vector product). The
/// step's padded head (passes/HeadPadding.h) has N = V', a multiple of 64.
std::pair<const char *, int64_t> unalignedRow(const Analysis &an, OpId i, int64_t per) {
  const Graph &g = *an.graph;
  const Op &op = g.ops[i];
  if (op.kind != OpKind::Matmul || op.inputs.size() != 2 || per <= 0)
    return {nullptr, 0};
  const Shape &a = g.tensors[op.inputs[0]].shape, &b = g.tensors[op.inputs[1]].shape;
  if (a.empty() || b.empty())
    return {nullptr, 0};
  int64_t k = a.back().size;
  if (k > 1 && k % per != 0)
    return {"K", k};
  int64_t n = an.headPad.applies() && an.headPad.matmul == i ? an.headPad.padded : b.back().size;
  if (b.size() >= 2 && n > 1 && n % per != 0)
    return {"N", n};
  return {nullptr, 0};
}

/// Seconds per micro-batch that padding matmul `i`'s unaligned `length` to `padded` would save
/// in tally's CUDA step: its forward and backward as priced (at the fraction measured for an
/// unaligned cuBLASLt call, StepTime.cpp's asRun) less the same products over the padded length
/// (FLOPs grown by padded / length: each of the three products is linear in K and in N; bytes
/// as priced) at the target's matmul efficiency, the rate an aligned product is priced at.
double paddingSaves(const Analysis &a, OpId i, int64_t length, int64_t padded) {
  const OpAnalysis &o = a.ops[i];
  const Target &t = a.plan->target;
  const double grow = static_cast<double>(padded) / static_cast<double>(length);
  KernelWork f = forwardWork(a, i, o);
  f.flops *= grow;
  f.efficiency = 0; // the target's matmul efficiency: an aligned product
  double after = kernelTime(t, OpClass::Matmul, o.computeDtype, f);
  if (o.backwardTime > 0) {
    KernelWork b = backwardWork(a, i, o);
    b.flops *= grow;
    b.efficiency = 0;
    after += kernelTime(t, OpClass::Matmul, o.computeDtype, b);
  }
  return o.forwardTime + o.backwardTime - after;
}

} // namespace

bool unalignedMatmul(const Analysis &a, OpId i) {
  const Target &t = a.plan->target;
  if (t.isHost())
    return false;
  return unalignedRow(a, i, tensorCoreElements(a.ops[i].computeDtype)).first != nullptr;
}

void matmulAlignment(const Analysis &a, DiagnosticEngine &diags) {
  const Target &t = a.plan->target;
  if (t.isHost())
    return;
  const Graph &g = *a.graph;
  struct Found {
    OpId first;
    size_t copies = 0;
    const char *name;
    int64_t length, per;
    double saves = 0; // seconds per micro-batch over every copy (tally's CUDA step)
  };
  std::vector<Found> found;
  std::map<std::pair<const char *, int64_t>, size_t> index; // (source location, length)
  for (OpId i = 0; i < g.ops.size(); ++i) {
    const Op &op = g.ops[i];
    if (op.kind != OpKind::Matmul)
      continue;
    int64_t per = tensorCoreElements(a.ops[i].computeDtype);
    auto [name, length] = unalignedRow(a, i, per);
    if (!name || !(a.ops[i].forwardTime > t.kernelLaunch))
      continue;
    auto [it, fresh] = index.try_emplace({op.range.Start.getPointer(), length}, found.size());
    if (fresh)
      found.push_back({i, 0, name, length, per});
    ++found[it->second].copies;
    if (a.plan->cudaStep)
      found[it->second].saves += paddingSaves(a, i, length, (length + 63) / 64 * 64);
  }
  for (const Found &f : found) {
    const Op &op = g.ops[f.first];
    Dtype d = a.ops[f.first].computeDtype;
    std::string where = "'" + g.opPath(op) + "'";
    if (f.copies > 1)
      where += " (and " + std::to_string(f.copies - 1) +
               (f.copies == 2 ? " more copy)" : " more copies)");
    auto b = diags.report(DiagKind::UnalignedMatmul, op.range.Start,
                          "matmul " + where + " has " + f.name + " = " + std::to_string(f.length) +
                              ", not a multiple of " + std::to_string(f.per) + " (16 bytes of " +
                              nameOf(d).str() + "): its rows do not start on 16 bytes, so " +
                              t.name + "'s tensor-core kernels fall back to slower ones");
    b.range(op.range);
    int64_t padded = (f.length + 63) / 64 * 64;
    b.note(op.range.Start,
           "padding " + std::to_string(f.length) + " to " + std::to_string(padded) +
               " (a multiple of 64, as nanoGPT pads GPT-2's vocabulary) keeps the fast kernels; " +
               (a.plan->cudaStep
                    ? "tally's CUDA step is priced at the 0.126 of the peak measured for such a "
                      "cuBLASLt call (docs/validation.md); padded and priced as aligned, its "
                      "forward and backward would take " +
                          formatDuration(f.saves) + " less per micro-batch"
                    : "the estimate prices it as aligned (the loss depends on the library: "
                      "cuBLASLt measured 0.126 of the peak, docs/validation.md)"));
    if (a.headPad.head == f.first && !a.headPad.refused.empty())
      b.note(op.range.Start, "tally's step does not pad this head (passes/HeadPadding.h): " + a.headPad.refused);
    noteInstances(b, diags, op.range.Start, g, op.instance);
  }
}

} // namespace tally
