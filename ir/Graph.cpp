// The IR graph's small helpers: op names and classes, building, shape formatting, verification.
#include "ir/Graph.h"
#include "ir/OpRules.h"
#include "support/Format.h"

#include <type_traits>

#include "llvm/Support/ErrorHandling.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "llvm/ADT/Hashing.h"

namespace tally {

static_assert(sizeof(IdList) == 16 && sizeof(Op) == 88 && sizeof(Tensor) == 40,
              "Op or Tensor grew: a 100,000-layer step has millions of each (issue 12)");

void IdList::reserve(size_t n) {
  size_t room = onHeap() ? words_[0] : kInline;
  if (n <= room)
    return;
  if (n >= kHeap)
    llvm::report_fatal_error("an op with over 2^31 inputs or outputs");
  size_t cap = std::max<size_t>(n, 2 * room);
  cap = std::min<size_t>(cap, kHeap - 1);
  auto *block = static_cast<uint32_t *>(std::malloc(cap * sizeof(uint32_t)));
  if (!block)
    llvm::report_bad_alloc_error("IdList");
  std::copy(begin(), end(), block);
  release();
  words_[0] = static_cast<uint32_t>(cap);
  std::memcpy(words_ + 1, &block, sizeof block);
  size_ |= kHeap;
}

SharedAttrs::SharedAttrs() {
  static const std::shared_ptr<const OpAttrs> defaults = std::make_shared<const OpAttrs>();
  p_ = defaults;
}

bool sameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

namespace {
bool sameShape(const Shape &a, const Shape &b) {
  if (a.size() != b.size())
    return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].size != b[i].size || a[i].sym != b[i].sym)
      return false;
  return true;
}

struct ShapeHash {
  size_t operator()(const Shape &s) const {
    size_t h = s.size();
    for (const Dim &d : s)
      h = (h * 1000003) ^ std::hash<int64_t>()(d.size) ^ (static_cast<size_t>(d.sym) << 40);
    return h;
  }
  size_t operator()(const ShapeRef::Data &s) const { return (*this)(s.dims); }
};
struct ShapeEq {
  bool operator()(const ShapeRef::Data &a, const ShapeRef::Data &b) const { return sameShape(a.dims, b.dims); }
};
} // namespace

namespace {
/// The pooled copy of a value (shapes, layouts, names): one process-wide, locked, grow-only
/// pool per call site (the template is instantiated once per pool: its lambdas are that
/// site's own). Node-based and never erased, so an entry never moves and a pointer to it
/// never dangles. In front of the lock, the entries this thread last found, by `hash` (a
/// deep model asks millions of times for the same few dozen values; the lock was 3% of a
/// 30,000-layer check); a hit is compared in full (`same`). `make` builds the value to insert.
template <class T, class Hash, class Eq, class Same, class Make>
const T *pooled(size_t hash, Same same, Make make) {
  thread_local const T *recent[64] = {};
  const T *&hit = recent[(hash ^ (hash >> 23)) & 63];
  if (hit && same(*hit))
    return hit;
  static std::mutex lock;
  static std::unordered_set<T, Hash, Eq> pool;
  T value = make();
  std::lock_guard<std::mutex> hold(lock);
  hit = &*pool.insert(std::move(value)).first;
  return hit;
}
} // namespace

const ShapeRef::Data *ShapeRef::intern(const Shape &s) {
  return pooled<Data, ShapeHash, ShapeEq>(
      ShapeHash()(s), [&](const Data &x) { return sameShape(x.dims, s); },
      [&] { return Data{s, numel(s), checkedNumel(s)}; });
}

namespace {
struct LayoutHash {
  size_t operator()(llvm::ArrayRef<int64_t> strides, int64_t offset) const {
    size_t h = std::hash<int64_t>()(offset);
    for (int64_t s : strides)
      h = (h * 1000003) ^ std::hash<int64_t>()(s);
    return h;
  }
  size_t operator()(const Layout::Data &l) const { return (*this)(l.strides, l.offset); }
};
struct LayoutEq {
  bool operator()(const Layout::Data &a, const Layout::Data &b) const {
    return a.offset == b.offset && a.strides == b.strides;
  }
};
} // namespace

const Layout::Data *Layout::intern(llvm::ArrayRef<int64_t> strides, int64_t offset) {
  return pooled<Data, LayoutHash, LayoutEq>(
      LayoutHash()(strides, offset),
      [&](const Data &x) { return x.offset == offset && llvm::ArrayRef<int64_t>(x.strides) == strides; },
      [&] {
        Data d;
        d.strides.assign(strides.begin(), strides.end());
        d.offset = offset;
        return d;
      });
}

Layout::Layout() {
  static const Data *rowMajor = intern({}, 0);
  p_ = rowMajor;
}

ShapeRef::ShapeRef() {
  static const Data *scalar = intern(Shape());
  p_ = scalar;
}

// Every field of OpAttrs is compared and hashed below; this size changes when one is added.
static_assert(sizeof(OpAttrs) == 384, "a field was added to OpAttrs: compare and hash it in sameAttrs and hashAttrs");

const char *crossEntropyKernelName(CrossEntropyKernel k) {
  switch (k) {
  case CrossEntropyKernel::Fused: return "fused";
  case CrossEntropyKernel::Eager: return "eager";
  case CrossEntropyKernel::Megatron: return "megatron";
  }
  return "fused";
}

const char *normKernelName(NormKernel k) { return k == NormKernel::Eager ? "eager" : "fused"; }

bool sameAttrs(const OpAttrs &a, const OpAttrs &b) {
  if (&a == &b) // one shared record (SharedAttrs: the copies of a repeated block's ops)
    return true;
  if (a.dim != b.dim || a.parts != b.parts || a.k != b.k || !sameBits(a.capacity, b.capacity) ||
      a.heads != b.heads || a.kvHeads != b.kvHeads || a.causal != b.causal || a.fused != b.fused ||
      a.keepDim != b.keepDim || a.reduceAll != b.reduceAll || !sameBits(a.p, b.p) ||
      !sameBits(a.eps, b.eps) || a.hasScalar != b.hasScalar || !sameBits(a.scalar, b.scalar) ||
      a.scalarOnLeft != b.scalarOnLeft || a.shares != b.shares || a.transposeA != b.transposeA ||
      a.transposeB != b.transposeB || !sameShape(a.newShape, b.newShape) ||
      !sameBits(a.scale, b.scale) || a.headDim != b.headDim || !sameBits(a.theta, b.theta) ||
      !sameBits(a.fraction, b.fraction) || a.alibi != b.alibi || a.hasMask != b.hasMask || a.loss != b.loss ||
      a.norm != b.norm ||
      a.attnWindow != b.attnWindow || !sameBits(a.softcap, b.softcap) ||
      a.latent != b.latent || a.latentRope != b.latentRope ||
      a.stream != b.stream || a.of != b.of || a.gradMask != b.gradMask || a.optimizer != b.optimizer ||
      a.slices.size() != b.slices.size())
    return false;
  for (int i = 0; i < 2; ++i)
    if (a.window[i] != b.window[i] || a.strides[i] != b.strides[i] || a.pads[i] != b.pads[i])
      return false;
  for (size_t i = 0; i < a.slices.size(); ++i)
    if (a.slices[i].start != b.slices[i].start || a.slices[i].count != b.slices[i].count ||
        a.slices[i].step != b.slices[i].step || a.slices[i].drop != b.slices[i].drop)
      return false;
  return true;
}

size_t hashAttrs(const OpAttrs &a) {
  // The fields that tell a step's derived attributes apart (equal attributes must hash
  // equal; sameAttrs decides).
  llvm::hash_code h = llvm::hash_combine(a.dim, a.k, a.heads, a.gradMask, static_cast<int>(a.of),
                                         a.stream, a.hasScalar, a.shares, a.newShape.size());
  for (const Dim &d : a.newShape)
    h = llvm::hash_combine(h, d.size);
  return h;
}

SharedAttrs AttrsPool::get(OpAttrs a) {
  size_t h = hashAttrs(a);
  auto [lo, hi] = byHash_.equal_range(h);
  for (auto it = lo; it != hi; ++it)
    if (sameAttrs(*it->second, a))
      return it->second;
  return byHash_.emplace(h, SharedAttrs(std::move(a)))->second;
}

static_assert(std::is_nothrow_move_constructible_v<Tensor> && std::is_nothrow_move_constructible_v<Op>,
              "graphs grow by moving their tensors and ops");

namespace {
struct OpEntry {
  const char *name;
  OpClass cls;
};
const OpEntry kOps[] = {
#define OP(ID, NAME, CLASS) {NAME, OpClass::CLASS},
#include "ir/Ops.def"
};
} // namespace

double numel(const Shape &s) {
  double n = 1;
  for (const Dim &d : s)
    n *= static_cast<double>(d.size);
  return n;
}

std::optional<int64_t> checkedNumel(const Shape &s) {
  int64_t n = 1;
  for (const Dim &d : s) {
    if (d.size < 0 || __builtin_mul_overflow(n, d.size, &n))
      return std::nullopt;
  }
  return n;
}

llvm::StringRef opName(OpKind k) { return kOps[static_cast<unsigned>(k)].name; }
OpClass opClass(OpKind k) { return kOps[static_cast<unsigned>(k)].cls; }

llvm::StringRef opClassName(OpClass c) {
  switch (c) {
  case OpClass::Matmul: return "matmul";
  case OpClass::Attention: return "attention";
  case OpClass::Elementwise: return "elementwise";
  case OpClass::Reduction: return "reduction";
  case OpClass::Normalization: return "normalization";
  case OpClass::Loss: return "loss";
  case OpClass::Data: return "data";
  case OpClass::View: return "view";
  }
  return "?";
}

llvm::StringRef phaseName(Phase p) {
  switch (p) {
  case Phase::Forward: return "forward";
  case Phase::Backward: return "backward";
  case Phase::Optimizer: return "optimizer";
  }
  return "forward";
}

llvm::SmallVector<int64_t, 4> denseStrides(const Shape &s) {
  llvm::SmallVector<int64_t, 4> st(s.size(), 1);
  for (size_t i = s.size(); i-- > 1;)
    st[i - 1] = st[i] * std::max<int64_t>(1, s[i].size);
  return st;
}

llvm::SmallVector<int64_t, 4> stridesOf(const Shape &s, const Layout &l) {
  if (l.strides().empty())
    return denseStrides(s);
  return llvm::SmallVector<int64_t, 4>(l.strides().begin(), l.strides().end());
}

namespace {
/// Whether `strides` are exactly the row-major strides of `s` (denseStrides), compared
/// without building them; a product past int64 is not row-major. Exact, so every other list
/// (a size-1 dimension's odd stride included) is kept as written (Layout).
bool rowMajor(const Shape &s, llvm::ArrayRef<int64_t> strides) {
  if (strides.size() != s.size())
    return false;
  int64_t stride = 1;
  for (size_t i = s.size(); i-- > 0;)
    if (strides[i] != stride ||
        (i > 0 && __builtin_mul_overflow(stride, std::max<int64_t>(1, s[i].size), &stride)))
      return false;
  return true;
}
} // namespace

void setLayout(Tensor &t, llvm::ArrayRef<int64_t> strides, int64_t offset) {
  t.layout = Layout(rowMajor(t.shape, strides) ? llvm::ArrayRef<int64_t>() : strides, offset);
}

bool isDense(const Shape &s, const Layout &l) {
  if (l.strides().empty())
    return true;
  int64_t stride = 1; // denseStrides(s)[i], from the back, without building them
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i].size > 1 && l.strides()[i] != stride)
      return false;
    if (i > 0)
      stride *= std::max<int64_t>(1, s[i].size);
  }
  return true;
}

std::optional<llvm::SmallVector<int64_t, 4>>
viewStrides(const Shape &oldShape, llvm::ArrayRef<int64_t> oldStrides, const Shape &newShape) {
  // PyTorch's view rule: walk the old dimensions from the back in chunks whose strides are
  // contiguous with each other (stride[d-1] = stride[d]·size[d]); each chunk must be covered
  // exactly by a run of new dimensions, which get row-major strides inside the chunk.
  llvm::SmallVector<int64_t, 4> out(newShape.size(), 1);
  int64_t total = 1;
  for (const Dim &d : oldShape)
    total *= d.size;
  if (total == 0)
    return denseStrides(newShape);
  if (oldShape.empty()) {
    for (const Dim &d : newShape)
      if (d.size != 1)
        return std::nullopt;
    return out;
  }
  int64_t view = static_cast<int64_t>(newShape.size()) - 1;
  int64_t base = oldStrides.back(), tensorNumel = 1, viewNumel = 1;
  for (int64_t d = static_cast<int64_t>(oldShape.size()) - 1; d >= 0; --d) {
    tensorNumel *= oldShape[d].size;
    bool chunkEnds = d == 0 || (oldShape[d - 1].size != 1 &&
                                oldStrides[d - 1] != tensorNumel * base);
    if (!chunkEnds)
      continue;
    while (view >= 0 && (viewNumel < tensorNumel || newShape[view].size == 1)) {
      out[view] = viewNumel * base;
      viewNumel *= newShape[view].size;
      --view;
    }
    if (viewNumel != tensorNumel)
      return std::nullopt;
    if (d > 0) {
      base = oldStrides[d - 1];
      tensorNumel = viewNumel = 1;
    }
  }
  if (view != -1)
    return std::nullopt;
  return out;
}

void TensorLists::build(size_t tensors, const std::vector<std::pair<TensorId, uint32_t>> &pairs) {
  start.assign(tensors + 1, 0);
  for (const auto &[t, x] : pairs)
    ++start[t + 1];
  for (size_t t = 0; t < tensors; ++t)
    start[t + 1] += start[t];
  items.resize(pairs.size());
  std::vector<uint32_t> next(start.begin(), start.end() - 1);
  for (const auto &[t, x] : pairs)
    items[next[t]++] = x;
}

Graph Graph::extend() const {
  // Every field: one added to Graph must be added here (the size check is the reminder).
  static_assert(sizeof(Graph) == 224 + 4 * sizeof(Records<Tensor>), "a field was added to Graph: copy it in Graph::extend");
  Graph g;
  g.model = model;
  g.tensors = Records<Tensor>::extend(tensors);
  g.ops = Records<Op>::extend(ops);
  g.params = Records<ParamInfo>::extend(params);
  g.instances = Records<Instance>::extend(instances);
  g.inputs = inputs;
  g.inputNames = inputNames;
  g.loss = loss;
  g.outputs = outputs;
  g.locals = locals;
  g.symbols = symbols;
  g.activationDtype = activationDtype;
  g.gradient = gradient;
  g.differentiated = differentiated;
  g.randomStreams = randomStreams;
  g.skipped = skipped;
  return g;
}

TensorId Graph::addTensor(Tensor &&t) {
  tensors.push_back(std::move(t));
  Tensor &x = tensors.back();
  // None listed, a wrong count or the row-major list: listed as none (Layout). Most list
  // none already, and keep their Layout as it is (not looked up in its pool again).
  if (!x.layout.strides().empty() &&
      (x.layout.strides().size() != x.shape.size() || rowMajor(x.shape, x.layout.strides())))
    x.layout = Layout({}, x.layout.offset());
  return static_cast<TensorId>(tensors.size() - 1);
}

OpId Graph::addOp(Op &&op) {
  OpId id = static_cast<OpId>(ops.size());
  for (TensorId t : op.outputs)
    tensors[t].producer = id;
  ops.push_back(std::move(op));
  return id;
}

std::string Graph::opPath(const Op &op) const {
  // Safe on a broken graph too (the verifier names its ops): an instance or forward op out of
  // range is said as such, and a forward op is followed only to a forward op.
  if (op.phase == Phase::Forward) {
    std::string path = op.instance < instances.size()
                           ? joinPath(instancePath(op.instance), opName(op.kind))
                           : "<instance " + std::to_string(op.instance) + ">." + opName(op.kind).str();
    if (op.ordinal > 1)
      path.append(1, '#').append(std::to_string(op.ordinal));
    return path;
  }
  if (op.forwardOp < ops.size() && ops[op.forwardOp].phase == Phase::Forward)
    return joinPath(opPath(ops[op.forwardOp]), opName(op.kind));
  return opName(op.kind).str();
}

uint32_t Graph::symbol(llvm::StringRef name) {
  if (name.empty())
    return 0;
  for (uint32_t i = 1; i < symbols.size(); ++i)
    if (symbols[i] == name)
      return i;
  symbols.push_back(name.str());
  return static_cast<uint32_t>(symbols.size() - 1);
}

std::string Graph::formatShape(const Shape &s) const {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i)
      out += ", ";
    out += s[i].sym ? symbols[s[i].sym] : std::to_string(s[i].size);
  }
  return out + "]";
}

std::string Graph::formatSizes(const Shape &s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i)
      out += ", ";
    out += std::to_string(s[i].size);
  }
  return out + "]";
}

std::string Graph::tensorName(TensorId t) const {
  const Tensor &x = tensors[t];
  if (x.role == TensorRole::Param && x.param < params.size())
    return paramPath(x.param);
  if (x.role == TensorRole::Input)
    for (size_t i = 0; i < inputs.size() && i < inputNames.size(); ++i)
      if (inputs[i] == t)
        return inputNames[i];
  return "";
}

std::string Graph::instancePath(uint32_t instance) const {
  if (instance >= instances.size())
    return "<instance " + std::to_string(instance) + ">";
  llvm::SmallVector<const std::string *, 8> parts;
  size_t length = 0;
  for (uint32_t i = instance;;) {
    const Instance &in = instances[i];
    parts.push_back(in.part);
    length += in.part->size();
    if (in.parent >= i) // the model (kNone), or a broken parent link
      break;
    i = in.parent;
  }
  std::string path;
  path.reserve(length);
  for (size_t k = parts.size(); k-- > 0;)
    path += *parts[k];
  return path;
}

std::string Graph::paramPath(const ParamInfo &p) const { return joinPath(instancePath(p.instance), *p.name); }

namespace {
struct NameHash {
  size_t operator()(const std::string &s) const { return llvm::hash_value(llvm::StringRef(s)); }
};
} // namespace

const std::string &pooledName(llvm::StringRef s) {
  return *pooled<std::string, NameHash, std::equal_to<std::string>>(
      llvm::hash_value(s), [&](const std::string &x) { return llvm::StringRef(x) == s; },
      [&] { return s.str(); });
}

namespace {
std::mutex labelLock;
const char *labelTexts[256];
size_t labelCount = 0;
} // namespace

uint8_t Label::indexOf(const char *text) {
  // Each text is given where it is written as a literal: the last few pointers a thread saw
  // are remembered (a walk labels millions of buffers with a handful of literals).
  struct Seen {
    const char *text;
    uint8_t index;
  };
  thread_local Seen seen[16];
  thread_local size_t next = 0;
  if (!text)
    text = "";
  for (const Seen &s : seen) // compared in full too: a pointer may be reused for another text
    if (s.text == text && std::strcmp(labelTexts[s.index], text) == 0)
      return s.index;
  std::lock_guard<std::mutex> hold(labelLock);
  size_t i = 0;
  while (i < labelCount && std::strcmp(labelTexts[i], text) != 0)
    ++i;
  if (i == labelCount) {
    if (labelCount == 256)
      llvm::report_fatal_error("internal error: more than 256 distinct labels");
    labelTexts[labelCount++] = pooledName(text).c_str(); // a copy that is never freed
  }
  seen[next++ % 16] = {text, static_cast<uint8_t>(i)};
  return static_cast<uint8_t>(i);
}

const char *Label::text(uint8_t index) {
  // Written under the lock before any Label held this index; never changed after.
  return labelTexts[index];
}

namespace {
/// Whether every element a view can address lies inside its storage.
bool viewInBounds(const Graph &g, const Tensor &t) {
  const Tensor &base = g.tensors[t.viewOf];
  int64_t lo = t.layout.offset(), hi = t.layout.offset();
  llvm::SmallVector<int64_t, 4> strides = stridesOf(t.shape, t.layout);
  for (size_t i = 0; i < t.shape.size(); ++i) {
    if (t.shape[i].size == 0)
      return true;
    int64_t span = (t.shape[i].size - 1) * strides[i];
    (span < 0 ? lo : hi) += span;
  }
  auto n = checkedNumel(base.shape);
  return n && lo >= 0 && hi < std::max<int64_t>(*n, 1);
}
} // namespace

RepeatCopies findRepeatCopies(const Graph &g) {
  // Instances are made parents first, so one pass in order finds each one's copy.
  std::vector<uint32_t> copyOfInstance(g.instances.size(), kNone);
  for (uint32_t i = 0; i < g.instances.size(); ++i) {
    uint32_t parent = g.instances[i].parent;
    if (parent == kNone || parent >= i)
      continue; // the model itself
    if (copyOfInstance[parent] != kNone)
      copyOfInstance[i] = copyOfInstance[parent];
    else if (*g.instances[parent].block == "repeat")
      copyOfInstance[i] = i;
  }
  RepeatCopies r;
  r.ofOp.assign(g.ops.size(), kNone);
  std::vector<uint32_t> index(g.instances.size(), kNone); // per copy instance
  for (OpId o = 0; o < g.ops.size(); ++o) {
    uint32_t inst = g.ops[o].instance;
    uint32_t c = inst < copyOfInstance.size() ? copyOfInstance[inst] : kNone;
    if (c == kNone)
      continue;
    if (index[c] == kNone) {
      index[c] = static_cast<uint32_t>(r.copies.size());
      r.copies.push_back({g.instancePath(c), {}});
    }
    r.ofOp[o] = index[c];
    r.copies[index[c]].ops.push_back(o);
  }
  r.ofInstance.assign(g.instances.size(), kNone);
  for (uint32_t i = 0; i < g.instances.size(); ++i)
    if (copyOfInstance[i] != kNone)
      r.ofInstance[i] = index[copyOfInstance[i]];
  return r;
}

std::string verifyGraph(const Graph &g, size_t verifiedOps, size_t verifiedTensors) {
  verifiedOps = std::min(verifiedOps, g.ops.size());
  verifiedTensors = std::min(verifiedTensors, g.tensors.size());
  std::vector<uint8_t> defined(g.tensors.size(), 0); // bytes, not bits: read and set per id of every op
  auto name = [](TensorId t) { return "tensor %" + std::to_string(t); };
  for (TensorId t = 0; t < verifiedTensors; ++t) {
    TensorRole role = g.tensors[t].role;
    defined[t] = role == TensorRole::Input || role == TensorRole::Param;
  }
  for (TensorId t = static_cast<TensorId>(verifiedTensors); t < g.tensors.size(); ++t) {
    const Tensor &x = g.tensors[t];
    // Inputs and parameters exist before the step; so do parameters' gradients, which the
    // gradient region holds (zeroed by the previous step's zero_grad, or at allocation).
    if (x.role == TensorRole::Input || x.role == TensorRole::Param)
      defined[t] = true;
    if (x.role == TensorRole::Gradient && x.gradOf != kNone && x.viewOf == kNone &&
        g.tensors[x.gradOf].role == TensorRole::Param)
      defined[t] = true;
    if (t == g.skipped.boundary) // a compact step's: the skipped ops wrote it (Graph::Skipped)
      defined[t] = true;
    if (x.dtype == Dtype::Invalid)
      return name(t) + " has no dtype";
    if (!checkedNumel(x.shape))
      return name(t) + " has an overflowing or negative shape";
    if (x.role == TensorRole::Param && (x.param >= g.params.size() || g.params[x.param].tensor != t))
      return "parameter " + name(t) + " is not listed in params";
    if (!x.layout.strides().empty() && x.layout.strides().size() != x.shape.size())
      return name(t) + " has " + std::to_string(x.layout.strides().size()) + " strides for rank " +
             std::to_string(x.shape.size());
    if (x.viewOf != kNone) {
      if (x.viewOf >= t || g.tensors[x.viewOf].viewOf != kNone)
        return name(t) + " views a tensor that is not an earlier base tensor";
      if (!viewInBounds(g, x))
        return name(t) + " addresses elements outside its storage %" + std::to_string(x.viewOf);
    } else if (x.layout.offset() != 0 || !isDense(x.shape, x.layout)) {
      return name(t) + " owns its storage but is not dense";
    }
  }
  // A view is defined once its storage is: views made by autodiff have no op of their own.
  auto isDefined = [&](TensorId t) {
    return defined[t] || (g.tensors[t].viewOf != kNone && defined[g.tensors[t].viewOf]);
  };
  Phase phase = Phase::Forward;
  for (OpId o = 0; o < verifiedOps; ++o) { // a verified forward graph: its outputs are defined
    for (TensorId t : g.ops[o].outputs)
      defined[t] = true;
    phase = g.ops[o].phase;
  }
  for (OpId o = static_cast<OpId>(verifiedOps); o < g.ops.size(); ++o) {
    const Op &op = g.ops[o];
    if (op.phase < phase)
      return "op " + g.opPath(op) + " is " + phaseName(op.phase).str() + " after a " +
             phaseName(phase).str() + " op";
    phase = op.phase;
    for (TensorId t : op.inputs)
      if (t >= g.tensors.size() || !isDefined(t))
        return "op " + g.opPath(op) + " reads " + name(t) + " before it is written";
    bool inPlace = op.phase == Phase::Optimizer;
    for (size_t i = 0; i < op.outputs.size(); ++i) {
      TensorId t = op.outputs[i];
      if (t >= g.tensors.size())
        return "op " + g.opPath(op) + " writes an unknown tensor";
      bool acc = i < 32 && ((op.accumulate >> i) & 1); // wider ops (a split, the update) never add
      // A gradient is written once unless later writes add to it; a view of a gradient is
      // written into its storage, which must exist when the write adds.
      if (acc && !isDefined(t))
        return "op " + g.opPath(op) + " adds into " + name(t) + " before anything wrote it";
      if (!acc && !inPlace && defined[t] && g.tensors[t].role != TensorRole::Gradient)
        return "op " + g.opPath(op) + " writes " + name(t) + ", which is already defined";
      if (op.phase == Phase::Forward && g.tensors[t].producer != o)
        return "op " + g.opPath(op) + " is not recorded as its output's producer";
      defined[t] = true;
      if (g.tensors[t].viewOf != kNone && !acc && g.tensors[g.tensors[t].viewOf].role == TensorRole::Gradient)
        defined[g.tensors[t].viewOf] = defined[g.tensors[t].viewOf] || true;
    }
    if (op.phase == Phase::Backward && op.forwardOp != kNone &&
        (op.forwardOp >= o || g.ops[op.forwardOp].phase != Phase::Forward))
      return "backward op " + g.opPath(op) + " names no earlier forward op";
    if (op.instance >= g.instances.size())
      return "op " + g.opPath(op) + " names no block instance";
  }
  std::vector<bool> seen(g.tensors.size(), false);
  for (const ParamInfo &p : g.params) {
    if (p.tensor >= g.tensors.size())
      return "parameter " + g.paramPath(p) + " names no tensor";
    if (seen[p.tensor])
      return "parameter " + g.paramPath(p) + " is listed twice";
    seen[p.tensor] = true;
  }
  return "";
}

void printGraph(const Graph &g, llvm::raw_ostream &os) {
  auto type = [&](TensorId t) {
    const Tensor &x = g.tensors[t];
    return nameOf(x.dtype).str() + g.formatShape(x.shape);
  };
  os << "graph @" << g.model << " {\n";
  for (TensorId t : g.inputs)
    os << "  input %" << t << " " << g.tensorName(t) << ": " << type(t) << "\n";
  for (const ParamInfo &p : g.params)
    os << "  param %" << p.tensor << " " << g.paramPath(p) << ": " << type(p.tensor)
       << (p.trainable ? "" : " frozen") << "\n";
  // Views that no op produces (made by autodiff over gradients or saved tensors) are declared
  // just before their first use; non-dense layouts print their strides and offset.
  std::vector<bool> declared(g.tensors.size(), false);
  for (const Op &op : g.ops)
    for (TensorId t : op.outputs)
      declared[t] = true;
  auto layout = [&](TensorId t) -> std::string {
    const Tensor &x = g.tensors[t];
    if (x.viewOf == kNone && isDense(x.shape, x.layout) && x.layout.offset() == 0)
      return "";
    std::string s = " {strides = [";
    llvm::SmallVector<int64_t, 4> strides = stridesOf(x.shape, x.layout);
    for (size_t i = 0; i < strides.size(); ++i)
      s += (i ? ", " : "") + std::to_string(strides[i]);
    return s + "], offset = " + std::to_string(x.layout.offset()) + "}";
  };
  Phase phase = Phase::Forward;
  for (const Op &op : g.ops) {
    if (op.phase != phase) {
      phase = op.phase;
      os << "  // " << phaseName(phase) << "\n";
    }
    for (TensorId t : op.inputs)
      if (!declared[t] && g.tensors[t].viewOf != kNone) {
        declared[t] = true;
        os << "  %" << t << " = view(%" << g.tensors[t].viewOf << ") : " << type(t) << layout(t)
           << "\n";
      }
    os << "  ";
    for (size_t i = 0; i < op.outputs.size(); ++i)
      os << (i ? ", " : "") << "%" << op.outputs[i];
    os << (op.accumulate ? " += " : " = ") << opName(op.kind) << "(";
    const OpAttrs &a = op.attrs;
    if (a.hasScalar && a.scalarOnLeft) // `2 - x` is sub(2, %x), not sub(%x, 2)
      os << significant(a.scalar) << (op.inputs.empty() ? "" : ", ");
    for (size_t i = 0; i < op.inputs.size(); ++i)
      os << (i ? ", " : "") << "%" << op.inputs[i];
    if (a.hasScalar && !a.scalarOnLeft)
      os << (op.inputs.empty() ? "" : ", ") << significant(a.scalar);
    os << ")";
    if (auto print = ruleFor(op.kind).printAttrs) // the kind's attributes (ir/ops/)
      print(g, op, os);
    os << " : ";
    for (size_t i = 0; i < op.outputs.size(); ++i)
      os << (i ? ", " : "") << type(op.outputs[i]) << layout(op.outputs[i]);
    os << "  // " << g.opPath(op) << "\n";
  }
  os << "  return";
  for (size_t i = 0; i < g.outputs.size(); ++i)
    os << (i ? ", " : " ") << "%" << g.outputs[i];
  os << "\n}\n";
}

} // namespace tally
