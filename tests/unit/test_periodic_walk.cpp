// The periodic walk (passes/ActivationPeriodic.cpp, issue 41): a comparison walk of a segment
// policy priced from a smaller model, with the middle of each run of like copies left out,
// must give the whole walk's peak, peak step, Saved and other bytes and re-run FLOPs and
// seconds exactly, and must be the one taken where the copies and the policy are alike.
#include <catch.hpp>

#include "passes/ActivationsInternal.h"
#include "passes/BackwardTable.h"
#include "passes/GradientShares.h"
#include "passes/HeadPadding.h"
#include "tests/unit/Support.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

using namespace tally;
using namespace tally::activations;

namespace {

/// TinyGPT with `layers` copies on `target` (a plan with tensor parallelism splits some
/// activations: the bytes the walks compare differ from the unsplit plan's).
std::string periodicGpt(int layers, const std::string &target) {
  return std::string(test::kTinyGPTModel) + R"(
train t {
  model       = TinyGPT(layers = )" + std::to_string(layers) + R"()
  batch       = 16
  seq         = 128
  micro_batch = 4
  optimizer   = AdamW(lr = 1e-4)
  precision   = mixed_bf16
  target      = )" + target + R"(
}
)";
}

/// Segments of k copies over the first m copies (the last may be shorter).
Policy segmentsOf(size_t m, size_t k) {
  Policy p;
  p.name = "test";
  for (size_t c = 0; c < m; c += k)
    p.segments.push_back({c, std::min(m, c + k)});
  return p;
}

/// The whole walk against the periodic one; whether the periodic one answered.
bool samePeriodic(const Facts &f, const Analysis &a, const Policy &p) {
  Walk whole = walk(f, a, p, /*keepBuffers=*/true);
  std::optional<Walk> periodic = periodicWalk(f, p);
  if (!periodic)
    return false;
  CHECK(periodic->peakSaved == whole.peakSaved);
  CHECK(periodic->peakOther == whole.peakOther);
  CHECK(periodic->peakStep == whole.peakStep);
  CHECK(periodic->recomputeFlops == whole.recomputeFlops);
  CHECK(periodic->recomputeExecuted == whole.recomputeExecuted);
  CHECK(periodic->recomputeTime == whole.recomputeTime);
  return true;
}

} // namespace

TEST_CASE("periodic walk: the copies' walk from a smaller model is the whole walk, exactly",
          "[activations][periodic]") {
  for (const char *target : {"8 x H100_SXM { data = 8 }", "8 x H100_SXM { tensor = 2, data = 4 }"}) {
    INFO(target);
    test::Compiled t(periodicGpt(40, target));
    const Analysis &a = *t.a;
    REQUIRE(a.walks);
    Facts f = gatherFacts(a);
    REQUIRE(f.copies.size() == 40);
    // Policies the copies treat alike: the periodic walk must answer them.
    std::vector<std::pair<std::string, Policy>> alike = {
        {"none", Policy()},         {"full", segmentsOf(40, 1)},  {"every(2)", segmentsOf(40, 2)},
        {"every(3)", segmentsOf(40, 3)}, {"every(4)", segmentsOf(40, 4)},
        {"first 23", segmentsOf(23, 1)}, {"first 30 by 3", segmentsOf(30, 3)}};
    for (const auto &[name, p] : alike) {
      INFO(name);
      CHECK(samePeriodic(f, a, p));
    }
    // Policies it may decline (runs too short to leave periods out): equal when it answers.
    std::vector<std::pair<std::string, Policy>> other = {
        {"every(7)", segmentsOf(40, 7)}, {"every(20)", segmentsOf(40, 20)},
        {"one segment", segmentsOf(40, 40)},
        {"first 3", segmentsOf(3, 1)}};
    Policy scattered;
    for (size_t c : {1, 2, 9, 10, 11, 12, 13, 14, 15, 16, 17, 30})
      scattered.segments.push_back({c, c + 1});
    other.push_back({"scattered", scattered});
    for (const auto &[name, p] : other) {
      INFO(name);
      samePeriodic(f, a, p);
    }
  }
}

TEST_CASE("periodic walk: copies that differ are walked whole", "[activations][periodic]") {
  // Eight copies are too few to leave any out; a selective policy is not a segment policy.
  test::Compiled t(periodicGpt(8, "8 x H100_SXM { data = 8 }"));
  Facts f = gatherFacts(*t.a);
  CHECK(!periodicWalk(f, segmentsOf(8, 1)));
  test::Compiled deep(periodicGpt(40, "8 x H100_SXM { data = 8 }"));
  Facts g = gatherFacts(*deep.a);
  Policy selective;
  selective.selectiveOps.push_back(deep.op("h[3].mlp.gelu"));
  CHECK(!periodicWalk(g, selective));
  // The copies of the 40-layer model are alike from copy 1 to copy 38 (copy 0 reads the
  // embedding, copy 39's output goes to the head).
  REQUIRE(g.walked);
  const PeriodicCopies &pc = g.walked->periodic;
  REQUIRE(pc.built);
  REQUIRE(pc.runs.size() == 1);
  CHECK(pc.runs[0].first == 1);
  CHECK(pc.runs[0].second == 38);
}

namespace {

/// gradientShares as it was written before its groups became lists (a std::set of writers per
/// group in a std::map): the oracle for the lists.
GradientShares sharesBySets(const Graph &g) {
  GradientShares s;
  size_t T = g.tensors.size(), n = g.ops.size();
  s.root.assign(T, kNone);
  s.at.assign(T, kNone);
  if (g.loss == kNone)
    return s;
  auto base = [&](TensorId t) { return g.tensors[t].viewOf == kNone ? t : g.tensors[t].viewOf; };
  std::vector<bool> hasGrad(T, false), runs(n, false);
  hasGrad[g.loss] = true;
  for (OpId o = static_cast<OpId>(n); o-- > 0;) {
    const Op &op = g.ops[o];
    if (!backward::backwardFor(op.kind).build || op.outputs.empty() || !hasGrad[base(op.outputs[0])])
      continue;
    runs[o] = true;
    for (TensorId x : op.inputs)
      if (gradientNeeded(g, x))
        hasGrad[base(x)] = true;
  }
  std::vector<std::vector<OpId>> readers(T);
  for (OpId o = 0; o < n; ++o)
    for (TensorId x : g.ops[o].inputs)
      readers[base(x)].push_back(o);
  std::map<TensorId, std::pair<OpId, std::set<OpId>>> groups;
  for (OpId o = static_cast<OpId>(n); o-- > 0;) {
    if (!runs[o] || !sharingAdd(g, o))
      continue;
    const Op &op = g.ops[o];
    TensorId y = op.outputs[0];
    for (TensorId u : op.inputs) {
      if (s.root[u] != kNone || !sharingOperand(g, u, y))
        continue;
      const Tensor &tu = g.tensors[u];
      const std::vector<OpId> &rs = readers[u];
      if (rs.empty() || rs.back() != o || std::count(rs.begin(), rs.end(), o) != 1)
        continue;
      TensorId r = s.root[y] != kNone ? s.root[y] : y;
      auto &[minProducer, writers] = groups.try_emplace(r, o, std::set<OpId>()).first->second;
      OpId p = tu.producer;
      bool ok = rs.size() < 2 || rs[rs.size() - 2] < minProducer;
      auto w = writers.lower_bound(p);
      ok = ok && (w == writers.end() || *w >= o);
      if (!ok)
        continue;
      s.root[u] = r;
      s.at[u] = o;
      minProducer = std::min(minProducer, p);
      writers.insert(rs.begin(), rs.end() - 1);
    }
  }
  for (TensorId t = 0; t < T; ++t)
    if (s.root[t] != kNone)
      s.members.emplace_back(s.root[t], t);
  std::stable_sort(s.members.begin(), s.members.end(),
                   [](const auto &x, const auto &y) { return x.first < y.first; });
  return s;
}

} // namespace

TEST_CASE("gradient shares: the groups' writer lists decide as the sets did",
          "[autodiff][periodic]") {
  std::vector<std::unique_ptr<test::Compiled>> models;
  models.push_back(std::make_unique<test::Compiled>(periodicGpt(12, "8 x H100_SXM { data = 8 }")));
  for (const char *name : {"gpt2.tally", "llama2_7b.tally", "mixtral_8x7b.tally", "tour.tally"})
    models.push_back(std::make_unique<test::Compiled>(test::fromFile, test::example(name)));
  size_t shared = 0;
  for (const auto &m : models) {
    const Graph &g = m->g();
    GradientShares lists = gradientShares(g), sets = sharesBySets(g);
    CHECK(lists.root == sets.root);
    CHECK(lists.at == sets.at);
    CHECK(lists.members == sets.members);
    shared += lists.members.size();
  }
  CHECK(shared > 0);
}

TEST_CASE("gradient shares: made once per graph, and the padded head's copy has the same",
          "[autodiff][periodic]") {
  // Issue 41: the step build, the walks' facts and a fix search's graph part share one
  // GradientSharesOnce; the step of a padded head (a copy of the graph, three tensors wider)
  // takes the forward graph's shares when no add reads or writes a padded tensor.
  size_t padded = 0, sharing = 0;
  for (const char *name : {"gpt2.tally", "llama2_7b.tally", "tour.tally"}) {
    INFO(name);
    PlanOverrides o;
    o.padHead = true;
    test::Compiled m(test::fromFile, test::example(name), "", o);
    const Graph &g = m.g();
    const Plan &plan = *m.c.plan;
    GradientShares direct = gradientShares(g);
    GradientSharesOnce once(g);
    CHECK(once.get().root == direct.root);
    CHECK(once.get().at == direct.at);
    CHECK(once.get().members == direct.members);
    CHECK(&once.get() == &once.get()); // made once
    HeadPadding hp = headPadding(g, plan);
    if (hp.applies()) {
      ++padded;
      CHECK_FALSE(sharesReadShapeOf(g, {hp.weight, hp.view, hp.logits}));
      GradientShares wide = gradientShares(paddedForward(g, hp));
      CHECK(wide.root == direct.root);
      CHECK(wide.members == direct.members);
    }
    // The step built with the shared shares is the step built alone.
    Graph alone = buildTrainingStep(g, plan), withOnce = buildTrainingStep(g, plan, nullptr, &once);
    REQUIRE(alone.ops.size() == withOnce.ops.size());
    for (OpId i = 0; i < alone.ops.size(); ++i) {
      CHECK(alone.ops[i].kind == withOnce.ops[i].kind);
      CHECK(alone.ops[i].attrs->shares == withOnce.ops[i].attrs->shares);
      sharing += alone.ops[i].attrs->shares;
    }
  }
  CHECK(padded > 0);
  CHECK(sharing > 0);
}
