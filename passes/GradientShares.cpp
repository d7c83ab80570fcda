// The gradient buffers that adds share (passes/GradientShares.h; issue 46, item 2).
//
// Why it is safe. Backward steps run in reverse op order. A member's gradient is read once, by
// its producer's backward; written after it joins only by its other readers' backwards (an op
// reading it, or a view of it, with a lower index than the add). At the add, every member
// holds dy. Two members stay equal until one is written, so a write to member a by op c is
// wrong only while another member b joined and is not yet read: c's backward runs between
// the add that joined b and b's producer's backward, i.e. producer(b) ≤ c (c is below b's
// add). So an operand u joins a group when (i) each other reader c of u is below every
// member's producer (the add's output counts with the add itself), and (ii) no writer of a
// member lies in [producer(u), add): there it would change the buffer before u is read.
#include "passes/GradientShares.h"

#include "passes/BackwardTable.h"

#include <algorithm>
#include <functional>

namespace tally {

bool gradientNeeded(const Graph &g, TensorId t) {
  const Tensor &x = g.tensors[t];
  if (!x.requiresGrad || !isFloat(x.dtype))
    return false;
  const Tensor &b = g.tensors[x.viewOf == kNone ? t : x.viewOf];
  if (b.role == TensorRole::Param)
    return g.params[b.param].trainable;
  return b.role == TensorRole::Activation;
}

bool sharingAdd(const Graph &g, OpId o) {
  const Op &op = g.ops[o];
  if (op.kind != OpKind::Add || op.attrs->hasScalar || op.inputs.size() != 2 || op.outputs.size() != 1 ||
      op.inputs[0] == op.inputs[1])
    return false;
  TensorId y = op.outputs[0];
  const Tensor &ty = g.tensors[y];
  return ty.viewOf == kNone && ty.role == TensorRole::Activation && y != g.loss &&
         std::find(g.outputs.begin(), g.outputs.end(), y) == g.outputs.end();
}

bool sharingOperand(const Graph &g, TensorId u, TensorId y) {
  const Tensor &tu = g.tensors[u], &ty = g.tensors[y];
  return tu.viewOf == kNone && tu.role == TensorRole::Activation && tu.producer != kNone && gradientNeeded(g, u) &&
         tu.shape == ty.shape && tu.dtype == ty.dtype && tu.layout == ty.layout;
}

bool sharesReadShapeOf(const Graph &g, std::initializer_list<TensorId> tensors) {
  auto listed = [&](TensorId t) { return std::find(tensors.begin(), tensors.end(), t) != tensors.end(); };
  for (const Op &op : g.ops)
    if (op.kind == OpKind::Add &&
        (std::any_of(op.inputs.begin(), op.inputs.end(), listed) ||
         std::any_of(op.outputs.begin(), op.outputs.end(), listed)))
      return true;
  return false;
}

GradientShares gradientShares(const Graph &g) {
  GradientShares s;
  size_t T = g.tensors.size(), n = g.ops.size();
  s.root.assign(T, kNone);
  s.at.assign(T, kNone);
  if (g.loss == kNone)
    return s;
  auto base = [&](TensorId t) { return g.tensors[t].viewOf == kNone ? t : g.tensors[t].viewOf; };
  auto needs = [&](TensorId t) { return gradientNeeded(g, t); };
  // Which ops run a backward (as autodiff's step 1 decides it).
  std::vector<bool> hasGrad(T, false);
  std::vector<bool> runs(n, false);
  hasGrad[g.loss] = true;
  for (OpId o = static_cast<OpId>(n); o-- > 0;) {
    const Op &op = g.ops[o];
    if (!backward::backwardFor(op.kind).build || op.outputs.empty() || !hasGrad[base(op.outputs[0])])
      continue;
    runs[o] = true;
    for (TensorId x : op.inputs)
      if (needs(x))
        hasGrad[base(x)] = true;
  }
  // The readers of each stored tensor (or of a view of it), in op order.
  std::vector<uint32_t> from(T + 1, 0);
  for (const Op &op : g.ops)
    for (TensorId x : op.inputs)
      ++from[base(x) + 1];
  for (size_t t = 0; t < T; ++t)
    from[t + 1] += from[t];
  std::vector<OpId> readers(from[T]);
  {
    std::vector<uint32_t> next(from.begin(), from.end() - 1);
    for (OpId o = 0; o < n; ++o)
      for (TensorId x : g.ops[o].inputs)
        readers[next[base(x)]++] = o;
  }
  auto readersOf = [&](TensorId t) {
    return llvm::ArrayRef<OpId>(readers).slice(from[t], from[t + 1] - from[t]);
  };
  // Per group (by root): the lowest producer of a member, the members' later writers. The
  // writers joined with a member are below the lowest producer before it joined (i) and above
  // its producer, which becomes the lowest: each member's writers are below all the earlier
  // ones', so the list is in descending order as appended (a std::set per group in a std::map
  // was a quarter of a deep model's check).
  struct Group {
    OpId minProducer;
    std::vector<OpId> writers; // descending
  };
  std::vector<Group> groups;
  std::vector<uint32_t> groupOf(T, kNone); // per root
  for (OpId o = static_cast<OpId>(n); o-- > 0;) {
    if (!runs[o] || !sharingAdd(g, o))
      continue;
    const Op &op = g.ops[o];
    TensorId y = op.outputs[0];
    for (TensorId u : op.inputs) {
      if (s.root[u] != kNone || !sharingOperand(g, u, y))
        continue;
      const Tensor &tu = g.tensors[u];
      llvm::ArrayRef<OpId> rs = readersOf(u);
      if (rs.empty() || rs.back() != o || std::count(rs.begin(), rs.end(), o) != 1)
        continue; // the add is not u's last reader, or reads it twice
      TensorId r = s.root[y] != kNone ? s.root[y] : y;
      if (groupOf[r] == kNone) {
        groupOf[r] = static_cast<uint32_t>(groups.size());
        groups.push_back({o, {}});
      }
      auto &[minProducer, writers] = groups[groupOf[r]];
      OpId p = tu.producer;
      bool ok = rs.size() < 2 || rs[rs.size() - 2] < minProducer;           // (i)
      // The lowest writer at or above p (the list read from its end is ascending).
      auto w = std::lower_bound(writers.rbegin(), writers.rend(), p);
      ok = ok && (w == writers.rend() || *w >= o);                          // (ii)
      if (!ok)
        continue;
      s.root[u] = r;
      s.at[u] = o;
      minProducer = std::min(minProducer, p);
      for (size_t i = rs.size() - 1; i-- > 0;) { // rs ascending: at the end, as argued above
        auto at = std::lower_bound(writers.begin(), writers.end(), rs[i], std::greater<OpId>());
        if (at == writers.end() || *at != rs[i])
          writers.insert(at, rs[i]);
      }
    }
  }
  for (TensorId t = 0; t < T; ++t)
    if (s.root[t] != kNone)
      s.members.emplace_back(s.root[t], t);
  std::stable_sort(s.members.begin(), s.members.end(),
                   [](const auto &x, const auto &y) { return x.first < y.first; });
  return s;
}

} // namespace tally
