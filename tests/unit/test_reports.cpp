// Unit tests for the HTML and SARIF renderers' helpers: every diagnostic kind has SARIF rule
// text, artifact URIs, XML escaping, and the chart scales (values derived by hand); the trace of
// `tally run --trace` (the estimated timeline and the merged Chrome trace).
#include "report/ChromeTrace.h"
#include "report/Report.h"
#include "report/Sarif.h"
#include "report/Svg.h"
#include "passes/StepTimeline.h"
#include "tests/unit/Support.h"

#include <catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>

using namespace tally;

TEST_CASE("sarif: every diagnostic kind has a rule with its texts", "[reports]") {
  for (unsigned k = 0; k < NumDiagKinds; ++k) {
    DiagKind kind = static_cast<DiagKind>(k);
    INFO(codeOf(kind).str());
    const SarifRuleText *r = sarifRuleText(kind);
    REQUIRE(r != nullptr);
    CHECK(codeOf(kind) == r->code);
    CHECK(std::string(r->shortDescription).size() > 10);
    CHECK(std::string(r->fullDescription).size() > 10);
    CHECK(std::string(r->help).size() > 5);
  }
}

TEST_CASE("sarif: file paths become URIs", "[reports]") {
  CHECK(sarifUri("/work/a b/m.tally") == "file:///work/a%20b/m.tally");
  CHECK(sarifUri("models/gpt2.tally") == "models/gpt2.tally");
  CHECK(sarifUri("<stdin>") == "%3Cstdin%3E");
  // UTF-8 bytes are percent-encoded one by one: é is C3 A9.
  CHECK(sarifUri("caf\xc3\xa9.tally") == "caf%C3%A9.tally");
}

TEST_CASE("svg: text is escaped for XML", "[reports]") {
  CHECK(xmlEscape("a<b & \"c\" > 'd'") == "a&lt;b &amp; &quot;c&quot; &gt; &#39;d&#39;");
}

TEST_CASE("svg: a log scale spans whole decades", "[reports]") {
  // 0.2 .. 3000 needs the decades 10^-1 .. 10^4: five decades over 500 pixels, 100 each.
  LogScale s = LogScale::covering(0.2, 3000, 0, 500);
  CHECK(s.lo == -1);
  CHECK(s.hi == 4);
  CHECK(s(0.1) == Approx(0));
  CHECK(s(1) == Approx(100));
  CHECK(s(10000) == Approx(500));
  // One value: still one decade wide.
  LogScale one = LogScale::covering(100, 100, 0, 1);
  CHECK(one.hi - one.lo == 1);
}

TEST_CASE("svg: a linear scale ends at a 1-2-5 multiple", "[reports]") {
  // 74.5 / 5 = 14.9 → step 20, max 80; 80 maps to the far end, 20 to a quarter of it.
  LinearScale s = LinearScale::upTo(74.5, 100, 500);
  CHECK(s.step == Approx(20));
  CHECK(s.max == Approx(80));
  CHECK(s(20) == Approx(200));
  CHECK(s(80) == Approx(500));
  // 0.031 / 5 = 0.0062 → step 0.01, max 0.04.
  LinearScale small = LinearScale::upTo(0.031, 0, 1);
  CHECK(small.step == Approx(0.01));
  CHECK(small.max == Approx(0.04));
  // Nothing to draw: a unit axis rather than a division by zero.
  LinearScale zero = LinearScale::upTo(0, 0, 1);
  CHECK(zero.max == Approx(1));
}

TEST_CASE("json: a streamed number is written as llvm::json writes it", "[reports]") {
  // The report's large arrays format doubles with std::to_chars (writeJsonNumber); llvm::json
  // formats a Value's double with printf's "%.17g". The two must agree byte for byte.
  auto viaLlvm = [](double v) {
    std::string s;
    llvm::raw_string_ostream os(s);
    llvm::json::OStream(os).value(v);
    return os.str();
  };
  auto viaUs = [](double v) {
    std::string s;
    llvm::raw_string_ostream os(s);
    llvm::json::OStream j(os);
    writeJsonNumber(j, v);
    return os.str();
  };
  std::vector<double> values{0.0, -0.0, 1.0, -2.5, 3.0, 0.1, 1e16, 1e17, 123456789012345678.0,
                             1e21, 1e-300, 5e-324, std::numeric_limits<double>::max(),
                             std::numeric_limits<double>::min(), 124439808.0, 6.02e23};
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    uint64_t bits = rng();
    double d;
    std::memcpy(&d, &bits, sizeof d);
    if (std::isfinite(d))
      values.push_back(d);
    values.push_back(std::ldexp(static_cast<double>(rng() >> 11), static_cast<int>(rng() % 160) - 80));
    // Integers take a path of their own below 10^17: every magnitude up to it, and past it.
    double scale = std::pow(10.0, static_cast<double>(rng() % 19));
    values.push_back(std::trunc(static_cast<double>(rng() >> 11) / 0x1p53 * scale));
    values.push_back(-std::trunc(static_cast<double>(rng() >> 11) / 0x1p53 * scale));
  }
  for (double v : {99999999999999984.0, 1e17 - 16, -99999999999999984.0, 0x1p53, 0x1p53 + 2, 1e15 + 1,
                   -1.0, 1e16 + 2, 100000000000000016.0})
    values.push_back(v);
  for (double v : values) {
    INFO(viaLlvm(v));
    CHECK(viaUs(v) == viaLlvm(v));
  }
  CHECK(viaUs(std::numeric_limits<double>::infinity()) == "null");
  CHECK(viaUs(std::nan("")) == "null");
}

// ---- `tally run --trace` (issue 42): the estimated step on a time axis, and the trace file ----

namespace {

/// The seconds of `slices` whose phase is one of `phases`.
double sumOf(const std::vector<TimelineSlice> &slices, std::initializer_list<const char *> phases) {
  double s = 0;
  for (const TimelineSlice &x : slices)
    for (const char *p : phases)
      if (x.phase == p)
        s += x.seconds;
  return s;
}

} // namespace

TEST_CASE("trace: the estimated step's slices are StepTime's times, one after another", "[reports]") {
  // GPT-2 on 8 H100s (data parallel, accumulation), and with full checkpointing (recompute slices).
  for (const char *extra : {"", "full"}) {
    INFO(extra);
    PlanOverrides o;
    if (*extra)
      o.checkpoint = extra;
    test::Compiled t(test::fromFile, test::example("gpt2.tally"), "", o);
    const Analysis &a = *t.a;
    std::vector<TimelineSlice> s = estimatedTimeline(a);
    REQUIRE(!s.empty());
    CHECK(sumOf(s, {"forward", "backward", "recompute"}) ==
          Approx(a.time.forward + a.time.backward + a.time.recompute).epsilon(1e-9));
    CHECK(sumOf(s, {"recompute"}) == Approx(a.time.recompute).margin(1e-15));
    CHECK((*extra ? a.time.recompute > 0 : a.time.recompute == 0));
    CHECK(sumOf(s, {"optimizer"}) == Approx(a.time.optimizer));
    CHECK(sumOf(s, {"communication"}) == Approx(a.time.communication).margin(1e-15));
    // Laid end to end from 0: the last slice ends at the step time, none overlaps the one before.
    double end = 0;
    for (const TimelineSlice &x : s) {
      CHECK(x.start >= end - 1e-12 * a.time.step);
      end = x.start + x.seconds;
    }
    CHECK(end == Approx(a.time.step).epsilon(1e-9));
    // Every micro-batch runs every op's forward: the first slice is the first op of micro-batch 0.
    CHECK(s.front().op == 0);
    CHECK(s.front().name == a.graph->opPath(0) + " (forward)");
    CHECK(s.back().microBatch == -1);
  }
}

TEST_CASE("trace: a pipeline's estimate is its schedule's slots, a track per stage", "[reports]") {
  PlanOverrides o;
  o.target = "8 x H100_SXM { pipeline = 4, data = 2 }";
  test::Compiled t(test::fromFile, test::example("gpt2.tally"), "", o);
  const Analysis &a = *t.a;
  REQUIRE(!a.pipeline.slots.empty());
  std::vector<TimelineSlice> s = estimatedTimeline(a);
  size_t slots = 0;
  for (const TimelineSlice &x : s)
    if (x.track.rfind("stage ", 0) == 0) {
      const Analysis::PipelineSlot &p = a.pipeline.slots[slots++];
      CHECK(x.track == "stage " + std::to_string(p.stage));
      CHECK(x.start == p.start);
      CHECK(x.seconds == Approx(p.end - p.start));
    }
  CHECK(slots == a.pipeline.slots.size());
  CHECK(s.back().start + s.back().seconds >= a.pipeline.makespan);
  CHECK(sumOf(s, {"optimizer"}) == Approx(a.time.optimizer));
}

TEST_CASE("trace: the ranks' traces on one axis, each kernel call with its op's costs", "[reports]") {
  test::Compiled t(test::fromFile, test::sourceDir() + "/tests/step/e2e/mlp.tally");
  const Analysis &a = *t.a;
  REQUIRE(a.step);
  // What a rank of the generated step writes (driver_cpu.cpp, writeTrace): fc1.matmul by its op id,
  // zero_grad by its path alone, an unknown path, and two calls of one op (the optimizer's).
  OpId fc1 = t.op("fc1.matmul"), opt = kNone;
  for (OpId i = 0; i < a.step->ops.size(); ++i)
    if (a.step->opPath(i) == "optimizer_update")
      opt = i;
  REQUIRE(opt != kNone);
  auto call = [](const std::string &path, int64_t id, double ts) {
    return llvm::json::Object{{"name", path + " (k)"}, {"ph", "X"}, {"ts", ts}, {"dur", 1.0}, {"pid", 1}, {"tid", 1},
                              {"args", llvm::json::Object{{"op_path", path}, {"op_id", id}, {"micro_batch", 0}}}};
  };
  auto rank = [&](double start) {
    return llvm::json::Value(llvm::json::Object{
        {"traceEvents", llvm::json::Array{call("fc1.matmul", fc1, 1), call("zero_grad", -1, 2), call("nowhere", -1, 3),
                                          call("optimizer_update", opt, 4), call("optimizer_update", opt, 5)}},
        {"otherData", llvm::json::Object{{"step_start_s", start}, {"step_s", 1e-5}, {"step", 3}}}});
  };
  std::vector<llvm::json::Value> ranks{rank(100.0), rank(100.5)};
  llvm::json::Object out;
  std::string error;
  REQUIRE(runTrace(a, ranks, 2e-5, out, error));
  const llvm::json::Array &ev = *out.getArray("traceEvents");
  auto args = [&](size_t i) { return ev[i].getAsObject()->getObject("args"); };
  // fc1.matmul: [4, 16] x [16, 64] per micro-batch: 2·4·16·64 FLOPs; reads both, writes [4, 64] (fp32).
  CHECK(args(0)->getNumber("flops").getValueOr(0) == 2.0 * 4 * 16 * 64);
  CHECK(args(0)->getNumber("bytes").getValueOr(0) == 4.0 * (4 * 16 + 16 * 64 + 4 * 64));
  CHECK(args(1)->getNumber("bytes").hasValue());  // zero_grad, found by its path
  CHECK(!args(2)->getNumber("flops").hasValue()); // no op has that path
  CHECK(args(3)->getInteger("op_calls").getValueOr(0) == 2);   // two calls share the op's FLOPs
  CHECK(args(3)->getNumber("op_flops").hasValue());
  // The second rank started 0.5 s later: its slices move by 500,000 us.
  CHECK(ev[5].getAsObject()->getNumber("ts").getValueOr(0) == Approx(1 + 0.5e6));
  // Then the estimate, a process of its own, named, with its totals.
  CHECK(ev[10].getAsObject()->getObject("args")->getString("name") == llvm::StringRef("tally estimate"));
  CHECK(out.getObject("otherData")->getObject("estimate")->getNumber("step_s").getValueOr(0) == a.time.step);
  // A rank's trace without its start is refused.
  std::vector<llvm::json::Value> bad{llvm::json::Object{{"traceEvents", llvm::json::Array{}}}};
  CHECK(!runTrace(a, bad, 2e-5, out, error));
  CHECK(error.find("step_start_s") != std::string::npos);
}
