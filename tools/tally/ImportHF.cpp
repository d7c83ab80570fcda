// `tally import-hf config.json [-o model.tally]`: turns a Hugging Face `config.json` into a
// readable .tally file — the model written with the standard library's blocks (Linear,
// Embedding, LayerNorm, RMSNorm) plus a few blocks of its own, and a `train` plan of stated
// defaults to edit. docs/import-hf.md lists the families and the keys read.
//
// 1. Read and parse the JSON (io-error, syntax-error with llvm::json's line:column).
// 2. Pick the family from `model_type`, else from `architectures[0]`: llama, mistral, qwen2,
//    gemma, mixtral (one decoder template with per-family defaults; mixtral's MLP is the
//    standard MoE block), gpt2, gpt_neox, bert. Other mixtures of experts (qwen2_moe's shared
//    experts, deepseek's) are refused.
// 3. Read each key the family needs: a required key that is missing is `missing-setting`
//    naming the key and the file; a key of the wrong type, a non-positive size or sizes that do
//    not divide (hidden_size by num_attention_heads, heads by key-value heads) is
//    `invalid-value`. Optional keys take the defaults of the transformers library's config
//    classes, and the generated file says which defaults were used.
// 4. Write the model text. The parameter count is the real model's because every weight and
//    bias of the checkpoint is declared with its shape (tests/lit/import-hf-*.tally pin the
//    published counts); what the language cannot express yet (partial rotary, the pooler's
//    first-token slice) is said in a comment where it applies.
//
// Exit codes: 0 written; 1 an error in the config (or a file that cannot be read); 2 bad
// usage or an output that cannot be written.
#include "support/Diagnostics.h"
#include "support/Format.h"
#include "report/Output.h"
#include "tools/tally/Commands.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

using namespace llvm;

namespace tally {
namespace importopts {

cl::SubCommand ImportHF("import-hf", "Write a .tally model and train plan from a Hugging Face config.json");
cl::OptionCategory Cat("tally import-hf options");
cl::opt<std::string> File(cl::Positional, cl::desc("<config.json>"), cl::Required,
                          cl::sub(ImportHF), cl::cat(Cat));
cl::opt<std::string> Output("o", cl::desc("Write the .tally file here (default: standard output)"),
                            cl::value_desc("file"), cl::init("-"), cl::sub(ImportHF), cl::cat(Cat));
cl::opt<bool> NoColor("no-color", cl::desc("Do not color diagnostics"), cl::sub(ImportHF),
                      cl::cat(Cat));

} // namespace importopts

namespace {

/// Typed access to the config's keys with diagnostics that name the key and the file.
class Config {
public:
  Config(const json::Object &obj, std::string file, std::string family, DiagnosticEngine &diags)
      : obj_(obj), file_(std::move(file)), family_(std::move(family)), diags_(diags) {}

  /// A required positive integer; 0 after a diagnostic.
  int64_t size(StringRef key) {
    if (!obj_.get(key) || obj_.get(key)->kind() == json::Value::Null) {
      missing(key);
      return 0;
    }
    return positive(key, *obj_.get(key));
  }
  /// An optional positive integer: `fallback` when absent or null (noted in `defaults`).
  int64_t size(StringRef key, int64_t fallback, StringRef why) {
    const json::Value *v = obj_.get(key);
    if (!v || v->kind() == json::Value::Null) {
      noteDefault(key, std::to_string(fallback), why);
      return fallback;
    }
    return positive(key, *v);
  }
  /// An optional positive number (or, with `zeroOk`, a number >= 0).
  double number(StringRef key, double fallback, bool zeroOk = false) {
    const json::Value *v = obj_.get(key);
    if (!v || v->kind() == json::Value::Null) {
      noteDefault(key, fmt(fallback), "");
      return fallback;
    }
    auto d = v->getAsNumber();
    if (!d || !(*d > 0 || (zeroOk && *d == 0)) || !std::isfinite(*d)) {
      invalid(key, zeroOk ? "a number >= 0" : "a positive number");
      return fallback;
    }
    return *d;
  }
  /// An optional boolean.
  bool flag(StringRef key, bool fallback) {
    const json::Value *v = obj_.get(key);
    if (!v || v->kind() == json::Value::Null) {
      noteDefault(key, fallback ? "true" : "false", "");
      return fallback;
    }
    auto b = v->getAsBoolean();
    if (!b) {
      invalid(key, "true or false");
      return fallback;
    }
    return *b;
  }
  /// An optional string.
  std::string text(StringRef key, StringRef fallback) {
    const json::Value *v = obj_.get(key);
    if (!v || v->kind() == json::Value::Null) {
      noteDefault(key, ("\"" + fallback + "\"").str(), "");
      return fallback.str();
    }
    auto s = v->getAsString();
    if (!s) {
      invalid(key, "a string");
      return fallback.str();
    }
    return s->str();
  }
  /// `a` must be a multiple of `b` (both keys named in the message).
  void divisible(StringRef aKey, int64_t a, StringRef bKey, int64_t b) {
    if (a > 0 && b > 0 && a % b != 0)
      diags_.report(DiagKind::InvalidValue, SMLoc(),
                    formatv("{0}: {1} = {2} is not a multiple of {3} = {4}", file_, aKey, a, bKey, b)
                        .str());
  }
  /// Reports that `key` must be `what` (a value outside what tally can express).
  void invalid(StringRef key, StringRef what) {
    diags_.report(DiagKind::InvalidValue, SMLoc(),
                  (file_ + ": key '" + key + "' must be " + what).str());
  }
  /// The "// key: not given, default" lines the generated file starts with.
  const std::vector<std::string> &defaults() const { return defaults_; }

  /// The shortest decimal text that reads back as `v` ("1e-05", "10000", "0.25").
  static std::string fmt(double v) {
    return isExactInteger(v, 1e15) ? integerText(v) : roundTrip(v);
  }


private:
  void missing(StringRef key) {
    diags_.report(DiagKind::MissingSetting, SMLoc(),
                  (file_ + ": missing key '" + key + "' (needed for model_type '" + family_ + "')")
                      .str());
  }
  int64_t positive(StringRef key, const json::Value &v) {
    auto i = v.getAsInteger();
    // Sizes beyond 2^40 are no real model; the bound keeps every product tally forms checked.
    if (!i || *i <= 0 || *i > (int64_t(1) << 40)) {
      invalid(key, "a positive integer");
      return 0;
    }
    return *i;
  }
  void noteDefault(StringRef key, const std::string &value, StringRef why) {
    defaults_.push_back((key + ": not given, " + value + (why.empty() ? "" : " (" + why + ")")).str());
  }

  const json::Object &obj_;
  std::string file_, family_;
  DiagnosticEngine &diags_;
  std::vector<std::string> defaults_;
};

/// The activation op tally has for a Hugging Face activation name (transformers' ACT2FN
/// names, matched exactly: the name is written into the generated file's comments); empty when
/// none.
std::string activationOp(StringRef act) {
  if (act == "silu" || act == "swish")
    return "silu";
  if (act == "gelu" || act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast" ||
      act == "gelu_python" || act == "gelu_accurate")
    return "gelu"; // one op, tanh or erf
  if (act == "relu")
    return "relu";
  if (act == "tanh")
    return "tanh";
  if (act == "sigmoid")
    return "sigmoid";
  return "";
}

/// Writes the model and the plan; the pieces are filled per family, then laid out in one
/// place so every imported file reads the same way.
struct Generated {
  std::string header;          ///< the comment at the top
  std::string blocks;          ///< block declarations
  std::string model;           ///< the model declaration
  std::string modelCall;       ///< "Llama()"
  int64_t seq = 2048;          ///< the plan's sequence length
  std::string target = "8 x H100_SXM { data = 8, zero = 3 }"; ///< the plan's target
};

/// Fills a template of tally text: "{N}" becomes the N-th argument; every other brace is
/// literal (formatv would read the blocks' braces as replacement fields).
template <typename... Args> std::string fill(StringRef tpl, const Args &...args) {
  std::vector<std::string> values{formatv("{0}", args).str()...};
  std::string out;
  for (size_t i = 0; i < tpl.size(); ++i) {
    if (tpl[i] == '{') {
      size_t j = i + 1;
      while (j < tpl.size() && isdigit(static_cast<unsigned char>(tpl[j])))
        ++j;
      if (j > i + 1 && j < tpl.size() && tpl[j] == '}') {
        size_t n = std::stoul(tpl.substr(i + 1, j - i - 1).str());
        if (n < values.size()) {
          out += values[n];
          i = j;
          continue;
        }
      }
    }
    out += tpl[i];
  }
  return out;
}

std::string boolText(bool b) { return b ? "true" : "false"; }

/// llama, mistral, qwen2, gemma, mixtral: pre-norm decoder with RMSNorm, rotary attention with
/// grouped key-value heads, and a gated MLP (mixtral: a mixture of gated-MLP experts).
std::optional<Generated> decoderFamily(Config &c, StringRef family) {
  bool gemma = family == "gemma";
  bool qwen2 = family == "qwen2";
  bool mixtral = family == "mixtral";
  // Mixtral's sparse MoE: num_local_experts experts, num_experts_per_tok of them per token
  // (MixtralConfig's defaults 8 and 2). The router's settings change no count: its auxiliary
  // load-balancing loss and jitter noise are noted, not modelled.
  int64_t experts = 0, topK = 0;
  if (mixtral) {
    experts = c.size("num_local_experts", 8, "MixtralConfig's default");
    topK = c.size("num_experts_per_tok", 2, "MixtralConfig's default");
    if (experts > 0 && topK > experts) {
      c.invalid("num_experts_per_tok", "at most num_local_experts = " + std::to_string(experts));
      return std::nullopt;
    }
  }
  int64_t vocab = c.size("vocab_size");
  int64_t d = c.size("hidden_size");
  int64_t hidden = c.size("intermediate_size");
  int64_t layers = c.size("num_hidden_layers");
  int64_t heads = c.size("num_attention_heads");
  int64_t kv = heads > 0 ? c.size("num_key_value_heads", heads, "= num_attention_heads") : 0;
  int64_t headDim = 0;
  if (gemma)
    headDim = c.size("head_dim", 256, "Gemma's default");
  else if (heads > 0 && d > 0 && d % heads == 0)
    headDim = c.size("head_dim", d / heads, "= hidden_size / num_attention_heads");
  else
    c.divisible("hidden_size", d, "num_attention_heads", heads);
  c.divisible("num_attention_heads", heads, "num_key_value_heads", kv);
  double eps = c.number("rms_norm_eps", 1e-6);
  double theta = c.number("rope_theta", 10000);
  int64_t positions = c.size("max_position_embeddings", gemma ? 8192 : 2048, "");
  bool tie = c.flag("tie_word_embeddings", gemma);
  bool attnBias = qwen2 ? true : c.flag("attention_bias", false);
  bool mlpBias = (family == "llama") ? c.flag("mlp_bias", false) : false;
  std::string act = c.text(gemma ? "hidden_activation" : "hidden_act",
                           gemma ? "gelu_pytorch_tanh" : "silu");
  std::string op = activationOp(act);
  if (op.empty()) {
    return std::nullopt; // reported by the caller, which knows the key
  }
  if (mixtral && op != "silu") {
    c.invalid("hidden_act", "silu for mixtral: the MoE block's experts are SwiGLU, not '" + act + "'");
    return std::nullopt;
  }
  if (vocab == 0 || d == 0 || hidden == 0 || layers == 0 || heads == 0 || kv == 0 || headDim == 0)
    return std::nullopt;

  std::string name = family == "llama" ? "Llama" : family == "mistral" ? "Mistral"
                     : qwen2 ? "Qwen2" : mixtral ? "Mixtral" : "Gemma";
  Generated g;
  g.modelCall = name + "()";
  g.seq = std::min<int64_t>(positions, 2048);
  // A mixture of experts holds every expert: twice the devices, the experts spread over up to
  // 8 ranks (a divisor of the expert count).
  if (mixtral) {
    int64_t e = experts % 8 == 0 ? 8 : experts % 4 == 0 ? 4 : experts % 2 == 0 ? 2 : 1;
    g.target = fill("16 x H100_SXM { data = 16, expert = {0}, zero = 3 }", e);
  }
  g.header = formatv("// rotary embeddings with theta = {0}; max_position_embeddings = {1}; "
                     "activation {2} (tally's `{3}`)\n",
                     Config::fmt(theta), positions, act, op)
                 .str();
  if (qwen2)
    g.header += "// Qwen2 has biases on q, k and v (not on o)\n";
  if (family == "mistral" || mixtral)
    g.header += "// sliding-window attention is modelled as full causal attention\n";
  if (mixtral)
    g.header += fill("// {0} experts, {1} per token: the standard MoE block (Hugging Face's "
                     "MixtralSparseMoeBlock); the router's aux loss coefficient {2} and jitter "
                     "{3} change no count\n",
                     experts, topK, Config::fmt(c.number("router_aux_loss_coef", 0.001, true)),
                     Config::fmt(c.number("router_jitter_noise", 0, true)));
  if (gemma)
    g.header += "// Gemma scales the embedding by sqrt(d) and its norms by (1 + weight): neither "
                "changes a count\n";
  // Qwen2 has biases on q, k and v but not on o; Llama's attention_bias puts one on all four.
  std::string qkvBias = boolText(attnBias), oBias = boolText(attnBias && !qwen2);
  g.blocks = fill(R"(// Self-attention with rotary positions and {0} per {1} query heads.
block Attention(d, heads, kv_heads, head_dim) {
  q = Linear(d, heads * head_dim, bias = {2})
  k = Linear(d, kv_heads * head_dim, bias = {2})
  v = Linear(d, kv_heads * head_dim, bias = {2})
  o = Linear(heads * head_dim, d, bias = {3})
  forward(x) {
    y = attention(rope(q(x)), rope(k(x)), v(x), heads = heads, kv_heads = kv_heads, causal = true)
    return o(y)
  }
}

// The gated MLP: down({4}(gate(x)) * up(x)).
block GatedMLP(d, hidden) {
  gate = Linear(d, hidden, bias = {5})
  up   = Linear(d, hidden, bias = {5})
  down = Linear(hidden, d, bias = {5})
  forward(x) { return down({4}(gate(x)) * up(x)) }
}

// One pre-norm decoder layer.
block DecoderLayer(d, heads, kv_heads, head_dim, hidden, eps) {
  attn_norm = RMSNorm(d, eps = eps)
  attn      = Attention(d, heads, kv_heads, head_dim)
  mlp_norm  = RMSNorm(d, eps = eps)
  mlp       = {6}
  forward(x) {
    x = x + attn(attn_norm(x))
    return x + mlp(mlp_norm(x))
  }
}
)",
                     std::to_string(kv) + (kv == 1 ? " key-value head" : " key-value heads"), heads,
                     qkvBias, oBias, op, boolText(mlpBias),
                     mixtral ? fill("MoE(d, hidden, experts = {0}, top_k = {1})", experts, topK)
                             : std::string("GatedMLP(d, hidden)"));
  if (mixtral) // the experts are the MoE block's own SwiGLU: no GatedMLP block
    g.blocks.erase(g.blocks.find("// The gated MLP"), g.blocks.find("// One pre-norm") -
                                                          g.blocks.find("// The gated MLP"));
  std::string head = tie ? "" : "  head   = Linear(d, vocab, bias = false)\n";
  std::string logits = tie ? "norm(layers(embed(tokens))) @ transpose(embed.weight)  // tied head"
                           : "head(norm(layers(embed(tokens))))";
  g.model = fill(R"(model {0}(vocab = {1}, d = {2}, heads = {3}, kv_heads = {4}, head_dim = {5},
      hidden = {6}, n_layers = {7}, eps = {8}) {
  embed  = Embedding(vocab, d)
  layers = repeat(n_layers) DecoderLayer(d, heads, kv_heads, head_dim, hidden, eps)
  norm   = RMSNorm(d, eps = eps)
{9}  forward(tokens: i32[batch, seq]) {
    logits = {10}
    return cross_entropy(logits, next_tokens(tokens))
  }
}
)",
                    name, vocab, d, heads, kv, headDim, hidden, layers, Config::fmt(eps), head,
                    logits);
  return g;
}

/// gpt2: learned positions, pre-norm blocks with LayerNorm, a fused qkv projection and a
/// GELU MLP; the head is tied to the token embedding unless the config says otherwise.
std::optional<Generated> gpt2Family(Config &c) {
  int64_t vocab = c.size("vocab_size");
  int64_t d = c.size("n_embd");
  int64_t layers = c.size("n_layer");
  int64_t heads = c.size("n_head");
  int64_t positions = c.size("n_positions");
  int64_t inner = d > 0 ? c.size("n_inner", 4 * d, "4 * n_embd") : 0;
  c.divisible("n_embd", d, "n_head", heads);
  double eps = c.number("layer_norm_epsilon", 1e-5);
  bool tie = c.flag("tie_word_embeddings", true);
  std::string act = c.text("activation_function", "gelu_new");
  std::string op = activationOp(act);
  if (op.empty() || vocab == 0 || d == 0 || layers == 0 || heads == 0 || positions == 0 ||
      inner == 0 || d % heads != 0)
    return std::nullopt;
  Generated g;
  g.modelCall = "GPT2()";
  g.seq = positions;
  g.header = formatv("// activation {0} (tally's `{1}`)\n", act, op).str();
  g.blocks = fill(R"(// Causal self-attention with one fused q, k, v projection.
block CausalSelfAttention(d, heads) {
  qkv  = Linear(d, 3 * d)
  proj = Linear(d, d)
  forward(x) {
    q, k, v = split(qkv(x), 3, dim = -1)
    return proj(attention(q, k, v, heads = heads, causal = true))
  }
}

block MLP(d, hidden) {
  fc   = Linear(d, hidden)
  proj = Linear(hidden, d)
  forward(x) { return proj({0}(fc(x))) }
}

// One pre-norm transformer block.
block Block(d, heads, hidden, eps) {
  ln1  = LayerNorm(d, eps = eps)
  attn = CausalSelfAttention(d, heads)
  ln2  = LayerNorm(d, eps = eps)
  mlp  = MLP(d, hidden)
  forward(x) {
    x = x + attn(ln1(x))
    return x + mlp(ln2(x))
  }
}
)",
                     op);
  std::string head = tie ? "" : "  head = Linear(d, vocab, bias = false)\n";
  std::string logits = tie ? "lnf(h(x)) @ transpose(wte.weight)  // tied head" : "head(lnf(h(x)))";
  g.model = fill(R"(model GPT2(vocab = {0}, ctx = {1}, d = {2}, heads = {3}, hidden = {4}, layers = {5},
     eps = {6}) {
  wte = Embedding(vocab, d)
  wpe = Embedding(ctx, d)
  h   = repeat(layers) Block(d, heads, hidden, eps)
  lnf = LayerNorm(d, eps = eps)
{7}  forward(tokens: i32[batch, seq]) {
    x = wte(tokens) + wpe(positions(seq))
    logits = {8}
    return cross_entropy(logits, next_tokens(tokens))
  }
}
)",
                    vocab, positions, d, heads, inner, layers, Config::fmt(eps), head, logits);
  return g;
}

/// gpt_neox (Pythia, GPT-NeoX-20B): LayerNorm with biases everywhere, a fused qkv, partial
/// rotary embeddings and (by default) the parallel residual x + attn(ln1(x)) + mlp(ln2(x)).
std::optional<Generated> neoxFamily(Config &c) {
  int64_t vocab = c.size("vocab_size");
  int64_t d = c.size("hidden_size");
  int64_t hidden = c.size("intermediate_size");
  int64_t layers = c.size("num_hidden_layers");
  int64_t heads = c.size("num_attention_heads");
  c.divisible("hidden_size", d, "num_attention_heads", heads);
  int64_t positions = c.size("max_position_embeddings", 2048, "");
  double eps = c.number("layer_norm_eps", 1e-5);
  double rotary = c.number("rotary_pct", 0.25);
  double base = c.number("rotary_emb_base", 10000);
  bool parallel = c.flag("use_parallel_residual", true);
  bool tie = c.flag("tie_word_embeddings", false);
  bool bias = c.flag("attention_bias", true);
  std::string act = c.text("hidden_act", "gelu");
  std::string op = activationOp(act);
  if (op.empty() || vocab == 0 || d == 0 || hidden == 0 || layers == 0 || heads == 0 ||
      d % heads != 0)
    return std::nullopt;
  Generated g;
  g.modelCall = "GPTNeoX()";
  g.seq = std::min<int64_t>(positions, 2048);
  g.header = formatv("// rotary_pct = {0} with base {1}: tally's rope has no fraction yet, so it "
                     "rotates whole heads (no parameters either way); activation {2}; "
                     "max_position_embeddings = {3}\n",
                     Config::fmt(rotary), Config::fmt(base), act, positions)
                 .str();
  std::string residual = parallel ? "    return x + attn(ln1(x)) + mlp(ln2(x))   // parallel residual\n"
                                  : "    x = x + attn(ln1(x))\n    return x + mlp(ln2(x))\n";
  g.blocks = fill(R"(// Self-attention with one fused q, k, v projection and rotary positions.
block NeoXAttention(d, heads) {
  qkv   = Linear(d, 3 * d, bias = {0})
  dense = Linear(d, d, bias = {0})
  forward(x) {
    q, k, v = split(qkv(x), 3, dim = -1)
    return dense(attention(rope(q), rope(k), v, heads = heads, causal = true))
  }
}

block NeoXMLP(d, hidden) {
  fc   = Linear(d, hidden)
  proj = Linear(hidden, d)
  forward(x) { return proj({1}(fc(x))) }
}

block NeoXLayer(d, heads, hidden, eps) {
  ln1  = LayerNorm(d, eps = eps)
  ln2  = LayerNorm(d, eps = eps)
  attn = NeoXAttention(d, heads)
  mlp  = NeoXMLP(d, hidden)
  forward(x) {
{2}  }
}
)",
                     boolText(bias), op, residual);
  std::string head = tie ? "" : "  embed_out = Linear(d, vocab, bias = false)\n";
  std::string logits = tie ? "final_norm(layers(embed_in(tokens))) @ transpose(embed_in.weight)"
                           : "embed_out(final_norm(layers(embed_in(tokens))))";
  g.model = fill(R"(model GPTNeoX(vocab = {0}, d = {1}, heads = {2}, hidden = {3}, n_layers = {4}, eps = {5}) {
  embed_in   = Embedding(vocab, d)
  layers     = repeat(n_layers) NeoXLayer(d, heads, hidden, eps)
  final_norm = LayerNorm(d, eps = eps)
{6}  forward(tokens: i32[batch, seq]) {
    logits = {7}
    return cross_entropy(logits, next_tokens(tokens))
  }
}
)",
                    vocab, d, heads, hidden, layers, Config::fmt(eps), head, logits);
  return g;
}

/// bert: post-norm encoder with token, position and token-type embeddings. BertModel ends
/// with the pooler; BertForMaskedLM with the masked-LM head (a transform and a decoder tied
/// to the word embeddings, with its own bias) and no pooler.
std::optional<Generated> bertFamily(Config &c, bool maskedLM) {
  int64_t vocab = c.size("vocab_size");
  int64_t d = c.size("hidden_size");
  int64_t hidden = c.size("intermediate_size");
  int64_t layers = c.size("num_hidden_layers");
  int64_t heads = c.size("num_attention_heads");
  c.divisible("hidden_size", d, "num_attention_heads", heads);
  int64_t positions = c.size("max_position_embeddings", 512, "");
  int64_t types = c.size("type_vocab_size", 2, "");
  double eps = c.number("layer_norm_eps", 1e-12);
  std::string act = c.text("hidden_act", "gelu");
  std::string op = activationOp(act);
  if (op.empty() || vocab == 0 || d == 0 || hidden == 0 || layers == 0 || heads == 0 ||
      d % heads != 0)
    return std::nullopt;
  Generated g;
  g.modelCall = maskedLM ? "BertForMaskedLM()" : "Bert()";
  g.seq = positions;
  g.header = formatv("// activation {0}; every sequence is segment 0 (token_type_ids all zero)\n",
                     act)
                 .str();
  g.blocks = fill(R"(block BertAttention(d, heads) {
  query = Linear(d, d)
  key   = Linear(d, d)
  value = Linear(d, d)
  out   = Linear(d, d)
  forward(x) { return out(attention(query(x), key(x), value(x), heads = heads, causal = false)) }
}

// One post-norm encoder layer.
block BertLayer(d, heads, hidden, eps) {
  attn         = BertAttention(d, heads)
  attn_norm    = LayerNorm(d, eps = eps)
  intermediate = Linear(d, hidden)
  output       = Linear(hidden, d)
  out_norm     = LayerNorm(d, eps = eps)
  forward(x) {
    x = attn_norm(x + attn(x))
    return out_norm(x + output({0}(intermediate(x))))
  }
}
)",
                     op);
  std::string members, body;
  if (maskedLM) {
    members = fill(R"(  transform  = Linear(d, d)
  transform_norm = LayerNorm(d, eps = eps)
  param decoder_bias: [vocab]   // the decoder's weight is the word embedding
)");
    body = fill(R"(    y = transform_norm({0}(transform(x)))
    logits = y @ transpose(word.weight) + decoder_bias
    return cross_entropy(logits, tokens)   // masked-LM targets: the tokens themselves
)",
                   op);
  } else {
    members = "  pooler     = Linear(d, d)\n";
    body = "    // The pooler reads the first token; without slicing (x[:, 0]) it runs on every\n"
           "    // token here, which changes its FLOPs but not its parameters. The mean stands\n"
           "    // in for a task loss: replace it with your head.\n"
           "    return mean(tanh(pooler(x)))\n";
  }
  g.model = fill(R"(model {0}(vocab = {1}, ctx = {2}, types = {3}, d = {4}, heads = {5}, hidden = {6},
     n_layers = {7}, eps = {8}) {
  word       = Embedding(vocab, d)
  position   = Embedding(ctx, d)
  token_type = Embedding(types, d)
  emb_norm   = LayerNorm(d, eps = eps)
  layers     = repeat(n_layers) BertLayer(d, heads, hidden, eps)
{9}  forward(tokens: i32[batch, seq], segments: i32[batch, seq]) {
    x = emb_norm(word(tokens) + position(positions(seq)) + token_type(segments))
    x = layers(x)
{10}  }
}
)",
                    maskedLM ? "BertForMaskedLM" : "Bert", vocab, positions, types, d, heads,
                    hidden, layers, Config::fmt(eps), members, body);
  return g;
}

/// The families tally imports, for messages.
constexpr const char *kFamilies = "llama, mistral, qwen2, gemma, mixtral, gpt2, gpt_neox, bert";

/// True for a Python class name as transformers writes in `architectures` (an ASCII letter or
/// `_`, then letters, digits and `_`): the only form written into the generated file.
bool isClassName(StringRef s) {
  if (s.empty() || s.size() > 200 || !(isAlpha(s[0]) || s[0] == '_'))
    return false;
  return llvm::all_of(s, [](char c) { return isAlnum(c) || c == '_'; });
}

/// A config's string for a message: control and non-ASCII bytes as \xNN, at most 80 bytes.
std::string shown(StringRef s) {
  std::string out;
  for (char ch : s.take_front(80)) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c >= 0x7F)
      out += formatv("\\x{0:x-2}", static_cast<unsigned>(c)).str();
    else
      out += ch;
  }
  return s.size() > 80 ? out + "..." : out;
}

/// model_type for an architectures[0] name, for configs without model_type.
std::string familyOfArchitecture(StringRef arch) {
  struct Prefix {
    const char *prefix, *family;
  };
  static const Prefix table[] = {{"GPTNeoX", "gpt_neox"}, {"GPT2", "gpt2"},     {"Llama", "llama"},
                                 {"Mistral", "mistral"},  {"Mixtral", "mixtral"}, {"Qwen2", "qwen2"},
                                 {"Gemma", "gemma"},      {"Bert", "bert"}};
  for (const Prefix &p : table)
    if (arch.startswith(p.prefix))
      return p.family;
  return "";
}

int importHF() {
  using namespace importopts;
  SourceMgr sm;
  DiagnosticEngine diags(sm);
  if (NoColor)
    diags.setShowColors(false);

  // Step 1: read and parse.
  ErrorOr<std::unique_ptr<MemoryBuffer>> buf = MemoryBuffer::getFileOrSTDIN(File, /*IsText=*/true);
  if (!buf) {
    diags.report(DiagKind::IoError, SMLoc(),
                 "cannot read '" + File + "': " + buf.getError().message());
    return 1;
  }
  Expected<json::Value> parsed = json::parse((*buf)->getBuffer());
  if (!parsed) {
    diags.report(DiagKind::SyntaxError, SMLoc(),
                 File + ": not valid JSON: " + toString(parsed.takeError()));
    return 1;
  }
  const json::Object *obj = parsed->getAsObject();
  if (!obj) {
    diags.report(DiagKind::InvalidValue, SMLoc(), File + ": a config.json must be one JSON object");
    return 1;
  }

  // Step 2: the family.
  std::string arch;
  if (const json::Array *archs = obj->getArray("architectures"))
    if (!archs->empty())
      if (auto a = (*archs)[0].getAsString())
        arch = a->str();
  if (!arch.empty() && !isClassName(arch)) {
    diags.report(DiagKind::InvalidValue, SMLoc(),
                 File + ": architectures[0] '" + shown(arch) +
                     "' is not a class name (letters, digits and _, starting with a letter)");
    return 1;
  }
  std::string family;
  if (auto mt = obj->getString("model_type"))
    family = mt->str();
  else if (!arch.empty())
    family = familyOfArchitecture(arch);
  if (family.empty()) {
    diags.report(DiagKind::MissingSetting, SMLoc(),
                 File + ": missing key 'model_type' (and no known 'architectures' entry to infer it from)");
    return 1;
  }
  if (family == "qwen2_moe" || family == "deepseek_v2") {
    diags.report(DiagKind::InvalidValue, SMLoc(),
                 File + ": model_type '" + family +
                     "' is a mixture of experts with shared experts, which the MoE block does "
                     "not express yet; tally imports " + kFamilies);
    return 1;
  }

  // Step 3: the keys, family by family.
  Config c(*obj, File, family, diags);
  std::optional<Generated> g;
  std::string actKey = "hidden_act";
  if (family == "llama" || family == "mistral" || family == "qwen2" || family == "gemma" ||
      family == "mixtral") {
    g = decoderFamily(c, family);
    if (family == "gemma")
      actKey = "hidden_activation";
  } else if (family == "gpt2") {
    g = gpt2Family(c);
    actKey = "activation_function";
  } else if (family == "gpt_neox") {
    g = neoxFamily(c);
  } else if (family == "bert") {
    bool mlm = StringRef(arch).contains("MaskedLM");
    if (!arch.empty() && arch != "BertModel" && !mlm) {
      diags.report(DiagKind::InvalidValue, SMLoc(),
                   File + ": architecture '" + arch +
                       "' of model_type 'bert' is not imported; tally imports BertModel and "
                       "BertForMaskedLM");
      return 1;
    }
    g = bertFamily(c, mlm);
  } else {
    diags.report(DiagKind::InvalidValue, SMLoc(),
                 File + ": unknown model_type '" + shown(family) + "'; tally imports " + kFamilies);
    return 1;
  }
  if (!diags.hasErrors() && !g) {
    // The only failure left without a diagnostic: an activation tally has no op for.
    const json::Value *v = obj->get(actKey);
    std::string name = v && v->getAsString() ? v->getAsString()->str() : "?";
    diags.report(DiagKind::InvalidValue, SMLoc(),
                 File + ": key '" + actKey + "' names activation '" + shown(name) +
                     "', which tally has no op for (silu, swish, gelu, gelu_new, gelu_pytorch_tanh, "
                     "gelu_fast, gelu_python, gelu_accurate, relu, tanh, sigmoid)");
  }
  if (diags.hasErrors() || !g)
    return 1;

  // Step 4: write.
  // report/Output.h: a temporary file renamed into place; never over the config it reads.
  std::string error;
  std::unique_ptr<OutputFile> out = OutputFile::open(Output, {File}, error);
  if (!out) {
    diags.report(DiagKind::IoError, SMLoc(), error);
    return kOutputErrorExit;
  }
  raw_ostream &os = out->os();
  os << "// Imported by `tally import-hf` from " << sys::path::filename(File) << ": model_type '"
     << family << "'" << (arch.empty() ? "" : ", " + arch) << ".\n";
  os << g->header;
  for (const std::string &d : c.defaults())
    os << "// " << d << "\n";
  os << "\n" << g->blocks << "\n" << g->model << "\n";
  os << fill(R"(// A starting plan of stated defaults: edit the batch, sequence length, tokens, optimizer,
// precision and target to match your run.
train pretrain {
  model       = {0}
  batch       = 256          // sequences per optimizer step, all devices together
  seq         = {1}
  micro_batch = 1            // per device; gradient accumulation steps are derived
  tokens      = 100B
  optimizer   = AdamW(lr = 3e-4, betas = (0.9, 0.95), eps = 1e-8, weight_decay = 0.1)
  precision   = mixed_bf16
  checkpoint  = full
  target      = {2}
}
)",
                g->modelCall, g->seq, g->target);
  if (!out->commit(error)) {
    diags.report(DiagKind::IoError, SMLoc(), error);
    return kOutputErrorExit;
  }
  return 0;
}

} // namespace

int runImportHF() {
  if (!importopts::ImportHF)
    return -1;
  return importHF();
}

} // namespace tally
