// test_primitives.cpp — the table of callable primitives (ir/Primitives.cpp) and the lowering
// (frontend/LowerPrimitives.cpp) agree: every entry lowers when called with only its required
// arguments and when called with every parameter named, appending the entry's op kind (the
// lowering reports an internal error when it reads a parameter the table lacks, or when an
// argument the table accepts goes unread); defaults come from the table; every primitive is
// documented; a misspelled argument name still gets its suggestion.
#include <catch.hpp>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "driver/Compiler.h"
#include "ir/Primitives.h"
#include "tests/unit/Support.h"

using namespace tally;
using tally::test::sourceDir;

namespace {

/// One call of `expr` in a model whose inputs are tensors of fitting shapes, lowered for an
/// inference plan (no scalar loss needed); the diagnostics go to a string.
struct Lowered {
  Compilation c;
  std::string out;
  llvm::raw_string_ostream os{out};
  bool ok = false;

  explicit Lowered(const std::string &expr) {
    c.diags.setOutput(&os);
    c.diags.setShowColors(false);
    std::string text =
        "model M() {\n"
        "  forward(x: f32[2, 4, 8], w: f32[8, 8], v8: f32[8], ids: i32[2, 4], m: i32[2, 4],\n"
        "          e: f32[10, 8], idx: i32[2, 4, 2], gates: f32[2, 4, 2], wg: f32[2, 8, 16],\n"
        "          wu: f32[2, 8, 16], wd: f32[2, 16, 8], img: f32[2, 3, 8, 8],\n"
        "          k: f32[4, 3, 3, 3], kb: f32[4], h: f32[2, 4, 4]) {\n"
        "    return " + expr + "\n"
        "  }\n"
        "}\n"
        "infer t { model = M() batch = 2 prompt = 4 generate = 1 target = H100_SXM }\n";
    if (c.addSource("t.tally", text))
      if (const PlanDecl *p = c.pickPlan(""))
        ok = c.lower(*p);
    os.flush();
  }
  bool has(OpKind k) const {
    for (const Op &op : c.graph->ops)
      if (op.kind == k)
        return true;
    return false;
  }
  const Op &first(OpKind k) const {
    for (const Op &op : c.graph->ops)
      if (op.kind == k)
        return op;
    FAIL("no op of kind " << opName(k).str());
    return c.graph->ops[0];
  }
};

/// Per primitive: a call with only the required arguments, and one naming every parameter.
struct Calls {
  const char *required, *allNamed;
};
const std::map<std::string, Calls> kCalls = {
    {"matmul", {"matmul(x, w)", "matmul(a = x, b = w)"}},
    {"relu", {"relu(x)", "relu(x = x)"}},
    {"gelu", {"gelu(x)", "gelu(x = x)"}},
    {"gelu_tanh", {"gelu_tanh(x)", "gelu_tanh(x = x)"}},
    {"silu", {"silu(x)", "silu(x = x)"}},
    {"tanh", {"tanh(x)", "tanh(x = x)"}},
    {"sigmoid", {"sigmoid(x)", "sigmoid(x = x)"}},
    {"exp", {"exp(x)", "exp(x = x)"}},
    {"dropout", {"dropout(x, 0.1)", "dropout(x = x, p = 0.1)"}},
    {"rope", {"rope(x)", "rope(x = x, fraction = 0.5, head = 4)"}},
    {"softmax", {"softmax(x)", "softmax(x = x, dim = 1)"}},
    {"layer_norm",
     {"layer_norm(x, v8)", "layer_norm(x = x, weight = v8, bias = v8, eps = 1e-6)"}},
    {"rms_norm", {"rms_norm(x, v8)", "rms_norm(x = x, weight = v8, eps = 1e-5)"}},
    {"attention",
     {"attention(x, x, x, 2)",
      "attention(q = x, k = h, v = h, heads = 2, kv_heads = 1, causal = true, fused = false, "
      "dropout = 0.1, alibi = true, mask = m, window = 2, softcap = 30, latent = 4, latent_rope = 2)"}},
    {"embedding", {"embedding(ids, e)", "embedding(ids = ids, weight = e)"}},
    {"sum", {"sum(x)", "sum(x = x, dim = 1, keepdim = true)"}},
    {"mean", {"mean(x)", "mean(x = x, dim = 1, keepdim = true)"}},
    {"cross_entropy", {"cross_entropy(x, ids)", "cross_entropy(logits = x, labels = ids)"}},
    {"positions", {"positions(4)", "positions(n = 4)"}},
    {"next_tokens", {"next_tokens(ids)", "next_tokens(x = ids)"}},
    {"concat", {"concat(x, x)", "concat(tensors = (x, x), dim = 1)"}},
    {"split", {"split(x, 2)", "split(x = x, parts = 2, dim = 1)"}},
    {"reshape", {"reshape(x, (8, 8))", "reshape(x = x, shape = (2, 32))"}},
    {"transpose", {"transpose(x)", "transpose(x = x, dim0 = 0, dim1 = 1)"}},
    {"topk", {"topk(x, 2)", "topk(x = x, k = 2, dim = 1)"}},
    {"gather", {"gather(x, idx)", "gather(x = x, indices = idx, dim = -1)"}},
    {"moe",
     {"moe(x, gates, idx, wg, wu, wd)",
      "moe(x = x, gates = gates, indices = idx, w_gate = wg, w_up = wu, w_down = wd, "
      "capacity_factor = 1.25)"}},
    {"conv2d",
     {"conv2d(img, k)", "conv2d(x = img, weight = k, bias = kb, stride = 2, padding = 1)"}},
    {"max_pool2d",
     {"max_pool2d(img, 2)", "max_pool2d(x = img, kernel = 2, stride = (2, 1), padding = 1)"}},
    {"avg_pool2d",
     {"avg_pool2d(img, 2)", "avg_pool2d(x = img, kernel = 2, stride = (2, 1), padding = 1)"}},
    {"broadcast_to", {"broadcast_to(v8, (2, 8))", "broadcast_to(x = v8, shape = (2, 8))"}},
};


} // namespace

TEST_CASE("every primitive in the table lowers as the table says", "[primitives][frontend]") {
  std::set<std::string> tested;
  for (const Primitive &p : primitives()) {
    const std::string name = p.name().str();
    INFO(name);
    auto it = kCalls.find(name);
    REQUIRE(it != kCalls.end()); // a new primitive needs its calls here
    tested.insert(name);
    // The all-named call names each of the table's parameters, so the lowering reads each.
    for (const PrimitiveParam &param : p.params)
      CHECK(std::string(it->second.allNamed).find(std::string(param.name) + " = ") !=
            std::string::npos);
    for (const char *call : {it->second.required, it->second.allNamed}) {
      INFO(call);
      Lowered l(call);
      INFO(l.out);
      CHECK(l.ok);
      CHECK(l.out.empty());
      if (l.ok)
        CHECK(l.has(p.kind));
    }
    // Leaving out a required argument is reported with its name.
    if (p.required > 0 && !p.variadic) {
      std::string call = name + "(";
      for (unsigned i = 0; i + 1 < p.required; ++i)
        call += std::string(i ? ", " : "") + "x";
      Lowered l(call + ")");
      CHECK_FALSE(l.ok);
      CHECK(l.out.find("'" + name + "' needs its argument '" +
                       p.params[p.required - 1].name + "'") != std::string::npos);
    }
  }
  CHECK(tested.size() == kCalls.size()); // no calls for a primitive the table lacks
  CHECK(primitiveNames().size() == primitives().size());
}

TEST_CASE("primitive names map to their op kinds and lookups agree", "[primitives]") {
  for (const Primitive &p : primitives()) {
    INFO(p.name().str());
    CHECK(findPrimitive(p.name()) == &p);
    CHECK(static_cast<unsigned>(p.kind) < static_cast<unsigned>(kFirstInternalOp));
    CHECK(p.required <= p.params.size());
    // Parameters after the required ones either have a default or mean something when left
    // out; the required ones have none.
    for (unsigned i = 0; i < p.required; ++i)
      CHECK(p.params[i].defaultText == nullptr);
  }
  // The operators append these kinds; they are not callable by name.
  for (const char *op : {"add", "sub", "mul", "div", "neg", "slice", "contiguous"})
    CHECK(findPrimitive(op) == nullptr);
}

TEST_CASE("signatures and defaults come from the table", "[primitives]") {
  // As docs/language.md §5 writes them.
  CHECK(findPrimitive("layer_norm")->signature() == "layer_norm(x, weight, bias, eps = 1e-5)");
  CHECK(findPrimitive("max_pool2d")->signature() ==
        "max_pool2d(x, kernel, stride = kernel, padding = 0)");
  CHECK(findPrimitive("concat")->signature() == "concat(tensors..., dim = -1)");
  CHECK(findPrimitive("attention")->signature() ==
        "attention(q, k, v, heads, kv_heads = heads, causal = false, fused = true, "
        "dropout = 0, alibi = false, mask, window = 0, softcap = 0, latent = 0, latent_rope = 0)");

  // PyTorch's defaults: LayerNorm eps 1e-5; RMSNorm as Llama writes it, 1e-6; softmax over
  // the last axis; transpose of the last two; no cap on experts; fused attention.
  Lowered ln("layer_norm(x, v8)");
  REQUIRE(ln.ok);
  CHECK(ln.first(OpKind::LayerNorm).attrs->eps == 1e-5);
  Lowered rms("rms_norm(x, v8)");
  REQUIRE(rms.ok);
  CHECK(rms.first(OpKind::RmsNorm).attrs->eps == 1e-6);
  Lowered sm("softmax(x)");
  REQUIRE(sm.ok);
  CHECK(sm.first(OpKind::Softmax).attrs->dim == -1);
  Lowered tr("transpose(x)");
  REQUIRE(tr.ok);
  CHECK(tr.first(OpKind::Transpose).attrs->transposeA == -2);
  CHECK(tr.first(OpKind::Transpose).attrs->transposeB == -1);
  // kv_heads = heads: 2 heads give 2 key/value heads; fused, not causal, no dropout.
  Lowered at("attention(x, x, x, 2)");
  REQUIRE(at.ok);
  const Op &a = at.first(OpKind::Attention);
  CHECK(a.attrs->kvHeads == 2);
  CHECK(a.attrs->fused);
  CHECK_FALSE(a.attrs->causal);
  CHECK(a.attrs->p == 0);
  // The pool's stride defaults to its window: 8x8 pooled by 2 is 4x4.
  Lowered mp("max_pool2d(img, 2)");
  REQUIRE(mp.ok);
  CHECK(mp.first(OpKind::MaxPool2d).attrs->strides[0] == 2);
  CHECK(mp.first(OpKind::MaxPool2d).attrs->strides[1] == 2);
  // sum without dim is over every element.
  Lowered s("sum(x)");
  REQUIRE(s.ok);
  CHECK(s.first(OpKind::Sum).attrs->reduceAll);
}

TEST_CASE("a misspelled argument name gets the table's closest parameter", "[primitives]") {
  Lowered l("layer_norm(x, v8, esp = 1e-5)");
  CHECK_FALSE(l.ok);
  CHECK(l.out.find("'layer_norm' has no argument 'esp'; did you mean 'eps'? [unknown-argument]") !=
        std::string::npos);
}

TEST_CASE("every primitive is documented in docs/language.md", "[primitives][docs]") {
  std::string doc = test::readText(sourceDir() + "/docs/language.md");
  size_t from = doc.find("## 5. Primitive ops"), to = doc.find("## 6.");
  REQUIRE(from != std::string::npos);
  REQUIRE(to != std::string::npos);
  std::string section = doc.substr(from, to - from);
  for (const std::string &name : primitiveNames()) {
    INFO(name);
    CHECK((section.find("`" + name + "(") != std::string::npos ||
           section.find(" " + name + "(") != std::string::npos));
  }
}
