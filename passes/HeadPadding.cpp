// The padded LM head (issue 38, item 4): the rule and the padded forward graph. What padding
// does and who reads the rule: passes/HeadPadding.h.
#include "passes/HeadPadding.h"

#include <vector>

namespace tally {

namespace {

/// The op path of a reader of `t` other than those allowed, or "" (`allowed`: the op ids).
std::string otherReader(const Graph &g, TensorId t, const std::vector<OpId> &allowed) {
  for (OpId i = 0; i < g.ops.size(); ++i) {
    bool ok = false;
    for (OpId a : allowed)
      ok = ok || a == i;
    if (ok)
      continue;
    for (TensorId x : g.ops[i].inputs)
      if (x == t)
        return g.opPath(i);
  }
  return "";
}

} // namespace

HeadPadding headPadding(const Graph &g, const Plan &plan) {
  HeadPadding hp;
  if (!plan.padHead || !plan.isTrain || g.loss == kNone)
    return hp;
  // The loss: a cross_entropy over logits a matmul makes.
  const Tensor &loss = g.tensors[g.loss];
  if (loss.producer == kNone || g.ops[loss.producer].kind != OpKind::CrossEntropy)
    return hp;
  const Op &ce = g.ops[loss.producer];
  TensorId logits = ce.inputs.empty() ? kNone : ce.inputs[0];
  if (logits == kNone || g.tensors[logits].viewOf != kNone || g.tensors[logits].producer == kNone)
    return hp;
  OpId mm = g.tensors[logits].producer;
  const Op &head = g.ops[mm];
  if (head.kind != OpKind::Matmul || head.inputs.size() != 2 || head.outputs.size() != 1)
    return hp;
  TensorId b = head.inputs[1];
  const Shape &bs = g.tensors[b].shape;
  if (bs.size() != 2 || !g.isParamStorage(b))
    return hp;
  int64_t V = bs[1].size, d = bs[0].size;
  if (V <= 1 || V % kHeadPadMultiple == 0)
    return hp;
  TensorId w = g.storageOf(b);
  hp.head = mm;
  std::string name = "'" + g.tensorName(w) + "'";
  auto refuse = [&](const std::string &why) {
    hp.refused = why;
    return hp;
  };
  if (w == b)
    return refuse(name + " is [" + std::to_string(d) + ", " + std::to_string(V) +
                  "] (logits = x @ weight): the vocabulary is its inner axis, so padding it would "
                  "restride every row of the weight, not append rows; only a head of x @ "
                  "transpose(weight [V, d]) (a tied embedding's) is padded");
  const Tensor &bt = g.tensors[b];
  const Shape &ws = g.tensors[w].shape;
  llvm::SmallVector<int64_t, 4> st = stridesOf(bs, bt.layout);
  if (ws.size() != 2 || ws[0].size != V || ws[1].size != d || bt.layout.offset() != 0 || st.size() != 2 ||
      st[0] != 1 || st[1] != d || bt.producer == kNone || g.ops[bt.producer].kind != OpKind::Transpose)
    return refuse("the head reads " + name + " through a view other than its transpose");
  // Every other reader of the weight must read rows by index (an embedding lookup), and the
  // transpose and logits must feed only the head and the loss.
  std::vector<OpId> allowed{bt.producer};
  for (OpId i = 0; i < g.ops.size(); ++i)
    if (g.ops[i].kind == OpKind::Embedding && g.ops[i].inputs.size() == 2 && g.ops[i].inputs[1] == w)
      allowed.push_back(i);
  if (std::string other = otherReader(g, w, allowed); !other.empty())
    return refuse(name + " is also read by '" + other + "', which would see the padded rows");
  if (std::string other = otherReader(g, b, {mm}); !other.empty())
    return refuse("the head's transpose of " + name + " is also read by '" + other + "'");
  if (std::string other = otherReader(g, logits, {loss.producer}); !other.empty())
    return refuse("the logits are also read by '" + other + "', which would see the padded columns");
  for (TensorId o : g.outputs)
    if (o == logits)
      return refuse("the model returns the logits, which would have the padded columns");
  const Parallelism &par = plan.parallel;
  // ZeRO-1 shards the flat regions (the padded rows are in the last shard that holds the
  // weight, updated by nobody); ZeRO 2 and 3 and tensor parallelism cut each parameter by
  // its element count, which the files give as the real one.
  if (par.zero >= 2 || par.tensor > 1)
    return refuse(std::string(par.zero >= 2 ? "ZeRO " + std::to_string(par.zero) : "tensor parallelism") +
                  " cuts each parameter into pieces by its real element count");
  hp.matmul = mm;
  hp.loss = loss.producer;
  hp.weight = w;
  hp.view = b;
  hp.logits = logits;
  hp.vocab = V;
  hp.padded = (V + kHeadPadMultiple - 1) / kHeadPadMultiple * kHeadPadMultiple;
  hp.width = d;
  return hp;
}

Graph paddedForward(const Graph &g, const HeadPadding &hp) {
  Graph p = g; // an independent copy (Records: only extend shares)
  if (!hp.applies())
    return p;
  auto widen = [&](TensorId t, size_t axis) {
    Shape s = p.tensors[t].shape;
    s[axis].size = hp.padded;
    s[axis].sym = 0; // no longer the model's vocabulary symbol
    p.tensors[t].shape = s;
  };
  widen(hp.weight, 0);                                        // [V', d], row-major
  widen(hp.view, 1);                                          // [d, V'], strides [1, d] as before
  widen(hp.logits, p.tensors[hp.logits].shape.size() - 1);    // [.., V'], row-major
  return p;
}

std::string headPaddingNote(const Graph &g, const HeadPadding &hp) {
  if (hp.applies())
    return "lm head: " + g.tensorName(hp.weight) + " padded " + std::to_string(hp.vocab) + " -> " +
           std::to_string(hp.padded) + " rows in the step's regions (zero, never updated; the loss masks logit " +
           "columns " + std::to_string(hp.vocab) + ".." + std::to_string(hp.padded - 1) +
           "; files and parameter counts keep [" + std::to_string(hp.vocab) + ", " + std::to_string(hp.width) + "])";
  if (!hp.refused.empty())
    return "lm head: not padded: " + hp.refused;
  return "";
}

} // namespace tally
