// The generated training step, for every backend: walks Analysis::stepSchedule and prints one
// runtime call per op of the step graph, every operand an offset into one of the memory plan's
// regions. The CPU and CUDA steps are this one walk; a Backend (codegen/EmitBackend.h; the CPU's
// in EmitCpu.cpp, the CUDA's in EmitCuda.cpp) only spells it: includes, where the op path and
// op class are recorded, reading the loss back from device memory, file names. The emitter's
// pieces share codegen/EmitInternal.h; this file holds 1. and 3.
//
// 1. Where a tensor lives. A view is its base tensor's storage at the view's element offset.
//    Parameters are in the params region, gradients of parameters in the grads region, input
//    data in the data region (one micro-batch, laid out here). Everything else is an arena
//    buffer of the memory plan: the buffer of that tensor live at the schedule step that runs
//    the op (a recomputed tensor has two buffers; the one started last is the live one). A
//    tensor with no live buffer is a disagreement between the step and the memory plan and
//    stops the emitter with an internal error rather than printing a call that reads freed
//    bytes.
// 2. One call per op, by kind (EmitOps.cpp, EmitLayers.cpp; fused runs: EmitFused.cpp): the
//    runtime's signatures (codegen/runtime/API.md) over the tensors' shapes and strides.
//    Matmul operands may be transposed views and carry batch strides; a transposed output
//    computes Cᵀ = Bᵀ·Aᵀ instead. Elementwise kernels take broadcast strides. Accumulate bits
//    become the kernels' `+=`.
// 3. The step: micro_step() runs the forward and backward entries of the schedule for one
//    micro-batch (the recompute entries are the forward calls again, into their own buffers),
//    update() (EmitUpdate.cpp) runs the optimizer entries over the flat regions one parameter
//    at a time (the regions pad each tensor to 256 bytes, which is a different element count
//    per dtype, so a single flat loop over params and master would not line up), and
//    train_step() loops the micro-batches, updates and zeroes the gradients.
// 4. Data parallel (data = N > 1): train_step() calls reduce_gradients() after the
//    micro-batches, which averages G over the N MPI processes in 25 MiB buckets; under ZeRO-1
//    (the memory plan's shard) a reduce-scatter, the update of this rank's pieces (kUpdate by
//    rank) and gather_parameters() (communication() in EmitUpdate.cpp; docs/codegen.md). Under
//    ZeRO 2 and 3 (CPU) micro_step moves the pieces itself (EmitZero.cpp). Tensor parallel:
//    EmitTensor.cpp; pipeline parallel (one namespace of functions per rank): EmitPipeline.cpp.
// The layout (regions, parameter and input tables) goes into kLayout for the driver
// (codegen/program/driver_cpu.cpp), which allocates exactly those bytes.
#include "codegen/EmitInternal.h"

#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cmath>

namespace tally::codegen::emit {

/// The C++ storage type of a dtype in the runtime, or "" when the runtime has none.
std::string ctype(Dtype d) {
  switch (d) {
  case Dtype::F32: return "float";
  case Dtype::BF16: return "rt::bf16";
  case Dtype::F16: return "rt::f16";
  case Dtype::I32: return "int32_t";
  case Dtype::U8: return "uint8_t";
  default: return "";
  }
}

/// The safetensors name of a dtype.
const char *stName(Dtype d) {
  switch (d) {
  case Dtype::F32: return "F32";
  case Dtype::BF16: return "BF16";
  case Dtype::F16: return "F16";
  case Dtype::I32: return "I32";
  case Dtype::U8: return "U8";
  default: return "";
  }
}

/// "h[0].attn.qkv.weight" → "h.0.attn.qkv.weight": the names safetensors files use.
std::string tensorName(llvm::StringRef path) {
  std::string out;
  for (char c : path) {
    if (c == '[')
      out += '.';
    else if (c != ']')
      out += c;
  }
  return out;
}

/// A string literal for C++ (paths and names come from the user's file).
std::string literal(llvm::StringRef s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\')
      out += '\\', out += static_cast<char>(c);
    else if (c < 0x20 || c >= 0x7f)
      out += llvm::formatv("\\{0:o3}", static_cast<unsigned>(c)).str();
    else
      out += static_cast<char>(c);
  }
  return out + "\"";
}

/// A comment-safe copy: no newlines, no "*/", printable ASCII.
std::string commentSafe(llvm::StringRef s) {
  std::string out;
  for (unsigned char c : s)
    out += (c < 0x20 || c >= 0x7f) ? '?' : static_cast<char>(c);
  return out;
}

std::string list(llvm::ArrayRef<int64_t> v) {
  std::string out = "{";
  for (size_t i = 0; i < v.size(); ++i)
    out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "}";
}

std::string number(double v) {
  if (v == 0)
    return "0.0f";
  return llvm::formatv("{0:e9}f", v).str();
}

/// The op class reports use ("matmul", "elementwise", ...): the profile files kernels under it.
/// A backward op's kernels go under its forward op's class, as the estimate files the forward
/// op's backward time (tally run's table compares them class by class): a bias add's gradient
/// reduction and copies are elementwise time, not reduction and data.
std::string className(const Graph &g, const Op &op) {
  const Op &of = op.phase == Phase::Backward && op.forwardOp < g.ops.size() ? g.ops[op.forwardOp] : op;
  return opClassName(opClass(of.kind)).str();
}

bool Emitter::fail(const std::string &why) {
  if (error.empty()) {
    std::string at = op && opt.where ? opt.where(op->range.Start) : "";
    error = op ? "op " + s.opPath(*op) + (at.empty() ? "" : " (" + at + ")") + ": " + why : why;
  }
  return false;
}

// ---- 1. where tensors live ----------------------------------------------------------------

void Emitter::index() {
  paramOffset.clear(), gradOffset.clear(), masterOffset.clear(), dataOffset.clear(), stateOffset.clear();
  dataBytes = 0;
  for (const Region::Entry &e : regions.params.tensors)
    paramOffset[e.tensor] = e.offset;
  for (const Region::Entry &e : regions.grads.tensors)
    gradOffset[e.tensor] = e.offset;
  for (const Region::Entry &e : regions.master.tensors)
    masterOffset[e.tensor] = e.offset;
  for (const Region::Entry &e : regions.optimizer.tensors)
    stateOffset[{e.tensor, e.state}] = e.offset;
  for (TensorId t : s.inputs) {
    dataOffset[t] = dataBytes;
    // The data region is laid out here, not in the memory plan: the same checked sums.
    std::optional<int64_t> n = checkedNumel(s.tensors[t].shape);
    std::optional<int64_t> bytes = n ? checkedMul(*n, static_cast<int64_t>(bytesOf(stored(t)))) : std::nullopt;
    std::optional<int64_t> aligned = bytes ? checkedAlignUp(*bytes) : std::nullopt;
    std::optional<int64_t> end = aligned ? checkedAdd(dataBytes, *aligned) : std::nullopt;
    if (!end) {
      fail("the input data region passes 2^63 - 1 bytes: its offsets do not fit int64");
      return;
    }
    dataBytes = *end;
  }
}

Dtype Emitter::stored(TensorId t) const {
  const Tensor &x = s.tensors[t];
  if (s.tensors[base(t)].role == TensorRole::Input && isFloat(x.dtype))
    return s.activationDtype;
  return x.dtype;
}

std::string Emitter::ptr(TensorId t) {
  const Tensor &x = s.tensors[t];
  TensorId b = base(t);
  const Tensor &bt = s.tensors[b];
  int64_t elem = b == t ? 0 : x.layout.offset();
  if (auto sc = scratchNow.find(b); sc != scratchNow.end()) // sequence parallel: gathered or whole
    return "(" + sc->second + " + " + std::to_string(elem) + ")";
  std::string ty = ctype(stored(t));
  if (ty.empty()) {
    fail("tensor %" + std::to_string(t) + " has dtype " + nameOf(x.dtype).str() +
         ", which the " + title() + " runtime does not store");
    return "nullptr";
  }
  int64_t scale = static_cast<int64_t>(bytesOf(stored(t)));
  auto at = [&](const char *region, int64_t off) {
    return llvm::formatv("{0}<{1}>({2})", region, ty, off + elem * scale).str();
  };
  // ZeRO 3: a parameter is read from its unit's gathered copy; ZeRO 2 and 3: a parameter's
  // gradient of this micro-batch is an arena buffer until it is reduce-scattered (EmitZero.cpp).
  TensorId zeroKey = bt.role == TensorRole::Param && regions.tensorShards >= 3 ? b
                     : pieced() && bt.role == TensorRole::Gradient && bt.gradOf != kNone &&
                               s.tensors[bt.gradOf].role == TensorRole::Param
                         ? s.gradient[bt.gradOf]
                         : kNone;
  if (zeroKey != kNone) {
    const Buffer *live = buffers.liveAt(zeroKey, step);
    if (!live) {
      fail("internal error: " + s.tensorName(b) + " has no ZeRO buffer live at schedule step " + std::to_string(step) +
           " (the step and the memory plan disagree)");
      return "nullptr";
    }
    return arenaAt(live, ty, elem * scale, s.tensorName(b));
  }
  if (bt.role == TensorRole::Param)
    return at("P", paramOffset.at(b));
  if (bt.role == TensorRole::Gradient && bt.gradOf != kNone &&
      s.tensors[bt.gradOf].role == TensorRole::Param) {
    auto it = gradOffset.find(bt.gradOf);
    if (it == gradOffset.end()) {
      fail("the gradient of frozen parameter " + s.tensorName(bt.gradOf) + " has no place");
      return "nullptr";
    }
    return at("G", it->second);
  }
  if (bt.role == TensorRole::Input)
    return at("D", dataOffset.at(b));
  const Buffer *live = buffers.liveAt(b, step);
  if (!live) {
    fail("internal error: tensor %" + std::to_string(b) + " has no arena buffer live at schedule step " +
         std::to_string(step) + " (the step and the memory plan disagree)");
    return "nullptr";
  }
  return arenaAt(live, ty, elem * scale, "tensor %" + std::to_string(b));
}

std::string Emitter::arenaAt(const Buffer *live, const std::string &type, int64_t extra, const std::string &what) {
  if (chunkNow < 0)
    return llvm::formatv("A<{0}>({1})", type, live->offset + extra).str();
  // A pipeline chunk's slot (PipelineStep.cpp): `cb` is its offset.
  const auto &offsets = a.pipelineStep.chunks[static_cast<size_t>(chunkNow)].offset;
  auto it = offsets.find(static_cast<uint32_t>(live - a.buffers.data()));
  if (it == offsets.end()) {
    fail("internal error: " + what + " has no buffer in pipeline stage " + std::to_string(chunkNow) +
         "'s slot at schedule step " + std::to_string(step));
    return "nullptr";
  }
  return llvm::formatv("A<{0}>(cb + {1})", type, it->second + extra).str();
}

/// A `contiguous` that shares its input's buffer (passes/GradientShares.h): no call, only a
/// comment; the memory plan gave both the same bytes, else the step and the plan disagree.
bool Emitter::sharedGradient() {
  std::string from = ptr(op->inputs[0]), to = ptr(op->outputs[0]);
  if (from != to)
    return fail("internal error: " + s.tensorName(op->outputs[0]) + " shares the buffer of " +
                s.tensorName(op->inputs[0]) + " but the memory plan places it apart (" + to + ", " + from + ")");
  body += "\n  // " + commentSafe(s.opPath(*op)) + " (backward): the gradient is the output's, " + to +
          " (no copy)\n";
  return true;
}

std::vector<int64_t> Emitter::strides(TensorId t) const {
  const Tensor &x = s.tensors[t];
  auto d = stridesOf(shape(t), x.layout);
  return std::vector<int64_t>(d.begin(), d.end());
}

std::vector<int64_t> Emitter::sizes(TensorId t) const {
  std::vector<int64_t> v;
  for (const Dim &d : shape(t))
    v.push_back(d.size);
  return v;
}

bool Emitter::needDense(TensorId t, const char *what) {
  if (dense(t))
    return true;
  return fail(std::string(what) + " is a strided view, which this kernel does not read; "
              "the " + title() + " backend needs a contiguous copy here");
}

bool Emitter::sameType(std::initializer_list<TensorId> ts) {
  std::string t0;
  for (TensorId t : ts) {
    if (t == kNone)
      continue;
    std::string ty = T(t);
    if (t0.empty())
      t0 = ty;
    else if (ty != t0)
      return fail("mixes " + t0 + " and " + ty + " operands; the " + title() + " runtime's kernels take one storage type");
  }
  return true;
}

int64_t Emitter::opIndex(const Op *o) {
  if (opIds.empty())
    for (OpId i = 0; i < s.ops.size(); ++i)
      opIds[&s.ops[i]] = static_cast<int64_t>(i);
  auto it = opIds.find(o);
  return it == opIds.end() ? -1 : it->second;
}

std::string Emitter::siteText(const std::string &path, const std::string &cls) {
  if (!be.device) // op_path and op_id: what `tally run --trace` names each kernel call by
    return "  op_class = \"" + cls + "\";\n  op_path = " + literal(path) + "; op_id = " +
           std::to_string(op && s.opPath(*op) == path ? opIndex(op) : -1) + ";\n";
  if (siteClass.emplace(path, cls).second)
    sites.push_back({path, cls});
  return "  ctx.where = " + literal(path) + ";\n";
}

std::vector<int64_t> Emitter::broadcastStrides(TensorId t, const std::vector<int64_t> &out) {
  std::vector<int64_t> st = strides(t), sz = sizes(t), res(out.size(), 0);
  size_t off = out.size() - sz.size();
  for (size_t i = 0; i < sz.size(); ++i)
    res[off + i] = (sz[i] == 1 && out[off + i] != 1) ? 0 : st[i];
  return res;
}

// ---- 3. the step --------------------------------------------------------------------------

std::string Emitter::where(const Op &o) const {
  std::string w = opt.where ? opt.where(o.range.Start) : "";
  return w.empty() ? "" : " — " + commentSafe(w);
}

const char *entryKind(StepEntry::Kind k) {
  static const char *const names[] = {"forward", "backward", "recompute", "optimizer"};
  return names[k];
}

bool Emitter::emitEntry(const StepEntry &se) {
  std::string path = s.opPath(*op);
  body += "\n  // " + commentSafe(path) + " (" + entryKind(se.kind) + ")" + where(*op) + "\n";
  site(path, className(s, *op));
  if (!emitOp() || !error.empty())
    return false;
  if (se.kind == StepEntry::Forward && !op->outputs.empty() && op->outputs[0] == s.loss) {
    if (be.device) // copied on the stream; read_losses() reads every micro-batch's after the graph region
      lossType = ctype(stored(s.loss));
    line(be.device ? "store_loss(ctx, " + ptr(s.loss) + ", m);" : "loss = rt::load(*" + ptr(s.loss) + ");");
  }
  return true;
}

bool Emitter::scheduleEntry(size_t &e, llvm::function_ref<void(size_t, size_t)> ran) {
  const StepEntry &se = a.stepSchedule[e];
  op = &s.ops[se.op];
  step = buffers.stepOf(e);
  if (pieced())
    zeroBefore(e);
  // A view has no code; a `contiguous` that shares its input's buffer (an add's gradient passed
  // on) only a comment.
  const bool shared = op->kind == OpKind::Contiguous && op->attrs->shares;
  if (opClass(op->kind) == OpClass::View || shared) {
    if (shared && !sharedGradient())
      return false;
    if (pieced())
      zeroAfter(e);
    return true;
  }
  // A fused run (passes/Fusion.cpp keeps each in one chunk and one kind of entry), at its first
  // entry; emitStep refuses --fuse with tensor parallelism and with ZeRO 2 and 3.
  if (const Analysis::FusedKernel *f = fusedAt(e)) {
    if (!fused(*f, entryKind(se.kind)) || !error.empty())
      return false;
    ran(e, e + f->count - 1);
    e += f->count - 1;
    return true;
  }
  if (!sequenceBefore(e) || !emitEntry(se)) // sequence parallelism's gathers and reduce-scatters
    return false;
  sequenceAfter(e);
  ran(e, e);
  tensorParallelAfter(e); // the tensor all-reduces (EmitTensor.cpp)
  if (pieced())
    zeroAfter(e);
  return true;
}

bool Emitter::microStep(std::string &outText) {
  std::map<size_t, std::vector<size_t>> startAfter = overlappedBuckets();
  // After entries [from, to] ran: the buckets whose last gradient write was among them.
  auto startBuckets = [&](size_t from, size_t to) {
    for (auto it = startAfter.lower_bound(from); it != startAfter.end() && it->first <= to; ++it)
      for (size_t k : it->second)
        line("if (last) start_bucket(ctx, " + std::to_string(k) + "); // its last gradient is written");
  };
  body.clear();
  for (size_t e = 0; e < a.stepSchedule.size(); ++e)
    if (a.stepSchedule[e].kind != StepEntry::Optimizer && !scheduleEntry(e, startBuckets))
      return false;
  op = nullptr;
  if (be.device) { // the loss goes to device_losses[m]; the graph region calls it (EmitGraph.cpp)
    outText = functors + (overlap() ? "static void start_bucket(rt::Ctx &ctx, int k);\n\n" : "") +
              "/// The forward and backward of micro-batch m (the data region holds it); its loss to\n"
              "/// device_losses[m]." +
              (overlap() ? " In the last micro-batch each gradient bucket's reduction starts once the\n"
                           "/// backward has written it, overlapping the rest of the backward.\n"
                           "static void micro_step(rt::Ctx &ctx, uint64_t seed, int64_t m) {\n"
                           "  [[maybe_unused]] const bool last = m + 1 == kLayout.microSteps;\n"
                         : "\nstatic void micro_step(rt::Ctx &ctx, uint64_t seed, int64_t m) {\n") +
              body + "}\n";
    return true;
  }
  outText = functors +
            (overlap() ? "static void start_bucket(rt::Ctx &ctx, int k);\n\n"
                         "/// The forward and backward of one micro-batch (the data region holds it); its loss. In\n"
                         "/// the last micro-batch (`last`) each gradient bucket's reduction starts once the backward\n"
                         "/// has written it, overlapping the rest of the backward.\n"
                         "static double micro_step(rt::Ctx &ctx, uint64_t seed, bool last) {\n  double loss = 0;\n"
                       : "/// The forward and backward of one micro-batch (the data region holds it); its loss.\n"
                         "static double micro_step(rt::Ctx &ctx, uint64_t seed) {\n  double loss = 0;\n") +
            body + "  return loss;\n}\n";
  return true;
}

std::string Emitter::tables() {
  std::string out = "static const ParamInfo kParams[] = {\n";
  for (size_t index = 0; index < s.params.size(); ++index) {
    const ParamInfo &pi = s.params[index];
    const Tensor &t = s.tensors[pi.tensor];
    // Tensor parallel: the whole parameter (its name, shape and elements in files), of which
    // the regions hold this rank's cut (kParams' tp_dim, tp_parts; TensorShard.cpp).
    const Tensor &whole = a.graph->tensors[pi.tensor];
    std::vector<int64_t> sz;
    for (const Dim &d : whole.shape)
      sz.push_back(d.size);
    TensorShardOf cut = index < a.tensorShards.size() ? a.tensorShards[index] : TensorShardOf{};
    llvm::StringRef leaf = *pi.name; // "weight" of "h[0].ln_1.weight"
    const char *init = sz.size() >= 2 ? "Init::Normal002" : leaf == "weight" ? "Init::Ones" : "Init::Zeros";
    auto g = gradOffset.find(pi.tensor);
    auto m = masterOffset.find(pi.tensor);
    int64_t master = m == masterOffset.end() ? -1 : m->second;
    auto held = paramOffset.find(pi.tensor);
    if (held == paramOffset.end()) { // pipeline: another rank's parameter (offset -1; the same
      // grad and master presence as on its rank, so every rank's whole model is laid out alike)
      bool withMaster = plan.precision.master != Dtype::Invalid && pi.trainable;
      out += llvm::formatv("    {{{{{0}, \"{1}\", {2}, {3}, {4}}, -1, {5}, {6}, {7}, {8}, -1, 1},\n",
                           literal(tensorName(s.paramPath(pi))), stName(t.dtype), sz.size(), list(sz),
                           checkedNumel(whole.shape).value_or(0), boolean(pi.trainable), pi.trainable ? 0 : -1,
                           withMaster ? 0 : -1, init)
                 .str();
      continue;
    }
    if (sharded() && plan.precision.master != Dtype::Invalid && g != gradOffset.end()) { // tally_step.h
      // An element offset of the grads region in master's dtype: wider than the grads' (bf16
      // grads, fp32 master), it can pass int64 where the grads region did not.
      std::optional<int64_t> at = checkedMul(g->second / static_cast<int64_t>(bytesOf(plan.precision.grads)),
                                             static_cast<int64_t>(bytesOf(plan.precision.master)));
      if (!at)
        fail("the master copy of " + s.paramPath(pi) + " is past 2^63 - 1 bytes: its offset does not fit int64");
      master = at.value_or(-1);
    }
    out += llvm::formatv("    {{{{{0}, \"{1}\", {2}, {3}, {4}}, {5}, {6}, {7}, {8}, {9}, {10}, {11}},\n",
                         literal(tensorName(s.paramPath(pi))), stName(t.dtype), sz.size(), list(sz),
                         checkedNumel(whole.shape).value_or(0), paramOffset.at(pi.tensor), boolean(pi.trainable),
                         g == gradOffset.end() ? -1 : g->second, master, init, cut.dim, cut.parts)
               .str();
  }
  if (s.params.empty())
    out += "    {{\"\", \"F32\", 0, {}, 0}, 0, false, -1, -1, Init::Zeros, -1, 1},\n";
  out += "};\n\nstatic const InputInfo kInputs[] = {\n";
  for (TensorId t : s.inputs) {
    const Tensor &x = s.tensors[t];
    std::vector<int64_t> sz = sizes(t);
    bool batched = !x.shape.empty() && x.shape[0].sym != 0 && s.symbols[x.shape[0].sym] == "batch";
    int64_t vocab = 2;
    for (const Op &o : s.ops) // the forward graph's table: a padded head's real rows
      if (o.kind == OpKind::Embedding && base(o.inputs[0]) == t)
        vocab = o.inputs[1] < a.graph->tensors.size() ? a.graph->tensors[o.inputs[1]].shape[0].size
                                                      : shape(o.inputs[1])[0].size;
    out += llvm::formatv("    {{{{{0}, \"{1}\", {2}, {3}, {4}}, {5}, {6}, {7}},\n", literal(s.tensorName(t)), stName(stored(t)),
                         sz.size(), list(sz), n(t), dataOffset.at(t), boolean(batched), vocab)
               .str();
  }
  if (s.inputs.empty())
    out += "    {{\"\", \"F32\", 0, {}, 0}, 0, false, 0},\n";
  return out + "};\n";
}

bool Emitter::checkPlan() {
  const Parallelism &par = plan.parallel;
  if (!plan.isTrain)
    return fail("plan " + plan.name + " is an infer plan; `tally build` generates training steps");
  if (s.loss == kNone)
    return fail("the model returns no loss to train on");
  for (const Op &o : a.graph->ops) // `tally build` analyzes the plan as its own step (Plan::generatedStep)
    if (o.kind == OpKind::CrossEntropy && o.attrs->loss != CrossEntropyKernel::Fused)
      return fail(std::string("the plan was analyzed with the ") + crossEntropyKernelName(o.attrs->loss) +
                  " loss of a framework; the generated step runs cross_entropy as one fused kernel (analyze it "
                  "as `tally build` does, Plan::generatedStep)");
    else if (o.kind == OpKind::RmsNorm && o.attrs->norm != NormKernel::Fused)
      return fail("the plan was analyzed with the eager rms_norm of PyTorch model code; the generated step "
                  "runs rms_norm as one fused kernel (analyze it as `tally build` does, Plan::generatedStep)");
  // Data × tensor runs ZeRO-1 over each data group (rank r's shard of its tensor cut's grads
  // region by its data rank), and ZeRO 2 and 3 (rank r's pieces of each tensor of its cut, by
  // its data rank), with a separate master copy cut as the optimizer state is (driver_host.h
  // WholeModel::part), with sequence parallelism too: the norms' gradients, partial sums over the
  // tensor group, are all-reduced over it after the data group's reduction (under ZeRO 2 and 3 in
  // their data pieces: sequenceGradients).
  // Sequence parallelism runs alone and with data parallelism (each data rank's tensor group
  // gathers and scatters its own rows; the data group then reduces the grads region as dp2tp2).
  const bool sequenceRefused = par.sequenceParallel && be.device;
  const bool pipelineRefused = par.pipeline != 1 && be.device; // tensor x pipeline: the CPU's MPI ranks
  if (par.tensor > 1 && (sequenceRefused || plan.fuseKernels || pipelineRefused ||
                         par.context != 1 || par.expert != 1)) {
    std::string how =
        sequenceRefused && be.device
            ? "without sequence_parallel (its gathers and reduce-scatters run on the CPU backend's MPI ranks, not "
              "over NCCL yet)"
        : plan.fuseKernels ? std::string("without fused kernels (build it ") +
                                 (be.device ? "with --fuse=false)" : "without --fuse)")
        : pipelineRefused ? std::string("on its own, not with pipeline parallelism yet (the CPU backend runs tensor x "
                                        "pipeline, under MPI)")
                     : "on its own or with data or pipeline parallelism, not with context or expert parallelism";
    return fail("tensor = " + std::to_string(par.tensor) + ": the " + title() + " backend runs tensor parallelism " + how);
  }
  if (par.tensor > 1 && be.device && par.data > 1) // tally_comm_nccl.h splits the groups; not run yet
    return fail("tensor = " + std::to_string(par.tensor) + ": the " + title() + " backend runs tensor parallelism "
                "on its own, not with data parallelism yet (the CPU backend runs data x tensor, under MPI)");
  if (par.tensor > 1 && !a.tensorStepError.empty()) {
    op = a.tensorStepOp < s.ops.size() ? &s.ops[a.tensorStepOp] : nullptr;
    std::string why = a.tensorStepError;
    if (op && llvm::StringRef(why).startswith("op " + s.opPath(*op) + " ")) // fail() names it, with its line
      why = why.substr(why.find(')') + 1);
    return fail("tensor = " + std::to_string(par.tensor) + (op ? " (" + opName(op->kind).str() + ")" : "") +
                (op ? why : ": " + why));
  }
  if (par.tensor > 1 && (!plan.tensorStep || par.tensor > 4096))
    return fail("tensor = " + std::to_string(par.tensor) + ": the plan was not analyzed as the generated step runs it");
  if (pipelined() && !checkPipeline())
    return false;
  if (par.devices != par.tensor * par.pipeline * par.data || par.context != 1 || par.expert != 1)
    return fail("the " + title() + " backend runs data, tensor and pipeline parallelism (processes under " +
                be.parallelEngine + "), not context or expert parallelism (this plan: data " + std::to_string(par.data) + ", tensor " + std::to_string(par.tensor) + ", pipeline " +
                std::to_string(par.pipeline) + ", context " + std::to_string(par.context) + ", expert " +
                std::to_string(par.expert) + ")");
  if (par.data > 1 && par.zero > 1 && be.device)
    return fail("ZeRO stage " + std::to_string(par.zero) + ": the " + title() + " backend shards the optimizer "
                "state and master weights (zero = 1), not the gradients or parameters (the CPU backend runs "
                "ZeRO 2 and 3)");
  if (par.data > 1 && par.zero > 1 && plan.fuseKernels)
    return fail("ZeRO stage " + std::to_string(par.zero) + " with fused kernels (--fuse): the " + title() +
                " step moves gradient and parameter pieces between single ops; build it without --fuse");
  if (par.data > 1 && par.reduceEveryGiven && par.reduceEveryMicroBatch != (par.zero >= 2))
    return fail(std::string("reduce_every_micro_batch = ") + (par.reduceEveryMicroBatch ? "true" : "false") +
                ": the " + title() + " step reduces the gradients " +
                (par.zero >= 2 ? "after every micro-batch under ZeRO 2 and 3" : "once per step below ZeRO 2") +
                "; build it without the setting");
  if (par.data > 1 && par.zero >= 3 && (!par.reshardAfterForward || !par.prefetch))
    return fail(std::string(par.prefetch ? "reshard_after_forward" : "prefetch") + " = false: the " + title() +
                " step runs ZeRO 3 as its estimate prices it (each block gathered before its forward and again "
                "before its backward); build it without the setting");
  if (par.data > 1 && par.zero > 1 && !pieced())
    return fail("ZeRO stage " + std::to_string(par.zero) + ": the memory plan has no per-rank pieces");
  if (par.data > 1 && (par.data > 4096 || plan.batch % (plan.microBatch * par.data) != 0))
    return fail("data = " + std::to_string(par.data) + " does not divide the batch of " + std::to_string(plan.batch) +
                " into whole micro-batches of " + std::to_string(plan.microBatch) + " per rank");
  for (TensorId t : s.inputs)
    if (ctype(stored(t)).empty())
      return fail("input " + s.tensorName(t) + " has dtype " + nameOf(s.tensors[t].dtype).str());
  if (plan.microBatch <= 0 || plan.batch % plan.microBatch != 0)
    return fail("the batch is not a whole number of micro-batches");
  return true;
}

std::string Emitter::deviceHelpers() const {
  if (!be.device)
    return "";
  return "/// Micro-batches per step on this rank (kLayout.microSteps): device_losses holds one slot each.\n"
         "constexpr int64_t kMicroSteps = " + std::to_string(plan.batch / (plan.microBatch * plan.parallel.data)) + ";\n"
         "/// A scalar of device memory read on the host (the fp16 overflow check's sum of\n"
         "/// squares): copied on the step's stream, which is then waited for. Every call is checked.\n"
         "template <class T> double device_load(rt::Ctx &ctx, const T *p) {\n"
         "  T v;\n"
         "  rt::cu::check(cudaMemcpyAsync(&v, p, sizeof(T), cudaMemcpyDeviceToHost, ctx.stream), \"cudaMemcpyAsync\",\n"
         "                \"device_load\", ctx.where);\n"
         "  rt::cu::check(cudaStreamSynchronize(ctx.stream), \"cudaStreamSynchronize\", \"device_load\", ctx.where);\n"
         "  return rt::load(v);\n"
         "}\n"
         "/// The loss of micro-batch m to device_losses[m] (8 bytes each), on the stream: no host wait\n"
         "/// inside the graph region; read_losses() reads them all after it.\n"
         "template <class T> void store_loss(rt::Ctx &ctx, const T *p, int64_t m) {\n"
         "  static_assert(sizeof(T) <= 8, \"a loss fits its 8-byte slot\");\n"
         "  rt::cu::check(cudaMemcpyAsync(device_losses + 8 * m, p, sizeof(T), cudaMemcpyDeviceToDevice, ctx.stream),\n"
         "                \"cudaMemcpyAsync\", \"store_loss\", ctx.where);\n"
         "}\n"
         "/// The sum of every micro-batch's loss: one copy of device_losses and one stream synchronise.\n"
         "template <class T> double read_losses(rt::Ctx &ctx) {\n"
         "  uint8_t slots[8 * kMicroSteps];\n"
         "  rt::cu::check(cudaMemcpyAsync(slots, device_losses, sizeof slots, cudaMemcpyDeviceToHost, ctx.stream),\n"
         "                \"cudaMemcpyAsync\", \"read_losses\", ctx.where);\n"
         "  rt::cu::check(cudaStreamSynchronize(ctx.stream), \"cudaStreamSynchronize\", \"read_losses\", ctx.where);\n"
         "  double sum = 0;\n"
         "  for (int64_t m = 0; m < kMicroSteps; ++m) {\n"
         "    T v;\n"
         "    std::memcpy(&v, slots + 8 * m, sizeof(T));\n"
         "    sum += rt::load(v);\n"
         "  }\n"
         "  return sum;\n"
         "}\n";
}

std::string Emitter::opSites() const {
  if (!be.device)
    return "";
  std::string out = "const OpSite kOpSites[] = {\n";
  for (const auto &[path, cls] : sites)
    out += "    {" + literal(path) + ", " + literal(cls) + "},\n";
  if (sites.empty())
    out += "    {\"\", \"\"},\n";
  return out + "};\nconst int kNumOpSites = " + std::to_string(sites.size()) + ";\n\n";
}

std::string Emitter::layoutRow(const std::string &params, const std::string &inputs, int64_t arena, int64_t stage) {
  const Graph &g = *a.graph;
  double lossScale = plan.precision.lossScaling ? kLossScale : 1.0;
  int64_t data = plan.parallel.data;
  return llvm::formatv("{{{0}, {1}, {2}, \"{3}\", {4}, {5}, {6}, {7}, {8}, {9}, \"{10}\", \"{11}\", {12}, {13}, {14}, "
                       "{15}, {16}, {17}, {18}, {19}, {20}, {21}, {22}, {23}, {24}, {25}, {26}, {27}, {28}}",
                       literal(g.model), literal(plan.name), literal(opt.source), be.name, arena, regions.params.bytes,
                       regions.grads.bytes, regions.master.bytes, regions.optimizer.bytes, dataBytes,
                       stName(plan.precision.grads),
                       plan.precision.master == Dtype::Invalid ? "" : stName(plan.precision.master), plan.batch,
                       plan.microBatch, plan.batch / (plan.microBatch * data), number(lossScale),
                       llvm::formatv("{0:e6}", a.flops.step).str(), s.params.empty() ? 0 : s.params.size(),
                       s.inputs.size(), params, inputs, data, sharded() ? 1 : regions.tensorShards, regions.shard,
                       plan.parallel.tensor, plan.parallel.pipeline, stage, rankStride(plan, 't'),
                       rankStride(plan, 'd'))
      .str();
}

std::string Emitter::stepSource(const std::string &micro, const std::string &upd, const std::string &zero) {
  const Graph &g = *a.graph;
  double lossScale = plan.precision.lossScaling ? kLossScale : 1.0;
  std::string src;
  llvm::raw_string_ostream os(src);
  os << "// Generated by `tally build` from " << commentSafe(opt.source) << ", plan " << commentSafe(plan.name)
     << ": the training step of " << commentSafe(g.model) << " " << be.machine << ".\n"
     << "// One call per op of the step graph (`tally report --emit=ir`), in the order of the schedule\n"
     << "// (`tally report --emit=memory-plan`); every operand is a byte offset into one region:\n"
     << "//   A arena " << a.arenaBytes << " B, P params " << regions.params.bytes << " B, G grads "
     << regions.grads.bytes << " B, M master " << regions.master.bytes << " B,\n"
     << "//   O optimizer state " << regions.optimizer.bytes << " B, D data " << dataBytes << " B.\n"
     << "// Kernels: runtime/" << be.runtimeHeader << " (codegen/runtime/API.md). Rewritten by every `tally build`.\n"
     << "#include \"" << be.runtimeHeader << "\"\n#include \"driver/tally_step.h\"\n" << be.extraIncludes
     << (multiRank() ? "#include \"" + std::string(be.commHeader) + "\"\n\n#include <algorithm>\n" : "\n")
     << "#include <cmath>\n\n"
     << "namespace tally_step {\n\nMemory mem;\nconst char *op_class = \"\";\n" +
            std::string(be.device ? "" : "const char *op_path = \"\";\nint op_id = -1;\n") + "\nnamespace {\n\n"
     << "template <class T> T *A(int64_t off) { return reinterpret_cast<T *>(mem.arena + off); }\n"
     << "template <class T> T *P(int64_t off) { return reinterpret_cast<T *>(mem.params + off); }\n"
     << "template <class T> T *G(int64_t off) { return reinterpret_cast<T *>(mem.grads + off); }\n"
     << "template <class T> T *M(int64_t off) { return reinterpret_cast<T *>(mem.master + off); }\n"
     << "template <class T> T *O(int64_t off) { return reinterpret_cast<T *>(mem.optimizer + off); }\n"
     << "template <class T> T *D(int64_t off) { return reinterpret_cast<T *>(mem.data + off); }\n"
     << "/// Shapes and strides passed inline: dims{{16, 64}} converts to const int64_t *.\n"
     << "struct dims {\n  int64_t v[8];\n  operator const int64_t *() const { return v; }\n};\n"
     << (be.device ? "[[maybe_unused]] " : "") << "constexpr float kLossScale = " << number(lossScale) << ";\n" << deviceHelpers() << "\n"
     << (pipelined() ? micro : tables() + "\n" + micro + "\n" + upd + "\n" + zero + "\n")
     << "} // namespace\n\n"
     << opSites();
  if (pipelined()) { // the ranks' layouts and the train_step that picks one (EmitPipeline.cpp)
    os << upd << "} // namespace tally_step\n";
    os.flush();
    return src;
  }
  os << "Layout kLayout = " << layoutRow("kParams", "kInputs", a.arenaBytes, 0) << ";\n"
     << "void select_stage(int) {}\n\n";
  // After the micro-batches: the reduction (data parallel), the update, --dump-grads, zero_grad.
  // The CUDA step waits for its overlapped reductions inside its graph region (EmitGraph.cpp).
  // The driver's gradient check runs once the gradients are complete, before the update.
  // Sequence parallel: the norms' and biases' gradients (partial sums on each tensor rank) are
  // summed over the tensor group after the data group's reduction, as Megatron-LM's
  // finalize_model_grads runs finish_grad_sync before _allreduce_layernorm_grads: the overlapped
  // buckets reduce them in the last micro-batch, so the other paths keep that order too (under
  // ZeRO-1 the rank's shard of them is the data group's sum, the rest is not read).
  const std::string check = "  if (check_gradients)\n    check_gradients();\n";
  const std::string sequence = sequenceGradients();
  std::string tail;
  if (dataParallel() && pieced()) // each gradient was reduce-scattered when the backward completed it
    tail = sequence + check + "  if (before_zero)\n    before_zero();\n  *updated = update(ctx, step);\n";
  else if (dataParallel())
    tail = std::string(be.device && overlap() ? "" : "  reduce_gradients(ctx);\n") + sequence + check +
           "  if (before_zero) {\n" + (sharded() ? "    gather_gradients(ctx);\n" : "") +
           "    before_zero();\n  }\n  *updated = update(ctx, step);\n";
  else
    tail = sequence + check + "  *updated = update(ctx, step);\n  if (before_zero)\n    before_zero();\n";
  tail += "  zero_grad(ctx);\n";
  if (be.device)
    os << deviceTrainStep(tail);
  else
    os << "double train_step(rt::Ctx &ctx, int64_t step, uint64_t seed, void (*load_micro_batch)(int64_t m),\n"
       << "                  void (*before_zero)(), bool *updated, void (*check_gradients)()) {\n"
       << "  double loss = 0;\n"
       << "  for (int64_t m = 0; m < kLayout.microSteps; ++m) {\n"
       << "    load_micro_batch(m);\n"
       << (overlap() ? "    loss += micro_step(ctx, seed + static_cast<uint64_t>(m), m + 1 == kLayout.microSteps);\n"
                     : "    loss += micro_step(ctx, seed + static_cast<uint64_t>(m));\n")
       << "  }\n" << tail << "  return loss / static_cast<double>(kLayout.microSteps);\n}\n\n";
  os << "} // namespace tally_step\n";
  os.flush();
  return src;
}

/// The embedded template named `name` (codegen/templates/), or null.
static const char *cmakeTemplate(llvm::StringRef name) {
  for (const RuntimeFile &f : cmakeTemplates())
    if (name == f.path)
      return f.text;
  return nullptr;
}

std::string Emitter::cmakeLists(const std::vector<File> &files) {
  const char *text = cmakeTemplate(be.cmakeTemplate);
  // MPI only for a step that runs on several processes.
  const char *dataParallelText = multiRank() ? cmakeTemplate(be.dataParallelCmakeTemplate) : "";
  if (!text || !dataParallelText)
    return fail(std::string("internal error: no CMake template ") +
                (text ? be.dataParallelCmakeTemplate : be.cmakeTemplate) + " in codegen/templates"),
           "";
  std::string out = text;
  auto fill = [&](llvm::StringRef placeholder, llvm::StringRef value) {
    size_t at = out.find(placeholder.str());
    if (at != std::string::npos)
      out.replace(at, placeholder.size(), value.str());
  };
  fill("@STEP_SOURCE@", be.stepFile);
  std::string kernelSources; // the backend's kernel files (the CPU's kernels_*.cpp)
  for (const File &f : files)
    if (llvm::StringRef(f.path).startswith("kernels_") && llvm::StringRef(f.path).endswith(".cpp"))
      kernelSources += " " + f.path;
  fill("@KERNEL_SOURCES@", kernelSources);
  fill("@DATA_PARALLEL@\n", dataParallelText);
  if (out.find('@') != std::string::npos)
    return fail(std::string("internal error: a placeholder of codegen/templates/") + be.cmakeTemplate +
                " is not filled in"),
           "";
  return out;
}

bool Emitter::run(std::vector<File> &files) {
  if (!a.planOverflow.empty())
    return fail("the memory plan does not fit in 64-bit byte offsets: " + a.planOverflow);
  index();
  if (!error.empty() || !checkPlan())
    return false;
  indexZeroMoves();
  if (!indexTensorParallel())
    return false;
  std::string micro, upd, zero;
  if (pipelined() ? !pipelineSource(micro, upd) : !microStep(micro) || !update(upd, zero))
    return false;
  std::string src = stepSource(micro, upd, zero);
  if (!error.empty()) // tables() found an offset past int64
    return false;
  files.push_back({be.stepFile, src});
  if (be.kernelFiles)
    be.kernelFiles(src, files);
  std::string cmake = cmakeLists(files);
  if (!error.empty())
    return false;
  files.push_back({"CMakeLists.txt", cmake});
  for (const RuntimeFile &f : runtimeFiles()) {
    llvm::StringRef p(f.path);
    bool skipped = false;
    for (const char *prefix : be.skip)
      skipped = skipped || (prefix && p.startswith(prefix));
    if (!skipped)
      files.push_back({"runtime/" + p.str(), f.text});
  }
  return true;
}

} // namespace tally::codegen::emit

namespace tally::codegen {

std::string emitStep(const Analysis &a, const EmitOptions &options, const Backend &be, std::vector<File> &out) {
  if (!a.step || !a.plan || !a.graph)
    return "nothing to generate: the plan was not analyzed";
  // Quantized weights (int8, int4, nf4 storage; issue 45): tally prices them but its runtime
  // has no dequantization kernels.
  for (const ParamInfo &p : a.graph->params) {
    Dtype d = a.graph->tensors[p.tensor].dtype;
    if (!isQuantized(d))
      continue;
    std::string at = options.where ? options.where(p.range.Start) : "";
    return "parameter " + a.graph->paramPath(p) + (at.empty() ? "" : " (" + at + ")") +
           " is stored in " + nameOf(d).str() +
           ": the generated step has no quantized-weight kernels (tally report prices the "
           "dequantization; docs/precision.md, \"Quantized base weights\")";
  }
  // FP8 training (issue 45): tally prices Transformer Engine's recipe, but its runtime has no
  // fp8 GEMM or cast kernels.
  if (a.plan->precision.fp8.enabled())
    return "precision " + a.plan->precision.preset +
           " runs the GEMMs in fp8: the generated step has no fp8 GEMM or cast kernels (tally "
           "report prices them; docs/precision.md, \"FP8 training\"); build the plan with "
           "--precision mixed_bf16";
  emit::Emitter e(a, options, be);
  if (!e.run(out))
    return e.error.empty() ? "the step could not be generated" : e.error;
  if (options.notes && be.device)
    for (const std::string &line : e.graphNotes())
      options.notes->push_back("cuda graph: " + line);
  if (options.notes)
    for (const auto &[line, n] : e.attentionEngines)
      options.notes->push_back("attention: " + line + " (" + std::to_string(n.first) + " call" +
                               (n.first == 1 ? "" : "s") + ", first " + n.second + ")");
  if (std::string pad = headPaddingNote(*a.graph, a.headPad); options.notes && !pad.empty())
    options.notes->push_back(pad);
  return "";
}

} // namespace tally::codegen
