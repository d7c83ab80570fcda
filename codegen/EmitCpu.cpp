// The generated training step, for every backend: walks Analysis::stepSchedule and prints one
// runtime call per op of the step graph, every operand an offset into one of the memory plan's
// regions. The CPU and CUDA steps are this one walk; a Backend (codegen/EmitBackend.h; the CPU's
// at the end of this file, the CUDA's in EmitCuda.cpp) only spells it: includes, where the op
// path and op class are recorded, reading the loss back from device memory, file names.
//
// 1. Where a tensor lives. A view is its base tensor's storage at the view's element offset.
//    Parameters are in the params region, gradients of parameters in the grads region, input
//    data in the data region (one micro-batch, laid out here). Everything else is an arena
//    buffer of the memory plan: the buffer of that tensor live at the schedule step that runs
//    the op (a recomputed tensor has two buffers; the one started last is the live one). A
//    tensor with no live buffer is a disagreement between the step and the memory plan and
//    stops the emitter with an internal error rather than printing a call that reads freed
//    bytes.
// 2. One call per op, by kind: the runtime's signatures (codegen/runtime/API.md) over the
//    tensors' shapes and strides. Matmul operands may be transposed views and carry batch
//    strides; a transposed output computes Cᵀ = Bᵀ·Aᵀ instead. Elementwise kernels take
//    broadcast strides. Accumulate bits become the kernels' `+=`.
// 3. The step: micro_step() runs the forward and backward entries of the schedule for one
//    micro-batch (the recompute entries are the forward calls again, into their own buffers),
//    update() runs the optimizer entries over the flat regions one parameter at a time (the
//    regions pad each tensor to 256 bytes, which is a different element count per dtype, so
//    a single flat loop over params and master would not line up), and train_step() loops the
//    micro-batches, updates and zeroes the gradients.
// 4. Data parallel (data = N > 1, CPU only): train_step() calls reduce_gradients() after the
//    micro-batches, which averages G over the N MPI processes in 25 MiB buckets; under ZeRO-1
//    (the memory plan's shard) a reduce-scatter, the update of this rank's pieces (kUpdate by
//    rank) and gather_parameters() (communication(); docs/codegen.md).
// The layout (regions, parameter and input tables) goes into kLayout for the driver
// (codegen/driver/driver_cpu.cpp), which allocates exactly those bytes.
#include "codegen/EmitBackend.h"

#include "ir/OpRules.h"
#include "passes/Fusion.h"
#include "passes/Passes.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <unordered_map>

namespace tally::codegen {

namespace {

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

struct Emitter {
  const Analysis &a;
  const Graph &s;
  const Plan &plan;
  const EmitOptions &opt;
  const Backend &be;
  std::string error;
  std::string body;            ///< the function being written
  uint32_t step = 0;           ///< the schedule step of the entry being written
  const Op *op = nullptr;      ///< the op being written (for messages)

  BufferIndex buffers;          ///< the memory plan's buffers by tensor; each entry's schedule step
  std::unordered_map<TensorId, int64_t> paramOffset, gradOffset, masterOffset, dataOffset;
  std::map<std::pair<TensorId, unsigned>, int64_t> stateOffset;
  int64_t dataBytes = 0;
  /// Device backends: the op class of every op path set in ctx.where (kOpSites), in order.
  std::vector<std::pair<std::string, std::string>> sites;
  std::map<std::string, std::string> siteClass;

  Emitter(const Analysis &a, const EmitOptions &o, const Backend &be)
      : a(a), s(*a.step), plan(*a.plan), opt(o), be(be), buffers(a) {}

  /// The backend's name in messages: "CPU", "CUDA".
  std::string title() const { return be.title; }

  bool fail(const std::string &why) {
    if (error.empty()) {
      std::string at = op && opt.where ? opt.where(op->range.Start) : "";
      error = op ? "op " + s.opPath(*op) + (at.empty() ? "" : " (" + at + ")") + ": " + why : why;
    }
    return false;
  }

  // ---- 1. where tensors live ----------------------------------------------------------------

  void index() {
    for (const Region::Entry &e : a.regions.params.tensors)
      paramOffset[e.tensor] = e.offset;
    for (const Region::Entry &e : a.regions.grads.tensors)
      gradOffset[e.tensor] = e.offset;
    for (const Region::Entry &e : a.regions.master.tensors)
      masterOffset[e.tensor] = e.offset;
    for (const Region::Entry &e : a.regions.optimizer.tensors)
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

  TensorId base(TensorId t) const { return s.tensors[t].viewOf == kNone ? t : s.tensors[t].viewOf; }

  /// The dtype a tensor is stored in: its own, except float input data, which the driver
  /// stores in the activations' dtype (the first op reads it as mixed precision would cast it).
  Dtype stored(TensorId t) const {
    const Tensor &x = s.tensors[t];
    if (s.tensors[base(t)].role == TensorRole::Input && isFloat(x.dtype))
      return s.activationDtype;
    return x.dtype;
  }

  /// `A<float>(8192)`: a pointer to tensor t's first element at the current step.
  std::string ptr(TensorId t) {
    const Tensor &x = s.tensors[t];
    TensorId b = base(t);
    const Tensor &bt = s.tensors[b];
    int64_t elem = b == t ? 0 : x.layout.offset();
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
    return at("A", live->offset);
  }

  int64_t n(TensorId t) const { return checkedNumel(s.tensors[t].shape).value_or(0); }
  const Shape &shape(TensorId t) const { return s.tensors[t].shape; }
  int64_t last(TensorId t) const { return shape(t).empty() ? 1 : shape(t).back().size; }
  std::string T(TensorId t) const { return ctype(stored(t)); }
  bool dense(TensorId t) const { return isDense(shape(t), s.tensors[t].layout); }
  std::vector<int64_t> strides(TensorId t) const {
    const Tensor &x = s.tensors[t];
    auto d = stridesOf(x.shape, x.layout);
    return std::vector<int64_t>(d.begin(), d.end());
  }
  std::vector<int64_t> sizes(TensorId t) const {
    std::vector<int64_t> v;
    for (const Dim &d : shape(t))
      v.push_back(d.size);
    return v;
  }
  bool needDense(TensorId t, const char *what) {
    if (dense(t))
      return true;
    return fail(std::string(what) + " is a strided view, which this kernel does not read; "
                "the " + title() + " backend needs a contiguous copy here");
  }
  bool sameType(std::initializer_list<TensorId> ts) {
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

  // ---- 2. one call per op -------------------------------------------------------------------

  void line(const std::string &text) { body += "  " + text + "\n"; }

  /// Says which op runs now: the `op_class` global the CPU kernel timer reads, or on a device
  /// `ctx.where = "<op path>"` (the CUDA runtime names it in every error) with the path's op
  /// class recorded for the driver's kOpSites table.
  void site(const std::string &path, const std::string &cls) { body += siteText(path, cls); }
  /// site()'s line, for text written outside the function being built.
  std::string siteText(const std::string &path, const std::string &cls) {
    if (!be.device)
      return "  op_class = \"" + cls + "\";\n";
    if (siteClass.emplace(path, cls).second)
      sites.push_back({path, cls});
    return "  ctx.where = " + literal(path) + ";\n";
  }

  bool acc(unsigned i = 0) const { return i < 32 && (op->accumulate & (1u << i)); }
  const char *boolean(bool b) const { return b ? "true" : "false"; }

  /// The broadcast strides of operand t over an output of shape `out`.
  std::vector<int64_t> broadcastStrides(TensorId t, const std::vector<int64_t> &out) {
    std::vector<int64_t> st = strides(t), sz = sizes(t), res(out.size(), 0);
    size_t off = out.size() - sz.size();
    for (size_t i = 0; i < sz.size(); ++i)
      res[off + i] = (sz[i] == 1 && out[off + i] != 1) ? 0 : st[i];
    return res;
  }

  struct MatOperand {
    bool trans = false;
    int64_t rows = 1, cols = 1, ld = 1, batch = 1, batchStride = 0;
    std::string p;
  };
  /// A matmul operand: its last two dimensions as a (possibly transposed) row-major matrix,
  /// the others as one batch with one stride. `vectorAs`: how a rank-1 tensor stands as a
  /// matrix ('r' one row, 'c' one column).
  bool operand(TensorId t, char vectorAs, MatOperand &m) {
    std::vector<int64_t> sz = sizes(t), st = strides(t);
    if (sz.size() == 1) {
      if (vectorAs == 'r') {
        sz = {1, sz[0]};
        st = {sz[1], st[0]};
      } else {
        sz = {sz[0], 1};
        st = {st[0], 1};
      }
    } else if (sz.empty()) {
      sz = {1, 1};
      st = {1, 1};
    }
    size_t r = sz.size();
    m.rows = sz[r - 2];
    m.cols = sz[r - 1];
    if (st[r - 1] == 1 || m.cols == 1) {
      m.trans = false;
      m.ld = std::max<int64_t>({st[r - 2], m.cols, 1});
      if (m.rows == 1)
        m.ld = std::max<int64_t>(m.cols, 1);
    } else if (st[r - 2] == 1 || m.rows == 1) {
      m.trans = true;
      m.ld = std::max<int64_t>({st[r - 1], m.rows, 1});
      if (m.cols == 1)
        m.ld = std::max<int64_t>(m.rows, 1);
    } else {
      return fail("a matmul operand has neither unit row nor unit column stride");
    }
    m.batch = 1;
    m.batchStride = 0;
    for (size_t i = 0; i + 2 < r; ++i) {
      m.batch *= sz[i];
      if (sz[i] > 1)
        m.batchStride = st[i]; // acceptsLayout: the batch dimensions collapse to the innermost
    }
    m.p = ptr(t);
    return true;
  }

  bool matmul() {
    TensorId ta = op->inputs[0], tb = op->inputs[1], tc = op->outputs[0];
    if (!sameType({ta, tb, tc}))
      return false;
    MatOperand A, B, C;
    char cv = shape(ta).size() == 1 ? 'r' : 'c';
    if (!operand(ta, 'r', A) || !operand(tb, 'c', B) || !operand(tc, cv, C))
      return false;
    if (C.trans) { // Cᵀ = Bᵀ·Aᵀ: swap the operands and flip every transposition
      std::swap(A, B);
      A.trans = !A.trans;
      B.trans = !B.trans;
      std::swap(A.rows, A.cols);
      std::swap(B.rows, B.cols);
      std::swap(C.rows, C.cols);
      C.trans = false;
    }
    // rows and cols are the logical op(A), op(B), C dimensions; `trans` only says how the
    // storage holds them.
    int64_t M = C.rows, N = C.cols, K = A.cols;
    if (A.rows != M || B.rows != K || B.cols != N)
      return fail("matmul operands of " + std::to_string(A.rows) + "x" + std::to_string(A.cols) + " and " +
                  std::to_string(B.rows) + "x" + std::to_string(B.cols) + " do not give " +
                  std::to_string(M) + "x" + std::to_string(N));
    int64_t batch = C.batch;
    if ((A.batch != batch && A.batch != 1) || (B.batch != batch && B.batch != 1))
      return fail("matmul batch dimensions broadcast partially, which the " + title() + " backend does not run");
    int64_t sA = A.batch == 1 ? 0 : A.batchStride, sB = B.batch == 1 ? 0 : B.batchStride;
    int64_t sC = batch == 1 ? 0 : C.batchStride;
    // A batch against one weight with rows that run on across the batch is one big product.
    if (batch > 1 && sB == 0 && !A.trans && sA == M * A.ld && sC == M * C.ld) {
      M *= batch;
      batch = 1;
      sA = sC = 0;
    }
    if (!epilogueBias.empty()) { // the bias epilogue: one product into the add's output
      if (batch != 1 || acc() || C.ld != N)
        return fail("internal error: a bias epilogue on a batched, accumulating or strided product");
      line(llvm::formatv("rt::matmul_bias<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12});",
                         T(tc), boolean(A.trans), boolean(B.trans), M, N, K, A.p, A.ld, B.p, B.ld, epilogueBias,
                         epilogueOut, C.ld)
               .str());
      return true;
    }
    line(llvm::formatv("rt::matmul<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, 1.0f, {6}, {7}, {8}, {9}, {10}, {11}, "
                       "{12}, {13}, {14}, {15}, {16});",
                       T(tc), boolean(A.trans), boolean(B.trans), M, N, K, A.p, A.ld, sA, B.p, B.ld, sB,
                       acc() ? "1.0f" : "0.0f", C.p, C.ld, sC, batch)
             .str());
    return true;
  }

  static const char *binOp(OpKind k) {
    switch (k) {
    case OpKind::Add: return "rt::BinOp::Add";
    case OpKind::Sub: return "rt::BinOp::Sub";
    case OpKind::Mul: return "rt::BinOp::Mul";
    default: return "rt::BinOp::Div";
    }
  }
  static const char *unOp(OpKind k) {
    switch (k) {
    case OpKind::Neg: return "rt::UnOp::Neg";
    case OpKind::Relu: return "rt::UnOp::Relu";
    case OpKind::Gelu: return "rt::UnOp::Gelu";
    case OpKind::Silu: return "rt::UnOp::Silu";
    case OpKind::Tanh: return "rt::UnOp::Tanh";
    case OpKind::Sigmoid: return "rt::UnOp::Sigmoid";
    default: return "rt::UnOp::Exp";
    }
  }

  bool binary() {
    TensorId y = op->outputs[0];
    if (op->attrs->hasScalar) {
      TensorId x = op->inputs[0];
      if (!needDense(y, "the output") || !needDense(x, "the input") || !sameType({x, y}))
        return false;
      line(llvm::formatv("rt::binary_scalar<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6}, {7});", T(y),
                         binOp(op->kind), ptr(x), number(op->attrs->scalar),
                         boolean(op->attrs->scalarOnLeft), ptr(y), n(y), boolean(acc()))
               .str());
      return true;
    }
    TensorId ta = op->inputs[0], tb = op->inputs[1];
    if (!sameType({ta, tb, y}))
      return false;
    std::vector<int64_t> out = sizes(y);
    if (out.size() > 8)
      return fail("rank above 8");
    if (out.empty())
      out = {1};
    auto sa = shape(ta).empty() ? std::vector<int64_t>(out.size(), 0) : broadcastStrides(ta, out);
    auto sb = shape(tb).empty() ? std::vector<int64_t>(out.size(), 0) : broadcastStrides(tb, out);
    // A gradient written into a view (a split part) passes the view's strides.
    std::string os = dense(y) ? "" : ", dims{" + list(shape(y).empty() ? std::vector<int64_t>{0} : strides(y)) + "}";
    line(llvm::formatv("rt::binary<{0}>(ctx, {1}, {2}, dims{{{3}}, {4}, dims{{{5}}, {6}, dims{{{7}}, {8}, {9}{10});",
                       T(y), binOp(op->kind), ptr(ta), list(sa), ptr(tb), list(sb), ptr(y), list(out),
                       out.size(), boolean(acc()), os)
             .str());
    return true;
  }

  /// The gradient of a division by a tensor: d(a/b)/db (inputs a, b, dy), or of c / x from its
  /// output (inputs y, dy; the constant in attrs.scalar).
  bool divBackward() {
    TensorId out = op->outputs[0];
    if (op->attrs->hasScalar) {
      TensorId y = op->inputs[0], dy = op->inputs[1];
      if (!needDense(y, "the output") || !needDense(dy, "the output gradient") || !needDense(out, "the gradient") ||
          !sameType({y, dy, out}))
        return false;
      line(llvm::formatv("rt::div_scalar_bwd<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6});", T(out), ptr(y), ptr(dy),
                         number(op->attrs->scalar), ptr(out), n(out), boolean(acc()))
               .str());
      return true;
    }
    TensorId a = op->inputs[0], b = op->inputs[1], dy = op->inputs[2];
    if (!sameType({a, b, dy, out}))
      return false;
    std::vector<int64_t> sz = sizes(dy);
    if (sz.empty())
      sz = {1};
    if (sz.size() > 8)
      return fail("rank above 8");
    auto sa = shape(a).empty() ? std::vector<int64_t>(sz.size(), 0) : broadcastStrides(a, sz);
    auto sb = shape(b).empty() ? std::vector<int64_t>(sz.size(), 0) : broadcastStrides(b, sz);
    std::string ds = dense(dy) ? "nullptr" : "dims{" + list(strides(dy)) + "}";
    std::string os = dense(out) ? "nullptr" : "dims{" + list(strides(out)) + "}";
    if (n(out) != n(dy))
      return fail("the gradient of a division written at another shape");
    line(llvm::formatv("rt::div_bwd<{0}>(ctx, {1}, dims{{{2}}, {3}, dims{{{4}}, {5}, {6}, {7}, {8}, dims{{{9}}, {10}, {11});",
                       T(out), ptr(a), list(sa), ptr(b), list(sb), ptr(dy), ds, ptr(out), os, list(sz), sz.size(),
                       boolean(acc()))
             .str());
    return true;
  }

  bool unary() {
    TensorId x = op->inputs[0], y = op->outputs[0];
    if (!needDense(x, "the input") || !needDense(y, "the output") || !sameType({x, y}))
      return false;
    if (acc() || op->phase == Phase::Backward) // a negated gradient, possibly added in place
      line(llvm::formatv("rt::unary_bwd<{0}>(ctx, {1}, nullptr, nullptr, {2}, {3}, {4}, {5});", T(y),
                         unOp(op->kind), ptr(x), ptr(y), n(y), boolean(acc()))
               .str());
    else
      line(llvm::formatv("rt::unary_fwd<{0}>(ctx, {1}, {2}, {3}, {4});", T(y), unOp(op->kind), ptr(x),
                         ptr(y), n(y))
               .str());
    return true;
  }

  /// B, S, H, hd of a rope over x [..., S, H·hd].
  bool ropeDims(TensorId x, const OpAttrs &at, int64_t &B, int64_t &S, int64_t &H, int64_t &hd) {
    if (at.fraction < 1)
      return fail("partial rotary (rope fraction < 1) has no CPU kernel yet");
    int64_t w = last(x);
    hd = at.headDim > 0 ? at.headDim : w;
    if (hd <= 0 || w % hd != 0 || hd % 2 != 0)
      return fail("rope head size " + std::to_string(hd) + " does not divide the width " +
                  std::to_string(w) + " into even heads");
    H = w / hd;
    S = shape(x).size() >= 2 ? shape(x)[shape(x).size() - 2].size : 1;
    B = n(x) / std::max<int64_t>(1, S * w);
    return true;
  }

  std::string seedExpr() const { return "seed"; }

  bool attentionDims(const Op &fwd, int64_t &B, int64_t &S, int64_t &Skv, int64_t &H, int64_t &Hkv,
                     int64_t &hd, std::string &rows) {
    TensorId q = fwd.inputs[0], k = fwd.inputs[1], v = fwd.inputs[2];
    if (shape(q).size() != 3)
      return fail("attention over rank " + std::to_string(shape(q).size()) + " q; the " + title() + " backend runs [batch, seq, heads·head]");
    B = shape(q)[0].size;
    S = shape(q)[1].size;
    Skv = shape(k)[1].size;
    H = fwd.attrs->heads;
    Hkv = fwd.attrs->kvHeads ? fwd.attrs->kvHeads : H;
    hd = shape(q)[2].size / H;
    int64_t rq = strides(q)[1], rk = strides(k)[1], rv = strides(v)[1];
    bool strided = rq != H * hd || rk != Hkv * hd || rv != Hkv * hd;
    rows = strided ? llvm::formatv(", rt::AttnRows{{{0}, {1}, {2}}", rq, rk, rv).str() : "";
    if (be.checkAttention) {
      std::string why = be.checkAttention(B, S, Skv, H, Hkv, hd, rq, rk, rv, op->kind == OpKind::AttentionBackward);
      if (!why.empty())
        return fail(why);
    }
    return true;
  }

  bool attentionForward() {
    const OpAttrs &at = op->attrs;
    int64_t B, S, Skv, H, Hkv, hd;
    std::string rows;
    if (at.alibi || at.hasMask)
      return fail(std::string(at.alibi ? "ALiBi (alibi = true)" : "a padding mask (mask =)") +
                  " in attention has no CPU kernel yet");
    if (!attentionDims(*op, B, S, Skv, H, Hkv, hd, rows))
      return false;
    TensorId q = op->inputs[0], k = op->inputs[1], v = op->inputs[2], o = op->outputs[0];
    if (!sameType({q, k, v, o}))
      return false;
    std::string lse = at.fused ? ptr(op->outputs[1]) : "nullptr";
    std::string scores = at.fused ? "nullptr" : ptr(op->outputs[1]);
    line(llvm::formatv("rt::attention_fwd<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, "
                       "{13}, {14}, {15}, {16}, {17}{18});",
                       T(o), ptr(q), ptr(k), ptr(v), ptr(o), lse, scores, B, S, Skv, H, Hkv, hd,
                       number(at.scale), boolean(at.causal), number(at.p), seedExpr(),
                       at.stream == kNone ? 0 : at.stream, rows)
             .str());
    return true;
  }

  bool attentionBackward() {
    const Op &fwd = s.ops[op->forwardOp];
    const OpAttrs &at = fwd.attrs;
    if (!at.fused && be.device)
      return fail("the backward of materialised attention (fused = false) has no " + title() +
                  " kernel yet; the " + title() + " backend runs fused attention only");
    int64_t B, S, Skv, H, Hkv, hd;
    std::string rows;
    if (!attentionDims(fwd, B, S, Skv, H, Hkv, hd, rows))
      return false;
    // outputs: the gradients in gradMask order.
    std::string d[3] = {"nullptr", "nullptr", "nullptr"};
    unsigned out = 0;
    int accs = -1;
    for (unsigned i = 0; i < 3; ++i)
      if (op->attrs->gradMask & (1u << i)) {
        d[i] = ptr(op->outputs[out]);
        int ai = acc(out) ? 1 : 0;
        if (accs >= 0 && ai != accs)
          return fail("attention gradients written partly in place and partly overwritten; the "
                      "runtime takes one accumulate flag");
        accs = ai;
        ++out;
      }
    // inputs: fused (q, k, v, o, lse, dO); materialised (q, k, v, P[, mask, dropped P], dO): the
    // runtime reads P and replays the dropout mask from its stream, and needs neither o nor lse.
    const auto &in = op->inputs;
    std::string o = at.fused ? ptr(in[3]) : "nullptr", lse = at.fused ? ptr(in[4]) : "nullptr";
    std::string scores = at.fused ? "nullptr" : ptr(in[3]);
    line(llvm::formatv("rt::attention_bwd<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, "
                       "{12}, {13}, {14}, {15}, {16}, {17}, {18}, {19}, {20}, {21}, {22}{23});",
                       T(in[0]), ptr(in[0]), ptr(in[1]), ptr(in[2]), o, lse, scores, ptr(in.back()),
                       d[0], d[1], d[2], B, S, Skv, H, Hkv, hd, number(at.scale), boolean(at.causal),
                       number(at.p), seedExpr(), at.stream == kNone ? 0 : at.stream,
                       boolean(accs == 1), rows)
             .str());
    return true;
  }

  /// outer × axis × inner of a reduction over `dim` of shape `x` (or everything).
  void reduceDims(TensorId x, const OpAttrs &at, int64_t &outer, int64_t &axis, int64_t &inner) {
    outer = 1, axis = n(x), inner = 1;
    if (at.reduceAll)
      return;
    size_t d = 0;
    normalizeAxis(at.dim, shape(x).size(), d);
    outer = axis = inner = 1;
    for (size_t i = 0; i < shape(x).size(); ++i)
      (i < d ? outer : i == d ? axis : inner) *= shape(x)[i].size;
  }

  bool copy(TensorId src, TensorId dst, bool accumulate) {
    std::vector<int64_t> sz = sizes(dst);
    if (sz.empty())
      sz = {1};
    if (sz.size() > 8)
      return fail("rank above 8");
    // The source is read at the destination's shape (a gradient may be written at another
    // shape with the same elements, [1, d] from [d]): dense sources reshape freely.
    std::string srcStrides;
    if (shape(dst).empty()) { // one element
      srcStrides = "dims{{0}}";
    } else if (sizes(src) == sizes(dst)) {
      srcStrides = "dims{" + list(strides(src)) + "}";
    } else if (dense(src)) {
      auto st = denseStrides(shape(dst));
      srcStrides = "dims{" + list(std::vector<int64_t>(st.begin(), st.end())) + "}";
    } else {
      return fail("a strided copy between different shapes");
    }
    std::string dstStrides = dense(dst) ? "nullptr" : "dims{" + list(strides(dst)) + "}";
    line(llvm::formatv("rt::copy<{0}, {1}>(ctx, {2}, {3}, {4}, {5}, dims{{{6}}, {7}, {8});", T(src), T(dst),
                       ptr(src), srcStrides, ptr(dst), dstStrides, list(sz), sz.size(), boolean(accumulate))
             .str());
    return true;
  }

  bool emitOp() {
    const auto &in = op->inputs;
    const auto &out = op->outputs;
    const OpAttrs &at = op->attrs;
    switch (op->kind) {
    case OpKind::Split:
    case OpKind::Reshape:
    case OpKind::Transpose:
    case OpKind::Slice:
      return true; // views: no code
    case OpKind::Matmul:
      return matmul();
    case OpKind::Add:
    case OpKind::Sub:
    case OpKind::Mul:
    case OpKind::Div:
      return binary();
    case OpKind::Neg:
    case OpKind::Relu:
    case OpKind::Gelu:
    case OpKind::Silu:
    case OpKind::Tanh:
    case OpKind::Sigmoid:
    case OpKind::Exp:
      return unary();
    case OpKind::Dropout:
      if (!needDense(in[0], "the input") || !sameType({in[0], out[0]}))
        return false;
      line(llvm::formatv("rt::dropout_fwd<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6}, {7});", T(out[0]), ptr(in[0]),
                         ptr(out[0]), out.size() > 1 ? ptr(out[1]) : "nullptr", n(out[0]), number(at.p),
                         seedExpr(), at.stream)
               .str());
      return true;
    case OpKind::Rope: {
      int64_t B, S, H, hd;
      if (!needDense(in[0], "the input") || !sameType({in[0], out[0]}) || !ropeDims(in[0], at, B, S, H, hd))
        return false;
      line(llvm::formatv("rt::rope_fwd<{0}>(ctx, {1}, {2}, nullptr, {3}, {4}, {5}, {6}, {7});", T(out[0]),
                         ptr(in[0]), ptr(out[0]), B, S, H, hd, number(at.theta))
               .str());
      return true;
    }
    case OpKind::Softmax: {
      size_t d = 0;
      normalizeAxis(at.dim, shape(in[0]).size(), d);
      if (d + 1 != shape(in[0]).size())
        return fail("softmax over a dimension other than the last");
      if (!needDense(in[0], "the input") || !sameType({in[0], out[0]}))
        return false;
      line(llvm::formatv("rt::softmax_fwd<{0}>(ctx, {1}, {2}, {3}, {4});", T(out[0]), ptr(in[0]), ptr(out[0]),
                         n(in[0]) / std::max<int64_t>(1, last(in[0])), last(in[0]))
               .str());
      return true;
    }
    case OpKind::LayerNorm: {
      if (!needDense(in[0], "the input") || !sameType({in[0], in[1], out[0]}))
        return false;
      int64_t cols = last(in[0]);
      line(llvm::formatv("rt::layer_norm_fwd{10}<{0}>(ctx, {11}{1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9});", T(out[0]),
                         ptr(in[0]), ptr(in[1]), in.size() > 2 ? ptr(in[2]) : "nullptr", ptr(out[0]),
                         ptr(out[1]), ptr(out[2]), n(in[0]) / std::max<int64_t>(1, cols), cols, number(at.eps),
                         prologue.empty() ? "" : "_fused", prologue.empty() ? "" : prologue + ", ")
               .str());
      return true;
    }
    case OpKind::RmsNorm: {
      if (!needDense(in[0], "the input") || !sameType({in[0], in[1], out[0]}))
        return false;
      int64_t cols = last(in[0]);
      line(llvm::formatv("rt::rms_norm_fwd{8}<{0}>(ctx, {9}{1}, {2}, {3}, {4}, {5}, {6}, {7});", T(out[0]), ptr(in[0]),
                         ptr(in[1]), ptr(out[0]), ptr(out[1]), n(in[0]) / std::max<int64_t>(1, cols), cols,
                         number(at.eps), prologue.empty() ? "" : "_fused", prologue.empty() ? "" : prologue + ", ")
               .str());
      return true;
    }
    case OpKind::Attention:
      return attentionForward();
    case OpKind::Embedding: {
      TensorId w = in[1];
      if (!needDense(in[0], "the ids") || !sameType({w, out[0]}))
        return false;
      line(llvm::formatv("rt::embedding_fwd<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6});", T(out[0]), ptr(in[0]),
                         ptr(w), ptr(out[0]), n(in[0]), last(w), shape(w)[0].size)
               .str());
      return true;
    }
    case OpKind::Sum:
    case OpKind::Mean: {
      int64_t outer, axis, inner;
      reduceDims(in[0], at, outer, axis, inner);
      if (!needDense(in[0], "the input") || !sameType({in[0], out[0]}))
        return false;
      line(llvm::formatv("rt::sum_fwd<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6});", T(out[0]), ptr(in[0]),
                         ptr(out[0]), outer, axis, inner, boolean(op->kind == OpKind::Mean))
               .str());
      return true;
    }
    case OpKind::CrossEntropy:
      if (!needDense(in[0], "the logits") || !needDense(in[1], "the labels"))
        return false;
      line(llvm::formatv("rt::cross_entropy_fwd<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6});", T(in[0]), ptr(in[0]),
                         ptr(in[1]), ptr(out[0]), ptr(out[1]), n(in[1]), last(in[0]))
               .str());
      return true;
    case OpKind::Positions:
      line(llvm::formatv("rt::positions(ctx, {0}, {1});", ptr(out[0]), n(out[0])).str());
      return true;
    case OpKind::NextTokens: {
      int64_t S = last(in[0]);
      line(llvm::formatv("rt::next_tokens(ctx, {0}, {1}, {2}, {3});", ptr(in[0]), ptr(out[0]),
                         n(in[0]) / std::max<int64_t>(1, S), S)
               .str());
      return true;
    }
    case OpKind::Concat: {
      size_t axis = 0;
      normalizeAxis(at.dim, shape(out[0]).size(), axis);
      std::vector<int64_t> ost = strides(out[0]);
      int64_t at0 = 0;
      for (TensorId x : in) {
        std::vector<int64_t> sz = sizes(x);
        // The part of the output this input fills: a view at offset at0 along the axis.
        std::string dst = ptr(out[0]);
        int64_t off = at0 * ost[axis] * static_cast<int64_t>(bytesOf(s.tensors[out[0]].dtype));
        std::string partPtr = "reinterpret_cast<" + T(out[0]) + "*>(reinterpret_cast<uint8_t*>(" + dst +
                              ") + " + std::to_string(off) + ")";
        line(llvm::formatv("rt::copy<{0}, {1}>(ctx, {2}, dims{{{3}}, {4}, dims{{{5}}, dims{{{6}}, {7}, false);",
                           T(x), T(out[0]), ptr(x), list(strides(x)), partPtr, list(ost), list(sz), sz.size())
                 .str());
        at0 += sz[axis];
      }
      return true;
    }
    case OpKind::BroadcastTo: { // a copy whose source has stride 0 along the broadcast dims
      std::vector<int64_t> sz = sizes(out[0]), xz = sizes(in[0]), xs = strides(in[0]);
      if (sz.empty() || sz.size() > 8 || !needDense(out[0], "the output"))
        return fail("broadcast_to needs an output of rank 1 to 8");
      std::vector<int64_t> st(sz.size(), 0);
      size_t lead = sz.size() - xz.size();
      for (size_t j = 0; j < xz.size(); ++j)
        st[lead + j] = xz[j] == 1 ? 0 : xs[j];
      line(llvm::formatv("rt::copy<{0}, {1}>(ctx, {2}, dims{{{3}}, {4}, nullptr, dims{{{5}}, {6}, false);",
                         T(in[0]), T(out[0]), ptr(in[0]), list(st), ptr(out[0]), list(sz), sz.size())
               .str());
      return true;
    }
    case OpKind::Contiguous:
      return copy(in[0], out[0], acc());
    case OpKind::ReduceTo: {
      TensorId x = in[0], y = out[0];
      if (!needDense(x, "the local gradient") || !sameType({x, y}))
        return false;
      std::vector<int64_t> xs = sizes(x);
      std::vector<int64_t> ys = sizes(y), yst = strides(y), ost(xs.size(), 0);
      size_t off = xs.size() - ys.size();
      for (size_t i = 0; i < ys.size(); ++i)
        ost[off + i] = ys[i] == 1 && xs[off + i] != 1 ? 0 : yst[i];
      line(llvm::formatv("rt::reduce_to<{0}>(ctx, {1}, dims{{{2}}, {3}, {4}, dims{{{5}}, 1.0f, {6});", T(y), ptr(x),
                         list(xs), xs.size(), ptr(y), list(ost), boolean(acc()))
               .str());
      return true;
    }
    case OpKind::Expand: { // the backward of sum/mean: dy spread over x's shape
      TensorId dy = in[0], dx = out[0];
      if (!needDense(dx, "the gradient") || !sameType({dy, dx}))
        return false;
      int64_t outer = 1, axis = n(dx), inner = 1;
      if (!at.reduceAll) {
        size_t d = 0;
        normalizeAxis(at.dim, at.newShape.size(), d);
        outer = axis = inner = 1;
        for (size_t i = 0; i < at.newShape.size(); ++i)
          (i < d ? outer : i == d ? axis : inner) *= at.newShape[i].size;
      }
      line(llvm::formatv("rt::sum_bwd<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6}, {7});", T(dx), ptr(dy), ptr(dx),
                         outer, axis, inner, boolean(at.hasScalar), boolean(acc()))
               .str());
      return true;
    }
    case OpKind::Fill:
      if (!needDense(out[0], "the filled tensor"))
        return false;
      line(llvm::formatv("rt::fill<{0}>(ctx, {1}, {2}, {3});", T(out[0]), ptr(out[0]), number(at.scalar),
                         n(out[0]))
               .str());
      return true;
    case OpKind::UnaryBackward:
      return unaryBackward();
    case OpKind::DivBackward:
      return divBackward();
    case OpKind::SoftmaxBackward: {
      TensorId y = in[0], dy = in[1], dx = out[0];
      if (!needDense(dx, "the gradient") || !needDense(dy, "the output gradient") || !sameType({y, dy, dx}))
        return false;
      line(llvm::formatv("rt::softmax_bwd<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6});", T(dx), ptr(y), ptr(dy),
                         ptr(dx), n(y) / std::max<int64_t>(1, last(y)), last(y), boolean(acc()))
               .str());
      return true;
    }
    case OpKind::LayerNormBackward:
    case OpKind::RmsNormBackward:
      return normBackward();
    case OpKind::AttentionBackward:
      return attentionBackward();
    case OpKind::EmbeddingBackward: {
      TensorId ids = in[0], dy = in[1], dw = out[0];
      if (!needDense(dy, "the output gradient") || !sameType({dy, dw}))
        return false;
      if (be.checkEmbeddingBackward) {
        std::string why = be.checkEmbeddingBackward(n(ids), shape(dw)[0].size);
        if (!why.empty())
          return fail(why);
      }
      if (!acc()) // the kernel scatter-adds: a first write starts from zero
        line(llvm::formatv("rt::fill<{0}>(ctx, {1}, 0.0f, {2});", T(dw), ptr(dw), n(dw)).str());
      line(llvm::formatv("rt::embedding_bwd<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6});", T(dw), ptr(ids), ptr(dy),
                         ptr(dw), n(ids), last(dw), shape(dw)[0].size)
               .str());
      return true;
    }
    case OpKind::CrossEntropyBackward: {
      TensorId x = in[0], labels = in[1], lse = in[2], dloss = in[3], dx = out[0];
      if (!needDense(dx, "the gradient") || !sameType({x, dx}))
        return false;
      line(llvm::formatv("rt::cross_entropy_bwd<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8});", T(dx), ptr(x),
                         ptr(labels), ptr(lse), ptr(dloss), ptr(dx), n(labels), last(x), boolean(acc()))
               .str());
      return true;
    }
    case OpKind::ZeroGrad:
    case OpKind::SumSquares:
    case OpKind::OptimizerUpdate:
    case OpKind::Scale:
      return fail("internal error: an optimizer-phase op in the micro-batch");
    // No kernel in the runtime: refused below, naming the op (tests/lit/moe-build-refused.tally,
    // lang-cnn.tally). Listed, not defaulted, so that a new op kind is a -Wswitch warning here
    // until it is decided.
    case OpKind::TopK:
    case OpKind::Gather:
    case OpKind::ScatterAdd:
    case OpKind::Moe:
    case OpKind::MoeBackward:
    case OpKind::Conv2d:
    case OpKind::Conv2dBackward:
    case OpKind::MaxPool2d:
    case OpKind::AvgPool2d:
    case OpKind::PoolBackward:
      break;
    }
    return fail("no " + title() + " code for op kind " + opName(op->kind).str());
  }

  bool unaryBackward() {
    const OpAttrs &at = op->attrs;
    TensorId dx = op->outputs[0];
    TensorId dy = op->inputs.back();
    if (!needDense(dx, "the gradient") || !needDense(dy, "the output gradient"))
      return false;
    switch (at.of) {
    case OpKind::Gelu:
    case OpKind::Silu:
      if (!sameType({op->inputs[0], dy, dx}))
        return false;
      line(llvm::formatv("rt::unary_bwd<{0}>(ctx, {1}, {2}, nullptr, {3}, {4}, {5}, {6});", T(dx), unOp(at.of),
                         ptr(op->inputs[0]), ptr(dy), ptr(dx), n(dx), boolean(acc()))
               .str());
      return true;
    case OpKind::Relu:
    case OpKind::Tanh:
    case OpKind::Sigmoid:
    case OpKind::Exp:
      if (!sameType({op->inputs[0], dy, dx}))
        return false;
      line(llvm::formatv("rt::unary_bwd<{0}>(ctx, {1}, nullptr, {2}, {3}, {4}, {5}, {6});", T(dx), unOp(at.of),
                         ptr(op->inputs[0]), ptr(dy), ptr(dx), n(dx), boolean(acc()))
               .str());
      return true;
    case OpKind::Neg:
      line(llvm::formatv("rt::unary_bwd<{0}>(ctx, rt::UnOp::Neg, nullptr, nullptr, {1}, {2}, {3}, {4});", T(dx),
                         ptr(dy), ptr(dx), n(dx), boolean(acc()))
               .str());
      return true;
    case OpKind::Dropout:
      line(llvm::formatv("rt::dropout_bwd<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8});", T(dx), ptr(dy),
                         ptr(op->inputs[0]), ptr(dx), n(dx), number(at.p), seedExpr(), at.stream, boolean(acc()))
               .str());
      return true;
    case OpKind::Rope: {
      int64_t B, S, H, hd;
      if (!ropeDims(dx, at, B, S, H, hd))
        return false;
      line(llvm::formatv("rt::rope_bwd<{0}>(ctx, {1}, {2}, nullptr, {3}, {4}, {5}, {6}, {7}, {8});", T(dx), ptr(dy),
                         ptr(dx), B, S, H, hd, number(at.theta), boolean(acc()))
               .str());
      return true;
    }
    default:
      return fail("no " + title() + " backward for " + opName(at.of).str());
    }
  }

  bool normBackward() {
    bool layer = op->kind == OpKind::LayerNormBackward;
    const auto &in = op->inputs;
    // inputs: x, w, (mean,) rstd, dy; outputs: dx, dw, db as gradMask says.
    TensorId x = in[0], w = in[1], dy = in.back();
    std::string d[3] = {"nullptr", "nullptr", "nullptr"};
    unsigned out = 0;
    bool accDx = false;
    for (unsigned i = 0; i < 3; ++i)
      if (op->attrs->gradMask & (1u << i)) {
        TensorId t = op->outputs[out];
        if (!needDense(t, "a norm gradient"))
          return false;
        d[i] = ptr(t);
        if (i == 0)
          accDx = acc(out);
        else if (!acc(out)) // weight and bias gradients: the kernel always adds
          line(llvm::formatv("rt::fill<{0}>(ctx, {1}, 0.0f, {2});", T(t), d[i], n(t)).str());
        ++out;
      }
    if (!needDense(x, "the input") || !needDense(dy, "the output gradient") || !sameType({x, w, dy}))
      return false;
    int64_t cols = last(x), rows = n(x) / std::max<int64_t>(1, cols);
    if (layer)
      line(llvm::formatv("rt::layer_norm_bwd<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11});",
                         T(x), ptr(x), ptr(w), ptr(in[2]), ptr(in[3]), ptr(dy), d[0], d[1], d[2], rows, cols,
                         boolean(accDx))
               .str());
    else
      line(llvm::formatv("rt::rms_norm_bwd<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9});", T(x), ptr(x),
                         ptr(w), ptr(in[2]), ptr(dy), d[0], d[1], rows, cols, boolean(accDx))
               .str());
    return true;
  }

  // ---- 3. the step --------------------------------------------------------------------------

  std::string where(const Op &o) const {
    std::string w = opt.where ? opt.where(o.range.Start) : "";
    return w.empty() ? "" : " — " + commentSafe(w);
  }

  /// micro_step(): the forward, recompute and backward entries; a fused run of elementwise
  /// entries (Analysis::fusion) as one generated kernel, its functor printed before.
  bool microStep(std::string &outText) {
    std::map<uint32_t, const Analysis::FusedKernel *> fusedAt;
    for (const Analysis::FusedKernel &k : a.fusion.kernels)
      fusedAt[k.first] = &k;
    std::map<size_t, std::vector<size_t>> startAfter = overlappedBuckets();
    // After entries [from, to] ran: the buckets whose last gradient write was among them.
    auto startBuckets = [&](size_t from, size_t to) {
      for (auto it = startAfter.lower_bound(from); it != startAfter.end() && it->first <= to; ++it)
        for (size_t k : it->second)
          line("if (last) start_bucket(ctx, " + std::to_string(k) + "); // its last gradient is written");
    };
    body.clear();
    const char *kinds[] = {"forward", "backward", "recompute", "optimizer"};
    for (size_t e = 0; e < a.stepSchedule.size(); ++e) {
      const StepEntry &se = a.stepSchedule[e];
      if (se.kind == StepEntry::Optimizer)
        continue;
      op = &s.ops[se.op];
      step = buffers.stepOf(e);
      if (opClass(op->kind) == OpClass::View)
        continue;
      auto f = fusedAt.find(static_cast<uint32_t>(e));
      if (f != fusedAt.end()) {
        if (!fused(*f->second, kinds[se.kind]) || !error.empty())
          return false;
        startBuckets(e, e + f->second->count - 1);
        e += f->second->count - 1;
        continue;
      }
      std::string path = s.opPath(*op);
      body += "\n  // " + commentSafe(path) + " (" + kinds[se.kind] + ")" + where(*op) + "\n";
      site(path, className(s, *op));
      if (!emitOp() || !error.empty())
        return false;
      if (se.kind == StepEntry::Forward && !op->outputs.empty() && op->outputs[0] == s.loss)
        line(be.device ? "loss = device_load(ctx, " + ptr(s.loss) + ");" : "loss = rt::load(*" + ptr(s.loss) + ");");
      startBuckets(e, e);
    }
    op = nullptr;
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

  /// Data parallel with `overlap` (the plan's default) and without ZeRO: each 25 MiB bucket of
  /// G is averaged as soon as the last micro-batch's backward has written its last gradient.
  bool overlap() const { return dataParallel() && !sharded() && plan.parallel.overlap; }

  /// The gradient buckets: [begin, end) element ranges of G of at most 25 MiB (PyTorch DDP's
  /// bucket_cap_mb), in order.
  std::vector<std::pair<int64_t, int64_t>> gradientBuckets() const {
    constexpr int64_t kBucketBytes = 25 * 1024 * 1024;
    int64_t bg = static_cast<int64_t>(bytesOf(plan.precision.grads)), bucket = kBucketBytes / bg;
    int64_t elems = a.regions.grads.bytes / bg;
    std::vector<std::pair<int64_t, int64_t>> out;
    for (int64_t b0 = 0; b0 < elems; b0 += bucket)
      out.push_back({b0, std::min(elems, b0 + bucket)});
    return out;
  }

  /// With overlap(): per stepSchedule entry, the buckets whose last gradient write it is (a
  /// backward op writing a parameter's gradient, or a view of it, anywhere in the bucket).
  /// Buckets nothing writes are started by reduce_gradients().
  std::map<size_t, std::vector<size_t>> overlappedBuckets() const {
    std::map<size_t, std::vector<size_t>> out;
    if (!overlap())
      return out;
    auto buckets = gradientBuckets();
    int64_t bg = static_cast<int64_t>(bytesOf(plan.precision.grads));
    std::vector<size_t> lastWriter(buckets.size(), SIZE_MAX);
    for (size_t e = 0; e < a.stepSchedule.size(); ++e) {
      const StepEntry &se = a.stepSchedule[e];
      if (se.kind != StepEntry::Backward)
        continue;
      for (TensorId t : s.ops[se.op].outputs) {
        const Tensor &bt = s.tensors[s.storageOf(t)];
        if (bt.role != TensorRole::Gradient || bt.gradOf == kNone)
          continue;
        auto g = gradOffset.find(bt.gradOf);
        if (g == gradOffset.end())
          continue;
        int64_t lo = g->second / bg, hi = lo + n(bt.gradOf);
        for (size_t k = 0; k < buckets.size(); ++k)
          if (lo < buckets[k].second && buckets[k].first < hi)
            lastWriter[k] = e;
      }
    }
    for (size_t k = 0; k < buckets.size(); ++k)
      if (lastWriter[k] != SIZE_MAX)
        out[lastWriter[k]].push_back(k);
    return out;
  }

  // ---- fused kernels ------------------------------------------------------------------------

  std::string functors;                          ///< the fused kernels' functors, each once
  std::string prologue;                          ///< a norm's fused prologue (a functor instance), or ""
  std::string epilogueBias, epilogueOut;         ///< matmulBias(): the bias and the add's output, or ""

  /// A matmul with a bias epilogue (passes/Fusion.cpp step 5): rt::matmul_bias writes the add's
  /// output (its buffer live at the add's step); the matmul's own output is not written.
  bool matmulBias(const Analysis::FusedKernel &k, const char *kind) {
    const Op &add = s.ops[a.stepSchedule[k.first + 1].op];
    op = &add;
    step = buffers.stepOf(k.first + 1);
    TensorId c = s.ops[a.stepSchedule[k.first].op].outputs[0];
    epilogueBias = ptr(add.inputs[0] == c ? add.inputs[1] : add.inputs[0]);
    epilogueOut = ptr(add.outputs[0]);
    op = &s.ops[a.stepSchedule[k.first].op];
    step = buffers.stepOf(k.first);
    std::string path = s.opPath(*op);
    body += "\n  // fused (" + std::string(kind) + "): " + commentSafe(path) + " with the bias of " +
            commentSafe(s.opPath(add)) + where(*op) + "\n";
    site(path, className(s, *op));
    bool ok = error.empty() && matmul();
    epilogueBias.clear();
    epilogueOut.clear();
    return ok;
  }
  std::map<std::string, std::string> functorOf;  ///< functor body -> its name

  /// One fused run (passes/Fusion.cpp): a functor computing element e of every op of the run
  /// in registers (each value rounded to its storage type, so the results are the unfused
  /// ops'), then rt::fused over the outputs' elements, or, when the run ends in a norm, the
  /// norm's _fused call with the functor as its prologue. Identical runs (every layer's) share
  /// one functor; the call passes each its operands.
  bool fused(const Analysis::FusedKernel &k, const char *kind) {
    if (k.epilogue)
      return matmulBias(k, kind);
    std::string ty = T(s.ops[a.stepSchedule[k.first].op].outputs[0]);
    std::vector<std::string> members, args;     // functor members and the call's pointers
    std::map<TensorId, std::string> value;      // tensors held in registers
    std::string code, paths;
    int64_t n = 0;
    auto operand = [&](TensorId x, TensorId y) -> std::string {
      auto v = value.find(x);
      if (v != value.end())
        return v->second;
      std::optional<ElementIndex> ix = elementIndex(s, x, y);
      if (!ix)
        return fail("internal error: a fused operand without an element index"), "A(0)";
      std::string name = "i" + std::to_string(args.size());
      members.push_back("const " + ty + " *" + name + ";");
      args.push_back(ptr(x));
      std::string at = ix->kind == ElementIndex::Same       ? "e"
                       : ix->kind == ElementIndex::Trailing ? "e % " + std::to_string(ix->m)
                       : ix->kind == ElementIndex::Leading  ? "e / " + std::to_string(ix->m)
                                                            : "0";
      return "rt::load(" + name + "[" + at + "])";
    };
    uint32_t elems = k.count - (k.norm ? 1 : 0);
    for (uint32_t i = 0; i < elems; ++i) {
      op = &s.ops[a.stepSchedule[k.first + i].op];
      step = buffers.stepOf(k.first + i);
      TensorId y = op->outputs[0];
      n = this->n(y);
      paths += (i ? ", " : "") + commentSafe(s.opPath(*op));
      std::string expr;
      const auto &in = op->inputs;
      if (op->kind == OpKind::UnaryBackward) {
        OpKind of = op->attrs->of;
        bool readsX = of == OpKind::Gelu || of == OpKind::Silu, neg = of == OpKind::Neg;
        std::string x = neg ? "A(0)" : operand(in[0], y);
        expr = operand(in.back(), y) + " * rt::unary_grad(" + unOp(of) + ", " + (readsX ? x : "A(0)") + ", " +
               (readsX || neg ? "A(0)" : x) + ")";
      } else if (op->attrs->hasScalar) {
        std::string c = "static_cast<A>(static_cast<float>(" + number(op->attrs->scalar) + "))";
        std::string x = operand(in[0], y);
        expr = std::string("rt::binop(") + binOp(op->kind) + ", " + (op->attrs->scalarOnLeft ? c + ", " + x : x + ", " + c) + ")";
      } else if (in.size() == 2) {
        std::string l = operand(in[0], y), r = operand(in[1], y);
        expr = std::string("rt::binop(") + binOp(op->kind) + ", " + l + ", " + r + ")";
      } else {
        expr = std::string("rt::unary(") + unOp(op->kind) + ", " + operand(in[0], y) + ")";
      }
      if (!error.empty())
        return false;
      std::string v = "v" + std::to_string(i);
      if (k.unwritten >> i & 1) { // nothing after the run reads it
        code += "    const A " + v + " = rt::load(rt::store<" + ty + ">(" + expr + "));\n";
        value[y] = v;
        continue;
      }
      std::string out = "o" + std::to_string(args.size());
      members.push_back(ty + " *" + out + ";");
      args.push_back(ptr(y));
      if (acc())
        expr = "rt::load(" + out + "[e]) + " + expr;
      code += "    const A " + v + " = rt::load(rt::store<" + ty + ">(" + expr + "));\n"
              "    " + out + "[e] = rt::store<" + ty + ">(" + v + ");\n";
      value[y] = v;
    }
    std::string fields;
    for (const std::string &m : members)
      fields += "  " + m + "\n";
    std::string def = fields + "  TALLY_HD void operator()(int64_t e) const {\n    using A = rt::acc_t<" + ty + ">;\n" +
                      code + "  }\n";
    auto [it, fresh] = functorOf.emplace(def, "Fused" + std::to_string(functorOf.size()));
    if (fresh)
      functors += "/// A fused kernel (first " + paths.substr(0, paths.find(',')) + ", " + kind + ").\nstruct " +
                  it->second + " {\n" + def + "};\n\n";
    std::string functor = it->second + "{";
    for (size_t i = 0; i < args.size(); ++i)
      functor += (i ? ", " : "") + args[i];
    functor += "}";
    const Op *norm = k.norm ? &s.ops[a.stepSchedule[k.first + elems].op] : nullptr;
    if (norm)
      paths += ", " + commentSafe(s.opPath(*norm));
    op = &s.ops[a.stepSchedule[k.first].op];
    body += "\n  // fused (" + std::string(kind) + "): " + paths + where(*op) + "\n";
    site(s.opPath(*op), className(s, *op));
    if (!norm) {
      line("rt::fused(ctx, " + std::to_string(n) + ", " + functor + ");");
      return true;
    }
    // The norm's call, its prologue computing and writing x row by row first.
    op = norm;
    step = buffers.stepOf(k.first + elems);
    prologue = functor;
    bool ok = emitOp();
    prologue.clear();
    return ok;
  }

  /// Data parallel over more than one rank.
  bool dataParallel() const { return plan.parallel.data > 1; }
  /// ZeRO-1: master and optimizer hold this rank's shard (MemoryPlan.cpp).
  bool sharded() const { return a.regions.shard > 0; }

  /// Data parallel: reduce_gradients() averages the ranks' gradients after the backward, in
  /// buckets of gradientBuckets() (at most 25 MiB, PyTorch DDP's bucket_cap_mb) over the flat grads
  /// region: divided by the rank count, then summed by an all-reduce, or under ZeRO a
  /// reduce-scatter that leaves each rank its shard. ZeRO also has gather_gradients() (the
  /// whole averaged gradient on every rank, for --dump-grads) and gather_parameters(): each
  /// rank's updated shard of the parameters copied into its part of G, all-gathered there
  /// bucket by bucket, and copied back into P (G is zeroed next anyway, so the gather needs
  /// no memory of its own). "" for one rank.
  std::string communication(int64_t gradElems) {
    if (!dataParallel())
      return "";
    std::string T = ctype(plan.precision.grads);
    int64_t d = plan.parallel.data;
    const std::vector<std::pair<int64_t, int64_t>> bs = gradientBuckets();
    if (overlap()) {
      std::string out = llvm::formatv("/// Data parallel over {0} ranks ({1}; runtime/{2}), overlapped with the backward: the\n"
                                      "/// gradients in {3} bucket(s) of at most 25 MiB of G, each divided by {0} and its sum\n"
                                      "/// over the ranks started as soon as the last micro-batch's backward has written it\n"
                                      "/// (start_bucket, called from micro_step); reduce_gradients() waits for them all.\n",
                                      d, be.parallelEngine, be.commHeader, bs.size())
                            .str();
      out += "static const int64_t kBuckets[][2] = {\n";
      for (auto [b0, b1] : bs)
        out += llvm::formatv("    {{{0}, {1}},\n", b0, b1).str();
      out += "};\n\nstatic void start_bucket(rt::Ctx &ctx, int k) {\n" +
             siteText("data_parallel.reduce_gradients", "communication") +
             llvm::formatv("  rt::scale<{0}>(ctx, G<{0}>(0) + kBuckets[k][0], {1}, kBuckets[k][1] - kBuckets[k][0]);\n"
                           "  tally_comm::all_reduce_start<{0}>(ctx, G<{0}>(0), kBuckets[k][0], kBuckets[k][1], k);\n}\n\n",
                           T, number(1.0 / static_cast<double>(d)))
                 .str();
      out += "static void reduce_gradients(rt::Ctx &ctx) {\n";
      std::vector<bool> started(bs.size(), false);
      for (const auto &[entry, ks] : overlappedBuckets())
        for (size_t k : ks)
          started[k] = true;
      for (size_t k = 0; k < bs.size(); ++k)
        if (!started[k])
          out += "  start_bucket(ctx, " + std::to_string(k) + "); // no backward op writes it\n";
      out += siteText("data_parallel.reduce_gradients", "communication") + "  tally_comm::all_reduce_wait(ctx);\n}\n\n";
      return out;
    }
    auto each = [&](const char *what) {
      std::string out;
      for (auto [b0, b1] : bs)
        out += llvm::formatv("  tally_comm::{0}<{1}>(ctx, G<{1}>(0), {2}, {3}{4});\n", what, T, b0, b1,
                             sharded() ? ", kShard" : "")
                   .str();
      return out;
    };
    std::string out = llvm::formatv("/// Data parallel over {0} ranks ({3}; runtime/{4}): the gradients averaged\n"
                                    "/// after the backward in {1} bucket(s) of at most 25 MiB of G, divided by {0} and then\n"
                                    "/// summed{2}.\n",
                                    d, bs.size(), sharded() ? " by reduce-scatters (ZeRO-1: rank r keeps elements [r·kShard, (r+1)·kShard))"
                                                          : " by all-reduces",
                                    be.parallelEngine, be.commHeader)
                          .str();
    if (sharded())
      out += "constexpr int64_t kShard = " + std::to_string(a.regions.shard) + ";\n";
    out += "static void reduce_gradients(rt::Ctx &ctx) {\n"
           "  // The wait for the slowest rank's backward (load imbalance, not transfer) is its own class.\n" +
           siteText("data_parallel.barrier", "wait") + "  tally_comm::barrier(ctx);\n" +
           siteText("data_parallel.reduce_gradients", "communication");
    out += llvm::formatv("  rt::scale<{0}>(ctx, G<{0}>(0), {1}, {2});\n", T, number(1.0 / static_cast<double>(d)), gradElems)
               .str();
    out += each(sharded() ? "reduce_scatter" : "all_reduce") + "}\n\n";
    if (!sharded())
      return out;
    out += "/// ZeRO: every rank's shard of the averaged gradients to every rank (--dump-grads).\n"
           "static void gather_gradients(rt::Ctx &ctx) {\n" + siteText("data_parallel.gather", "communication") +
           each("all_gather") + "}\n\n";
    bool hasMaster = plan.precision.master != Dtype::Invalid;
    int64_t bp = static_cast<int64_t>(bytesOf(plan.precision.params));
    std::string gather = "/// ZeRO: per trainable parameter, its byte offsets in P and G and its bytes.\n"
                         "struct GatherEntry { int64_t p, g, bytes; };\n"
                         "static const GatherEntry kGather[] = {\n";
    size_t count = 0;
    for (const ParamInfo &pi : s.params)
      if (pi.trainable) {
        gather += llvm::formatv("    {{{0}, {1}, {2}}, // {3}\n", paramOffset.at(pi.tensor), gradOffset.at(pi.tensor),
                                bp * n(pi.tensor), commentSafe(s.paramPath(pi)))
                      .str();
        ++count;
      }
    if (count == 0)
      gather += "    {0, 0, 0},\n";
    out += gather + "};\n\n";
    out += "/// ZeRO: the updated parameters of every rank's shard to every rank, through G.\n"
           "static void gather_parameters(rt::Ctx &ctx) {\n" + siteText("data_parallel.gather", "communication") +
           "  const int me = tally_comm::rank();\n"
           "  for (const UpdateEntry &e : kUpdate)\n"
           "    if (e.n > 0 && e.rank == me)\n" +
           llvm::formatv("      tally_comm::copy(ctx, G<uint8_t>(e.g), P<uint8_t>(e.{0}), e.n * {1});\n",
                         hasMaster ? "pm" : "p", bp)
               .str() +
           each("all_gather") +
           "  for (const GatherEntry &e : kGather)\n"
           "    tally_comm::copy(ctx, P<uint8_t>(e.p), G<uint8_t>(e.g), e.bytes);\n}\n\n";
    return out;
  }

  /// update(): the optimizer entries; zero_grad(): the last one.
  bool update(std::string &updateText, std::string &zeroText) {
    Dtype gd = plan.precision.grads, pd = plan.precision.params, md = plan.precision.master;
    std::string G = ctype(gd);
    if (G.empty() || !isFloat(gd))
      return fail("gradients in " + nameOf(gd).str() + " are not supported by the " + title() + " runtime");
    bool hasMaster = md != Dtype::Invalid;
    if (hasMaster && md != Dtype::F32)
      return fail("a " + nameOf(md).str() + " master copy: the " + title() + " optimizers keep fp32 master weights");
    // 16-bit parameters without a master copy (precision = bf16 / fp16): the CPU optimizers
    // update each weight in fp32 and round it back once; the device runtime has no such kernels.
    bool pure16 = !hasMaster && pd != Dtype::F32;
    if (pure16 && (be.device || pd != gd || ctype(pd).empty() || !isFloat(pd)))
      return fail("parameters in " + nameOf(pd).str() + " without an fp32 master copy" +
                  (be.device ? ": the " + title() + " optimizers update fp32 weights"
                             : " and gradients in " + nameOf(gd).str() + ": the " + title() +
                                   " optimizers update 16-bit weights with gradients of their type"));
    if (hasMaster && pd != gd)
      return fail("parameters in " + nameOf(pd).str() + " with gradients in " + nameOf(gd).str() +
                  ": the " + title() + " optimizers refresh the model copy in the gradients' type");
    if (plan.precision.optimizer != Dtype::F32)
      return fail("optimizer state in " + nameOf(plan.precision.optimizer).str() + ": the " + title() + " optimizers keep fp32 state");
    const OptimizerSpec &o = plan.optimizer;
    unsigned states = optimizerStates(o);
    // The table: per trainable parameter, its element count and its offsets.
    std::string table = "/// Per trainable parameter: elements, then byte offsets of the weights updated (the fp32\n"
                        "/// master, or the params region in the params' dtype), the model copy (-1: none), the gradient and each optimizer state.\n"
                        "struct UpdateEntry { int64_t n, p, pm, g, s0, s1; };\n"
                        "static const UpdateEntry kUpdate[] = {\n";
    size_t count = 0;
    bool zero = sharded();
    if (zero) {
      if (pd != gd)
        return fail("ZeRO with parameters in " + nameOf(pd).str() + " and gradients in " + nameOf(gd).str() +
                    ": the " + title() + " step gathers the updated parameters through the gradients region, "
                    "so they must have one dtype");
      table = "/// ZeRO: per piece of a trainable parameter that one rank updates (rank r owns elements\n"
              "/// [r·kShard, (r+1)·kShard) of G): that rank, elements, then byte offsets of the fp32 weights\n"
              "/// (this rank's master shard, or the params region), the model copy (-1: none), the\n"
              "/// gradient and each optimizer state (in this rank's shard of O).\n"
              "struct UpdateEntry { int rank; int64_t n, p, pm, g, s0, s1; };\n"
              "static const UpdateEntry kUpdate[] = {\n";
      int64_t S = a.regions.shard, bg = static_cast<int64_t>(bytesOf(gd)), bp = static_cast<int64_t>(bytesOf(pd));
      int64_t stateBytes = alignUp(S * 4);
      for (const ParamInfo &pi : s.params) {
        if (!pi.trainable)
          continue;
        TensorId t = pi.tensor;
        int64_t g0 = gradOffset.at(t) / bg, total = n(t);
        for (int64_t r = 0; r < plan.parallel.data; ++r) {
          int64_t lo = std::max(g0, r * S), hi = std::min(g0 + total, (r + 1) * S);
          if (lo >= hi)
            continue;
          int64_t j = lo - g0, k = lo - r * S;
          int64_t p = hasMaster ? 4 * k : paramOffset.at(t) + 4 * j;
          int64_t pm = hasMaster ? paramOffset.at(t) + bp * j : -1;
          int64_t s0 = states > 0 ? 4 * k : -1, s1 = states > 1 ? stateBytes + 4 * k : -1;
          table += llvm::formatv("    {{{0}, {1}, {2}, {3}, {4}, {5}, {6}}, // {7} [{8}, {9})\n", r, hi - lo, p, pm,
                                 gradOffset.at(t) + bg * j, s0, s1, commentSafe(s.paramPath(pi)), j, j + hi - lo)
                       .str();
          ++count;
        }
      }
    }
    for (const ParamInfo &pi : s.params) {
      if (!pi.trainable || zero)
        continue;
      TensorId t = pi.tensor;
      int64_t p = hasMaster ? masterOffset.at(t) : paramOffset.at(t);
      int64_t pm = hasMaster ? paramOffset.at(t) : -1;
      int64_t s0 = states > 0 ? stateOffset.at({t, 0}) : -1, s1 = states > 1 ? stateOffset.at({t, 1}) : -1;
      table += llvm::formatv("    {{{0}, {1}, {2}, {3}, {4}, {5}}, // {6}\n", n(t), p, pm, gradOffset.at(t), s0, s1,
                             commentSafe(s.paramPath(pi)))
                   .str();
      ++count;
    }
    if (count == 0)
      table += zero ? "    {0, 0, 0, -1, 0, -1, -1},\n" : "    {0, 0, -1, 0, -1, -1},\n";
    table += "};\n\n";
    std::string gscale = "gscale";
    std::string call;
    float lr = static_cast<float>(o.lr), wd = static_cast<float>(o.weightDecay);
    std::string P = hasMaster ? "M<float>(e.p)" : "P<" + (pure16 ? G : std::string("float")) + ">(e.p)";
    std::string PM = hasMaster ? "e.pm < 0 ? nullptr : P<" + G + ">(e.pm)" : "static_cast<" + G + "*>(nullptr)";
    std::string g = "G<" + G + ">(e.g)", s0 = "O<float>(e.s0)", s1 = "O<float>(e.s1)";
    if (o.name == "AdamW" || o.name == "Adam")
      call = llvm::formatv("rt::adam_update<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, e.n, {6}, {7}, {8}, {9}, {10}, {11}, step, gscale);",
                           G, P, PM, g, s0, s1, number(lr), number(o.beta1), number(o.beta2), number(o.eps),
                           number(wd), o.name == "AdamW" ? "true" : "false")
                 .str();
    else if (o.name == "SGD")
      call = llvm::formatv("rt::sgd_update<{0}>(ctx, {1}, {2}, {3}, {4}, e.n, {5}, {6}, {7}, gscale);", G, P, PM, g,
                           states > 0 ? s0 : "nullptr", number(lr), number(o.momentum), number(wd))
                 .str();
    else if (o.name == "AdaGrad")
      call = llvm::formatv("rt::adagrad_update<{0}>(ctx, {1}, {2}, {3}, {4}, e.n, {5}, {6}, {7}, gscale);", G, P, PM,
                           g, s0, number(lr), number(o.eps), number(wd))
                 .str();
    else if (o.name == "RMSprop")
      call = llvm::formatv("rt::rmsprop_update<{0}>(ctx, {1}, {2}, {3}, {4}, {5}, e.n, {6}, {7}, {8}, {9}, {10}, gscale);",
                           G, P, PM, g, s0, states > 1 ? s1 : "nullptr", number(lr),
                           number(o.beta2 > 0 ? o.beta2 : 0.99), number(o.eps), number(wd), number(o.momentum))
                 .str();
    else if (o.name == "Lion")
      call = llvm::formatv("rt::lion_update<{0}>(ctx, {1}, {2}, {3}, {4}, e.n, {5}, {6}, {7}, {8}, gscale);", G, P, PM,
                           g, s0, number(lr), number(o.beta1), number(o.beta2), number(wd))
                 .str();
    else
      return fail("optimizer " + o.name + " has no " + title() + " update");
    int64_t gradElems = a.regions.grads.bytes / static_cast<int64_t>(bytesOf(gd));
    body.clear();
    bool scaled = plan.precision.lossScaling;
    for (const StepEntry &se : a.stepSchedule) {
      if (se.kind != StepEntry::Optimizer)
        continue;
      op = &s.ops[se.op];
      std::string path = s.opPath(*op);
      switch (op->kind) {
      case OpKind::SumSquares:
        body += "\n  // " + commentSafe(path) + ": the overflow check of fp16 loss scaling\n";
        site(path, "reduction");
        if (be.device && zero) { // this rank's shard of the averaged gradients: Σg² over the ranks
          line(llvm::formatv("const int64_t from = std::min<int64_t>({0}, tally_comm::rank() * kShard);", gradElems).str());
          line(llvm::formatv("rt::sum_squares<{0}>(ctx, G<{0}>(0) + from, std::min<int64_t>(kShard, {1} - from), device_scalars);",
                             G, gradElems)
                   .str());
          line("const double sumsq = tally_comm::sum(device_load(ctx, device_scalars));");
        } else if (be.device) { // Σg² lands in device memory; the host reads it back to decide
          line(llvm::formatv("rt::sum_squares<{0}>(ctx, G<{0}>(0), {1}, device_scalars);", G, gradElems).str());
          line("const double sumsq = device_load(ctx, device_scalars);");
        } else if (zero) { // each rank holds its shard of the averaged gradients: Σg² over all
          line("float sumsq = 0;");
          line(llvm::formatv("const int64_t from = std::min<int64_t>({0}, tally_comm::rank() * kShard);", gradElems).str());
          line(llvm::formatv("rt::sum_squares<{0}>(ctx, G<{0}>(0) + from, std::min<int64_t>(kShard, {1} - from), &sumsq);",
                             G, gradElems)
                   .str());
          line("sumsq = static_cast<float>(tally_comm::sum(sumsq));");
        } else {
          line("float sumsq = 0;");
          line(llvm::formatv("rt::sum_squares<{0}>(ctx, G<{0}>(0), {1}, &sumsq);", G, gradElems).str());
        }
        line("if (!std::isfinite(sumsq))");
        line("  return false; // skip the step: a gradient overflowed");
        break;
      case OpKind::OptimizerUpdate:
        body += "\n  // " + commentSafe(path) + ": " + commentSafe(o.name) + " over every trainable parameter\n";
        site(path, "optimizer");
        line("const float gscale = " + std::string(scaled ? "1.0f / kLossScale" : "1.0f") + ";");
        if (zero) {
          line("const int me = tally_comm::rank();");
          line("for (const UpdateEntry &e : kUpdate)");
          line("  if (e.n > 0 && e.rank == me)");
        } else {
          line("for (const UpdateEntry &e : kUpdate)");
          line("  if (e.n > 0)");
        }
        line("    " + call);
        break;
      case OpKind::ZeroGrad:
        break; // zero_grad() below
      default:
        return fail("no " + title() + " code for optimizer-phase op " + opName(op->kind).str());
      }
    }
    op = nullptr;
    if (zero)
      body += "\n  // ZeRO: every rank's updated parameters to every rank\n  gather_parameters(ctx);\n";
    updateText = table + communication(gradElems) +
                 "/// The optimizer phase: false when the step was skipped (fp16 overflow).\n"
                 "static bool update(rt::Ctx &ctx, int64_t step) {\n" +
                 body + "  return true;\n}\n";
    body.clear();
    site("zero_grad", "optimizer");
    zeroText = llvm::formatv("/// zero_grad: the whole gradient region (padding included) back to zero.\n"
                             "static void zero_grad(rt::Ctx &ctx) {{\n{0}"
                             "  rt::fill<{1}>(ctx, G<{1}>(0), 0.0f, {2});\n}\n",
                             body, G, gradElems)
                   .str();
    if (count == 0)
      zeroText = "static void zero_grad(rt::Ctx &) {}\n";
    return true;
  }

  /// kLayout's tables: parameters and inputs.
  std::string tables() {
    std::string out = "static const ParamInfo kParams[] = {\n";
    for (const ParamInfo &pi : s.params) {
      const Tensor &t = s.tensors[pi.tensor];
      std::vector<int64_t> sz = sizes(pi.tensor);
      llvm::StringRef leaf = *pi.name; // "weight" of "h[0].ln_1.weight"
      const char *init = sz.size() >= 2 ? "Init::Normal002" : leaf == "weight" ? "Init::Ones" : "Init::Zeros";
      auto g = gradOffset.find(pi.tensor);
      auto m = masterOffset.find(pi.tensor);
      int64_t master = m == masterOffset.end() ? -1 : m->second;
      if (sharded() && plan.precision.master != Dtype::Invalid && g != gradOffset.end()) { // tally_step.h
        // An element offset of the grads region in master's dtype: wider than the grads' (bf16
        // grads, fp32 master), it can pass int64 where the grads region did not.
        std::optional<int64_t> at = checkedMul(g->second / static_cast<int64_t>(bytesOf(plan.precision.grads)),
                                               static_cast<int64_t>(bytesOf(plan.precision.master)));
        if (!at)
          fail("the master copy of " + s.paramPath(pi) + " is past 2^63 - 1 bytes: its offset does not fit int64");
        master = at.value_or(-1);
      }
      out += llvm::formatv("    {{{{{0}, \"{1}\", {2}, {3}, {4}}, {5}, {6}, {7}, {8}, {9}},\n", literal(tensorName(s.paramPath(pi))),
                           stName(t.dtype), sz.size(), list(sz), n(pi.tensor), paramOffset.at(pi.tensor),
                           boolean(pi.trainable), g == gradOffset.end() ? -1 : g->second, master, init)
                 .str();
    }
    if (s.params.empty())
      out += "    {{\"\", \"F32\", 0, {}, 0}, 0, false, -1, -1, Init::Zeros},\n";
    out += "};\n\nstatic const InputInfo kInputs[] = {\n";
    for (TensorId t : s.inputs) {
      const Tensor &x = s.tensors[t];
      std::vector<int64_t> sz = sizes(t);
      bool batched = !x.shape.empty() && x.shape[0].sym != 0 && s.symbols[x.shape[0].sym] == "batch";
      int64_t vocab = 2;
      for (const Op &o : s.ops)
        if (o.kind == OpKind::Embedding && base(o.inputs[0]) == t)
          vocab = shape(o.inputs[1])[0].size;
      out += llvm::formatv("    {{{{{0}, \"{1}\", {2}, {3}, {4}}, {5}, {6}, {7}},\n", literal(s.tensorName(t)), stName(stored(t)),
                           sz.size(), list(sz), n(t), dataOffset.at(t), boolean(batched), vocab)
                 .str();
    }
    if (s.inputs.empty())
      out += "    {{\"\", \"F32\", 0, {}, 0}, 0, false, 0},\n";
    return out + "};\n";
  }

  bool checkPlan() {
    const Parallelism &par = plan.parallel;
    if (!plan.isTrain)
      return fail("plan " + plan.name + " is an infer plan; `tally build` generates training steps");
    if (s.loss == kNone)
      return fail("the model returns no loss to train on");
    if (par.tensor != 1 || par.pipeline != 1 || par.context != 1 || par.expert != 1 || par.devices != par.data)
      return fail("the " + title() + " backend runs data parallelism only (processes under " + be.parallelEngine +
                  "); this plan splits the model (tensor " + std::to_string(par.tensor) + ", pipeline " +
                  std::to_string(par.pipeline) + ", context " + std::to_string(par.context) + ", expert " +
                  std::to_string(par.expert) + ")");
    if (par.data > 1 && par.zero > 1)
      return fail("ZeRO stage " + std::to_string(par.zero) + ": the " + title() + " backend shards the optimizer "
                  "state and master weights (zero = 1), not the gradients or parameters");
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

  /// Device backends: copying a scalar back to the host (the loss, the overflow check's Σg²).
  std::string deviceHelpers() const {
    if (!be.device)
      return "";
    return "/// A scalar of device memory read on the host (the loss, the fp16 overflow check's sum of\n"
           "/// squares): copied on the step's stream, which is then waited for. Every call is checked.\n"
           "template <class T> double device_load(rt::Ctx &ctx, const T *p) {\n"
           "  T v;\n"
           "  rt::cu::check(cudaMemcpyAsync(&v, p, sizeof(T), cudaMemcpyDeviceToHost, ctx.stream), \"cudaMemcpyAsync\",\n"
           "                \"device_load\", ctx.where);\n"
           "  rt::cu::check(cudaStreamSynchronize(ctx.stream), \"cudaStreamSynchronize\", \"device_load\", ctx.where);\n"
           "  return rt::load(v);\n"
           "}\n";
  }

  /// Device backends: kOpSites, the op class of every path ctx.where takes (the driver files
  /// each kernel's CUDA-event time under it).
  std::string opSites() const {
    if (!be.device)
      return "";
    std::string out = "const OpSite kOpSites[] = {\n";
    for (const auto &[path, cls] : sites)
      out += "    {" + literal(path) + ", " + literal(cls) + "},\n";
    if (sites.empty())
      out += "    {\"\", \"\"},\n";
    return out + "};\nconst int kNumOpSites = " + std::to_string(sites.size()) + ";\n\n";
  }

  bool run(std::vector<File> &files) {
    if (!a.planOverflow.empty())
      return fail("the memory plan does not fit in 64-bit byte offsets: " + a.planOverflow);
    index();
    if (!error.empty() || !checkPlan())
      return false;
    std::string micro, upd, zero;
    if (!microStep(micro) || !update(upd, zero))
      return false;
    const Graph &g = *a.graph;
    double lossScale = plan.precision.lossScaling ? kLossScale : 1.0;
    std::string src;
    llvm::raw_string_ostream os(src);
    os << "// Generated by `tally build` from " << commentSafe(opt.source) << ", plan " << commentSafe(plan.name)
       << ": the training step of " << commentSafe(g.model) << " " << be.machine << ".\n"
       << "// One call per op of the step graph (`tally report --emit=ir`), in the order of the schedule\n"
       << "// (`tally report --emit=memory-plan`); every operand is a byte offset into one region:\n"
       << "//   A arena " << a.arenaBytes << " B, P params " << a.regions.params.bytes << " B, G grads "
       << a.regions.grads.bytes << " B, M master " << a.regions.master.bytes << " B,\n"
       << "//   O optimizer state " << a.regions.optimizer.bytes << " B, D data " << dataBytes << " B.\n"
       << "// Kernels: runtime/" << be.runtimeHeader << " (codegen/runtime/API.md). Rewritten by every `tally build`.\n"
       << "#include \"" << be.runtimeHeader << "\"\n#include \"driver/tally_step.h\"\n" << be.extraIncludes
       << (dataParallel() ? "#include \"" + std::string(be.commHeader) + "\"\n\n#include <algorithm>\n" : "\n")
       << "#include <cmath>\n\n"
       << "namespace tally_step {\n\nMemory mem;\nconst char *op_class = \"\";\n\nnamespace {\n\n"
       << "template <class T> T *A(int64_t off) { return reinterpret_cast<T *>(mem.arena + off); }\n"
       << "template <class T> T *P(int64_t off) { return reinterpret_cast<T *>(mem.params + off); }\n"
       << "template <class T> T *G(int64_t off) { return reinterpret_cast<T *>(mem.grads + off); }\n"
       << "template <class T> T *M(int64_t off) { return reinterpret_cast<T *>(mem.master + off); }\n"
       << "template <class T> T *O(int64_t off) { return reinterpret_cast<T *>(mem.optimizer + off); }\n"
       << "template <class T> T *D(int64_t off) { return reinterpret_cast<T *>(mem.data + off); }\n"
       << "/// Shapes and strides passed inline: dims{{16, 64}} converts to const int64_t *.\n"
       << "struct dims {\n  int64_t v[8];\n  operator const int64_t *() const { return v; }\n};\n"
       << (be.device ? "[[maybe_unused]] " : "") << "constexpr float kLossScale = " << number(lossScale) << ";\n" << deviceHelpers() << "\n"
       << tables() << "\n"
       << micro << "\n" << upd << "\n" << zero << "\n"
       << "} // namespace\n\n"
       << opSites()
       << "const Layout kLayout = {" << literal(g.model) << ", " << literal(plan.name) << ", "
       << literal(opt.source) << ", \"" << be.name << "\", " << a.arenaBytes << ", " << a.regions.params.bytes << ", "
       << a.regions.grads.bytes << ", " << a.regions.master.bytes << ", " << a.regions.optimizer.bytes << ", "
       << dataBytes << ", \"" << stName(plan.precision.grads) << "\", \""
       << (plan.precision.master == Dtype::Invalid ? "" : stName(plan.precision.master)) << "\", "
       << plan.batch << ", " << plan.microBatch << ", " << plan.batch / (plan.microBatch * plan.parallel.data) << ", "
       << number(lossScale) << ", " << llvm::formatv("{0:e6}", a.flops.step).str() << ", "
       << (s.params.empty() ? 0 : s.params.size()) << ", " << s.inputs.size() << ", kParams, kInputs, "
       << plan.parallel.data << ", " << (sharded() ? 1 : 0) << ", " << a.regions.shard << "};\n\n"
       << "double train_step(rt::Ctx &ctx, int64_t step, uint64_t seed, void (*load_micro_batch)(int64_t m),\n"
       << "                  void (*before_zero)(), bool *updated) {\n"
       << "  double loss = 0;\n"
       << "  for (int64_t m = 0; m < kLayout.microSteps; ++m) {\n"
       << "    load_micro_batch(m);\n"
       << (overlap() ? "    loss += micro_step(ctx, seed + static_cast<uint64_t>(m), m + 1 == kLayout.microSteps);\n"
                     : "    loss += micro_step(ctx, seed + static_cast<uint64_t>(m));\n")
       << "  }\n";
    if (dataParallel())
      os << "  reduce_gradients(ctx);\n"
         << "  if (before_zero) {\n" << (sharded() ? "    gather_gradients(ctx);\n" : "") << "    before_zero();\n  }\n"
         << "  *updated = update(ctx, step);\n";
    else
      os << "  *updated = update(ctx, step);\n"
         << "  if (before_zero)\n    before_zero();\n";
    os << "  zero_grad(ctx);\n"
       << "  return loss / static_cast<double>(kLayout.microSteps);\n}\n\n"
       << "} // namespace tally_step\n";
    os.flush();
    if (!error.empty()) // tables() found an offset past int64
      return false;
    files.push_back({be.stepFile, src});
    // MPI only for a step that runs on several processes.
    files.push_back({"CMakeLists.txt", std::string(be.cmakeLists) + (dataParallel() ? be.dataParallelCmake : "")});
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
};

} // namespace

const Backend &cpuBackend() {
  static const Backend be = {
      "cpu", "CPU", "on the CPU", "step.cpp", "cpu/tally_rt.h", "", "MPI", false,
      "# Generated by `tally build`: the training step and its driver, linked with the CPU\n"
      "# runtime (OpenBLAS, OpenMP). cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build\n"
      "cmake_minimum_required(VERSION 3.16)\n"
      "project(tally_step CXX)\n"
      "set(CMAKE_CXX_STANDARD 17)\nset(CMAKE_CXX_STANDARD_REQUIRED ON)\n"
      "if(NOT CMAKE_BUILD_TYPE)\n  set(CMAKE_BUILD_TYPE Release)\nendif()\n"
      "include(${CMAKE_CURRENT_LIST_DIR}/runtime/cpu/tally_rt_cpu.cmake)\n"
      "add_executable(tally_step step.cpp runtime/driver/driver_cpu.cpp)\n"
      "target_include_directories(tally_step PRIVATE ${CMAKE_CURRENT_LIST_DIR}/runtime)\n"
      "target_link_libraries(tally_step PRIVATE tally_rt_cpu)\n",
      "driver/tally_comm.h",
      "# Data parallel: the ranks are MPI processes (runtime/driver/tally_comm.h).\n"
      "find_package(MPI REQUIRED COMPONENTS CXX)\n"
      "target_link_libraries(tally_step PRIVATE MPI::MPI_CXX)\n"
      "target_compile_definitions(tally_step PRIVATE TALLY_MPI=1)\n",
      {"cuda/", "driver/driver_cuda.cu", "driver/tally_step_cuda.h", "driver/tally_comm_nccl.h"},
      nullptr,
      nullptr};
  return be;
}

std::string emitStep(const Analysis &a, const EmitOptions &options, const Backend &be, std::vector<File> &out) {
  if (!a.step || !a.plan || !a.graph)
    return "nothing to generate: the plan was not analyzed";
  Emitter e(a, options, be);
  if (!e.run(out))
    return e.error.empty() ? "the step could not be generated" : e.error;
  return "";
}

std::string emitCpuStep(const Analysis &a, const EmitOptions &options, std::vector<File> &out) {
  return emitStep(a, options, cpuBackend(), out);
}

} // namespace tally::codegen
