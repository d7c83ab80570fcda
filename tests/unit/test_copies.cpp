// The copies of a repeated block in the reports (report/Copies.h): grouping block instances
// and ops by their paths with every repeat index read as `*`, and the JSON report's rows that
// stand for the copies of one (ops[] and params.by_block[] with `copies`), checked against the
// analysis they summarise: every op and every block counted once, numbers summed exactly.
#include "Support.h"

#include "report/Copies.h"
#include "report/Report.h"

#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <map>
#include <string>

using namespace tally;
using tally::test::Compiled;

namespace {

/// Nested repeats, and a model that calls one copy's block again (h[1].fc before h, h[2]
/// after): those calls' ops are in one copy only.
constexpr const char *kNested = R"(
block Inner(d) {
  fc = Linear(d, d)
  forward(x) { return relu(fc(x)) }
}
block Outer(d) {
  inner = repeat(3) Inner(d)
  forward(x) { return inner(x) }
}
model Nested(d = 8) {
  h = repeat(2) Outer(d)
  extra = Linear(d, d)
  forward(x: f32[batch, d]) {
    y = h[1].inner[2].fc(x)
    return mean(extra(h(y)))
  }
}
train n { model = Nested() batch = 4 optimizer = SGD(lr = 0.1) target = H100_SXM }
)";

/// The JSON report of an analysis, parsed.
llvm::json::Value reportJson(const Compiled &t) {
  std::string text;
  llvm::raw_string_ostream os(text);
  renderJson(*t.a, t.c.diags, os);
  os.flush();
  llvm::Expected<llvm::json::Value> v = llvm::json::parse(text);
  REQUIRE(static_cast<bool>(v));
  return std::move(*v);
}

/// The rows of a JSON list with `copies`: how many ops (instances) they stand for in all and
/// how many stand for more than one, calling `merged(path, copies, row)` for each of those.
template <class F>
std::pair<int64_t, size_t> readRows(const llvm::json::Array &rows, const F &merged) {
  int64_t listed = 0;
  size_t several = 0;
  for (const llvm::json::Value &r : rows) {
    const llvm::json::Object &o = *r.getAsObject();
    std::string path = o.getString("path")->str();
    int64_t copies = *o.getInteger("copies");
    listed += copies;
    if (copies == 1)
      continue; // an op alone: its own numbers (the lit tests pin those)
    INFO(path);
    ++several;
    merged(path, copies, o);
  }
  return {listed, several};
}

} // namespace

TEST_CASE("copies: a repeat index is read as *", "[reports][copies]") {
  CHECK(repeatPattern("h[3].attn.qkv.matmul") == "h[*].attn.qkv.matmul");
  CHECK(repeatPattern("h[12].inner[0].fc") == "h[*].inner[*].fc");
  CHECK(repeatPattern("lnf.layer_norm") == "lnf.layer_norm");
  CHECK(repeatPattern("a[].b[x]") == "a[].b[x]"); // not indices
}

TEST_CASE("copies: instances and ops group by the pattern of their paths", "[reports][copies]") {
  Compiled t(kNested);
  const Graph &g = t.g();
  CopyGroups instances = instanceCopies(g), ops = opCopies(g, instances);
  REQUIRE(instances.of.size() == g.instances.size());
  REQUIRE(ops.of.size() == g.ops.size());

  // Every instance's group holds exactly the instances of its pattern, and every group's
  // first member is its lowest.
  std::map<std::string, unsigned> byPattern;
  for (uint32_t i = 0; i < g.instances.size(); ++i)
    ++byPattern[repeatPattern(g.instancePath(i))];
  CHECK(instances.groups.size() == byPattern.size());
  for (uint32_t i = 0; i < g.instances.size(); ++i) {
    const CopyGroups::Group &gr = instances.groups[instances.of[i]];
    std::string pattern = repeatPattern(g.instancePath(i));
    CHECK(repeatPattern(g.instancePath(gr.first)) == pattern);
    CHECK(gr.members == byPattern[pattern]);
    CHECK(gr.first <= i);
    CHECK(gr.everyCopy);
  }
  CHECK(byPattern["h[*].inner[*].fc"] == 6);

  // Ops: the same for their paths; h[*].inner[*].fc.matmul runs in all 6 copies, the second
  // call of h[1].inner[2].fc (its matmul #2) in one.
  std::map<std::string, unsigned> opPattern;
  for (OpId i = 0; i < g.ops.size(); ++i)
    ++opPattern[repeatPattern(g.opPath(i))];
  CHECK(ops.groups.size() == opPattern.size());
  for (OpId i = 0; i < g.ops.size(); ++i) {
    const CopyGroups::Group &gr = ops.groups[ops.of[i]];
    CHECK(repeatPattern(g.opPath(gr.first)) == repeatPattern(g.opPath(i)));
    CHECK(gr.members == opPattern[repeatPattern(g.opPath(i))]);
  }
  const CopyGroups::Group &all = ops.groups[ops.of[t.op("h[0].inner[0].fc.matmul")]];
  CHECK(all.members == 6);
  CHECK(all.everyCopy);
  // The first call, before h, is h[1].inner[2].fc.matmul; the copy's own (in h) is #2.
  const CopyGroups::Group &again = ops.groups[ops.of[t.op("h[1].inner[2].fc.matmul#2")]];
  CHECK(again.members == 1);
  CHECK_FALSE(again.everyCopy);
}

TEST_CASE("copies: the JSON report's rows stand for every op and block once",
          "[reports][copies]") {
  Compiled t(tally::test::kTinyGPTModel + std::string(R"(
train tiny { model = TinyGPT(layers = 6) batch = 8 seq = 128 optimizer = AdamW(lr = 1e-3)
             precision = mixed_bf16 target = H100_SXM }
)"));
  const Graph &g = t.g();
  llvm::json::Value v = reportJson(t);
  const llvm::json::Array &rows = *v.getAsObject()->getArray("ops");

  // Per pattern: the ops of the analysis, and their numbers summed in op order (the JSON sums
  // them so too, so the sums are exact).
  struct Sums {
    int64_t ops = 0;
    double flops = 0, bytes = 0, time = 0, backwardTime = 0;
  };
  std::map<std::string, Sums> want;
  for (OpId i = 0; i < g.ops.size(); ++i) {
    Sums &s = want[repeatPattern(g.opPath(i))];
    const OpAnalysis &o = t.a->ops[i];
    ++s.ops;
    s.flops += o.forward.flops;
    s.bytes += o.forward.bytesRead + o.forward.bytesWritten;
    s.time += o.forwardTime;
    s.backwardTime += o.backwardTime;
  }
  auto [listed, merged] = readRows(rows, [&](const std::string &path, int64_t copies,
                                             const llvm::json::Object &o) {
    REQUIRE(want.count(path) == 1);
    const Sums &s = want[path];
    CHECK(copies == s.ops);
    CHECK(copies == 6);
    CHECK(*o.getNumber("flops") == s.flops);
    CHECK(*o.getNumber("bytes") == s.bytes);
    CHECK(*o.getNumber("time_s") == s.time);
    CHECK(*o.getNumber("backward_time_s") == s.backwardTime);
    // The intensity and shape are each copy's.
    OpId first = t.op(std::string(path).replace(path.find("[*]"), 3, "[0]"));
    CHECK(*o.getNumber("intensity") == t.a->ops[first].intensity());
  });
  CHECK(listed == static_cast<int64_t>(g.ops.size()));
  CHECK(merged == 15); // a block's 15 ops: every one identical in all 6 copies
  CHECK(rows.size() == g.ops.size() - 15 * 5);

  // params.by_block: h[*] and its blocks once each, 6 copies, counts summed.
  const llvm::json::Array &blocks =
      *v.getAsObject()->getObject("params")->getArray("by_block");
  double total = 0;
  for (const llvm::json::Value &r : blocks) {
    const llvm::json::Object &o = *r.getAsObject();
    if (*o.getString("path") == "h[*]") {
      CHECK(*o.getInteger("copies") == 6);
      total = *o.getNumber("count");
    }
  }
  double h = t.block("h").count;
  CHECK(total == h);
  CHECK(h > 0);
}

TEST_CASE("copies: copies that differ are listed one by one", "[reports][copies]") {
  Compiled t(kNested);
  llvm::json::Value v = reportJson(t);
  std::map<std::string, int64_t> copies;
  for (const llvm::json::Value &r : *v.getAsObject()->getArray("ops"))
    copies[r.getAsObject()->getString("path")->str()] = *r.getAsObject()->getInteger("copies");
  // h[1].inner[2].fc's first call reads the data, so its matmul computes no input gradient:
  // the six first fc matmuls differ, and each is its own row. The relus are alike in all six.
  CHECK(copies.count("h[*].inner[*].fc.matmul") == 0);
  CHECK(copies["h[0].inner[0].fc.matmul"] == 1);
  CHECK(copies["h[1].inner[2].fc.matmul"] == 1);
  CHECK(copies.count("h[*].inner[*].relu") == 1);
  CHECK(copies["h[*].inner[*].relu"] == 6);
  // The op of one copy only (the second call of h[1].inner[2].fc) is its own row.
  CHECK(copies.count("h[1].inner[2].fc.matmul#2") == 1);
  CHECK(copies["h[1].inner[2].fc.matmul#2"] == 1);
  for (const auto &[path, n] : copies)
    if (path.find("[*]") != std::string::npos)
      CHECK(n > 1);
}

TEST_CASE("copies: an infer plan's decode ops are one row per op of a block",
          "[reports][copies]") {
  Compiled t(tally::test::kTinyGPTModel + std::string(R"(
infer serve { model = TinyGPT(layers = 6) batch = 2 prompt = 64 generate = 32
              precision = bf16 target = H100_SXM }
)"));
  const auto &decode = t.a->inference.ops;
  REQUIRE(!decode.empty());
  llvm::json::Value v = reportJson(t);
  const llvm::json::Array &rows =
      *v.getAsObject()->getObject("inference")->getArray("decode_ops");
  // Per pattern, the decode ops and their summed numbers, in the order the analysis lists them.
  std::map<std::string, std::pair<int64_t, double>> want; // ops, FLOPs
  std::map<std::string, double> time;
  for (const Analysis::DecodeOp &d : decode) {
    auto &w = want[repeatPattern(t.g().opPath(d.op))];
    ++w.first;
    w.second += d.flops;
    time[repeatPattern(t.g().opPath(d.op))] += d.time;
  }
  auto [listed, merged] = readRows(rows, [&](const std::string &path, int64_t copies,
                                             const llvm::json::Object &o) {
    CHECK(copies == 6);
    CHECK(copies == want[path].first);
    CHECK(*o.getNumber("flops") == want[path].second);
    CHECK(*o.getNumber("time_s") == time[path]);
  });
  CHECK(listed == static_cast<int64_t>(decode.size()));
  CHECK(merged > 0);
  CHECK(rows.size() < decode.size());
}
