// `tally import-hf`'s decoder families: one writer for the pre-norm (or post-norm, or
// sandwich-norm) decoders with rotary grouped-query attention that most open models are —
// llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3_text, phi3, olmo, olmo2, starcoder2 —
// and their mixtures of experts (mixtral, qwen2_moe, qwen3_moe). Each family's keys fill a
// Decoder; the text is laid out from it in one place (attentionBlock, mlpBlocks, layerBlocks,
// modelText), so the families differ only where their checkpoints differ. Sliding windows
// (readWindows: which layers slide, by transformers' rule for each family), Gemma's
// soft-capping (readCaps) and the tanh GELU are written as the config says; layers that differ
// in window become runs of `repeat` or a repeated block holding one period of the pattern.
#include "tools/tally/ImportHF.h"

#include "llvm/ADT/StringSwitch.h"

#include <algorithm>

using namespace llvm;

namespace tally::importhf {

namespace {

enum class NormKind { RMS, LayerNorm, NoAffine };
enum class Placement { Pre, Post, Sandwich };
enum class QKNorm { None, Whole, PerHead };

/// What one decoder family's checkpoint holds: sizes, where the norms sit, which projections
/// have biases or are fused, and the mixture of experts.
struct Decoder {
  std::string family, name;
  int64_t vocab = 0, d = 0, hidden = 0, layers = 0, heads = 0, kv = 0, headDim = 0;
  int64_t positions = 0;
  double eps = 1e-6, theta = 10000, ropeFraction = 1;
  bool tie = false, qkvBias = false, oBias = false, mlpBias = false;
  std::string act, op;
  NormKind norm = NormKind::RMS;
  Placement placement = Placement::Pre;
  QKNorm qkNorm = QKNorm::None;
  bool fused = false;          ///< phi3: one qkv projection and one gate_up projection
  bool plainMLP = false;       ///< starcoder2: c_proj(act(c_fc(x))), no gate
  std::optional<double> clip;  ///< olmo's clip_qkv
  // The mixture of experts: `experts` > 0 when any layer has one.
  int64_t experts = 0, topK = 0, denseHidden = 0, sharedHidden = 0;
  bool renormalise = true;     ///< the top-k routing weights sum to one
  std::vector<bool> sparse;    ///< per layer: the MoE block (true) or the dense MLP
  // Sliding windows, as transformers decides which layers slide (readWindows): per layer the
  // window (0: full causal attention); empty when no layer slides.
  std::vector<int64_t> window;
  int64_t windowSize = 0;      ///< the config's sliding_window when a layer slides
  std::optional<double> attnCap, finalCap; ///< Gemma's attn/final_logit_softcapping
  std::string notes;           ///< header lines the family adds
};

bool anyWindow(const Decoder &m) { return !m.window.empty(); }

bool isMoE(StringRef f) { return f == "mixtral" || f == "qwen2_moe" || f == "qwen3_moe"; }
bool isGemma(StringRef f) { return f == "gemma" || f == "gemma2" || f == "gemma3_text"; }
bool isQwen(StringRef f) {
  return f == "qwen2" || f == "qwen3" || f == "qwen2_moe" || f == "qwen3_moe";
}

/// max_position_embeddings of each family's config class.
int64_t defaultPositions(StringRef f) {
  return StringSwitch<int64_t>(f)
      .Cases("gemma", "gemma2", 8192).Case("gemma3_text", 131072).Cases("phi3", "starcoder2", 4096)
      .Cases("qwen2", "qwen3", "qwen2_moe", "qwen3_moe", 32768).Cases("mistral", "mixtral", 4096 * 32)
      .Default(2048);
}

std::string modelName(StringRef f) {
  return StringSwitch<std::string>(f)
      .Case("llama", "Llama").Case("mistral", "Mistral").Case("qwen2", "Qwen2")
      .Case("qwen3", "Qwen3").Case("gemma", "Gemma").Case("gemma2", "Gemma2")
      .Case("gemma3_text", "Gemma3").Case("phi3", "Phi3").Case("olmo", "OLMo")
      .Case("olmo2", "OLMo2").Case("starcoder2", "Starcoder2").Case("mixtral", "Mixtral")
      .Case("qwen2_moe", "Qwen2MoE").Case("qwen3_moe", "Qwen3MoE").Default("Decoder");
}

/// The experts' keys (read first for mixtral, as its files always have): their count, how many
/// each token uses, their width, qwen2_moe's shared expert and which layers are sparse.
bool readExperts(Config &c, Decoder &m) {
  StringRef f = m.family;
  if (f == "mixtral") {
    m.experts = c.size("num_local_experts", 8, "MixtralConfig's default");
    m.topK = c.size("num_experts_per_tok", 2, "MixtralConfig's default");
  } else {
    bool q2 = f == "qwen2_moe";
    m.experts = c.size("num_experts", q2 ? 60 : 128, q2 ? "Qwen2MoeConfig's default"
                                                        : "Qwen3MoeConfig's default");
    m.topK = c.size("num_experts_per_tok", q2 ? 4 : 8, "");
  }
  if (m.experts > 0 && m.topK > m.experts) {
    c.invalid("num_experts_per_tok",
              "at most " + std::string(f == "mixtral" ? "num_local_experts" : "num_experts") +
                  " = " + std::to_string(m.experts));
    return false;
  }
  return true;
}

/// qwen2_moe and qwen3_moe: the expert width, the shared expert, norm_topk_prob and which
/// layers are sparse (Qwen2MoeDecoderLayer: not in mlp_only_layers, and (i + 1) a multiple of
/// decoder_sparse_step).
void readQwenExperts(Config &c, Decoder &m) {
  bool q2 = m.family == "qwen2_moe";
  if (q2)
    m.sharedHidden = c.size("shared_expert_intermediate_size", 5632, "Qwen2MoeConfig's default");
  m.renormalise = c.flag("norm_topk_prob", false);
  int64_t step = c.size("decoder_sparse_step", 1, "");
  std::vector<int64_t> denseOnly = c.indices("mlp_only_layers", m.layers);
  m.sparse.assign(m.layers, false);
  for (int64_t i = 0; i < m.layers; ++i)
    m.sparse[i] = (i + 1) % step == 0 &&
                  std::find(denseOnly.begin(), denseOnly.end(), i) == denseOnly.end();
  if (std::find(m.sparse.begin(), m.sparse.end(), false) != m.sparse.end())
    m.denseHidden = c.size("intermediate_size");
}

/// layer_types (the newer configs' per-layer list): which layers slide; false when absent.
bool readLayerTypes(Config &c, int64_t layers, std::vector<bool> &slides) {
  if (!c.has("layer_types"))
    return false;
  std::vector<std::string> types = c.strings("layer_types");
  bool ok = static_cast<int64_t>(types.size()) == layers;
  for (size_t i = 0; ok && i < types.size(); ++i) {
    ok = types[i] == "sliding_attention" || types[i] == "full_attention";
    slides[i] = types[i] == "sliding_attention";
  }
  if (!ok && !types.empty())
    c.invalid("layer_types", "a list of num_hidden_layers = " + std::to_string(layers) +
                                 " entries, each \"sliding_attention\" or \"full_attention\"");
  return true;
}

/// The sliding window and which layers use it, exactly as the transformers library decides
/// (its main branch, read for issue 44):
/// - mistral, mixtral, phi3, starcoder2: MistralModel.forward (models/mistral/modeling_mistral.py;
///   likewise MixtralModel.forward, Phi3Model.forward, Starcoder2Model.forward) builds one mask
///   for every layer, create_sliding_window_causal_mask whenever config.sliding_window is not
///   None. MistralConfig.__init__ defaults sliding_window to 4096, the others to None.
/// - qwen2, qwen3: Qwen2Config.__post_init__ (models/qwen2/configuration_qwen2.py; Qwen3Config
///   the same) keeps sliding_window (default 4096) only with use_sliding_window and, without
///   layer_types, slides layer i when i >= max_window_layers (default 28); Qwen2Attention takes
///   the window on the "sliding_attention" layers.
/// - qwen2_moe: Qwen2MoeConfig.__post_init__ (configuration_qwen2_moe.py): without layer_types,
///   layer i slides when (i + 1) % 2 != 0 (i even), i < max_window_layers and
///   use_sliding_window (sliding_window is 0 without it).
/// - qwen3_moe: Qwen3MoeAttention.__init__ (models/qwen3_moe/modular_qwen3_moe.py) takes
///   config.sliding_window on every layer (Qwen3MoeConfig has no layer_types), None unless
///   use_sliding_window.
/// - gemma2: Gemma2Config.__init__ (models/gemma2/modular_gemma2.py): layer_types, else layer i
///   slides when (i + 1) % 2 != 0: layers 0, 2, 4, ...; sliding_window defaults to 4096.
/// - gemma3_text: Gemma3TextConfig.__init__ (models/gemma3/configuration_gemma3.py):
///   layer_types, else layer i slides when (i + 1) % sliding_window_pattern != 0 (default 6:
///   five sliding layers, then one global); sliding_window defaults to 4096.
/// A null sliding_window is no window. A window at least the context is still written: it is
/// what the config says, costs what causal attention costs at any sequence it covers, and
/// keeps the window in the file for a user who raises `seq`.
void readWindows(Config &c, Decoder &m) {
  StringRef f = m.family;
  int64_t n = m.layers;
  auto size = [&](int64_t fallback, StringRef why) -> int64_t {
    if (c.isNull("sliding_window") || (fallback == 0 && !c.has("sliding_window")))
      return 0;
    return c.size("sliding_window", fallback, why);
  };
  std::vector<bool> slides(n, false);
  int64_t w = 0;
  std::string rule;
  if (f == "mistral" || f == "mixtral" || f == "phi3" || f == "starcoder2") {
    w = size(f == "mistral" ? 4096 : 0, "MistralConfig's default");
    slides.assign(n, true);
    rule = "every layer";
  } else if (isQwen(f)) {
    if (!c.has("use_sliding_window") || !c.flag("use_sliding_window", false))
      return; // sliding_window is None (0 for qwen2_moe): no layer slides
    w = size(4096, "the Qwen configs' default");
    if (f == "qwen3_moe") {
      slides.assign(n, true);
      rule = "every layer (Qwen3MoeAttention takes sliding_window on each)";
    } else if (readLayerTypes(c, n, slides)) {
      rule = "the layers layer_types names \"sliding_attention\"";
    } else {
      int64_t mwl = c.count("max_window_layers", 28, "the Qwen configs' default");
      for (int64_t i = 0; i < n; ++i)
        slides[i] = f == "qwen2_moe" ? (i % 2 == 0 && i < mwl) : i >= mwl;
      rule = f == "qwen2_moe"
                 ? "the even layers below max_window_layers = " + std::to_string(mwl) +
                       " (Qwen2MoeConfig's layer_types)"
                 : "the layers from max_window_layers = " + std::to_string(mwl) + " up";
    }
  } else if (f == "gemma2" || f == "gemma3_text") {
    w = size(4096, f == "gemma2" ? "Gemma2Config's default" : "Gemma3TextConfig's default");
    if (readLayerTypes(c, n, slides)) {
      rule = "the layers layer_types names \"sliding_attention\"";
    } else {
      int64_t p = f == "gemma2" ? 2
                                : c.size("sliding_window_pattern", 6, "Gemma3TextConfig's default");
      for (int64_t i = 0; i < n; ++i)
        slides[i] = (i + 1) % p != 0;
      rule = f == "gemma2" ? "every other layer from layer 0 (Gemma2Config's layer_types)"
                           : std::to_string(p - 1) + " layers of " + std::to_string(p) +
                                 " (sliding_window_pattern)";
    }
  }
  int64_t k = std::count(slides.begin(), slides.end(), true);
  if (w == 0 || k == 0)
    return;
  m.windowSize = w;
  m.window.assign(n, 0);
  for (int64_t i = 0; i < n; ++i)
    m.window[i] = slides[i] ? w : 0;
  if (k == n)
    m.notes += fillText("// sliding-window attention (sliding_window = {0}) on {1}: each sees the last "
                        "{0} positions\n", w, rule);
  else
    m.notes += fillText("// sliding-window attention (sliding_window = {0}) on {1}: {2} of {3} layers "
                        "see the last {0} positions, the others all earlier ones (window = 0)\n",
                        w, rule, k, n);
  if (w >= m.positions)
    m.notes += fillText("// the window is at least max_position_embeddings = {0}: no sequence the "
                        "model takes is cut, but the window is written as the config says\n",
                        m.positions);
}

/// Gemma's soft-capping: attn_logit_softcapping on the scores (`softcap = c`),
/// final_logit_softcapping on the logits (`c * tanh(logits / c)`). Gemma2Config defaults them
/// to 50 and 30, Gemma3TextConfig to None; null is none.
void readCaps(Config &c, Decoder &m) {
  auto cap = [&](StringRef key, double gemma2Default) -> std::optional<double> {
    if (c.isNull(key))
      return std::nullopt;
    if (!c.has(key))
      return m.family == "gemma2" ? std::optional<double>(c.number(key, gemma2Default))
                                  : std::nullopt;
    return c.optionalNumber(key);
  };
  m.attnCap = cap("attn_logit_softcapping", 50);
  m.finalCap = cap("final_logit_softcapping", 30);
  if (m.attnCap)
    m.notes += fillText("// attn_logit_softcapping = {0}: every attention score s becomes "
                        "{0}·tanh(s / {0}) before the mask (softcap = {0})\n",
                        Config::fmt(*m.attnCap));
  if (m.finalCap)
    m.notes += fillText("// final_logit_softcapping = {0}: the logits are {0} * tanh(logits / {0})\n",
                        Config::fmt(*m.finalCap));
}

/// Keys that change no count and only a cost tally leaves out, said in the header; keys whose
/// value tally cannot write, refused.
void readNotes(Config &c, Decoder &m) {
  StringRef f = m.family;
  if (f == "gemma3_text" && c.has("use_bidirectional_attention") &&
      c.flag("use_bidirectional_attention", false))
    c.unsupported("use_bidirectional_attention",
                  "true (an encoder without the causal mask) is not imported");
  if (f == "gemma2" || f == "gemma3_text") {
    if (auto s = c.optionalNumber("query_pre_attn_scalar"))
      m.notes += "// the scores are scaled by query_pre_attn_scalar^-0.5 = " + Config::fmt(*s) +
                 "^-0.5: no count changes\n";
  }
  if (c.has("rope_scaling"))
    m.notes += "// rope_scaling changes the rotary frequencies, no count\n";
  std::string drops;
  for (StringRef key : {"attention_dropout", "resid_pdrop", "embd_pdrop", "residual_dropout",
                        "embedding_dropout"})
    if (c.has(key) && c.number(key, 0, true) > 0)
      drops += (drops.empty() ? "" : ", ") + key.str() + " = " +
               Config::fmt(c.number(key, 0, true));
  if (!drops.empty())
    m.notes += "// dropout (" + drops + ") is not written: add dropout(x, p) where you train "
               "with it\n";
}

/// The keys every decoder family reads, in the order the generated header lists defaults.
bool readDecoder(Config &c, Decoder &m) {
  StringRef f = m.family;
  bool gemma = isGemma(f), olmo = f == "olmo";
  if (isMoE(f) && !readExperts(c, m))
    return false;
  m.vocab = c.size("vocab_size");
  m.d = c.size("hidden_size");
  if (f == "qwen2_moe" || f == "qwen3_moe") // the experts' width; intermediate_size is the
    m.hidden = c.size("moe_intermediate_size", f == "qwen2_moe" ? 1408 : 768, ""); // dense MLP's
  else
    m.hidden = c.size("intermediate_size");
  m.layers = c.size("num_hidden_layers");
  m.heads = c.size("num_attention_heads");
  if (f == "starcoder2")
    m.kv = m.heads > 0 ? c.size("num_key_value_heads", 2, "Starcoder2Config's default") : 0;
  else
    m.kv = m.heads > 0 ? c.size("num_key_value_heads", m.heads, "= num_attention_heads") : 0;
  if (gemma)
    m.headDim = c.size("head_dim", 256, "Gemma's default");
  else if (f == "qwen3")
    m.headDim = c.size("head_dim", 128, "Qwen3Config's default");
  else if (m.heads > 0 && m.d > 0 && m.d % m.heads == 0)
    m.headDim = c.size("head_dim", m.d / m.heads, "= hidden_size / num_attention_heads");
  else
    c.divisible("hidden_size", m.d, "num_attention_heads", m.heads);
  c.divisible("num_attention_heads", m.heads, "num_key_value_heads", m.kv);
  if (f == "starcoder2")
    m.eps = c.number("norm_epsilon", 1e-5);
  else if (!olmo) // OLMo's LayerNorm has eps 1e-5, not a key
    m.eps = c.number("rms_norm_eps", f == "phi3" || f == "olmo2" ? 1e-5 : 1e-6);
  else
    m.eps = 1e-5;
  m.theta = c.number("rope_theta", f == "gemma3_text" ? 1e6 : 10000);
  m.positions = c.size("max_position_embeddings", defaultPositions(f), "");
  // Gemma's config classes and PretrainedConfig (StarCoder2 names no default) tie the head.
  m.tie = c.flag("tie_word_embeddings", gemma || f == "starcoder2");
  bool qwenBias = f == "qwen2" || f == "qwen2_moe";
  if (f == "starcoder2") {
    m.qkvBias = m.oBias = m.mlpBias = c.flag("use_bias", true);
  } else if (qwenBias) {
    m.qkvBias = true; // Qwen2 has biases on q, k and v but not on o
  } else if (f != "phi3") {
    m.qkvBias = m.oBias = c.flag("attention_bias", false);
  }
  if (f == "llama")
    m.mlpBias = c.flag("mlp_bias", false);
  if (f == "phi3") {
    double p = c.number("partial_rotary_factor", 1);
    if (p > 1)
      c.invalid("partial_rotary_factor", "at most 1");
    m.ropeFraction = std::min(p, 1.0);
  }
  if (olmo)
    m.clip = c.optionalNumber("clip_qkv");
  m.act = c.text(gemma ? "hidden_activation" : "hidden_act",
                 gemma ? "gelu_pytorch_tanh" : f == "starcoder2" ? "gelu_pytorch_tanh" : "silu");
  m.op = activationOp(m.act);
  if (m.op.empty())
    return false; // reported by the caller, which knows the key
  if (isMoE(f) && m.op != "silu") {
    c.invalid("hidden_act", "silu for " + f.str() + ": the MoE block's experts are SwiGLU, not '" +
                                m.act + "'");
    return false;
  }
  if (m.vocab == 0 || m.d == 0 || m.hidden == 0 || m.layers == 0 || m.heads == 0 || m.kv == 0 ||
      m.headDim == 0)
    return false;
  if (f == "qwen2_moe" || f == "qwen3_moe")
    readQwenExperts(c, m);
  else if (f == "mixtral")
    m.sparse.assign(m.layers, true);
  return true;
}

std::string normText(NormKind k) {
  switch (k) {
  case NormKind::RMS: return "RMSNorm(d, eps = eps)";
  case NormKind::LayerNorm: return "LayerNorm(d, eps = eps)";
  case NormKind::NoAffine: return "LayerNorm(d, eps = eps, affine = false)";
  }
  return "";
}


/// The attention block's parameters, as its declaration and as a layer's member: eps for the
/// q/k norms, window where a layer slides.
std::string attentionCall(const Decoder &m) {
  std::string args = "d, heads, kv_heads, head_dim";
  if (m.qkNorm != QKNorm::None)
    args += ", eps";
  if (anyWindow(m))
    args += ", window";
  return "Attention(" + args + ")";
}

/// The attention block: separate or fused q, k, v; clipped (OLMo), normalised over the whole
/// projection (OLMo 2) or per head (Qwen3, Gemma 3); rotary, whole or partial (Phi-3).
std::string attentionBlock(const Decoder &m) {
  std::string sig = attentionCall(m);
  std::string out = fillText("// Self-attention with rotary positions and {0} per {1} query heads.\n",
                         std::to_string(m.kv) + (m.kv == 1 ? " key-value head" : " key-value heads"),
                         m.heads);
  if (m.fused)
    out += "// q, k and v come from one projection (qkv_proj), [q heads, k heads, v heads].\n";
  if (m.clip)
    out += "// q, k and v are clipped to [-clip_qkv, clip_qkv], written as relu(x + c) - relu(x - c) - c.\n";
  if (m.qkNorm == QKNorm::Whole)
    out += "// q and k are RMS-normalised over the whole projection (q_norm, k_norm) before rope.\n";
  if (m.qkNorm == QKNorm::PerHead)
    out += "// q and k are RMS-normalised per head (q_norm, k_norm over head_dim) before rope.\n";
  if (anyWindow(m))
    out += "// window = w: query i sees keys i - w < j <= i (sliding_window); window = 0: all earlier keys.\n";
  if (m.attnCap)
    out += "// The scores are soft-capped: c·tanh(s / c) with c = attn_logit_softcapping.\n";
  out += "block " + sig + " {\n";
  std::string qb = boolText(m.qkvBias), ob = boolText(m.oBias);
  std::string pre, q = "q(x)", k = "k(x)", v = "v(x)";
  if (m.fused) {
    out += "  qkv = Linear(d, (heads + 2 * kv_heads) * head_dim, bias = " + qb + ")\n";
    if (m.kv == m.heads) {
      pre += "    qs, ks, vs = split(qkv(x), 3, dim = -1)\n";
    } else {
      pre += "    t = reshape(qkv(x), (batch, seq, heads + 2 * kv_heads, head_dim))\n"
             "    qs = reshape(t[:, :, 0:heads], (batch, seq, heads * head_dim))\n"
             "    ks = reshape(t[:, :, heads:heads + kv_heads], (batch, seq, kv_heads * head_dim))\n"
             "    vs = reshape(t[:, :, heads + kv_heads:], (batch, seq, kv_heads * head_dim))\n";
    }
    q = "qs", k = "ks", v = "vs";
  } else {
    out += "  q = Linear(d, heads * head_dim, bias = " + qb + ")\n"
           "  k = Linear(d, kv_heads * head_dim, bias = " + qb + ")\n"
           "  v = Linear(d, kv_heads * head_dim, bias = " + qb + ")\n";
  }
  out += "  o = Linear(heads * head_dim, d, bias = " + ob + ")\n";
  if (m.clip) {
    out += "  clip = Clip(" + Config::fmt(*m.clip) + ")\n";
    q = "clip(" + q + ")", k = "clip(" + k + ")", v = "clip(" + v + ")";
  }
  if (m.qkNorm == QKNorm::Whole) {
    out += "  q_norm = RMSNorm(heads * head_dim, eps = eps)\n"
           "  k_norm = RMSNorm(kv_heads * head_dim, eps = eps)\n";
    q = "q_norm(" + q + ")", k = "k_norm(" + k + ")";
  } else if (m.qkNorm == QKNorm::PerHead) {
    out += "  q_norm = RMSNorm(head_dim, eps = eps)\n  k_norm = RMSNorm(head_dim, eps = eps)\n";
    pre += "    qn = reshape(q_norm(reshape(" + q +
           ", (batch, seq, heads, head_dim))), (batch, seq, heads * head_dim))\n"
           "    kn = reshape(k_norm(reshape(" + k +
           ", (batch, seq, kv_heads, head_dim))), (batch, seq, kv_heads * head_dim))\n";
    q = "qn", k = "kn";
  }
  std::string frac = m.ropeFraction < 1 ? ", fraction = " + Config::fmt(m.ropeFraction) : "";
  std::string extra;
  if (anyWindow(m))
    extra += "window = window";
  if (m.attnCap)
    extra += (extra.empty() ? "" : ", ") + ("softcap = " + Config::fmt(*m.attnCap));
  out += "  forward(x) {\n" + pre + "    y = attention(rope(" + q + frac + "), rope(" + k + frac +
         "), " + v + ", heads = heads, kv_heads = kv_heads, causal = true" +
         (extra.empty() ? "" : ",\n                  " + extra) + ")\n    return o(y)\n  }\n}\n";
  return out;
}

/// The MLP blocks: the gated MLP (fused for Phi-3), StarCoder2's plain MLP, and the sparse
/// block of the Qwen mixtures when the standard MoE block is not it.
std::string mlpBlocks(const Decoder &m) {
  bool anyDense = std::find(m.sparse.begin(), m.sparse.end(), false) != m.sparse.end() ||
                  m.sparse.empty();
  std::string out;
  if (m.plainMLP) {
    out += fillText(R"(
// The MLP: c_proj({0}(c_fc(x))).
block MLP(d, hidden) {
  c_fc   = Linear(d, hidden, bias = {1})
  c_proj = Linear(hidden, d, bias = {1})
  forward(x) { return c_proj({0}(c_fc(x))) }
}
)",
                m.op, boolText(m.mlpBias));
  } else if (m.fused) {
    out += fillText(R"(
// The gated MLP with one gate_up projection: down({0}(gate) * up).
block GatedMLP(d, hidden) {
  gate_up = Linear(d, 2 * hidden, bias = false)
  down    = Linear(hidden, d, bias = false)
  forward(x) {
    gate, up = split(gate_up(x), 2, dim = -1)
    return down({0}(gate) * up)
  }
}
)",
                m.op);
  } else if (anyDense || m.sharedHidden > 0) {
    out += fillText(R"(
// The gated MLP: down({0}(gate(x)) * up(x)).
block GatedMLP(d, hidden) {
  gate = Linear(d, hidden, bias = {1})
  up   = Linear(d, hidden, bias = {1})
  down = Linear(hidden, d, bias = {1})
  forward(x) { return down({0}(gate(x)) * up(x)) }
}
)",
                m.op, boolText(m.mlpBias));
  }
  if (m.experts == 0 || (m.renormalise && m.sharedHidden == 0))
    return out; // dense, or the standard library's MoE block
  bool shared = m.sharedHidden > 0;
  out += fillText(R"(
// The sparse block (Hugging Face's {0}): a bias-free router over the
// experts, the softmax over all of them, the top_k kept {1};
// each expert a bias-free SwiGLU of width `hidden` (the moe op){2}.
block SparseMoE(d, hidden, {3}experts, top_k) {
  router = Linear(d, experts, bias = false)
  param w_gate: [experts, d, hidden]
  param w_up: [experts, d, hidden]
  param w_down: [experts, hidden, d]
{4}  forward(x) {
{5}    y = moe(x, gates, chosen, w_gate, w_up, w_down)
    return {6}
  }
}
)",
              m.family == "qwen2_moe" ? "Qwen2MoeSparseMoeBlock" : "Qwen3MoeSparseMoeBlock",
              m.renormalise ? "and renormalised to sum to one (norm_topk_prob)"
                            : "as they are (norm_topk_prob false)",
              shared ? ";\n// beside them a shared SwiGLU expert of width `shared_hidden`, scaled by\n"
                       "// sigmoid(shared_gate(x))"
                     : "",
              shared ? "shared_hidden, " : "",
              shared ? "  shared      = GatedMLP(d, shared_hidden)\n"
                       "  shared_gate = Linear(d, 1, bias = false)\n"
                     : "",
              m.renormalise ? "    logits, chosen = topk(router(x), top_k)\n    gates = softmax(logits)\n"
                            : "    gates, chosen = topk(softmax(router(x)), top_k)\n",
              shared ? "y + sigmoid(shared_gate(x)) * shared(x)" : "y");
  return out;
}

/// The MoE member of a sparse layer.
std::string moeMember(const Decoder &m) {
  if (m.renormalise && m.sharedHidden == 0)
    return fillText("MoE(d, hidden, experts = {0}, top_k = {1})", m.experts, m.topK);
  if (m.sharedHidden > 0)
    return fillText("SparseMoE(d, hidden, {0}, experts = {1}, top_k = {2})", m.sharedHidden, m.experts,
                m.topK);
  return fillText("SparseMoE(d, hidden, experts = {0}, top_k = {1})", m.experts, m.topK);
}

/// One layer block: `name`, with `mlp` as its MLP member.
std::string layerBlock(const Decoder &m, StringRef name, const std::string &mlp) {
  std::string n = normText(m.norm);
  std::string attn = attentionCall(m);
  std::string sig = name.str() + "(d, heads, kv_heads, head_dim, hidden, eps" +
                    (anyWindow(m) ? ", window" : "") + ")";
  if (m.placement == Placement::Pre)
    return fillText(R"(
// One pre-norm decoder layer.
block {0} {
  attn_norm = {1}
  attn      = {2}
  mlp_norm  = {1}
  mlp       = {3}
  forward(x) {
    x = x + attn(attn_norm(x))
    return x + mlp(mlp_norm(x))
  }
}
)",
                sig, n, attn, mlp);
  if (m.placement == Placement::Post)
    return fillText(R"(
// One decoder layer with its norms after attention and the MLP (post_attention_layernorm,
// post_feedforward_layernorm), none before.
block {0} {
  attn      = {2}
  attn_norm = {1}
  mlp       = {3}
  mlp_norm  = {1}
  forward(x) {
    x = x + attn_norm(attn(x))
    return x + mlp_norm(mlp(x))
  }
}
)",
                sig, n, attn, mlp);
  return fillText(R"(
// One decoder layer with norms before and after attention and the MLP.
block {0} {
  attn_norm      = {1}
  attn           = {2}
  post_attn_norm = {1}
  mlp_norm       = {1}
  mlp            = {3}
  post_mlp_norm  = {1}
  forward(x) {
    x = x + post_attn_norm(attn(attn_norm(x)))
    return x + post_mlp_norm(mlp(mlp_norm(x)))
  }
}
)",
              sig, n, attn, mlp);
}

/// Helper blocks: OLMo's clip.
std::string helperBlocks(const Decoder &m) {
  std::string out;
  if (m.clip)
    out += R"(// clamp(x, -c, c) with relu: x inside [-c, c], c above, -c below.
block Clip(c) {
  forward(x) { return relu(x + c) - relu(x - c) - c }
}

)";
  return out;
}

/// What tells one layer from another in the text: its MLP (the MoE block or the dense one)
/// and its window (0: full causal attention).
struct LayerKey {
  bool sparse;
  int64_t window;
  bool operator==(const LayerKey &o) const { return sparse == o.sparse && window == o.window; }
};

LayerKey keyOf(const Decoder &m, int64_t i) {
  return {m.sparse.empty() || m.sparse[i], anyWindow(m) ? m.window[i] : 0};
}

bool mixedSparse(const Decoder &m) {
  return !m.sparse.empty() &&
         std::find(m.sparse.begin(), m.sparse.end(), !m.sparse[0]) != m.sparse.end();
}

bool mixedWindows(const Decoder &m) {
  return anyWindow(m) &&
         std::find(m.window.begin(), m.window.end(), m.window[0] ? 0 : m.windowSize) !=
             m.window.end();
}

/// A layer as a member's value: "DecoderLayer(d, ..., eps, window)".
std::string layerCall(const Decoder &m, LayerKey k) {
  bool dense = !m.sparse.empty() && !k.sparse;
  std::string call = fillText("{0}(d, heads, kv_heads, head_dim, {1}, eps",
                              dense ? "DenseDecoderLayer" : "DecoderLayer",
                              dense ? std::to_string(m.denseHidden) : std::string("hidden"));
  if (anyWindow(m))
    call += k.window > 0 ? ", window" : ", 0";
  return call + ")";
}

/// The start of a member's name for layers of kind `k`: "moe_", "local_", "dense_global_".
std::string kindPrefix(const Decoder &m, LayerKey k) {
  std::string n;
  if (mixedSparse(m))
    n += k.sparse ? "moe_" : "dense_";
  if (mixedWindows(m))
    n += k.window > 0 ? "local_" : "global_";
  return n;
}

/// A stretch of layers: `copies` repeats of the `period` layers from `start` (period 1: a run
/// of one kind of layer).
struct Segment {
  int64_t start, period, copies;
};

/// The layers as segments: runs of one kind and, where the windows differ, the repeating
/// pattern of up to 8 layers that covers the most layers (Gemma 2's sliding/global pairs,
/// Gemma 3's five sliding layers and one global), so the file shows one period of the pattern
/// and a count instead of a run per layer; what is left after it is runs again.
std::vector<Segment> layerSegments(const Decoder &m) {
  std::vector<Segment> out;
  bool groups = mixedWindows(m);
  for (int64_t i = 0; i < m.layers;) {
    Segment best{i, 1, 1};
    while (i + best.copies < m.layers && keyOf(m, i + best.copies) == keyOf(m, i))
      ++best.copies;
    for (int64_t p = 2; groups && p <= 8; ++p) {
      auto repeats = [&](int64_t c) {
        for (int64_t j = 0; j < p; ++j)
          if (!(keyOf(m, i + c * p + j) == keyOf(m, i + j)))
            return false;
        return true;
      };
      int64_t k = 1;
      while (i + (k + 1) * p <= m.layers && repeats(k))
        ++k;
      if (k >= 2 && i + p <= m.layers && k * p > best.period * best.copies)
        best = {i, p, k};
    }
    out.push_back(best);
    i += best.period * best.copies;
  }
  return out;
}

/// The distinct periods of the segments that repeat a pattern, in order of first use.
std::vector<std::vector<LayerKey>> groupPatterns(const Decoder &m, const std::vector<Segment> &segs) {
  std::vector<std::vector<LayerKey>> out;
  for (const Segment &s : segs) {
    if (s.period == 1)
      continue;
    std::vector<LayerKey> p;
    for (int64_t j = 0; j < s.period; ++j)
      p.push_back(keyOf(m, s.start + j));
    if (std::find(out.begin(), out.end(), p) == out.end())
      out.push_back(p);
  }
  return out;
}

std::string groupName(const std::vector<std::vector<LayerKey>> &patterns, size_t i) {
  return patterns.size() == 1 ? "LayerGroup" : "LayerGroup" + std::to_string(i + 1);
}

std::string groupCall(const Decoder &m, const std::vector<std::vector<LayerKey>> &patterns,
                      const Segment &s) {
  std::vector<LayerKey> p;
  for (int64_t j = 0; j < s.period; ++j)
    p.push_back(keyOf(m, s.start + j));
  size_t i = std::find(patterns.begin(), patterns.end(), p) - patterns.begin();
  return groupName(patterns, i) + "(d, heads, kv_heads, head_dim, hidden, eps, window)";
}

/// The block holding one period of a layer pattern: its runs as members, called in order.
std::string groupBlock(const Decoder &m, const std::string &name, const std::vector<LayerKey> &p) {
  struct Run {
    LayerKey key;
    int64_t count;
    std::string name;
  };
  std::vector<Run> runs;
  for (LayerKey k : p) {
    if (!runs.empty() && runs.back().key == k)
      ++runs.back().count;
    else
      runs.push_back({k, 1, ""});
  }
  size_t width = 0;
  std::string desc, chain = "x";
  for (size_t r = 0; r < runs.size(); ++r) {
    std::string base = kindPrefix(m, runs[r].key);
    base.pop_back(); // "local_" -> "local"
    int64_t same = 0, offset = 0;
    for (size_t q = 0; q < runs.size(); ++q)
      same += kindPrefix(m, runs[q].key) == kindPrefix(m, runs[r].key);
    for (size_t q = 0; q < r; ++q)
      offset += runs[q].count;
    runs[r].name = same > 1 ? base + "_" + std::to_string(offset) : base;
    width = std::max(width, runs[r].name.size());
    std::string kind = (mixedSparse(m) ? (runs[r].key.sparse ? "MoE " : "dense ") : "") +
                       std::string(runs[r].key.window > 0 ? "sliding-window" : "full-attention");
    desc += (r == 0 ? "" : ", then ") + std::to_string(runs[r].count) + " " + kind +
            (runs[r].count == 1 ? " layer" : " layers");
    chain = runs[r].name + "(" + chain + ")";
  }
  std::string out = "\n// One period of the layer pattern: " + desc + ".\nblock " + name +
                    "(d, heads, kv_heads, head_dim, hidden, eps, window) {\n";
  for (const Run &r : runs)
    out += "  " + r.name + std::string(width - r.name.size(), ' ') + " = " +
           (r.count > 1 ? "repeat(" + std::to_string(r.count) + ") " : "") + layerCall(m, r.key) +
           "\n";
  return out + "  forward(x) { return " + chain + " }\n}\n";
}

/// The blocks of the layer patterns modelText repeats.
std::string groupBlocks(const Decoder &m) {
  std::vector<std::vector<LayerKey>> patterns = groupPatterns(m, layerSegments(m));
  std::string out;
  for (size_t i = 0; i < patterns.size(); ++i)
    out += groupBlock(m, groupName(patterns, i), patterns[i]);
  return out;
}

/// The model: the embedding, the layers (one repeat, or runs of dense and sparse, sliding and
/// full-attention layers and repeated groups of them), the final norm and the head.
std::string modelText(const Decoder &m) {
  std::vector<Segment> segs = layerSegments(m);
  std::vector<std::vector<LayerKey>> patterns = groupPatterns(m, segs);
  bool single = segs.size() == 1;
  std::string head = m.tie ? "" : "  head   = Linear(d, vocab, bias = false)\n";
  std::string out = fillText(R"(model {0}(vocab = {1}, d = {2}, heads = {3}, kv_heads = {4}, head_dim = {5},
      hidden = {6}, n_layers = {7}, eps = {8}{9}) {
  embed  = Embedding(vocab, d)
)",
                         m.name, m.vocab, m.d, m.heads, m.kv, m.headDim, m.hidden, m.layers,
                         Config::fmt(m.eps),
                         anyWindow(m) ? ", window = " + std::to_string(m.windowSize) : "");
  std::string chain;
  if (single) {
    const Segment &s = segs[0];
    out += "  layers = repeat(" + (s.period == 1 ? std::string("n_layers") : std::to_string(s.copies)) +
           ") " + (s.period == 1 ? layerCall(m, keyOf(m, 0)) : groupCall(m, patterns, s)) + "\n";
    chain = "layers(embed(tokens))";
  } else {
    std::string calls = "    x = embed(tokens)\n";
    for (const Segment &s : segs) {
      std::string member = (s.period == 1 ? kindPrefix(m, keyOf(m, s.start)) : std::string("groups_")) +
                           std::to_string(s.start);
      int64_t last = s.start + s.period * s.copies - 1;
      std::string where = !mixedWindows(m) ? ""
                          : last == s.start
                              ? "  // layer " + std::to_string(last)
                              : "  // layers " + std::to_string(s.start) + "-" + std::to_string(last);
      out += fillText("  {0} = repeat({1}) {2}{3}\n", member, s.copies,
                      s.period == 1 ? layerCall(m, keyOf(m, s.start)) : groupCall(m, patterns, s),
                      where);
      calls += "    x = " + member + "(x)\n";
    }
    chain = "x";
    head = head + "  forward(tokens: i32[batch, seq]) {\n" + calls;
  }
  std::string logits = m.tie ? "norm(" + chain + ") @ transpose(embed.weight)  // tied head"
                             : "head(norm(" + chain + "))";
  out += "  norm   = " + normText(m.norm) + "\n" + head;
  if (single)
    out += "  forward(tokens: i32[batch, seq]) {\n";
  out += "    logits = " + logits + "\n";
  if (m.finalCap)
    out += fillText("    logits = {0} * tanh(logits / {0})  // final_logit_softcapping\n",
                    Config::fmt(*m.finalCap));
  out += "    return cross_entropy(logits, next_tokens(tokens))\n  }\n}\n";
  return out;
}

/// The header lines: positions, activation and what the family's text leaves out or adds.
std::string headerText(Config &c, const Decoder &m) {
  StringRef f = m.family;
  std::string h = fillText("// rotary embeddings with theta = {0}; max_position_embeddings = {1}; {2}\n",
                       Config::fmt(m.theta), m.positions, activationNote(m.act, m.op));
  if (f == "qwen2" || f == "qwen2_moe")
    h += "// Qwen2 has biases on q, k and v (not on o)\n";
  if (f == "mixtral")
    h += fillText("// {0} experts, {1} per token: the standard MoE block (Hugging Face's "
              "MixtralSparseMoeBlock); the router's aux loss coefficient {2} and jitter "
              "{3} change no count\n",
              m.experts, m.topK, Config::fmt(c.number("router_aux_loss_coef", 0.001, true)),
              Config::fmt(c.number("router_jitter_noise", 0, true)));
  if (f == "qwen2_moe" || f == "qwen3_moe") {
    int64_t nSparse = std::count(m.sparse.begin(), m.sparse.end(), true);
    h += fillText("// {0} experts, {1} per token, on {2} of {3} layers{4}; the router's aux loss "
              "coefficient {5} changes no count\n",
              m.experts, m.topK, nSparse, m.layers,
              m.sharedHidden > 0 ? ", with a shared expert" : "",
              Config::fmt(c.number("router_aux_loss_coef", 0.001, true)));
  }
  if (isGemma(f))
    h += "// Gemma scales the embedding by sqrt(d) and its norms by (1 + weight): neither "
         "changes a count\n";
  if (f == "gemma3_text" && c.has("rope_local_base_freq"))
    h += "// the sliding layers' rotary theta is rope_local_base_freq = " +
         Config::fmt(c.number("rope_local_base_freq", 10000)) + ": no count changes\n";
  if (m.norm == NormKind::NoAffine)
    h += "// OLMo's LayerNorm has no weight and no bias (elementwise_affine = False): "
         "LayerNorm(d, affine = false)\n";
  if (m.clip)
    h += "// clip_qkv = " + Config::fmt(*m.clip) + ": q, k and v are clipped (Clip below)\n";
  return h + m.notes;
}

} // namespace

bool isDecoderFamily(StringRef f) {
  return f == "llama" || f == "mistral" || f == "qwen2" || f == "qwen3" || f == "phi3" ||
         f == "olmo" || f == "olmo2" || f == "starcoder2" || isGemma(f) || isMoE(f);
}

std::optional<Generated> decoderFamily(Config &c, StringRef family) {
  Decoder m;
  m.family = family.str();
  m.name = modelName(family);
  if (!readDecoder(c, m))
    return std::nullopt;
  if (family == "olmo")
    m.norm = NormKind::NoAffine;
  if (family == "starcoder2")
    m.norm = NormKind::LayerNorm, m.plainMLP = true;
  if (family == "olmo2")
    m.placement = Placement::Post, m.qkNorm = QKNorm::Whole;
  if (family == "gemma2" || family == "gemma3_text")
    m.placement = Placement::Sandwich;
  if (family == "qwen3" || family == "qwen3_moe" || family == "gemma3_text")
    m.qkNorm = QKNorm::PerHead;
  m.fused = family == "phi3";
  readWindows(c, m);
  if (family == "gemma2" || family == "gemma3_text")
    readCaps(c, m);
  readNotes(c, m);
  Generated g;
  g.modelCall = m.name + "()";
  g.seq = std::min<int64_t>(m.positions, 2048);
  g.context = m.positions;
  // A mixture of experts holds every expert: twice the devices, the experts spread over up to
  // 8 ranks (a divisor of the expert count).
  if (m.experts > 0) {
    int64_t e = m.experts % 8 == 0 ? 8 : m.experts % 4 == 0 ? 4 : m.experts % 2 == 0 ? 2 : 1;
    g.target = fillText("16 x H100_SXM { data = 16, expert = {0}, zero = 3 }", e);
  }
  g.header = headerText(c, m);
  g.blocks = helperBlocks(m) + attentionBlock(m) + mlpBlocks(m);
  bool anySparse = std::find(m.sparse.begin(), m.sparse.end(), true) != m.sparse.end();
  bool anyDense = m.sparse.empty() ||
                  std::find(m.sparse.begin(), m.sparse.end(), false) != m.sparse.end();
  std::string mlp = m.plainMLP ? "MLP(d, hidden)" : "GatedMLP(d, hidden)";
  if (anySparse)
    g.blocks += layerBlock(m, "DecoderLayer", moeMember(m));
  if (anyDense)
    g.blocks += layerBlock(m, m.sparse.empty() ? "DecoderLayer" : "DenseDecoderLayer", mlp);
  g.blocks += groupBlocks(m);
  g.model = modelText(m);
  return g;
}

} // namespace tally::importhf
