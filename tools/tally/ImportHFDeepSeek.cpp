// `tally import-hf` for DeepSeek-V2 and DeepSeek-V3 (model_type deepseek_v2, deepseek_v3; issue
// 44): multi-head latent attention (the standard library's MLA block), DeepSeekMoE (fine-grained
// routed experts beside shared ones, the first first_k_dense_replace layers dense) and, for V3's
// auxiliary-loss-free routing, the router's bias as a frozen parameter. The keys are those of
// the published configs (deepseek-ai/DeepSeek-V2-Lite, DeepSeek-V2, DeepSeek-V3) as
// transformers' DeepseekV2Config / DeepseekV3Config and the authors' modeling_deepseek.py read
// them; a key tally does not know is an error naming it, since it may change a shape or a cost.
#include "tools/tally/ImportHF.h"

#include "llvm/ADT/StringSet.h"

#include <algorithm>

using namespace llvm;

namespace tally::importhf {

namespace {

/// What a DeepSeek-V2/V3 config holds.
struct DeepSeek {
  bool v3 = false;
  int64_t vocab = 0, d = 0, hidden = 0, layers = 0, heads = 0;
  int64_t qLora = 0, kvLora = 0, nope = 0, rope = 0, vHead = 0;
  int64_t experts = 0, topK = 0, moeHidden = 0, shared = 0, dense = 0;
  double eps = 1e-6, scale = 1;
  bool tie = false, bias = false, renormalise = false;
  std::string scoring;  ///< "softmax" or "sigmoid"
  bool routerBias = false; ///< topk_method noaux_tc: e_score_correction_bias
  int64_t positions = 0;
};

/// The keys that change no shape and no cost, each stated in the header when present (the
/// count-changing ones are read below). Anything else is an error.
const StringSet<> &notedKeys() {
  static const StringSet<> keys = {
      "architectures", "auto_map", "model_type", "_name_or_path", "transformers_version",
      "torch_dtype", "dtype", "bos_token_id", "eos_token_id", "pad_token_id",
      "initializer_range", "use_cache", "pretraining_tp", "attention_dropout", "aux_loss_alpha",
      "seq_aux", "ep_size", "rope_theta", "rope_scaling", "quantization_config",
      "num_nextn_predict_layers", "n_group", "topk_group", "head_dim", "rope_interleave",
      "router_aux_loss_coef", "output_router_logits", "output_attentions",
      "output_hidden_states", "return_dict", "tokenizer_class"};
  return keys;
}

const StringSet<> &readKeys() {
  static const StringSet<> keys = {
      "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
      "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "q_lora_rank",
      "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
      "n_shared_experts", "num_experts_per_tok", "first_k_dense_replace", "moe_layer_freq",
      "norm_topk_prob", "scoring_func", "topk_method", "routed_scaling_factor", "rms_norm_eps",
      "tie_word_embeddings", "attention_bias", "hidden_act", "max_position_embeddings"};
  return keys;
}

/// Every key of the config is read or noted; the first other one is an error naming it.
bool knownKeys(Config &c) {
  for (const auto &kv : c.object()) {
    StringRef k = kv.first;
    if (readKeys().count(k) || notedKeys().count(k))
      continue;
    c.unsupported(k, "not a key tally knows for this family; it may change a shape or a cost, "
                     "so nothing is written (the keys tally reads: vocab_size, hidden_size, "
                     "intermediate_size, moe_intermediate_size, num_hidden_layers, "
                     "num_attention_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, "
                     "qk_rope_head_dim, v_head_dim, n_routed_experts, n_shared_experts, "
                     "num_experts_per_tok, first_k_dense_replace, moe_layer_freq, "
                     "norm_topk_prob, scoring_func, topk_method, routed_scaling_factor, ...)");
    return false;
  }
  return true;
}

bool readMoE(Config &c, DeepSeek &m) {
  if (!c.has("n_routed_experts")) { // DeepseekV2Config: None is a dense model
    m.dense = m.layers;
    return true;
  }
  m.experts = c.size("n_routed_experts");
  m.topK = c.size("num_experts_per_tok");
  m.moeHidden = c.size("moe_intermediate_size");
  m.shared = c.has("n_shared_experts") ? c.count("n_shared_experts", 0, "") : 0;
  m.dense = c.count("first_k_dense_replace", 0, "DeepseekV2Config's default");
  if (m.dense > m.layers)
    c.invalid("first_k_dense_replace", "at most num_hidden_layers = " + std::to_string(m.layers));
  if (c.size("moe_layer_freq", 1, "") != 1)
    c.unsupported("moe_layer_freq", "only 1 (every layer from first_k_dense_replace on sparse, "
                                    "as every published DeepSeek-V2/V3 config) is written");
  if (m.topK > m.experts)
    c.invalid("num_experts_per_tok", "at most n_routed_experts = " + std::to_string(m.experts));
  m.renormalise = c.flag("norm_topk_prob", m.v3);
  m.scale = c.number("routed_scaling_factor", m.v3 ? 2.5 : 1.0);
  m.scoring = c.text("scoring_func", m.v3 ? "sigmoid" : "softmax");
  if (m.scoring != "softmax" && m.scoring != "sigmoid")
    c.invalid("scoring_func", "softmax or sigmoid");
  std::string method = c.text("topk_method", m.v3 ? "noaux_tc" : "greedy");
  if (method != "greedy" && method != "group_limited_greedy" && method != "noaux_tc")
    c.invalid("topk_method", "greedy, group_limited_greedy or noaux_tc");
  m.routerBias = method == "noaux_tc";
  if (m.routerBias && m.scoring != "sigmoid")
    c.unsupported("topk_method", "noaux_tc (a bias on the scores for the choice) is written with "
                                 "scoring_func sigmoid only, as DeepSeek-V3 runs it");
  return true;
}

bool readDeepSeek(Config &c, DeepSeek &m) {
  m.vocab = c.size("vocab_size");
  m.d = c.size("hidden_size");
  m.hidden = c.size("intermediate_size");
  m.layers = c.size("num_hidden_layers");
  m.heads = c.size("num_attention_heads");
  m.kvLora = c.size("kv_lora_rank");
  m.nope = c.size("qk_nope_head_dim");
  m.rope = c.size("qk_rope_head_dim");
  m.vHead = c.size("v_head_dim");
  m.qLora = c.has("q_lora_rank") ? c.size("q_lora_rank") : 0; // null: one q projection
  if (c.has("num_key_value_heads") && c.size("num_key_value_heads", m.heads, "") != m.heads)
    c.invalid("num_key_value_heads", "num_attention_heads = " + std::to_string(m.heads) +
                                         ": MLA up-projects a key and a value for every head");
  if (m.rope % 2 != 0)
    c.invalid("qk_rope_head_dim", "even: rope turns pairs of dims");
  m.eps = c.number("rms_norm_eps", 1e-6);
  m.tie = c.flag("tie_word_embeddings", false);
  m.bias = c.flag("attention_bias", false);
  m.positions = c.size("max_position_embeddings", 163840, "the published configs' value");
  if (c.text("hidden_act", "silu") != "silu")
    c.invalid("hidden_act", "silu: DeepSeek's MLP and experts are SwiGLU");
  if (c.number("attention_dropout", 0, true) > 0)
    c.unsupported("attention_dropout", "above 0 is not written (no published model trains with it)");
  return !c.diagnosed() && readMoE(c, m) && !c.diagnosed();
}

std::string header(Config &c, const DeepSeek &m) {
  int64_t sparse = m.layers - m.dense;
  std::string h = fillText(
      "// multi-head latent attention (the standard library's MLA): {0} heads of {1} + {2} (q/k) and "
      "{3} (v) dims, keys and values up-projected from a latent of kv_lora_rank = {4}{5}; the KV "
      "cache holds the latent and the RoPE key, {6} values per token and layer (DeepSeek-V2, "
      "arXiv:2405.04434, §2.1)\n",
      m.heads, m.nope, m.rope, m.vHead, m.kvLora,
      m.qLora > 0 ? ", queries through q_lora_rank = " + std::to_string(m.qLora) : std::string(),
      m.kvLora + m.rope);
  if (m.experts > 0)
    h += fillText("// DeepSeekMoE: {0} routed experts of width {1}, {2} per token, {3} shared, on "
                  "{4} of {5} layers (the first {6} dense, width {7}); routing by {8}{9}{10}\n",
                  m.experts, m.moeHidden, m.topK, m.shared, sparse, m.layers, m.dense, m.hidden,
                  m.scoring, m.renormalise ? ", the top-k weights renormalised" : "",
                  m.scale != 1 ? ", scaled by routed_scaling_factor = " + Config::fmt(m.scale)
                               : std::string());
  if (m.routerBias)
    h += "// auxiliary-loss-free routing (topk_method noaux_tc): the router's bias "
         "(e_score_correction_bias) is a frozen parameter, added to the scores for the choice only "
         "(DeepSeek-V3, arXiv:2412.19437, §2.1.2: updated by a rule, not by gradients)\n";
  if (c.has("n_group") || c.has("topk_group"))
    h += "// group-limited routing (n_group, topk_group) restricts which experts a token may "
         "choose, not how many: written as plain top-k, the same count\n";
  if (c.has("num_nextn_predict_layers"))
    h += "// num_nextn_predict_layers: the multi-token-prediction module is not written (it is "
         "not part of the published main-model count; DeepSeek-V3's card: 671B main model + 14B "
         "MTP module)\n";
  if (c.has("rope_scaling"))
    h += "// rope_scaling (YaRN) changes the angles and the softmax scale (mscale), not a count\n";
  if (c.has("quantization_config"))
    h += "// quantization_config: the published weights are stored in fp8; the plan below sets "
         "its own precision\n";
  h += "// aux_loss_alpha, seq_aux, ep_size, rope_theta and the token ids change no count\n";
  return h;
}

std::string moeBlock(const DeepSeek &m) {
  std::string route;
  if (m.scoring == "softmax" && !m.renormalise)
    route = "    gates, chosen = topk(softmax(router(x)), top_k)\n";
  else if (m.scoring == "softmax")
    route = "    logits, chosen = topk(router(x), top_k)\n    gates = softmax(logits)\n";
  else {
    route = "    scores = sigmoid(router(x))\n";
    route += m.routerBias ? "    biased, chosen = topk(scores + router_bias, top_k)\n"
                            "    gates = gather(scores, chosen)\n"
                          : "    gates, chosen = topk(scores, top_k)\n";
    if (m.renormalise)
      route += "    gates = gates / sum(gates, dim = -1, keepdim = true)\n";
  }
  if (m.scale != 1)
    route += "    gates = gates * scale\n";
  return fillText(R"(
// DeepSeekMoE (DeepSeek-V2 §2.2; DeepSeek-V3 §2.1.2): a bias-free router over `experts`
// fine-grained routed experts, each token sent to top_k of them, each a bias-free SwiGLU of
// width `hidden` (the moe op){0}.
block DeepSeekMoE(d, hidden, shared_hidden, experts, top_k, scale) {
  router = Linear(d, experts, bias = false)
{1}  param w_gate: [experts, d, hidden]
  param w_up: [experts, d, hidden]
  param w_down: [experts, hidden, d]
{2}  forward(x) {
{3}    y = moe(x, gates, chosen, w_gate, w_up, w_down)
    return {4}
  }
}
)",
                  m.shared > 0 ? "; beside them the shared experts, one SwiGLU of width "
                                 "n_shared_experts × hidden that every token runs"
                               : "",
                  m.routerBias ? "  frozen param router_bias: [experts]   // e_score_correction_bias\n"
                               : "",
                  m.shared > 0 ? "  shared = GatedMLP(d, shared_hidden)\n" : "", route,
                  m.shared > 0 ? "y + shared(x)" : "y");
}

std::string layerBlock(const DeepSeek &m, bool sparse) {
  return fillText(R"(
// One pre-norm decoder layer: MLA, then {0}.
block {1}(d, heads, q_lora_rank, kv_lora_rank, nope, rope, v_head, hidden, eps{2}) {
  attn_norm = RMSNorm(d, eps = eps)
  attn      = MLA(d, heads, kv_lora_rank, nope, rope, v_head, q_lora = {5},
                  q_lora_rank = q_lora_rank, bias = {3}, eps = eps)
  mlp_norm  = RMSNorm(d, eps = eps)
  mlp       = {4}
  forward(x) {
    x = x + attn(attn_norm(x))
    return x + mlp(mlp_norm(x))
  }
}
)",
                  sparse ? "DeepSeekMoE" : "a dense gated MLP", sparse ? "MoELayer" : "DenseLayer",
                  sparse ? ", shared_hidden, experts, top_k, scale" : "", boolText(m.bias),
                  sparse ? "DeepSeekMoE(d, hidden, shared_hidden, experts, top_k, scale)"
                         : "GatedMLP(d, hidden)",
                  boolText(m.qLora > 0));
}

std::string modelText(const DeepSeek &m, const std::string &name) {
  std::string args = "d, heads, q_lora_rank, kv_lora_rank, nope, rope, v_head";
  std::string members;
  std::string x = "embed(tokens)";
  if (m.dense > 0) {
    members += fillText("  dense   = repeat({0}) DenseLayer({1}, hidden, eps)\n", m.dense, args);
    x = "dense(" + x + ")";
  }
  if (m.layers > m.dense) {
    members += fillText("  sparse  = repeat({0}) MoELayer({1}, moe_hidden, eps, shared_hidden, "
                        "experts, top_k, scale)\n",
                        m.layers - m.dense, args);
    x = "sparse(" + x + ")";
  }
  std::string experts =
      m.experts > 0
          ? fillText(",\n    moe_hidden = {0}, shared_hidden = {1}, experts = {2}, top_k = {3}, "
                     "scale = {4}",
                     m.moeHidden, m.shared * m.moeHidden, m.experts, m.topK, Config::fmt(m.scale))
          : std::string();
  return fillText(R"(model {0}(vocab = {1}, d = {2}, layers = {3}, heads = {4},
    q_lora_rank = {5}, kv_lora_rank = {6}, nope = {7}, rope = {8}, v_head = {9},
    hidden = {10}, eps = {11}{12}) {
  embed   = Embedding(vocab, d)
{13}  norm    = RMSNorm(d, eps = eps)
{14}  forward(tokens: i32[batch, seq]) {
    x = {15}
    return cross_entropy({16}, next_tokens(tokens))
  }
}
)",
                  name, m.vocab, m.d, m.layers, m.heads, std::max<int64_t>(m.qLora, 1), m.kvLora, m.nope, m.rope,
                  m.vHead, m.hidden, Config::fmt(m.eps), experts, members,
                  m.tie ? "" : "  lm_head = Linear(d, vocab, bias = false)\n", x,
                  m.tie ? "norm(x) @ transpose(embed.weight)" : "lm_head(norm(x))");
}

} // namespace

std::optional<Generated> deepseekFamily(Config &c, bool v3) {
  DeepSeek m;
  m.v3 = v3;
  if (!knownKeys(c) || !readDeepSeek(c, m))
    return std::nullopt;
  std::string name = v3 ? "DeepSeekV3" : "DeepSeekV2";
  Generated g;
  g.header = header(c, m);
  g.blocks = R"(
// The gated MLP: down(silu(gate(x)) * up(x)).
block GatedMLP(d, hidden) {
  gate = Linear(d, hidden, bias = false)
  up   = Linear(d, hidden, bias = false)
  down = Linear(hidden, d, bias = false)
  forward(x) { return down(silu(gate(x)) * up(x)) }
}
)";
  if (m.experts > 0)
    g.blocks += moeBlock(m);
  if (m.dense > 0)
    g.blocks += layerBlock(m, false);
  if (m.layers > m.dense)
    g.blocks += layerBlock(m, true);
  g.model = modelText(m, name);
  g.modelCall = name + "()";
  g.seq = std::min<int64_t>(m.positions, 2048);
  g.context = m.positions;
  if (m.experts > 0) {
    int64_t e = m.experts % 8 == 0 ? 8 : m.experts % 4 == 0 ? 4 : m.experts % 2 == 0 ? 2 : 1;
    g.target = fillText("16 x H100_SXM { data = 16, expert = {0}, zero = 3 }", e);
  }
  return g;
}

} // namespace tally::importhf
