// The tally IR: a flat graph of primitive ops over tensors, in topological order.
//
// Lowering (frontend/Lower.cpp) instantiates a model for one plan and evaluates its forward
// function into this graph: every tensor has a concrete shape (plan symbols such as `batch` and
// `seq` are bound, but their names are kept for messages), every op has its dotted path
// ("h[3].attn.qkv.matmul") and source location. Parameters are tensors too, listed once each
// (tied weights are one tensor used twice). The module instance tree is kept for per-block
// reports. Passes never change the graph; they annotate an Analysis (passes/Analysis.h).
#pragma once

#include "ir/Dtype.h"
#include "ir/Records.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/SMLoc.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace llvm {
class raw_ostream;
}

namespace tally {

using TensorId = uint32_t;
using OpId = uint32_t;
constexpr uint32_t kNone = UINT32_MAX;

/// One dimension: its extent and, when it was written as a name (`batch`, `seq`, `d`), the
/// index of that name in Graph::symbols (0 = no name) so messages can say `[batch, seq, 768]`.
struct Dim {
  int64_t size = 0;
  uint32_t sym = 0;
};
using Shape = llvm::SmallVector<Dim, 4>;

/// A tensor's shape, held by pointer to one immutable copy per distinct shape. Most tensors
/// of a model have one of a few dozen shapes (`[batch, seq, d]`, the weights'), and an inline
/// Shape was 80 of a Tensor's 128 bytes (now 56): at 100,000 layers, half a gigabyte (issue 12). A
/// ShapeRef reads like a const Shape (it converts to one, and has its read-only members); a
/// new shape is assigned whole (`t.shape = s`), which finds or adds s in a process-wide pool.
/// The pool only grows (a few kilobytes per model: one entry per distinct shape ever made)
/// and takes a lock, so a ShapeRef may cross threads.
class ShapeRef {
public:
  /// A pooled shape with its element counts, computed once (numel and checkedNumel of it: a
  /// deep step asks for them millions of times).
  struct Data {
    Shape dims;
    double numel;
    std::optional<int64_t> exactNumel;
  };
  ShapeRef(); ///< the shape of a scalar, []
  ShapeRef(const Shape &s) : p_(intern(s)) {}
  ShapeRef(std::initializer_list<Dim> dims) : p_(intern(Shape(dims))) {}
  operator const Shape &() const { return p_->dims; }
  const Shape &get() const { return p_->dims; }
  size_t size() const { return p_->dims.size(); }
  bool empty() const { return p_->dims.empty(); }
  const Dim &operator[](size_t i) const { return p_->dims[i]; }
  const Dim &front() const { return p_->dims.front(); }
  const Dim &back() const { return p_->dims.back(); }
  Shape::const_iterator begin() const { return p_->dims.begin(); }
  Shape::const_iterator end() const { return p_->dims.end(); }
  /// Equal shapes are one pooled copy, so equality is identity.
  bool operator==(const ShapeRef &o) const { return p_ == o.p_; }
  bool operator!=(const ShapeRef &o) const { return p_ != o.p_; }
  const Data &data() const { return *p_; }

private:
  static const Data *intern(const Shape &s);
  const Data *p_;
};

/// Number of elements as a double (exact below 2^53; lowering rejects any shape whose element
/// count overflows int64, so this never sees an overflowed product).
double numel(const Shape &s);
/// Element count with overflow checking; nullopt when the product exceeds int64.
std::optional<int64_t> checkedNumel(const Shape &s);
/// The same two of a pooled shape: read, not computed.
inline double numel(const ShapeRef &s) { return s.data().numel; }
inline std::optional<int64_t> checkedNumel(const ShapeRef &s) { return s.data().exactNumel; }
/// a + b and a · b with overflow checking: nullopt when the exact result does not fit int64
/// (the memory plan's sizes and offsets are summed with these).
inline std::optional<int64_t> checkedAdd(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r))
    return std::nullopt;
  return r;
}
inline std::optional<int64_t> checkedMul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    return std::nullopt;
  return r;
}

enum class OpKind : uint8_t {
#define OP(ID, NAME, CLASS) ID,
#include "ir/Ops.def"
};
/// How many op kinds there are, and the first kind the language cannot name (the ops that
/// autodiff and step assembly add); tests iterate with these, never a hard-coded last kind.
constexpr unsigned kOpKinds = 0
#define OP(ID, NAME, CLASS) +1
#include "ir/Ops.def"
    ;
constexpr OpKind kFirstInternalOp = OpKind::Contiguous;
enum class OpClass : uint8_t { Matmul, Attention, Elementwise, Reduction, Normalization, Loss, Data, View };

llvm::StringRef opName(OpKind k);
OpClass opClass(OpKind k);
llvm::StringRef opClassName(OpClass c);

enum class TensorRole : uint8_t {
  Input,      ///< data fed by the plan (tokens, x): needs no gradient
  Param,      ///< a learned parameter (trainable unless frozen)
  Activation, ///< produced by a forward op
  Gradient,   ///< the gradient of an activation or of a parameter, produced by backward ops
};

/// When an op runs in the training step: the forward, the backward (gradients), or the
/// step's bookkeeping and update (zero-grad, loss scaling, clipping, the optimizer).
enum class Phase : uint8_t { Forward, Backward, Optimizer };

/// How the step computes cross_entropy (OpAttrs::loss; docs/memory.md, "The loss as frameworks
/// run it"). It changes what the op keeps, moves and holds in its backward, never its FLOPs:
///  - Fused: one kernel reads the logits in their dtype, keeps them and the logsumexp, and its
///    backward writes their gradient (tally's generated step; flash-attn's cross entropy,
///    llm-foundry's default; a torch.compile'd loss);
///  - Eager: PyTorch's F.cross_entropy on an fp32 copy of the logits (autocast runs
///    cross_entropy in fp32; torchtitan's and Hugging Face's losses call .float()): the copy,
///    log_softmax's fp32 output kept for the backward, nll_loss; the backward makes nll_loss's
///    dense fp32 gradient, log_softmax's fp32 gradient, then the cast back;
///  - Megatron: Megatron-LM's vocab-parallel cross entropy on the logits' .float() copy, the
///    softmax computed in that copy in place and kept, its backward in place.
enum class CrossEntropyKernel : uint8_t { Fused, Eager, Megatron };
/// "fused", "eager", "megatron".
const char *crossEntropyKernelName(CrossEntropyKernel k);

/// How the step computes rms_norm (OpAttrs::norm; docs/time.md, "The norm as frameworks run
/// it"). Like the loss's kernel it changes what the op keeps, moves and launches, never its
/// FLOPs:
///  - Fused: one kernel forward, one backward (Transformer Engine's and Apex's RMSNorm,
///    Liger's, a torch.compile'd one, tally's generated step);
///  - Eager: the norm as PyTorch model code writes it and autograd differentiates it
///    (Hugging Face's LlamaRMSNorm, torchtitan's and fms's RMSNorm): x.float(), pow(2),
///    mean, + eps, rsqrt, multiply, cast back, times the weight, each a kernel over the
///    tensor (the statistics' over its rows), the fp32 copy and the normalised output kept.
enum class NormKernel : uint8_t { Fused, Eager };
/// "fused", "eager".
const char *normKernelName(NormKernel k);
llvm::StringRef phaseName(Phase p);

/// Where a tensor's elements are: `storage` is the tensor that owns the bytes (itself unless it
/// is a view), `offset` the element offset of element [0, ...] in that storage, `strides` the
/// element step of each dimension. A dense tensor has row-major strides and offset 0.
/// `strides` is empty for row-major strides (Graph::addTensor stores them so: most tensors
/// have them); read them with stridesOf. Pooled like shapes (ShapeRef): a tensor holds one
/// pointer to an immutable copy per distinct (strides, offset), a few dozen per model, where
/// an inline list and offset took 24 of a Tensor's 56 bytes (now 40; issue 12). A new layout
/// is assigned whole (`t.layout = Layout(strides, offset)`, or setLayout).
class Layout {
public:
  Layout(); ///< no strides listed (row-major), offset 0
  Layout(llvm::ArrayRef<int64_t> strides, int64_t offset) : p_(intern(strides, offset)) {}
  llvm::ArrayRef<int64_t> strides() const { return p_->strides; }
  int64_t offset() const { return p_->offset; }
  /// Equal layouts are one pooled copy, so equality is identity.
  bool operator==(const Layout &o) const { return p_ == o.p_; }
  bool operator!=(const Layout &o) const { return p_ != o.p_; }

  struct Data {
    llvm::SmallVector<int64_t, 4> strides;
    int64_t offset = 0;
  };

private:
  static const Data *intern(llvm::ArrayRef<int64_t> strides, int64_t offset);
  const Data *p_;
};
/// Row-major strides of a dense tensor of shape `s`.
llvm::SmallVector<int64_t, 4> denseStrides(const Shape &s);
/// The strides of a tensor of shape `s` with layout `l`: its own, or row-major ones when it
/// lists none.
llvm::SmallVector<int64_t, 4> stridesOf(const Shape &s, const Layout &l);
/// Whether a tensor of shape `s` with layout `l` is dense row-major (size-1 dimensions may
/// have any stride; the offset may be anything).
bool isDense(const Shape &s, const Layout &l);
/// The strides a view of shape `newShape` over a tensor of `oldShape` with `oldStrides` would
/// have (reshape without a copy), or nullopt when no strides express it.
std::optional<llvm::SmallVector<int64_t, 4>>
viewStrides(const Shape &oldShape, llvm::ArrayRef<int64_t> oldStrides, const Shape &newShape);

struct Tensor {
  ShapeRef shape;
  Dtype dtype = Dtype::Invalid;
  TensorRole role = TensorRole::Activation;
  bool requiresGrad = false;  ///< a gradient flows to it (depends on a trainable parameter)
  OpId producer = kNone;      ///< the op that produces it (activations only)
  uint32_t param = kNone;     ///< index into Graph::params for parameters
  TensorId viewOf = kNone;    ///< for outputs of view ops: the tensor whose storage it shares
  Layout layout;              ///< strides and offset in the storage of viewOf (or its own)
  TensorId gradOf = kNone;    ///< Gradient tensors: the tensor whose gradient this is
  // A tensor's name is Graph::tensorName's: only inputs and parameters have one, so it is not
  // kept in every tensor (a string was a fifth of a Tensor; issue 12).

  // Moves are declared noexcept so that std::vector<Tensor> moves (not copies) its elements
  // when it grows: llvm::SmallVector's move constructor is not noexcept, which made every
  // reallocation of a 10,000-layer graph copy each shape and name (issue 12).
  Tensor() = default;
  Tensor(const Tensor &) = default;
  Tensor(Tensor &&) noexcept = default;
  Tensor &operator=(const Tensor &) = default;
  Tensor &operator=(Tensor &&) noexcept = default;
};

/// Gives `t` (whose shape is set) these strides and offset, listing the strides only when
/// they are not row-major (Layout).
void setLayout(Tensor &t, llvm::ArrayRef<int64_t> strides, int64_t offset);

/// One axis of a `slice` view (`x[:, 0]`, `x[:, 1:]`): the first index taken, how many, the
/// step between them, and whether the axis is dropped (an integer subscript).
struct SliceDim {
  int64_t start = 0, count = 0, step = 1;
  bool drop = false;
};

/// Attributes of an op; which ones matter depends on the kind (see its rule in ir/ops/).
struct OpAttrs {
  int64_t dim = -1;           ///< split/concat/softmax/sum/mean axis (negative counts from the end)
  int64_t parts = 0;          ///< split: number of equal parts
  int64_t k = 0;              ///< topk: how many largest values to keep
  double capacity = 0;        ///< moe: capacity factor (0: no cap, no token dropped)
  int64_t heads = 0;          ///< attention: query heads
  int64_t kvHeads = 0;        ///< attention: key/value heads (grouped-query attention)
  bool causal = false;        ///< attention: causal mask
  bool fused = true;          ///< attention: flash (true) or materialised scores (false)
  bool keepDim = false;       ///< sum/mean over one axis: keep it with size 1
  bool reduceAll = true;      ///< sum/mean: over every element (no dim given)
  double p = 0;               ///< dropout probability (dropout, or attention's dropout =)
  double eps = 0;             ///< layer_norm / rms_norm epsilon
  bool hasScalar = false;     ///< add/sub/mul/div with one tensor and a constant
  double scalar = 0;          ///< that constant
  bool scalarOnLeft = false;  ///< `2 - x` rather than `x - 2`
  bool shares = false;        ///< contiguous: the output is the input's buffer, no copy (an add's gradient passed on: passes/GradientShares.h)
  int64_t transposeA = -1, transposeB = -1; ///< transpose: the two axes swapped
  Shape newShape;             ///< reshape: the target shape
  double scale = 0;           ///< attention: the score scale (1/√head_dim unless written)
  int64_t headDim = 0;        ///< rope: the head size (the last dimension when no attention reads it)
  double theta = 10000;       ///< rope: the base of the angles
  double fraction = 1;        ///< rope: the share of each head's dims rotated (NeoX rotary_pct)
  bool alibi = false;         ///< attention: ALiBi bias added to the scores in the kernel
  bool hasMask = false;       ///< attention: input 3 is a padding mask [batch, seq_kv]
  CrossEntropyKernel loss = CrossEntropyKernel::Fused; ///< cross_entropy (and its backward): how the step runs it
  NormKernel norm = NormKernel::Fused; ///< rms_norm (and its backward): how the step runs it
  int64_t attnWindow = 0;     ///< attention: sliding window, key j seen by query i iff i − w < j ≤ i (0: none)
  double softcap = 0;         ///< attention: scores become c·tanh(scores / c) before the mask (0: none)
  int64_t latent = 0;         ///< attention: the KV cache holds a latent of this width per token, not K and V (MLA's kv_lora_rank; 0: K and V)
  int64_t latentRope = 0;     ///< attention: the decoupled RoPE key cached beside the latent (MLA's qk_rope_head_dim)
  int64_t window[2] = {0, 0}; ///< conv2d kernel (from the weight), pooling window: (h, w)
  int64_t strides[2] = {1, 1}; ///< conv2d / pooling stride (h, w)
  int64_t pads[2] = {0, 0};   ///< conv2d / pooling zero padding on each side (h, w)
  std::vector<SliceDim> slices; ///< slice: leading axes (the rest are taken whole); a vector, not inline: every op carries it, few are slices
  uint32_t stream = kNone;    ///< dropout, attention with dropout: the random stream (Philox)
  OpKind of = OpKind::Matmul; ///< unary_backward: the forward op it differentiates
  uint32_t gradMask = 0;      ///< multi-output backward ops: bit i set when input i's gradient is an output
  std::string optimizer;      ///< optimizer_update: the optimizer's name ("AdamW")
};

/// An op's attributes, held by pointer and shared: the ops of every copy of a repeated block
/// (lowering copies them), the forward ops the training step copies, and backward ops that
/// keep their forward op's attributes point at one OpAttrs (an inline OpAttrs was 352 of an
/// Op's 496 bytes, a third of a 10,000-layer graph's memory; issue 12). Immutable: an op with
/// other attributes is given a new OpAttrs (`op.attrs = a`). Read as `op.attrs->dim`, or as a
/// `const OpAttrs &`; changed with `op.attrs.change([](OpAttrs &a) { ... })`.
class SharedAttrs {
public:
  SharedAttrs(); ///< the default attributes, one instance for every op that has them
  SharedAttrs(OpAttrs a) : p_(std::make_shared<const OpAttrs>(std::move(a))) {}
  const OpAttrs *operator->() const { return p_.get(); }
  const OpAttrs &operator*() const { return *p_; }
  operator const OpAttrs &() const { return *p_; }
  /// Gives this op its own attributes: a copy of the shared ones, changed by `edit`.
  template <class F> void change(F &&edit) {
    OpAttrs a = *p_;
    edit(a);
    p_ = std::make_shared<const OpAttrs>(std::move(a));
  }

private:
  std::shared_ptr<const OpAttrs> p_;
};

/// Whether two doubles are the same bit for bit (a NaN equals the same NaN; −0 is not 0).
bool sameBits(double a, double b);

/// Whether two attribute sets are the same in every field (doubles bit for bit), and a hash
/// that agrees with it. A field added to OpAttrs must be added to both (Graph.cpp checks the
/// size of OpAttrs to remind).
bool sameAttrs(const OpAttrs &a, const OpAttrs &b);
size_t hashAttrs(const OpAttrs &a);

/// Equal attributes made once and shared: the training step derives attributes for a backward
/// op from its forward op's (a gradient mask, the shape a gradient is summed to), the same for
/// every copy of a repeated block; each was its own 352-byte allocation (issue 12).
class AttrsPool {
public:
  SharedAttrs get(OpAttrs a);

private:
  std::unordered_multimap<size_t, SharedAttrs> byHash_;
};

/// An op's input or output ids: up to three held inline, more in one heap block. 16 bytes,
/// where an llvm::SmallVector<TensorId, 3> took 32 (a 100,000-layer step has 3.9 million ops:
/// issue 12). Reads like a SmallVector (size, [], iteration, an ArrayRef); grows by push_back,
/// append and assign. The ids are inline until a list first needs room for a fourth; from then
/// on (the top bit of `size_`) `words_[0]` is the heap block's capacity and the pointer sits
/// (copied in and out, not aliased) in the next 8 bytes. clear() and assign() free the block.
class alignas(8) IdList { // aligned so the heap pointer in it is (leak checkers scan aligned words)
public:
  IdList() = default;
  IdList(std::initializer_list<uint32_t> ids) { assign(ids.begin(), ids.end()); }
  IdList(llvm::ArrayRef<uint32_t> ids) { assign(ids.begin(), ids.end()); }
  template <class It> IdList(It first, It last) { assign(first, last); }
  IdList(const IdList &o) { assign(o.begin(), o.end()); }
  IdList(IdList &&o) noexcept : size_(o.size_) { // steals the heap block, if any
    std::memcpy(words_, o.words_, sizeof words_);
    o.size_ = 0;
  }
  IdList &operator=(const IdList &o) {
    if (this != &o)
      assign(o.begin(), o.end());
    return *this;
  }
  IdList &operator=(IdList &&o) noexcept {
    if (this != &o) {
      release();
      size_ = o.size_;
      std::memcpy(words_, o.words_, sizeof words_);
      o.size_ = 0;
    }
    return *this;
  }
  IdList &operator=(llvm::ArrayRef<uint32_t> ids) {
    assign(ids.begin(), ids.end());
    return *this;
  }
  IdList &operator=(std::initializer_list<uint32_t> ids) {
    assign(ids.begin(), ids.end());
    return *this;
  }
  ~IdList() { release(); }

  size_t size() const { return size_ & ~kHeap; }
  bool empty() const { return size() == 0; }
  const uint32_t *data() const { return onHeap() ? heap() : words_; }
  uint32_t *data() { return onHeap() ? heap() : words_; }
  const uint32_t *begin() const { return data(); }
  const uint32_t *end() const { return data() + size(); }
  uint32_t *begin() { return data(); }
  uint32_t *end() { return data() + size(); }
  uint32_t operator[](size_t i) const { return data()[i]; }
  uint32_t &operator[](size_t i) { return data()[i]; }
  uint32_t front() const { return data()[0]; }
  uint32_t back() const { return data()[size() - 1]; }
  operator llvm::ArrayRef<uint32_t>() const { return llvm::ArrayRef<uint32_t>(data(), size()); }
  bool operator==(const IdList &o) const {
    return size() == o.size() && std::equal(begin(), end(), o.begin());
  }
  bool operator!=(const IdList &o) const { return !(*this == o); }

  void clear() {
    release();
    size_ = 0;
  }
  void push_back(uint32_t id) {
    reserve(size() + 1);
    data()[size()] = id;
    ++size_;
  }
  template <class It> void append(It first, It last) {
    size_t n = static_cast<size_t>(std::distance(first, last));
    reserve(size() + n);
    std::copy(first, last, end());
    size_ += static_cast<uint32_t>(n);
  }
  template <class It> void assign(It first, It last) {
    clear();
    append(first, last);
  }
  void assign(std::initializer_list<uint32_t> ids) { assign(ids.begin(), ids.end()); }

private:
  static constexpr uint32_t kInline = 3;
  static constexpr uint32_t kHeap = 1u << 31;
  bool onHeap() const { return (size_ & kHeap) != 0; }
  uint32_t *heap() const {
    uint32_t *p;
    std::memcpy(&p, words_ + 1, sizeof p);
    return p;
  }
  void release() {
    if (onHeap())
      std::free(heap());
  }
  /// Room for `n` ids (moves the ids to a bigger heap block when n passes the room there is;
  /// an op with 2^31 inputs is refused with a fatal error long before memory runs out).
  void reserve(size_t n);

  uint32_t size_ = 0;
  uint32_t words_[3] = {0, 0, 0};
};

// The fields are ordered to leave no padding (88 bytes; a step has millions of ops).
struct Op {
  IdList inputs;
  IdList outputs;
  SharedAttrs attrs;
  llvm::SMRange range;        ///< the expression that created it
  uint32_t instance = 0;      ///< index into Graph::instances of the block it was written in
  OpId forwardOp = kNone;     ///< backward ops: the forward op whose gradient they compute
  /// Backward ops: which outputs add into a gradient another op already wrote (a tensor read
  /// twice gets one gradient, summed in place: bit i for output i).
  uint32_t accumulate = 0;
  /// Forward ops: which op of its kind in its instance this is (1 for the first); its path
  /// (Graph::opPath) says `#n` from the second on. Paths are not stored: a string per op was
  /// a twelfth of a deep model's memory, and each is its instance's path and its kind's name.
  uint32_t ordinal = 1;
  OpKind kind = OpKind::Matmul;
  Phase phase = Phase::Forward;

  // noexcept moves: std::vector<Op> moves its elements when it grows (see Tensor).
  Op() = default;
  Op(const Op &) = default;
  Op(Op &&) noexcept = default;
  Op &operator=(const Op &) = default;
  Op &operator=(Op &&) noexcept = default;
};

/// One copy of a string for the whole process (block names, parameter names, path parts),
/// never freed: a deep model names the same few dozen things in every layer, and a string in
/// every record was a tenth of its memory (issue 12). Thread-safe.
const std::string &pooledName(llvm::StringRef s);

/// A short label from tally's own small vocabulary ("input", "dropout mask", "gradient"): one
/// byte, the index of its text in a process-wide table (a pointer per saved tensor and per
/// buffer was 60 MB of a 100,000-layer check; issue 12). Labels are written in tally's code,
/// never taken from input; a 257th distinct one is tally's bug (a fatal error).
class Label {
public:
  Label(const char *text = "") : index_(indexOf(text)) {}
  const char *c_str() const { return text(index_); }
  operator const char *() const { return c_str(); }

private:
  static uint8_t indexOf(const char *text);
  static const char *text(uint8_t index);
  uint8_t index_;
};

/// A learned parameter, declared once by `param` in some block instance. Its path is its
/// instance's and its name, "h[0].attn.qkv.weight" (Graph::paramPath).
struct ParamInfo {
  const std::string *name = &pooledName(""); ///< pooled: "weight"
  TensorId tensor = kNone;
  bool trainable = true;
  uint32_t instance = 0;
  llvm::SMRange range;        ///< the `param` declaration
};

/// A name a forward function binds to a computed tensor (`h = fc(x)`): the unused-value lint
/// warns when the value reaches no output. The name is the source text at `name`.
struct LocalValue {
  TensorId tensor = kNone;
  llvm::SMRange name; ///< the name in the assignment
};

/// A path one level down: "h[3].attn" + "qkv" → "h[3].attn.qkv" ("" + "wte" → "wte"). Instance,
/// parameter and op paths (lowering), and a backward op's ("h[3].attn.matmul.matmul_backward"),
/// in one allocation: a path rarely fits the small-string buffer, and a 10,000-layer step
/// makes millions of them.
inline std::string joinPath(const std::string &path, llvm::StringRef name) {
  if (path.empty())
    return name.str();
  std::string s;
  s.reserve(path.size() + 1 + name.size());
  return s.append(path).append(1, '.').append(name.data(), name.size());
}

/// A block instance: the model itself (path ""), its members, and each repeat copy. Its path
/// ("", "h", "h[3]", "h[3].attn": Graph::instancePath) is its parent's followed by `part`.
struct Instance {
  const std::string *block = &pooledName(""); ///< pooled: the block's name, or "repeat" for a repeat list
  const std::string *part = &pooledName("");  ///< pooled: its path after its parent's ("wte", ".attn", "[3]")
  uint32_t parent = kNone;    ///< made before it (a smaller index), or kNone for the model
  int64_t depth = 0;          ///< 0 for the model itself
  /// The member declaration that made it (`fc = Linear(d, 4 * d)`, `h = repeat(n) Block(d)`);
  /// none for the model. Diagnostics about its ops lead back to the user's file through it.
  llvm::SMRange where;
};

struct Graph {
  std::string model;          ///< the model's block name
  // The records, by id. A training step's begin with its forward graph's, shared (extend).
  Records<Tensor> tensors;
  Records<Op> ops;            ///< topological order: inputs of an op are defined before it
  Records<ParamInfo> params;
  Records<Instance> instances;
  std::vector<TensorId> inputs;
  std::vector<std::string> inputNames; ///< per entry of `inputs`: the name it was declared with
  TensorId loss = kNone;      ///< the scalar the forward function returns (when training)
  std::vector<TensorId> outputs; ///< everything the forward function returns
  std::vector<LocalValue> locals; ///< the forward functions' named tensors, in lowering order
  std::vector<std::string> symbols{""}; ///< dimension names; index 0 is "no name"
  Dtype activationDtype = Dtype::F32; ///< dtype of floating-point activations
  /// After autodiff (passes/Backward.cpp): per tensor, its gradient tensor (kNone when none);
  /// the ops of each phase are contiguous, forward first.
  std::vector<TensorId> gradient;
  bool differentiated = false;
  uint32_t randomStreams = 0; ///< streams handed out to random ops (dropout), 0..n-1

  /// A compact training step (buildTrainingStep with `compact`; passes/Backward.cpp): the
  /// backward ops of `count` repeat copies were proven to repeat the backward ops of copy
  /// `model` (a copy the step has) with every id shifted, and were not made. Only the passes
  /// that price and check a step read a compact one (autodiff's costs, the step's check, the
  /// local gradients' bound); every other reader needs a whole step (count 0).
  struct Skipped {
    uint32_t count = 0;       ///< copies whose backward ops are not made (0: a whole step)
    uint32_t first = 0;       ///< the first of them (an index into RepeatCopies::copies); they are consecutive
    uint32_t model = 0;       ///< the copy whose backward ops each of them repeats
    /// The gradient of the first skipped copy's input, which that copy's backward would write
    /// and the copy before it reads: made, but written by no op of the compact step.
    TensorId boundary = kNone;
    /// The tensors the model copy's backward ops made, [begin, end): each skipped copy's would
    /// be as many, the same (localGradientBound counts them).
    TensorId modelTensorsBegin = 0, modelTensorsEnd = 0;
  } skipped;

  /// A graph that begins as this one, sharing its records rather than copying them (Records):
  /// the training step, which appends its own (passes/Backward.cpp). The rest is copied.
  Graph extend() const;

  /// Appends a tensor (strides listed only when they are not row-major). Taken by reference, not by value:
  /// a Tensor move copies its inline shape and strides, and a deep model adds 10^5 of them.
  TensorId addTensor(Tensor &&t);
  TensorId addTensor(const Tensor &t) { return addTensor(Tensor(t)); }
  OpId addOp(Op &&op);        ///< also sets the producer of each output
  uint32_t symbol(llvm::StringRef name);
  /// `[batch, seq, 768]`: names where a dimension has one, numbers otherwise.
  std::string formatShape(const Shape &s) const;
  /// `[16, 1024, 768]`: numbers only.
  static std::string formatSizes(const Shape &s);
  /// numel × bytes per element.
  double bytes(TensorId t) const { return numel(tensors[t].shape) * storageBytes(tensors[t].dtype); }
  /// An op's path: "h[3].attn.qkv.matmul" for a forward op (its instance's path, its kind,
  /// `#2` for the second of its kind there), "h[3].attn.qkv.matmul.matmul_backward" for a
  /// backward op (its forward op's path, its own kind), the kind alone for the others
  /// ("fill", "optimizer_update").
  std::string opPath(const Op &op) const;
  std::string opPath(OpId o) const { return opPath(ops[o]); }
  /// A parameter's path, an input's name, else "" (activations and gradients have none).
  std::string tensorName(TensorId t) const;
  /// An instance's path: its parents' parts and its own ("h[3].attn"; "" for the model).
  /// Safe on a broken graph: the chain stops at a parent out of range or not made before it.
  std::string instancePath(uint32_t instance) const;
  /// A parameter's path: its instance's and its name ("h[3].attn.qkv.weight").
  std::string paramPath(const ParamInfo &p) const;
  std::string paramPath(uint32_t param) const { return paramPath(params[param]); }
  /// The tensor that owns `t`'s bytes: `t` itself, or the tensor a view shares (views of views
  /// point at the owner directly, verifyGraph checks it).
  TensorId storageOf(TensorId t) const {
    TensorId v = tensors[t].viewOf;
    return v == kNone ? t : v;
  }
  /// Whether `t`'s bytes are a parameter's (a parameter, or a view of one).
  bool isParamStorage(TensorId t) const { return tensors[storageOf(t)].role == TensorRole::Param; }
};

/// Lists of ids per tensor (or per op: the memory plan's backward ops of each forward op),
/// flat: list t is items[start[t], start[t + 1]), built once from
/// (tensor, id) pairs, each list in the pairs' order (a counting sort; a vector per tensor was
/// an allocation per tensor of a deep model).
struct TensorLists {
  std::vector<uint32_t> start;
  std::vector<uint32_t> items;
  llvm::ArrayRef<uint32_t> operator[](TensorId t) const {
    return llvm::ArrayRef<uint32_t>(items).slice(start[t], start[t + 1] - start[t]);
  }
  void build(size_t tensors, const std::vector<std::pair<TensorId, uint32_t>> &pairs);
};

/// The copies of the graph's repeat blocks (a transformer's layers): a copy is an instance
/// whose parent is a `repeat` list, and an op belongs to the outermost copy at or above its
/// instance. Computed once per graph by the graph-only passes (Analysis::copies) and read by
/// the activation walk and the step time.
struct RepeatCopies {
  struct Copy {
    std::string path;       ///< "h[3]"
    std::vector<OpId> ops;  ///< in op order
  };
  std::vector<Copy> copies; ///< in the order of their first op
  std::vector<uint32_t> ofOp; ///< per op: its index in `copies`, or kNone
  std::vector<uint32_t> ofInstance; ///< per instance: the index in `copies` of the copy it is in (kNone: none, or a copy without ops)
};
RepeatCopies findRepeatCopies(const Graph &g);

/// Checks the graph's invariants (topological order, shapes present, ids in range, params
/// listed once). Returns an empty string when valid, or a description of the first problem.
/// `verifiedOps` and `verifiedTensors` say that the graph begins with a graph that passed
/// already (the forward graph a training step extends, verified by lowering): their checks are
/// not made again, only what their ops define is replayed (a third of a deep step's check).
std::string verifyGraph(const Graph &g, size_t verifiedOps = 0, size_t verifiedTensors = 0);

/// Prints the graph for `--emit=ir`: one line per tensor declaration and per op.
void printGraph(const Graph &g, llvm::raw_ostream &os);

} // namespace tally
