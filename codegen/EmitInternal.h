// The step emitter's state and its pieces, shared by the files that print the generated
// training step (private to codegen/; codegen/EmitStep.cpp describes the walk):
// - EmitStep.cpp: where tensors live, the walk over the schedule (micro_step), the tables of
//   kLayout, the step file and the files beside it (CMakeLists.txt, the runtime);
// - EmitTable.cpp: the table of how each op kind is printed (OpEmit, below), one entry per kind
//   of ir/Ops.def, each defined beside its kind's code; emitOp and update() dispatch through it;
// - EmitOps.cpp: the elementwise and data-movement ops; EmitLayers.cpp: matmul, attention,
//   norms and losses;
// - EmitFused.cpp: the fused kernels (passes/Fusion.cpp) as generated functors;
// - EmitUpdate.cpp: the optimizer phase (update, zero_grad) and the data-parallel collectives;
// - EmitCpu.cpp and EmitCuda.cpp: each backend's few hooks (codegen/EmitBackend.h).
#pragma once

#include "codegen/EmitBackend.h"

#include "ir/OpRules.h"
#include "passes/Collectives.h"
#include "passes/Fusion.h"
#include "passes/Passes.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"

#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace tally::codegen::emit {

/// The C++ storage type of a dtype in the runtime, or "" when the runtime has none.
std::string ctype(Dtype d);
/// The safetensors name of a dtype.
const char *stName(Dtype d);
/// "h[0].attn.qkv.weight" → "h.0.attn.qkv.weight": the names safetensors files use.
std::string tensorName(llvm::StringRef path);
/// A string literal for C++ (paths and names come from the user's file).
std::string literal(llvm::StringRef s);
/// A comment-safe copy: no newlines, no "*/", printable ASCII.
std::string commentSafe(llvm::StringRef s);
/// EmitStep.cpp: a schedule entry's kind as the step's comments name it ("forward", ...).
const char *entryKind(StepEntry::Kind k);
std::string list(llvm::ArrayRef<int64_t> v);
std::string number(double v);
/// The op class reports use ("matmul", "elementwise", ...) of an op's kernels (EmitStep.cpp).
std::string className(const Graph &g, const Op &op);
/// The runtime's rt::BinOp of a binary kind ("rt::BinOp::Add", from ir/ops/Binary.def) and
/// rt::UnOp of a unary kind ("rt::UnOp::Gelu", from ir/ops/Unary.def); nullptr for any other.
const char *binOp(OpKind k);
const char *unOp(OpKind k);

struct OptimizerPhase;

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
  /// Each op's index in the step graph by address (filled on first use by opIndex).
  std::unordered_map<const Op *, int64_t> opIds;
  /// The index of `o` in the step graph (the CPU step's op_id), or -1 for null.
  int64_t opIndex(const Op *o);

  BufferIndex buffers;          ///< the memory plan's buffers by tensor; each entry's schedule step
  std::unordered_map<TensorId, int64_t> paramOffset, gradOffset, masterOffset, dataOffset;
  std::map<std::pair<TensorId, unsigned>, int64_t> stateOffset;
  int64_t dataBytes = 0;
  /// Device backends: the op class of every op path set in ctx.where (kOpSites), in order.
  std::vector<std::pair<std::string, std::string>> sites;
  std::map<std::string, std::string> siteClass;
  /// Device backends: attention calls by engine line ("cuDNN fused attention", "the runtime's
  /// kernels: <why>"): how many, and the first op's path (EmitOptions::notes).
  std::map<std::string, std::pair<int, std::string>> attentionEngines;

  /// The regions the code being written addresses: the memory plan's, or under pipeline
  /// parallelism the rank's being written (Analysis::pipelineStep).
  decltype(Analysis::regions) regions;

  Emitter(const Analysis &a, const EmitOptions &o, const Backend &be)
      : a(a), s(*a.step), plan(*a.plan), opt(o), be(be), buffers(a), regions(a.regions) {}

  /// The backend's name in messages: "CPU", "CUDA".
  std::string title() const { return be.title; }

  bool fail(const std::string &why);

  // ---- 1. where tensors live (EmitStep.cpp) -------------------------------------------------

  void index();
  TensorId base(TensorId t) const { return s.tensors[t].viewOf == kNone ? t : s.tensors[t].viewOf; }
  /// The dtype a tensor is stored in: its own, except float input data, which the driver
  /// stores in the activations' dtype (the first op reads it as mixed precision would cast it).
  Dtype stored(TensorId t) const;
  /// `A<float>(8192)`: a pointer to tensor t's first element at the current step.
  std::string ptr(TensorId t);

  int64_t n(TensorId t) const { return checkedNumel(shape(t)).value_or(0); }
  /// Its shape in the step graph; under sequence parallelism, while an op that reads or writes
  /// a sequence-split tensor whole is written, that tensor's whole shape (shapeNow).
  const Shape &shape(TensorId t) const {
    auto it = shapeNow.find(t);
    if (it == shapeNow.end())
      return s.tensors[t].shape;
    return it->second;
  }
  int64_t last(TensorId t) const { return shape(t).empty() ? 1 : shape(t).back().size; }
  std::string T(TensorId t) const { return ctype(stored(t)); }
  bool dense(TensorId t) const { return isDense(shape(t), s.tensors[t].layout); }
  std::vector<int64_t> strides(TensorId t) const;
  std::vector<int64_t> sizes(TensorId t) const;
  bool needDense(TensorId t, const char *what);
  bool sameType(std::initializer_list<TensorId> ts);

  // ---- 2. one call per op (EmitOps.cpp, EmitLayers.cpp) -------------------------------------

  void line(const std::string &text) { body += "  " + text + "\n"; }

  /// Says which op runs now: the `op_class` global the CPU kernel timer reads, or on a device
  /// `ctx.where = "<op path>"` (the CUDA runtime names it in every error) with the path's op
  /// class recorded for the driver's kOpSites table.
  void site(const std::string &path, const std::string &cls) { body += siteText(path, cls); }
  /// site()'s line, for text written outside the function being built.
  std::string siteText(const std::string &path, const std::string &cls);

  bool acc(unsigned i = 0) const { return i < 32 && (op->accumulate & (1u << i)); }
  const char *boolean(bool b) const { return b ? "true" : "false"; }
  std::string seedExpr() const { return "seed"; }

  /// The broadcast strides of operand t over an output of shape `out`.
  std::vector<int64_t> broadcastStrides(TensorId t, const std::vector<int64_t> &out);

  /// The call of the op being written (op, at schedule step `step`): its kind's entry of the
  /// table (OpEmit, EmitTable.cpp), one of the functions below.
  bool emitOp();
  /// One schedule entry of the walk, `op` set to its op: the comment naming it and its kind,
  /// the site (op_class/op_path), the op's calls, and the loss read back after the forward op
  /// that computes it. The step's walk and the pipeline's chunks (EmitPipeline.cpp) both call it.
  bool emitEntry(const StepEntry &se);

  /// Views (split, reshape, transpose, slice): no code, the view's pointer is its base's.
  bool view() { return true; }

  // Elementwise (EmitOps.cpp).
  bool binary();
  /// The gradient of a division by a tensor: d(a/b)/db (inputs a, b, dy), or of c / x from its
  /// output (inputs y, dy; the constant in attrs.scalar).
  bool divBackward();
  bool unary();
  /// unary_backward: the entry of the kind it differentiates (attrs.of) prints it, one of
  /// unaryGradient, dropoutBackward and ropeBackward.
  bool unaryBackward();
  /// The gradient of a pure unary kind (ir/ops/Unary.def): rt::unary_bwd reading the input,
  /// the output or neither, as the kind's row says (UnaryDef::reads).
  bool unaryGradient();
  bool dropout();
  bool dropoutBackward();
  bool fill();

  // Reductions, copies and data (EmitOps.cpp).
  /// outer × axis × inner of a reduction over `dim` of shape `x` (or everything).
  void reduceDims(TensorId x, const OpAttrs &at, int64_t &outer, int64_t &axis, int64_t &inner);
  bool reduction(bool mean); ///< sum, mean
  bool sum() { return reduction(false); }
  bool mean() { return reduction(true); }
  bool expand();      ///< the backward of sum/mean: dy spread over x's shape
  bool reduceTo();
  bool copy(TensorId src, TensorId dst, bool accumulate);
  bool contiguous() { return copy(op->inputs[0], op->outputs[0], acc()); }
  bool sharedGradient(); ///< a contiguous that `shares`: a comment, no call (EmitStep.cpp)
  bool concat();
  bool broadcastTo(); ///< a copy whose source has stride 0 along the broadcast dims
  bool embedding();
  bool embeddingBackward();
  bool positions();
  bool nextTokens();

  // Matmul (EmitLayers.cpp).
  struct MatOperand {
    bool trans = false;
    int64_t rows = 1, cols = 1, ld = 1, batch = 1, batchStride = 0;
    std::string p;
  };
  /// A matmul operand: its last two dimensions as a (possibly transposed) row-major matrix,
  /// the others as one batch with one stride. `vectorAs`: how a rank-1 tensor stands as a
  /// matrix ('r' one row, 'c' one column).
  bool operand(TensorId t, char vectorAs, MatOperand &m);
  bool matmul();

  // Attention and rope (EmitLayers.cpp).
  /// B, S, H, hd of a rope over x [..., S, H·hd].
  bool ropeDims(TensorId x, const OpAttrs &at, int64_t &B, int64_t &S, int64_t &H, int64_t &hd);
  bool rope();
  bool ropeBackward();
  /// B, S, Skv, H, Hkv, hd of an attention op, and `rows`: the call's trailing arguments
  /// ("" when dense with no window or cap; else ", rt::AttnRows{...}" and, with a window or
  /// a soft cap, ", rt::AttnScores{w, c}").
  bool attentionDims(const Op &fwd, int64_t &B, int64_t &S, int64_t &Skv, int64_t &H, int64_t &Hkv,
                     int64_t &hd, std::string &rows);
  /// The CUDA step's engine for the attention being written: "_cudnn" (cuDNN's fused
  /// attention, passes/CudnnAttention.h) or "" (the runtime's kernels), recorded for the notes.
  std::string attentionEngine(const Op &fwd, bool backward, int accumulate);
  bool attentionForward();
  bool attentionBackward();

  // Norms and softmax (EmitLayers.cpp).
  bool softmax();
  bool softmaxBackward();
  bool layerNorm();
  bool rmsNorm();
  bool normBackward(bool layer);
  bool layerNormBackward() { return normBackward(true); }
  bool rmsNormBackward() { return normBackward(false); }

  // Losses (EmitLayers.cpp).
  bool crossEntropy();
  bool crossEntropyBackward();
  /// The columns of `logits` the loss reads: the vocabulary of a padded head
  /// (passes/HeadPadding.h), else the whole last axis.
  int64_t validColumns(TensorId logits) const;
  /// ", V'" (the row stride, the runtime's `ld` argument) for a padded head's logits, else "".
  std::string rowStride(TensorId logits) const;

  // ---- 3. the step (EmitStep.cpp) -----------------------------------------------------------

  std::string where(const Op &o) const;
  /// micro_step(): the forward, recompute and backward entries; a fused run of elementwise
  /// entries (Analysis::fusion) as one generated kernel, its functor printed before.
  bool microStep(std::string &outText);
  /// Device backends: the loss's storage type (store_loss, read_losses<T>), set by microStep.
  std::string lossType;
  /// Device backends: kGraph, the graph region forward_backward() and train_step() around it,
  /// `tail` (the reduction, update, --dump-grads and zero_grad) after it (EmitGraph.cpp).
  std::string deviceTrainStep(const std::string &tail);
  /// Device backends: kGraph (passes/CudaGraph.h: captured, else why not; what runs outside).
  std::string graphPlan() const;
  /// Device backends: `tally build`'s `cuda graph:` lines (what is captured, what is not, why).
  std::vector<std::string> graphNotes() const;
  /// kLayout's tables: parameters and inputs.
  std::string tables();
  bool checkPlan();
  /// Device backends: copying a scalar back to the host (the loss, the overflow check's Σg²).
  std::string deviceHelpers() const;
  /// Device backends: kOpSites, the op class of every path ctx.where takes (the driver files
  /// each kernel's CUDA-event time under it).
  std::string opSites() const;
  /// The step file's text around micro_step, update and zero_grad (`micro`, `upd`, `zero`).
  std::string stepSource(const std::string &micro, const std::string &upd, const std::string &zero);
  /// The backend's CMakeLists.txt: its template (codegen/templates/) with the placeholders
  /// filled in (the step's sources: the step file and the kernel files among `files`); "" after
  /// fail() when the template is missing.
  std::string cmakeLists(const std::vector<File> &files);
  bool run(std::vector<File> &files);

  // ---- fused kernels (EmitFused.cpp) --------------------------------------------------------

  std::string functors;                          ///< the fused kernels' functors, each once
  std::string prologue;                          ///< a norm's fused prologue (a functor instance), or ""
  std::string epilogueBias, epilogueOut;         ///< matmulBias(): the bias and the add's output, or ""
  std::map<std::string, std::string> functorOf;  ///< functor body -> its name

  /// A matmul with a bias epilogue (passes/Fusion.cpp step 5): rt::matmul_bias writes the add's
  /// output (its buffer live at the add's step); the matmul's own output is not written.
  bool matmulBias(const Analysis::FusedKernel &k, const char *kind);
  /// One fused run (passes/Fusion.cpp): a functor computing element e of every op of the run
  /// in registers (each value rounded to its storage type, so the results are the unfused
  /// ops'), then rt::fused over the outputs' elements, or, when the run ends in a norm, the
  /// norm's _fused call with the functor as its prologue. Identical runs (every layer's) share
  /// one functor; the call passes each its operands.
  bool fused(const Analysis::FusedKernel &k, const char *kind);
  /// The fused run that starts at stepSchedule entry `e`, or null (Analysis::fusion.kernels is
  /// sorted by first entry).
  const Analysis::FusedKernel *fusedAt(size_t e) const;

  // ---- the optimizer phase and data parallelism (EmitUpdate.cpp) ----------------------------

  /// Data parallel over more than one rank.
  bool dataParallel() const { return plan.parallel.data > 1; }
  /// ZeRO-1: master and optimizer hold this rank's shard (MemoryPlan.cpp).
  bool sharded() const { return regions.shard > 0; }
  /// ZeRO 2 or 3: every tensor of the sharded regions holds this rank's piece of ⌈n/d⌉
  /// elements (MemoryPlan.cpp; the moves: EmitZero.cpp).
  bool pieced() const { return regions.tensorShards >= 2; }
  /// Data parallel with `overlap` (the plan's default) and without ZeRO: each 25 MiB bucket of
  /// G is averaged as soon as the last micro-batch's backward has written its last gradient.
  /// Not under pipeline parallelism: each stage's data group reduces after the pipeline's last
  /// backward (EmitPipeline.cpp).
  bool overlap() const { return dataParallel() && !sharded() && !pieced() && !pipelined() && plan.parallel.overlap; }

  // ---- tensor parallelism (EmitTensor.cpp) -------------------------------------------------

  /// Tensor parallel over more than one rank (the CPU step's Plan::tensorStep).
  bool tensorParallel() const { return plan.parallel.tensor > 1; }
  /// More than one MPI process: the collectives header and MPI in the CMakeLists.txt.
  bool multiRank() const { return dataParallel() || tensorParallel() || pipelined(); }
  TensorSplit tp;                                     ///< tensorSplit of the forward graph
  std::map<size_t, std::vector<TensorId>> tpReduceAfter; ///< gradients all-reduced after an entry
  /// tp and tpReduceAfter; false after fail() (a column-parallel input read by another op).
  bool indexTensorParallel();
  /// After entry e: a row-parallel matmul's output, or the gradients it completes, all-reduced.
  void tensorParallelAfter(size_t e);

  // ---- sequence parallelism (EmitTensor.cpp) -----------------------------------------------

  bool sequenceParallel() const { return tensorParallel() && plan.parallel.sequenceParallel; }
  /// While an op is written that reads or writes a sequence-split tensor whole (beside a tensor
  /// with the whole sequence): by storage, its whole shape and the buffer outside the arena
  /// (tally_comm::sp_scratch) it is read from (gathered) or written to.
  std::unordered_map<TensorId, Shape> shapeNow;
  std::unordered_map<TensorId, std::string> scratchNow;
  /// The backward's gathered buffers, by the arena pointer they gathered: their scratch slot.
  std::map<std::string, int> gatheredNow;
  int nextSlot = 0;
  bool inBackward = false;
  struct SequenceOut {
    TensorId t;
    bool reduce, accumulate; ///< reduce-scattered (partial sums) or sliced (alike on every rank)
  };
  std::vector<SequenceOut> sequenceOuts;
  /// The dimension t's storage is cut along the sequence (Analysis::sequenceDim), or -1.
  int seqDim(TensorId t) const;
  /// rows × chunk of a sequence-split storage (tally_comm.h's sequence parallel section).
  void seqRows(TensorId t, int64_t &rows, int64_t &chunk) const;
  /// Before entry e: the gathers of its sequence-split inputs read whole, the scratch of its
  /// outputs written whole; false after fail() (an op the shard cannot run).
  bool sequenceBefore(size_t e);
  /// After entry e: its whole outputs reduce-scattered or sliced into this rank's shard.
  void sequenceAfter(size_t e);
  /// The tail's all-reduce of the sequence-split parameters' gradients, once per step.
  std::string sequenceGradients();

  // ---- pipeline parallelism (EmitPipeline.cpp) ---------------------------------------------

  /// Pipeline parallel over more than one rank (the CPU step; Analysis::pipelineStep).
  bool pipelined() const { return plan.parallel.pipeline > 1; }
  /// The chunk whose function is being written (-1: none): ptr() addresses its slot, `cb`.
  int64_t chunkNow = -1;
  /// The rank whose code is being written: its regions indexed (index()).
  void selectRank(int64_t r);
  /// Why the plan's pipeline cannot be generated; true when it can (after fail() otherwise).
  bool checkPipeline();
  /// One entry of stepSchedule (at a fused run's first entry, the run) into `body`, with the
  /// moves around it: ZeRO's, sequence parallelism's, the tensor all-reduces; `ran(from, to)`
  /// after entries [from, to] are written (micro_step's overlapped buckets). `e` is left at the
  /// last entry written; false after fail().
  bool scheduleEntry(size_t &e, llvm::function_ref<void(size_t, size_t)> ran);
  /// The ranks' namespaces (tables, chunk functions, update, train) and the layouts and
  /// train_step that pick one by rank; false after fail().
  bool pipelineSource(std::string &stages, std::string &tail);
  /// One chunk's forward or backward function: its entries, the boundary's receives and sends.
  bool chunkFunction(int64_t k, bool backward, std::string &out);
  /// The entry of stepSchedule at which buffer `t` (a storage) is addressed for a boundary move.
  int64_t boundaryEntry(int64_t k, TensorId t, bool backward, bool first);
  /// kLayout's row of the values after the tables (shared by every rank's layout).
  std::string layoutRow(const std::string &params, const std::string &inputs, int64_t arena, int64_t stage);

  // ---- ZeRO 2 and 3 (EmitZero.cpp) ----------------------------------------------------------

  /// The step's ZeRO moves: Analysis::zero's, or under data x pipeline the chunks' own
  /// (PipelineStep.cpp: a tied parameter's gradient reduced by each chunk that writes it).
  const Analysis::ZeroMoves &zeroPlan() const { return pipelined() ? a.pipelineStep.zero : a.zero; }
  /// zeroPlan()'s moves by stepSchedule entry: gathers before it, gradient buffers zeroed
  /// before it, gradients reduce-scattered after it (indexes into its lists).
  std::map<size_t, std::vector<size_t>> gathersAt, zeroAt, reduceAt;
  void indexZeroMoves();
  /// ⌈n/d⌉: the elements of one rank's piece of tensor t.
  int64_t pieceOf(TensorId t) const;
  /// The address of `key`'s buffer live at entry `entry` (in a pipeline chunk's slot, `cb` on);
  /// "nullptr" after fail().
  std::string zeroBuffer(TensorId key, uint32_t entry, const std::string &type);
  /// The address of arena buffer `live` plus `extra` bytes as a `type` pointer: its offset, or
  /// in a pipeline chunk's function its offset in the chunk's slot (`cb` on); "nullptr" after
  /// fail() (`what` names the tensor in the message).
  std::string arenaAt(const Buffer *live, const std::string &type, int64_t extra, const std::string &what);
  /// Before entry e: ZeRO 3's gathers of a unit's parameters, gradient buffers zeroed.
  void zeroBefore(size_t e);
  /// After entry e: each gradient it completes averaged and reduce-scattered into G's pieces.
  void zeroAfter(size_t e);
  /// kUpdate's rows: each trainable parameter's piece on each rank.
  std::string pieceUpdateRows(bool hasMaster, unsigned states, size_t &count);
  /// ZeRO 2: gather_parameters(), the updated pieces all-gathered in place in P ("" under 3).
  std::string pieceGather();
  /// The gradient buckets: [begin, end) element ranges of G of at most 25 MiB (PyTorch DDP's
  /// bucket_cap_mb), in order.
  std::vector<std::pair<int64_t, int64_t>> gradientBuckets() const;
  /// With overlap(): per stepSchedule entry, the buckets whose last gradient write it is (a
  /// backward op writing a parameter's gradient, or a view of it, anywhere in the bucket).
  /// Buckets nothing writes are started by reduce_gradients().
  std::map<size_t, std::vector<size_t>> overlappedBuckets() const;

  /// Data parallel: reduce_gradients() averages the ranks' gradients after the backward, in
  /// buckets of gradientBuckets() (at most 25 MiB, PyTorch DDP's bucket_cap_mb) over the flat grads
  /// region: divided by the rank count, then summed by an all-reduce, or under ZeRO a
  /// reduce-scatter that leaves each rank its shard. ZeRO also has gather_gradients() (the
  /// whole averaged gradient on every rank, for --dump-grads) and gather_parameters(): each
  /// rank's updated shard of the parameters copied into its part of G, all-gathered there
  /// bucket by bucket, and copied back into P (G is zeroed next anyway, so the gather needs
  /// no memory of its own). "" for one rank.
  std::string communication(int64_t gradElems);

  /// The dtypes of the optimizer phase: the gradients' C++ type, a fp32 master copy, and
  /// 16-bit parameters updated without one.
  struct UpdateTypes {
    std::string G;
    bool hasMaster = false, pure16 = false;
  };
  /// Checks the precision against what the backend's optimizers update; false after fail().
  bool updateTypes(UpdateTypes &u);
  /// kUpdate: per trainable parameter (under ZeRO per piece a rank updates) its element count
  /// and offsets; `count` rows. False after fail().
  bool updateTable(const UpdateTypes &u, std::string &table, size_t &count);
  /// The ZeRO rows of kUpdate: each trainable parameter cut at the ranks' shards.
  std::string zeroUpdateRows(bool hasMaster, unsigned states, size_t &count);
  /// The elements of parameter t that the optimizer updates: all of them, but of a padded head's
  /// weight (passes/HeadPadding.h) only the real rows, a prefix; the padded rows stay zero.
  int64_t updated(TensorId t) const {
    return a.headPad.applies() && t == a.headPad.weight ? a.headPad.vocab * a.headPad.width : n(t);
  }
  /// The optimizer's update call for one kUpdate entry `e`; false after fail().
  bool optimizerCall(const UpdateTypes &u, std::string &call);
  /// The overflow check of fp16 loss scaling: Σg² over the gradients, or this rank's shard.
  void sumSquares(const std::string &G, int64_t gradElems);
  /// update(): the optimizer entries, each printed by its kind's entry (OpEmit::optimizer):
  /// sum_squares, optimizer_update; zero_grad(): the last one.
  bool update(std::string &updateText, std::string &zeroText);
  bool updateSumSquares(const OptimizerPhase &p);
  bool updateParameters(const OptimizerPhase &p);
  bool updateZeroGrad(const OptimizerPhase &p);
};

/// What update() passes an optimizer-phase op's entry.
struct OptimizerPhase {
  const std::string &path;  ///< the op's path
  const std::string &G;     ///< the gradients' C++ type
  int64_t gradElems;        ///< elements of the gradient region
  const std::string &call;  ///< the optimizer's call for one kUpdate entry `e`
};

// ---- the table: how each op kind is printed ---------------------------------------------------

/// How the step emitter prints one op kind. Every kind of ir/Ops.def has one entry, emit<ID>,
/// defined by one EMIT... or NO_EMIT... line beside its kind's code (the unary and binary
/// kinds by one line over the rows of ir/ops/Unary.def and Binary.def, in EmitOps.cpp);
/// EmitTable.cpp indexes them by kind. A kind without an entry does not link, an entry for a
/// kind ir/Ops.def does not list does not compile, and a kind with two does not link.
struct OpEmit {
  OpKind kind;
  /// The op's call in micro_step; nullptr when the kind has none (then `refused` says why).
  bool (Emitter::*call)();
  /// The backward of this kind as a unary_backward op (whose attrs.of is this kind); nullptr
  /// when the autodiff never makes one.
  bool (Emitter::*backward)();
  /// An optimizer-phase kind's code in update(); nullptr for the micro-batch's kinds.
  bool (Emitter::*optimizer)(const OptimizerPhase &);
  /// Why a kind without a call has none; nullptr when it has one. The message the user gets is
  /// emitOp's ("no CPU code for op kind topk"), not this.
  const char *refused;
  /// The kind runs in the optimizer phase (update()), never in micro_step.
  bool optimizerPhase;
  /// The runtime's rt::UnOp or rt::BinOp of a unary or binary kind (its .def row); else nullptr.
  const char *runtime;
};

/// The entry of kind `k`.
const OpEmit &emitFor(OpKind k);

#define OP(ID, NAME, CLASS) extern const OpEmit emit##ID;
#include "ir/Ops.def"

#define EMIT_ENTRY(ID, CALL, BACKWARD, OPTIMIZER, REFUSED, OPTIMIZER_PHASE, RUNTIME)               \
  static_assert(static_cast<unsigned>(OpKind::ID) < kOpKinds);                                   \
  const OpEmit emit##ID = {OpKind::ID, CALL, BACKWARD, OPTIMIZER, REFUSED, OPTIMIZER_PHASE, RUNTIME};
/// A kind of the micro-batch, printed by Emitter::CALL.
#define EMIT(ID, CALL) EMIT_ENTRY(ID, &Emitter::CALL, nullptr, nullptr, nullptr, false, nullptr)
/// A kind of the micro-batch whose gradient the autodiff makes a unary_backward op, printed by
/// Emitter::BACKWARD.
#define EMIT_WITH_BACKWARD(ID, CALL, BACKWARD)                                                    \
  EMIT_ENTRY(ID, &Emitter::CALL, &Emitter::BACKWARD, nullptr, nullptr, false, nullptr)
/// A kind of the micro-batch the runtime has no kernel for: emitOp refuses it, naming the op.
#define NO_EMIT(ID, WHY) EMIT_ENTRY(ID, nullptr, nullptr, nullptr, WHY, false, nullptr)
/// An optimizer-phase kind, printed in update() by Emitter::CALL.
#define EMIT_OPTIMIZER(ID, CALL)                                                                  \
  EMIT_ENTRY(ID, nullptr, nullptr, &Emitter::CALL, "an optimizer-phase op", true, nullptr)
/// An optimizer-phase kind update() has no code for: refused, naming the op.
#define NO_EMIT_OPTIMIZER(ID, WHY) EMIT_ENTRY(ID, nullptr, nullptr, nullptr, WHY, true, nullptr)

} // namespace tally::codegen::emit
