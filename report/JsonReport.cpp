// The JSON report: one object with the keys of language.md §4. Counts are numbers, bytes in
// bytes, times in seconds, FLOPs as doubles. renderJson builds it from one function per
// top-level section (parallelJson, memoryJson, ...) and streams the three arrays that grow
// with the model (streamBlocks, streamOps, streamPerBlock).
#include "report/Report.h"
#include "report/Copies.h"
#include "report/Explain.h"

#include "llvm/Support/JSON.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace tally {

void writeJsonNumber(llvm::json::OStream &j, double v) {
  if (!std::isfinite(v)) {
    j.value(nullptr);
    return;
  }
  char buf[32];
  std::to_chars_result r;
  // Integers below 10^17 (most of a report: bytes, FLOPs, counts) print as the general format
  // prints them, digits alone, so they take the integer path (a tenth of a deep model's JSON
  // report was formatting doubles). -0 keeps the general format ("-0").
  if (std::abs(v) < 1e17 && v == std::trunc(v) && !(v == 0 && std::signbit(v)))
    r = std::to_chars(buf, buf + sizeof buf, static_cast<int64_t>(v));
  else
    r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general, 17);
  j.rawValue(llvm::StringRef(buf, static_cast<size_t>(r.ptr - buf)));
}

namespace {

llvm::json::Array diagnosticsJson(const DiagnosticEngine &diags) {
  llvm::json::Array out;
  for (const Diagnostic &d : diags.diagnostics())
    out.push_back(llvm::json::Object{{"severity", severityName(d.severity).str()},
                                     {"code", codeOf(d.kind).str()},
                                     {"message", d.message},
                                     {"file", d.file},
                                     {"line", static_cast<int64_t>(d.line)},
                                     {"column", static_cast<int64_t>(d.column)}});
  return out;
}

/// The numbers of one op's entry in "ops", by their index: the scan for non-finite numbers
/// and the writer read the same list.
enum OpNumber : size_t {
  kOpFlops, kOpExecutedFlops, kOpBackwardFlops, kOpBytes, kOpIntensity, kOpTime, kOpBackwardTime,
  kOpNumberCount
};
constexpr const char *kOpNumberKeys[kOpNumberCount] = {
    "flops", "executed_flops", "backward_flops", "bytes", "intensity", "time_s", "backward_time_s"};
using OpNumbers = std::array<double, kOpNumberCount>;
OpNumbers opNumbers(const OpAnalysis &oa) {
  return {oa.forward.flops,
          oa.forward.executedFlops,
          oa.inputGradFlops + oa.weightGradFlops,
          oa.forward.bytesRead + oa.forward.bytesWritten,
          oa.intensity(),
          oa.forwardTime,
          oa.backwardTime};
}

/// The tensor whose shape and dtype an op's row gives: its first output (its first input
/// for an op without outputs).
TensorId rowTensor(const Op &op) { return op.outputs.empty() ? op.inputs[0] : op.outputs[0]; }

/// The rows of a list whose entries are ops or block instances (ops[], params.by_block[],
/// inference.decode_ops[]): an entry alone, or the copies of one as one row at the place of
/// its first entry. Copies are the entries of a group of report/Copies.h (`groupOf` an entry)
/// when the list has an entry for each of its members (at least two, with a member in every
/// copy), all alike (`alike`: what the row shows besides numbers) and with the same numbers
/// bit for bit. The row's numbers are their sums, but for the indexes in `each` (an
/// intensity: each copy's).
template <size_t N> struct CopyRows {
  struct Row {
    size_t entry;        ///< the entry it is written from (the copies' first)
    uint32_t copies = 1; ///< how many entries it stands for
    uint32_t sum = 0;    ///< copies > 1: its numbers' index in `sums`
  };
  std::vector<Row> rows;
  std::vector<std::array<double, N>> sums;
  /// A row's numbers: the sums of its copies, or its entry's (`numbersOf`).
  template <class NumbersOf>
  std::array<double, N> numbers(const Row &r, const NumbersOf &numbersOf) const {
    return r.copies > 1 ? sums[r.sum] : numbersOf(r.entry);
  }
};

/// copyRows' state per group.
constexpr uint32_t kApart = UINT32_MAX; ///< no sums: the group's entries are rows of their own
struct CopyRowState {
  size_t first = SIZE_MAX; ///< its first entry
  uint32_t listed = 0;     ///< entries of the group
  uint32_t slot = kApart;  ///< its sums' index, while its entries are alike
};

template <size_t N, class GroupOf, class NumbersOf, class Alike>
CopyRows<N> copyRows(size_t entries, const CopyGroups &groups, const GroupOf &groupOf,
                     const NumbersOf &numbersOf, const Alike &alike, std::array<bool, N> each) {
  std::vector<CopyRowState> state(groups.groups.size());
  CopyRows<N> out;
  for (size_t e = 0; e < entries; ++e) {
    uint32_t k = groupOf(e);
    CopyRowState &s = state[k];
    ++s.listed;
    if (groups.groups[k].members < 2 || !groups.groups[k].everyCopy)
      continue;
    std::array<double, N> n = numbersOf(e);
    if (s.first == SIZE_MAX) {
      s.first = e;
      s.slot = static_cast<uint32_t>(out.sums.size());
      out.sums.push_back(n);
      continue;
    }
    if (s.slot == kApart)
      continue;
    std::array<double, N> m = numbersOf(s.first);
    bool same = alike(e, s.first);
    for (size_t x = 0; x < N && same; ++x)
      same = sameBits(n[x], m[x]);
    if (!same) {
      s.slot = kApart;
      continue;
    }
    for (size_t x = 0; x < N; ++x)
      if (!each[x])
        out.sums[s.slot][x] += n[x];
  }
  for (size_t e = 0; e < entries; ++e) {
    uint32_t k = groupOf(e);
    const CopyRowState &s = state[k];
    if (s.slot == kApart || s.listed != groups.groups[k].members)
      out.rows.push_back({e, 1, 0});
    else if (e == s.first)
      out.rows.push_back({e, s.listed, s.slot});
  }
  return out;
}

/// The inference section (passes/Inference.cpp): null for train plans. The decode ops of the
/// copies of a repeated block are one row (copyRows, with the ops' groups).
llvm::json::Value inferenceJson(const Analysis &a, const CopyGroups &opGroups) {
  const auto &inf = a.inference;
  if (!inf.active)
    return nullptr;
  const Graph &g = *a.graph;
  auto numbersOf = [&](size_t e) {
    const Analysis::DecodeOp &d = inf.ops[e];
    return std::array<double, 4>{d.flops, d.bytes, d.intensity, d.time};
  };
  CopyRows<4> rows = copyRows<4>(
      inf.ops.size(), opGroups, [&](size_t e) { return opGroups.of[inf.ops[e].op]; }, numbersOf,
      [&](size_t e, size_t first) { return inf.ops[e].computeBound == inf.ops[first].computeBound; },
      {false, false, true, false});
  llvm::json::Array ops;
  for (const CopyRows<4>::Row &row : rows.rows) {
    const Analysis::DecodeOp &d = inf.ops[row.entry];
    std::array<double, 4> n = rows.numbers(row, numbersOf);
    ops.push_back(llvm::json::Object{
        {"path", row.copies > 1 ? repeatPattern(g.opPath(d.op)) : g.opPath(d.op)},
        {"kind", opName(g.ops[d.op].kind).str()},
        {"copies", static_cast<int64_t>(row.copies)},
        {"flops", n[0]},
        {"bytes", n[1]},
        {"intensity", n[2]},
        {"bound", d.computeBound ? "compute" : "memory"},
        {"time_s", n[3]}});
  }
  auto decode = [&](double v) {
    return inf.encoder ? llvm::json::Value(nullptr) : llvm::json::Value(v);
  };
  return llvm::json::Object{
      // An encoder (no causal attention: passes/Inference.cpp step 8) keeps no cache and
      // decodes nothing: its KV bytes and decode steps are 0, its decode times and rates null.
      {"encoder", inf.encoder},
      {"bidirectional_layers", inf.bidirectionalLayers},
      {"forward_tokens_per_s", inf.forwardTokensPerSecond},
      {"forward_tokens_per_s_per_gpu", inf.forwardTokensPerSecondPerGpu},
      {"prefill_flops", inf.prefillFlops},
      {"prefill_s", inf.prefillTime},
      {"layers", inf.layers},
      {"kv_bytes_per_token", inf.kvBytesPerToken},
      {"kv_cache_bytes", inf.kvCacheBytes},
      {"decode_steps", inf.decodeSteps},
      {"mean_context", inf.meanContext},
      {"decode_flops_per_step", inf.decodeFlops},
      {"decode_bytes_per_step", inf.decodeBytes},
      {"decode_intensity", inf.decodeIntensity},
      {"decode_bound", inf.decodeMemoryBound ? "memory" : "compute"},
      {"decode_s_per_step", decode(inf.decodeTime)},
      {"first_decode_s", decode(inf.firstDecodeTime)},
      {"last_decode_s", decode(inf.lastDecodeTime)},
      {"tokens_per_s", decode(inf.tokensPerSecond)},
      {"total_s", inf.totalTime},
      {"two_n_flops", inf.twoNFlops},
      {"decode_ops", std::move(ops)},
      // Serving capacity (issue 45): the paged cache at max_context and what fits.
      {"max_context", inf.maxContext},
      {"concurrent", a.plan->batch},
      {"kv_block", inf.kvBlock},
      {"kv_dtype", nameOf(inf.kvDtype).str()},
      {"kv_heads", inf.kvHeads},
      {"kv_head_replicas", inf.kvReplication},
      {"kv_blocks_per_sequence", inf.kvBlocksPerSequence},
      {"kv_block_bytes", inf.kvBlockBytes},
      {"kv_bytes_per_sequence", inf.kvBytesPerSequence},
      {"kv_memory_bytes", inf.kvMemoryBytes},
      {"kv_blocks_total", inf.kvBlocksTotal},
      {"max_concurrent", inf.kvBytesPerSequence > 0 ? llvm::json::Value(inf.maxConcurrent)
                                                     : llvm::json::Value(nullptr)},
      {"time_to_first_token_s", inf.timeToFirstToken},
      {"inter_token_latency_s", decode(inf.interTokenLatency)},
      {"tokens_per_s_per_gpu", decode(inf.tokensPerSecondPerGpu)},
      // Multi-head latent attention (MLA): the layers whose cache holds the latent and RoPE
      // key (values per token and layer), the decode step priced with the up-projections absorbed.
      {"latent_attention",
       llvm::json::Object{{"layers", inf.latentLayers},
                          {"values_per_token", inf.latentWidth},
                          {"decode", inf.latentLayers > 0 ? llvm::json::Value("absorbed")
                                                          : llvm::json::Value(nullptr)}}}};
}

/// One object of a streamed array, written as llvm::json writes an Object (keys sorted, each
/// value as its Value would print) without building one: a 1,000-layer report built 40,000
/// Objects (a hash map each) to print them once.
class SortedFields {
public:
  void text(llvm::StringRef key, llvm::StringRef v) { add(key).text = v; }
  void integer(llvm::StringRef key, int64_t v) {
    Field &f = add(key);
    f.kind = Field::Integer;
    f.integer = v;
  }
  /// A double: null when it is not finite (JSON has no inf or nan).
  void number(llvm::StringRef key, double v) {
    Field &f = add(key);
    f.kind = Field::Number;
    f.number = v;
  }
  void integers(llvm::StringRef key, llvm::ArrayRef<int64_t> v) {
    Field &f = add(key);
    f.kind = Field::Integers;
    f.list = v;
  }
  void write(llvm::json::OStream &j) {
    std::sort(fields_.begin(), fields_.end(),
              [](const Field &x, const Field &y) { return x.key < y.key; });
    j.objectBegin();
    for (const Field &f : fields_) {
      j.attributeBegin(f.key);
      switch (f.kind) {
      case Field::Text: j.value(f.text); break;
      case Field::Integer: j.value(f.integer); break;
      case Field::Number: writeJsonNumber(j, f.number); break;
      case Field::Integers:
        j.arrayBegin();
        for (int64_t x : f.list)
          j.value(x);
        j.arrayEnd();
        break;
      }
      j.attributeEnd();
    }
    j.objectEnd();
  }

private:
  struct Field {
    llvm::StringRef key;
    enum Kind { Text, Integer, Number, Integers } kind = Text;
    llvm::StringRef text;
    int64_t integer = 0;
    double number = 0;
    llvm::ArrayRef<int64_t> list;
  };
  Field &add(llvm::StringRef key) {
    fields_.emplace_back();
    fields_.back().key = key;
    return fields_.back();
  }
  llvm::SmallVector<Field, 16> fields_;
};

/// A large array written element by element (a 10,000-layer model has 150,000 ops: as one
/// llvm::json::Value the report held 1.3 GiB more than the text report did): its elements'
/// count, and a writer of the element `i`.
struct StreamedArray {
  size_t size = 0;
  std::function<void(llvm::json::OStream &, size_t)> write;
};

/// Writes `v` as llvm::json does (keys sorted at every level, so the output is what
/// formatv("{0:2}", v) printed), with the values at the dotted paths in `streamed` written
/// from their StreamedArray instead.
void writeSorted(llvm::json::OStream &j, const llvm::json::Value &v, const std::string &path,
                 const std::map<std::string, StreamedArray> &streamed) {
  const llvm::json::Object *o = v.getAsObject();
  if (!o) {
    j.value(v);
    return;
  }
  std::vector<const llvm::json::Object::value_type *> elements;
  for (const auto &kv : *o)
    elements.push_back(&kv);
  std::sort(elements.begin(), elements.end(),
            [](const auto *x, const auto *y) { return x->first < y->first; });
  j.objectBegin();
  for (const auto *kv : elements) {
    std::string at = path.empty() ? kv->first.str() : path + "." + kv->first.str();
    j.attributeBegin(kv->first);
    auto s = streamed.find(at);
    if (s == streamed.end()) {
      writeSorted(j, kv->second, at, streamed);
    } else {
      j.arrayBegin();
      for (size_t i = 0; i < s->second.size; ++i)
        s->second.write(j, i);
      j.arrayEnd();
    }
    j.attributeEnd();
  }
  j.objectEnd();
}

using StreamedArrays = std::map<std::string, StreamedArray>;
using llvm::json::Array;
using llvm::json::Object;

std::array<double, 1> blockCount(const Analysis &a, size_t e) {
  return std::array<double, 1>{a.params.byBlock[e].count};
}

/// The rows of params.by_block: the copies of a repeated block are one row.
CopyRows<1> blockRows(const Analysis &a, const CopyGroups &instances) {
  const Graph &g = *a.graph;
  const auto &byBlock = a.params.byBlock;
  return copyRows<1>(
      byBlock.size(), instances, [&](size_t e) { return instances.of[byBlock[e].instance]; },
      [&](size_t e) { return blockCount(a, e); },
      [&](size_t e, size_t first) {
        return g.instances[byBlock[e].instance].block == g.instances[byBlock[first].instance].block;
      },
      {false});
}

/// params.by_block, streamed from `blocks` (which outlives the writing); its non-finite
/// numbers are added to `bad`.
void streamBlocks(const Analysis &a, const CopyRows<1> &blocks, StreamedArrays &streamed,
                  std::vector<std::string> &bad) {
  auto count = [&a](size_t e) { return blockCount(a, e); };
  streamed["params.by_block"] = {blocks.rows.size(), [&a, &blocks, count](llvm::json::OStream &j,
                                                                         size_t r) {
                                   const Graph &g = *a.graph;
                                   const CopyRows<1>::Row &row = blocks.rows[r];
                                   const Analysis::BlockCount &b = a.params.byBlock[row.entry];
                                   std::string path = g.instancePath(b.instance); // f keeps a StringRef
                                   if (row.copies > 1)
                                     path = repeatPattern(path);
                                   SortedFields f;
                                   f.text("path", path);
                                   f.text("block", *g.instances[b.instance].block);
                                   f.number("count", blocks.numbers(row, count)[0]);
                                   f.integer("copies", row.copies);
                                   f.write(j);
                                 }};
  for (size_t r = 0; r < blocks.rows.size(); ++r)
    if (!std::isfinite(blocks.numbers(blocks.rows[r], count)[0]))
      bad.push_back("params.by_block[" + std::to_string(r) + "].count");
}

using OpRows = CopyRows<kOpNumberCount>;

/// The rows of ops: the ops of the copies of a repeated block are one row each.
OpRows opRows(const Analysis &a, const CopyGroups &opGroups) {
  const Graph &g = *a.graph;
  std::array<bool, kOpNumberCount> each{};
  each[kOpIntensity] = true;
  return copyRows<kOpNumberCount>(
      g.ops.size(), opGroups, [&](size_t i) { return opGroups.of[i]; },
      [&](size_t i) { return opNumbers(a.ops[i]); },
      [&](size_t i, size_t first) {
        const Tensor &t = g.tensors[rowTensor(g.ops[i])], &ft = g.tensors[rowTensor(g.ops[first])];
        return t.shape == ft.shape && t.dtype == ft.dtype &&
               a.ops[i].computeBound == a.ops[first].computeBound;
      },
      each);
}

/// ops, streamed from `ops` (which outlives the writing); its non-finite numbers are added
/// to `bad`.
void streamOps(const Analysis &a, const OpRows &ops, StreamedArrays &streamed,
               std::vector<std::string> &bad) {
  auto numbersOf = [&a](size_t i) { return opNumbers(a.ops[i]); };
  streamed["ops"] = {ops.rows.size(), [&a, &ops, numbersOf](llvm::json::OStream &j, size_t r) {
                       const Graph &g = *a.graph;
                       const OpRows::Row &row = ops.rows[r];
                       const Op &op = g.ops[row.entry];
                       const OpAnalysis &oa = a.ops[row.entry];
                       const Tensor &out = g.tensors[rowTensor(op)];
                       llvm::SmallVector<int64_t, 4> shape;
                       for (const Dim &d : out.shape)
                         shape.push_back(d.size);
                       // The keys in sorted order, as an Object prints them, written
                       // directly: one row per op, and sorting them per row was a
                       // twentieth of a deep model's JSON report.
                       OpNumbers numbers = ops.numbers(row, numbersOf);
                       auto number = [&](size_t k) {
                         j.attributeBegin(kOpNumberKeys[k]);
                         writeJsonNumber(j, numbers[k]);
                         j.attributeEnd();
                       };
                       j.objectBegin();
                       number(kOpBackwardFlops);
                       number(kOpBackwardTime);
                       j.attribute("bound", oa.computeBound ? "compute" : "memory");
                       number(kOpBytes);
                       j.attribute("class", opClassName(opClass(op.kind)));
                       j.attribute("copies", static_cast<int64_t>(row.copies));
                       j.attribute("dtype", nameOf(out.dtype));
                       number(kOpExecutedFlops);
                       number(kOpFlops);
                       number(kOpIntensity);
                       j.attribute("kind", opName(op.kind));
                       j.attribute("path", row.copies > 1 ? repeatPattern(g.opPath(op))
                                                          : g.opPath(op));
                       j.attributeArray("shape", [&] {
                         for (int64_t x : shape)
                           j.value(x);
                       });
                       number(kOpTime);
                       j.objectEnd();
                     }};
  for (size_t r = 0; r < ops.rows.size(); ++r) {
    OpNumbers numbers = ops.numbers(ops.rows[r], numbersOf);
    for (size_t k = 0; k < kOpNumberCount; ++k)
      if (!std::isfinite(numbers[k]))
        bad.push_back("ops[" + std::to_string(r) + "]." + kOpNumberKeys[k]);
  }
}

/// checkpoint.per_block, streamed; its non-finite numbers are added to `bad`.
void streamPerBlock(const Analysis &a, StreamedArrays &streamed, std::vector<std::string> &bad) {
  streamed["checkpoint.per_block"] = {a.checkpoint.perBlock.size(),
                                      [&a](llvm::json::OStream &j, size_t i) {
                                        const auto &b = a.checkpoint.perBlock[i];
                                        SortedFields f;
                                        f.text("path", b.path);
                                        f.integer("reruns", b.reruns);
                                        f.integer("reselected_ops", b.reselected);
                                        f.number("kept_bytes", b.keptBytes);
                                        f.write(j);
                                      }};
  for (size_t i = 0; i < a.checkpoint.perBlock.size(); ++i)
    if (!std::isfinite(a.checkpoint.perBlock[i].keptBytes))
      bad.push_back("checkpoint.per_block[" + std::to_string(i) + "].kept_bytes");
}

// One function per top-level section of the report (the keys print sorted, writeSorted).

Object parallelJson(const Plan &p) {
  return Object{{"data", p.parallel.data},
                {"tensor", p.parallel.tensor},
                {"pipeline", p.parallel.pipeline},
                {"context", p.parallel.context},
                {"expert", p.parallel.expert},
                // The MoE layers' tensor degree: the tensor degree, or 1 under MoE parallel folding.
                {"expert_tensor", static_cast<int64_t>(expertLayout(p.parallel).etp)},
                {"zero", p.parallel.zero}};
}

Object precisionJson(const Plan &p) {
  return Object{{"preset", p.precision.preset},
                {"params", nameOf(p.precision.params).str()},
                {"grads", nameOf(p.precision.grads).str()},
                {"activations", nameOf(p.precision.activations).str()},
                {"master", p.precision.master == Dtype::Invalid
                               ? llvm::json::Value(nullptr)
                               : llvm::json::Value(nameOf(p.precision.master).str())},
                {"optimizer", nameOf(p.precision.optimizer).str()}};
}

Object paramsJson(const Analysis &a) {
  return Object{{"total", a.params.total},
                {"trainable", a.params.trainable},
                {"active", a.params.active},
                {"by_block", nullptr}}; // streamed
}

Object flopsJson(const Analysis &a) {
  return Object{{"forward", a.flops.forward},
                {"forward_matmul", a.flops.forwardMatmul},
                {"backward", a.flops.backward},
                {"backward_input_grad", a.flops.backwardInputGrad},
                {"backward_weight_grad", a.flops.backwardWeightGrad},
                {"recompute", a.flops.recompute},
                {"optimizer", a.flops.optimizer},
                {"step", a.flops.step},
                {"six_nd", a.flops.sixND},
                {"ratio_to_six_nd", a.flops.ratioToSixND},
                {"executed", a.flops.executed},
                {"tokens_per_step", a.flops.tokensPerStep}};
}

Object memoryJson(const Analysis &a, const Plan &p) {
  Object out{{"per_device", Object{{"params", a.memory.params},
                                      {"grads", a.memory.grads},
                                      {"master", a.memory.master},
                                      {"optimizer", a.memory.optimizer},
                                      {"activations", a.memory.activations},
                                      {"workspace", a.memory.workspace},
                                      {"grad_accum", a.memory.gradAccum},
                                      {"cuda_context", a.memory.context},
                                      {"comm_buffers", a.memory.commBuffers},
                                      {"allocator_reserve", a.memory.allocatorReserve},
                                      {"library_workspace", a.memory.libraryWorkspace},
                                      {"cudnn_workspace", a.memory.cudnnWorkspace},
                                      {"peak", a.memory.peak},
                                      {"capacity", p.target.memoryBytes}}},
                {"host", Object{{"total", a.memory.hostTotal}}},
                {"bytes_per_param", a.memory.bytesPerParam}};
  // ZeRO's transients, only where the plan has them (ZeRO 2 and 3 over more than one rank).
  if (a.memory.zeroGathered > 0 || a.memory.unshardedGrads > 0) {
    Object &per = *out.getObject("per_device");
    per["zero_gathered_params"] = a.memory.zeroGathered;
    per["unsharded_grads"] = a.memory.unshardedGrads;
  }
  return out;
}

Object timeJson(const Analysis &a) {
  return Object{{"step_s", a.time.step},
                {"forward_s", a.time.forward},
                {"backward_s", a.time.backward},
                {"recompute_s", a.time.recompute},
                {"optimizer_s", a.time.optimizer},
                {"communication_s", a.time.communication},
                {"host_transfer_s", a.time.hostTransfer},
                {"bubble_s", a.time.bubble},
                {"run_s", a.time.run},
                {"run_days", a.time.runDays},
                {"steps", a.time.steps},
                {"mfu", a.time.mfu},
                {"hfu", a.time.hfu},
                {"accumulation_steps", a.time.accumulationSteps},
                {"data_parallel_comm_s", a.time.dataParallelComm},
                {"tensor_parallel_comm_s", a.time.tensorParallelComm},
                {"pipeline_comm_s", a.time.pipelineComm},
                {"context_parallel_comm_s", a.time.contextParallelComm},
                {"expert_parallel_comm_s", a.time.expertParallelComm}};
}

/// time.mfu_convention and time.mfu_conventions (train plans; passes/MfuConventions.cpp).
void addMfuConventions(const Analysis &a, Object &time) {
  if (a.time.mfuConventions.empty())
    return;
  Object all;
  for (const Analysis::MfuConvention &c : a.time.mfuConventions)
    all[c.name] = Object{{"flops_per_step", c.flops},
                         {"mfu", c.mfu},
                         {"peak_flops_per_s", a.time.mfuPeak},
                         {"peak", "dense"},
                         {"formula", c.formula},
                         {"source", c.source}};
  time["mfu_convention"] = a.time.mfuConventions.front().name;
  time["mfu_conventions"] = std::move(all);
}

/// Quantized base weights and LoRA (issue 45): present only when the plan has them.
void addFineTuning(const Analysis &a, const Plan &p, Object &root) {
  if (a.params.quantized > 0) {
    const QuantSpec &q = a.dequant.spec;
    double bits = quantBitsPerElement(q);
    root["quantization"] = Object{
        {"dtype", nameOf(q.dtype).str()},
        {"block", q.block},
        {"scale", nameOf(q.scale).str()},
        {"double_quant_block", q.doubleBlock},
        {"bits_per_param", bits},
        {"bytes_per_param", bits / 8},
        {"params", a.params.quantized},
        {"bytes", a.params.quantizedBytes},
        {"dequant", Object{{"matmuls", a.dequant.matmuls},
                           {"bytes", a.dequant.bytes},
                           {"flops", a.dequant.flops},
                           {"forward_s", a.dequant.forward},
                           {"backward_s", a.dequant.backward}}}};
  }
  if (a.fp8.active) { // FP8 training (passes/Fp8.cpp): per micro-batch on one device unless marked
    const Fp8Recipe &r = p.precision.fp8;
    const auto &f = a.fp8;
    root["fp8"] = Object{
        {"format", r.format == Fp8Recipe::Format::Hybrid ? "hybrid" : "e4m3"},
        {"scaling", r.scaling == Fp8Recipe::Scaling::Block     ? "mxfp8"
                    : r.scaling == Fp8Recipe::Scaling::Current ? "current"
                                                               : "delayed"},
        {"amax_history", r.amaxHistory},
        {"keep_first_last_bf16", r.keepFirstLastBf16},
        {"param_gather", r.paramGather},
        {"gemms", f.gemms},
        {"kept_bf16", f.keptBf16},
        {"bytes_per_element", f.storage.bytes},
        {"copies", f.storage.copies},
        {"weight_copies_bytes_per_device", a.memory.fp8Weights},
        {"amax_history_bytes_per_device", a.memory.fp8Meta},
        {"saved_gemm_inputs_bytes", Object{{"before", f.savedBytesBf16}, {"fp8", f.savedBytesFp8}}},
        {"gemm_forward_s", f.gemmForward},
        {"gemm_backward_s", f.gemmBackward},
        {"gemm_forward_bf16_s", f.gemmForwardBf16},
        {"gemm_backward_bf16_s", f.gemmBackwardBf16},
        {"cast_forward_s", f.castForward},
        {"cast_backward_s", f.castBackward},
        {"cast_bytes", f.castBytes},
        {"weight_cast_per_step_s", f.weightCast},
        {"other_ops_s", f.otherForward + f.otherBackward}};
  }
  if (p.lora.r > 0) {
    Array targets;
    for (const std::string &t : p.lora.targets)
      targets.push_back(t);
    root["lora"] = Object{{"r", p.lora.r}, {"alpha", p.lora.alpha}, {"targets", std::move(targets)}};
  }
}

Object fusionJson(const Analysis &a) {
  return Object{{"enabled", a.fusion.enabled},
                {"kernels", static_cast<double>(a.fusion.kernels.size())},
                {"ops", a.fusion.ops},
                {"elementwise_ops", a.fusion.elementwiseOps},
                {"epilogues", a.fusion.epilogues},
                {"launches_saved", a.fusion.launchesSaved},
                {"bytes_saved", a.fusion.bytesSaved}};
}

Object checkpointJson(const Analysis &a) {
  Array options;
  for (const auto &o : a.checkpoint.options)
    options.push_back(Object{{"policy", o.policy},
                             {"checkpointed", o.checkpointed},
                             {"recompute_flops", o.recomputeFlops},
                             {"recompute_s", o.recomputeSeconds},
                             {"bytes", o.bytes}});

  Array saved;
  for (const std::string &s : a.checkpoint.saved)
    saved.push_back(s);
  Array curve;
  for (const auto &pt : a.checkpoint.curve)
    curve.push_back(Object{{"policy", pt.policy},
                           {"checkpointed", pt.checkpointed},
                           {"peak_bytes", pt.peakBytes},
                           {"recompute_flops", pt.recomputeFlops},
                           {"recompute_s", pt.recomputeSeconds}});
  return Object{{"policy", a.checkpoint.policy},
                {"requested", a.checkpoint.requested},
                {"note", a.checkpoint.note},
                {"blocks", a.checkpoint.blocks},
                {"checkpointed", a.checkpoint.checkpointed},
                {"segment", a.checkpoint.segment},
                {"limit_bytes", a.checkpoint.limitBytes},
                {"options", std::move(options)},
                {"curve", std::move(curve)},
                {"per_block", nullptr}, // streamed
                {"saved", std::move(saved)},
                {"recompute_flops", a.checkpoint.recomputeFlops}};
}

Object rooflineJson(const Analysis &a, const Plan &p) {
  return Object{{"ridge_intensity", a.ridge},
                {"peak_flops", a.peakFlops},
                {"bandwidth", p.target.bandwidth}};
}

/// Numbers past a double (a run time of 1e308 tokens) are null, and the report says which:
/// the streamed arrays' (`bad`, found before) and the rest of `value`'s, in one warning
/// diagnostic added to the report and printed.
void warnNonFinite(llvm::json::Value &value, std::vector<std::string> bad) {
  std::vector<std::string> small;
  nullNonFinite(value, "", small);
  bad.insert(bad.end(), small.begin(), small.end());
  if (!bad.empty()) {
    std::string message = "not a finite number (past the range of a double), written as null: ";
    for (size_t i = 0; i < bad.size(); ++i)
      message += (i ? ", " : "") + bad[i];
    value.getAsObject()->getArray("diagnostics")->push_back(
        Object{{"severity", "warning"}, {"code", "overflow"}, {"message", message},
               {"file", ""}, {"line", 0}, {"column", 0}});
    llvm::errs() << "tally: warning: " << message << "\n";
  }
}

} // namespace

void renderJson(const Analysis &a, const DiagnosticEngine &diags, llvm::raw_ostream &os) {
  const Graph &g = *a.graph;
  const Plan &p = *a.plan;

  // The three arrays that grow with the model are written element by element (writeSorted);
  // their non-finite numbers are found first, since "diagnostics" precedes them.
  std::vector<std::string> bad;
  StreamedArrays streamed;
  // The copies of a repeated block that agree in everything but their paths' indices are
  // one row each in params.by_block and ops (report/Copies.h, docs/reports.md): a 100,000-
  // layer GPT has 900,000 block rows and 1.5 million op rows, 99.99% of them repeats.
  CopyGroups instances = instanceCopies(g), opGroups = opCopies(g, instances);
  CopyRows<1> blocks = blockRows(a, instances);
  streamBlocks(a, blocks, streamed, bad);
  OpRows ops = opRows(a, opGroups);
  streamOps(a, ops, streamed, bad);
  streamPerBlock(a, streamed, bad);

  Object root{
      {"model", g.model},
      {"plan", p.name},
      {"kind", p.isTrain ? "train" : "infer"},
      {"target", p.target.name},
      {"devices", p.parallel.devices},
      {"parallel", parallelJson(p)},
      {"batch", p.batch},
      {"seq", p.seq},
      {"micro_batch", p.microBatch},
      {"precision", precisionJson(p)},
      {"optimizer", Object{{"name", p.optimizer.name}, {"states", p.optimizer.states}}},
      {"params", paramsJson(a)},
      {"flops", flopsJson(a)},
      {"memory", memoryJson(a, p)},
      {"time", timeJson(a)},
      {"stack", stackJson(a)},
      {"collectives", collectivesJson(a)},
      {"fusion", fusionJson(a)},
      {"checkpoint", checkpointJson(a)},
      {"ops", nullptr}, // streamed
      {"roofline", rooflineJson(a, p)},
      {"inference", inferenceJson(a, opGroups)},
      {"diagnostics", diagnosticsJson(diags)},
  };
  if (llvm::json::Object *time = root.getObject("time"))
    addMfuConventions(a, *time);
  addFineTuning(a, p, root);
  // The streamed arrays' non-finite numbers were found above, in the order they are written
  // (by key: ops, then params.by_block, after checkpoint.per_block).
  llvm::json::Value value(std::move(root));
  warnNonFinite(value, std::move(bad));
  {
    llvm::json::OStream j(os, 2);
    writeSorted(j, value, "", streamed);
  }
  os << "\n";
}

void nullNonFinite(llvm::json::Value &v, const std::string &path, std::vector<std::string> &replaced) {
  if (llvm::json::Object *o = v.getAsObject()) {
    for (auto &kv : *o)
      nullNonFinite(kv.second, path.empty() ? kv.first.str() : path + "." + kv.first.str(), replaced);
  } else if (llvm::json::Array *a = v.getAsArray()) {
    for (size_t i = 0; i < a->size(); ++i)
      nullNonFinite((*a)[i], path + "[" + std::to_string(i) + "]", replaced);
  } else if (v.kind() == llvm::json::Value::Number) {
    llvm::Optional<double> d = v.getAsNumber();
    if (d && !std::isfinite(*d)) {
      replaced.push_back(path);
      v = nullptr;
    }
  }
}

void printJson(llvm::raw_ostream &os, llvm::json::Value v) {
  std::vector<std::string> replaced;
  nullNonFinite(v, "", replaced);
  os << llvm::formatv("{0:2}", v) << "\n";
}

} // namespace tally
