// GradientShares.h — which activations' gradients are another's buffer instead of a copy of it
// (issue 46, item 2). One rule, read by autodiff (passes/Backward*.cpp: the add's backward
// passes its output gradient on instead of copying it) and by the memory plan
// (passes/ActivationFacts.cpp, ActivationLiveness.cpp: one gradient buffer for the group).
#pragma once

#include "ir/Graph.h"

#include <initializer_list>
#include <memory>
#include <mutex>
#include <vector>

namespace tally {

/// Per tensor of a forward graph of a train plan: `root[t]`, the tensor whose gradient buffer
/// t's gradient is (kNone: its own, or none), and `at[t]`, the add whose backward makes it so.
/// `members`: (root, member) pairs, grouped by root.
struct GradientShares {
  std::vector<TensorId> root;
  std::vector<OpId> at;
  std::vector<std::pair<TensorId, TensorId>> members;
  bool any() const { return !members.empty(); }
  bool sharedAt(TensorId t, OpId o) const { return t < at.size() && at[t] == o; }
};

/// The gradient of `y = x + z` (same shapes, no constant) is dy for both operands, so each
/// operand's gradient may be dy's buffer itself when the add's backward is its first writer
/// (the add is its last reader) and no other member of the buffer's group is still to be read
/// when a later op writes one of them (writers of the operand's gradient come after every
/// member's reader; no member's writer falls between the operand's producer and the add).
/// Walked in backward order (reverse op order), as autodiff and the schedule run it.
GradientShares gradientShares(const Graph &forward);

/// Whether gradientShares reads the shape of one of `tensors`: it reads shapes only of an
/// add's operands and output. When it does not, a copy of the graph that differs only in
/// those tensors' shapes (the step's padded head, passes/HeadPadding.h) has the same shares.
bool sharesReadShapeOf(const Graph &g, std::initializer_list<TensorId> tensors);

/// gradientShares of one forward graph, made once, by the first of its readers to ask:
/// autodiff's step build and the walks' graph facts (passes/ActivationFacts.cpp), which run on
/// two threads at once (analyzeGraph), and the analyses of the same graph after them (a fix
/// search's graph part and its trials, AnalysisManager.cpp). Each call on a deep graph was a
/// few percent of a 100,000-layer check, four times over (issue 41). The shares depend on the
/// graph alone, so sharing them changes nothing but who computes them.
class GradientSharesOnce {
public:
  explicit GradientSharesOnce(const Graph &g) : graph_(&g) {}
  const Graph *graph() const { return graph_; }
  /// The shares of graph(); the first call computes them, a concurrent one waits for it.
  const GradientShares &get() {
    std::call_once(once_, [this] { shares_ = gradientShares(*graph_); });
    return shares_;
  }

private:
  const Graph *graph_;
  std::once_flag once_;
  GradientShares shares_;
};

/// Whether autodiff gives tensor `t` of `g` a gradient: a float tensor that requires one and is
/// (a view of) a trainable parameter or an activation. Autodiff and gradientShares ask it.
bool gradientNeeded(const Graph &g, TensorId t);

/// The shape conditions before (i) and (ii): op o is a two-operand add of distinct tensors, no
/// scalar, whose output is a plain activation (not a view, the loss or a graph output); and u,
/// an operand of it with output y, is a plain activation with a producer and a gradient, in y's
/// shape, dtype and layout. (The unit tests' oracle asks the same two questions.)
bool sharingAdd(const Graph &g, OpId o);
bool sharingOperand(const Graph &g, TensorId u, TensorId y);

} // namespace tally
