// Tensor parallelism's split (Megatron; docs/time.md §3), one rule for the estimate and the
// generated step: a matmul of an activation by a weight is column-parallel when its activation
// input is whole (it splits its output over the t devices) and row-parallel when that input is
// split (its output is all-reduced); elementwise ops, views, attention and losses on a split
// tensor work on their share; reductions, losses and embeddings return whole tensors. Under
// Plan::tensorStep the output head (a matmul a cross entropy reads) runs whole.
// Under sequence parallelism every other op works on its 1/t share of the tokens but for the
// embedding section (Megatron's LanguageModelEmbedding: the lookups and their sum run whole,
// then are scattered); with traffic, the messages that adds (TensorParallel.h).
#include "passes/TensorParallel.h"

#include <map>

namespace tally {

/// Plan::tensorStep: whether weight matmul `op` is the output head, a matmul whose output a
/// cross entropy reads; the generated step runs it (and the loss) whole on every rank.
static bool wholeHead(const Graph &g, const Plan &plan, const Op &op, const std::vector<bool> &lossInput) {
  return plan.tensorStep && !op.outputs.empty() && lossInput[g.storageOf(op.outputs[0])];
}

/// Sequence parallelism: which activation storages each rank holds 1/t of along the sequence
/// (TensorParallel::sequenceSplit): a row-parallel matmul's output (reduce-scattered), the
/// embedding section's outputs that other ops read (scattered), and the outputs of every other
/// op reading such a storage, but for a column-parallel matmul's (split along the hidden
/// dimension) and the whole head's (Plan::tensorStep), which read their input gathered.
static void sequenceShards(const Graph &g, TensorParallel &tp, const std::vector<bool> &section) {
  std::vector<bool> &seq = tp.sequenceSplit;
  seq.assign(g.tensors.size(), false);
  for (OpId i = 0; i < g.ops.size(); ++i) {
    const Op &op = g.ops[i];
    if (op.outputs.empty() || section[g.storageOf(op.outputs[0])] || tp.columnParallel[i] ||
        (!tp.rowParallel[i] && weightMatmulOperands(g, op).first != kNone))
      continue;
    bool reads = tp.rowParallel[i];
    for (TensorId in : op.inputs) {
      TensorId st = g.storageOf(in);
      if (section[st] && g.tensors[st].requiresGrad)
        seq[st] = true; // where the section is scattered
      reads = reads || seq[st];
    }
    for (TensorId o : op.outputs)
      if (!tp.storageSplit[g.storageOf(o)])
        seq[g.storageOf(o)] = reads;
  }
}

/// Low-rank chains (LoRA's `x @ a @ b`, an adapter's down- and up-projection): a weight matmul
/// whose output, through elementwise ops and views alone, is read only by one other weight
/// matmul whose output is wider; per op, that second matmul (kNone where the op starts no
/// chain). The frameworks split a chain so that it adds no collective of its own beside the
/// base weight it adapts: beside a column-parallel layer (a whole input) the rank-r product runs
/// whole on every rank and the second is split by columns like the base weight; beside a
/// row-parallel one (a split input) the first is split by rows and the second runs whole, its
/// partial sum reduced with the base output's (NeMo's ParallelLinearAdapter; NeMo Automodel's
/// LoRA under its tensor-parallel plan, nemo_automodel/components/_peft/lora.py,
/// LinearLoRA.forward: "lora_res" stays partial beside the base output "so only one
/// reduce-scatter is needed after addition"). tally's rule would otherwise split the first by
/// columns and all-reduce the second's wide output. The row case keeps the all-reduce of the
/// rank-r product (an upper bound: its partial sum is not carried through the second).
static std::vector<OpId> lowRankChains(const Graph &g) {
  std::vector<OpId> second(g.ops.size(), kNone);
  std::vector<uint32_t> readers(g.tensors.size(), 0);
  std::vector<OpId> reader(g.tensors.size(), kNone);
  for (OpId i = 0; i < g.ops.size(); ++i) {
    if (g.ops[i].phase != Phase::Forward) // the backward's reads are not the chain's
      continue;
    for (TensorId in : g.ops[i].inputs) {
      TensorId st = g.storageOf(in);
      readers[st] += reader[st] == i ? 0 : 1;
      reader[st] = i;
    }
  }
  for (OpId i = 0; i < g.ops.size(); ++i) {
    const Op &op = g.ops[i];
    if (op.phase != Phase::Forward || op.outputs.empty() || weightMatmulOperands(g, op).first == kNone)
      continue;
    TensorId cur = g.storageOf(op.outputs[0]);
    double width = numel(g.tensors[op.outputs[0]].shape);
    for (int hops = 0; hops < 8 && readers[cur] == 1; ++hops) {
      const Op &r = g.ops[reader[cur]];
      if (r.outputs.empty())
        break;
      TensorId rx = weightMatmulOperands(g, r).first;
      if (rx != kNone) {
        if (g.storageOf(rx) == cur && numel(g.tensors[r.outputs[0]].shape) > width)
          second[i] = reader[cur];
        break;
      }
      OpClass k = opClass(r.kind);
      if (k != OpClass::Elementwise && k != OpClass::View)
        break;
      bool alone = true; // no other activation joins the chain
      for (TensorId in : r.inputs)
        alone = alone && (g.storageOf(in) == cur || g.tensors[g.storageOf(in)].role != TensorRole::Activation);
      if (!alone)
        break;
      cur = g.storageOf(r.outputs[0]);
    }
  }
  return second;
}

/// A moe op under tensor parallelism: its experts split like a Megatron MLP (gate and up
/// column-parallel, down row-parallel; y all-reduced forward, the gradient of x backward), its
/// work over `split`. Under MoE parallel folding (expert_tensor = 1, ir/Plan.h expertLayout) each
/// expert runs whole on its rank over the tokens dispatched to it from the ranks' sequence
/// shards: no tensor collective, and the same work per device (the t·c ranks share the tokens).
static void moeSplit(const Graph &g, const Plan &plan, OpId i, bool traffic, double split, TensorParallel &tp,
                     std::map<TensorId, std::vector<OpId>> &columnInputs) {
  const Op &op = g.ops[i];
  const bool folded = expertLayout(plan.parallel).folded;
  tp.rowParallel[i] = !folded;
  if (traffic && !folded) {
    tp.forwardBytes += g.bytes(op.outputs[0]);
    tp.forwardMessages.push_back(g.bytes(op.outputs[0]));
    if (plan.isTrain && g.tensors[op.inputs[0]].requiresGrad)
      columnInputs[g.storageOf(op.inputs[0])].push_back(i);
  }
  tp.split[i] = split;
}

TensorParallel tensorParallel(const Graph &g, const Plan &plan, bool traffic) {
  TensorParallel tp;
  double t = degree(plan.parallel.tensor);
  // Context parallelism: every op works on s/c tokens.
  double c = degree(plan.parallel.context);
  tp.split.assign(g.ops.size(), c);
  tp.rowParallel.assign(g.ops.size(), false);
  tp.columnParallel.assign(g.ops.size(), false);
  tp.storageSplit.assign(g.tensors.size(), false);
  if (t <= 1)
    return tp;
  std::vector<bool> &split = tp.storageSplit; // per storage
  std::vector<bool> lossInput(g.tensors.size(), false);
  if (plan.tensorStep)
    for (const Op &op : g.ops)
      if (op.kind == OpKind::CrossEntropy)
        for (TensorId x : op.inputs)
          lossInput[g.storageOf(x)] = true;
  std::map<TensorId, std::vector<OpId>> columnInputs; // storage -> the ops reading it
  const std::vector<OpId> chainSecond = lowRankChains(g);
  std::vector<bool> wholeSecond(g.ops.size(), false); // a row-parallel chain's second product
  const bool sequence = traffic && plan.parallel.sequenceParallel;
  std::vector<size_t> gathered(sequence ? g.tensors.size() : 0, SIZE_MAX); // its gatherMessages index
  auto gatherOf = [&](TensorId x, OpId reader) {
    TensorId st = g.storageOf(x);
    if (gathered[st] == SIZE_MAX) {
      gathered[st] = tp.gatherMessages.size();
      tp.gatherMessages.push_back(g.bytes(st));
      tp.gatherReaders.emplace_back();
    }
    tp.gatherReaders[gathered[st]].push_back(reader);
  };
  // Sequence parallelism: per parameter storage, 1 read by ops the sequence alone splits, 2 also
  // by another op (then the gradient is not a per-token partial sum: left out).
  std::vector<uint8_t> sequenceParam(sequence ? g.tensors.size() : 0, 0);
  // Sequence parallelism: the embedding section (Megatron's LanguageModelEmbedding runs the
  // lookups and their sum whole, then scatters it along the sequence): per storage, made by an
  // embedding or by an elementwise op (not dropout) of such storages, parameters and data.
  const bool sequenceSplit = plan.parallel.sequenceParallel;
  std::vector<bool> section(sequenceSplit ? g.tensors.size() : 0, false), scattered = section;
  auto inSection = [&](const Op &op) {
    if (op.kind == OpKind::Embedding)
      return true;
    if (op.kind == OpKind::Dropout || (!op.inputs.empty() && opClass(op.kind) != OpClass::Elementwise))
      return false;
    for (TensorId in : op.inputs)
      if (g.tensors[g.storageOf(in)].role == TensorRole::Activation && !section[g.storageOf(in)])
        return false;
    return true;
  };
  for (OpId i = 0; i < g.ops.size(); ++i) {
    const Op &op = g.ops[i];
    bool anySplit = false;
    for (TensorId x : op.inputs)
      anySplit = anySplit || split[g.storageOf(x)];
    bool out = false;
    TensorId x = weightMatmulOperands(g, op).first;
    bool sequenceOnly = x == kNone && !anySplit && op.kind != OpKind::Embedding && opClass(op.kind) != OpClass::View &&
                        !(sequenceSplit && inSection(op));
    if (sequence) // 1: only ops split by the sequence alone read it; 2: another op does too
      for (TensorId in : op.inputs)
        if (g.isParamStorage(in))
          sequenceParam[g.storageOf(in)] = sequenceOnly && sequenceParam[g.storageOf(in)] != 2 ? 1 : 2;
    if (sequenceSplit && inSection(op)) {
      tp.split[i] = c; // the embedding section runs whole on every tensor rank
      for (TensorId o : op.outputs)
        section[g.storageOf(o)] = true;
      continue;
    }
    if (sequence) // the gradient of the section's scattered output all-gathered in the backward
      for (TensorId in : op.inputs) {
        TensorId st = g.storageOf(in);
        if (section[st] && !scattered[st] && g.tensors[st].requiresGrad && plan.isTrain) {
          scattered[st] = true;
          tp.scatterMessages.push_back(g.bytes(st));
        }
      }
    if (x != kNone && !split[g.storageOf(x)] && wholeHead(g, plan, op, lossInput)) {
      tp.split[i] = c; // Plan::tensorStep: the head and its loss run whole on every rank
      if (sequence) // its input gathered along the sequence
        gatherOf(x, i);
      for (TensorId o : op.outputs)
        split[g.storageOf(o)] = false;
      continue;
    }
    if (op.kind == OpKind::Moe) {
      moeSplit(g, plan, i, traffic, t * c, tp, columnInputs);
      for (TensorId o : op.outputs)
        split[g.storageOf(o)] = false;
      continue;
    }
    if (x != kNone && ((!split[g.storageOf(x)] && chainSecond[i] != kNone) || wholeSecond[i])) {
      tp.split[i] = c; // a low-rank chain's product that runs whole on every rank
      if (sequence)
        gatherOf(x, i);
      for (TensorId o : op.outputs)
        split[g.storageOf(o)] = false;
      continue;
    }
    if (x != kNone) {
      bool inputSplit = split[g.storageOf(x)];
      out = !inputSplit;
      tp.rowParallel[i] = inputSplit;
      tp.columnParallel[i] = !inputSplit;
      if (inputSplit && chainSecond[i] != kNone)
        wholeSecond[chainSecond[i]] = true;
      if (traffic && inputSplit)
        for (TensorId o : op.outputs) {
          tp.forwardBytes += g.bytes(o);
          tp.forwardMessages.push_back(g.bytes(o));
        }
      else if (traffic && plan.isTrain && g.tensors[x].requiresGrad)
        columnInputs[g.storageOf(x)].push_back(i);
      if (sequence && !inputSplit)
        gatherOf(x, i);
    } else if (opClass(op.kind) != OpClass::Reduction && op.kind != OpKind::CrossEntropy &&
               op.kind != OpKind::Embedding) {
      out = anySplit;
    }
    // Under sequence parallelism the ops outside the tensor-parallel regions (norms, residual
    // adds, dropout, embeddings) work on their 1/t share of the tokens: every op is split.
    tp.split[i] = (x != kNone || anySplit || plan.parallel.sequenceParallel ? t : 1) * c;
    for (TensorId o : op.outputs)
      split[g.storageOf(o)] = out;
  }
  for (TensorId p = 0; p < sequenceParam.size(); ++p)
    if (sequenceParam[p] == 1 && g.tensors[p].param < g.params.size() && g.params[g.tensors[p].param].trainable) {
      tp.sequenceGradElements += numel(g.tensors[p].shape);
      tp.sequenceParams.push_back(p);
    }
  if (sequenceSplit)
    sequenceShards(g, tp, section);
  for (auto &[s, readers] : columnInputs) {
    tp.columnInputs.push_back(s);
    tp.backwardBytes += g.bytes(s);
    tp.backwardMessages.push_back(g.bytes(s));
    tp.backwardReaders.push_back(std::move(readers));
  }
  return tp;
}

std::shared_ptr<const TensorParallel> tensorParallelOf(const Analysis &a) {
  const Plan &plan = *a.plan;
  if (!a.tensorParallelMemo)
    return std::make_shared<const TensorParallel>(tensorParallel(*a.graph, plan));
  TensorParallelMemo &memo = *a.tensorParallelMemo;
  TensorParallelMemo::Key key{plan.parallel.tensor, plan.parallel.context,
                              plan.parallel.sequenceParallel, plan.tensorStep, plan.isTrain};
  std::lock_guard<std::mutex> hold(memo.lock);
  for (const auto &[k, tp] : memo.entries)
    if (k == key)
      return tp;
  auto tp = std::make_shared<const TensorParallel>(tensorParallel(*a.graph, plan));
  memo.entries.push_back({key, tp});
  return tp;
}

std::vector<double> opWorkSplits(const Graph &g, const Plan &plan) {
  return tensorParallel(g, plan, /*traffic=*/false).split;
}

TensorSplit tensorSplit(const Graph &g, const Plan &plan) {
  TensorParallel tp = tensorParallel(g, plan);
  TensorSplit out;
  out.split = std::move(tp.storageSplit);
  out.rowParallel = std::move(tp.rowParallel);
  out.columnParallel = std::move(tp.columnParallel);
  out.columnInputs = std::move(tp.columnInputs);
  out.sequenceSplit = std::move(tp.sequenceSplit);
  out.sequenceParams = std::move(tp.sequenceParams);
  return out;
}

} // namespace tally
