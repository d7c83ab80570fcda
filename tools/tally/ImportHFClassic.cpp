// `tally import-hf`'s writers for gpt2, gpt_neox, bert and falcon: the families whose blocks
// are LayerNorm with biases and (but for Falcon) learned or partial-rotary positions. The
// decoder families are in ImportHFDecoder.cpp; the command in ImportHF.cpp.
#include "tools/tally/ImportHF.h"

#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace tally::importhf {

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
  g.context = positions;
  g.header = "// " + activationNote(act, op) + "\n";
  g.blocks = fillText(R"(// Causal self-attention with one fused q, k, v projection.
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
  g.model = fillText(R"(model GPT2(vocab = {0}, ctx = {1}, d = {2}, heads = {3}, hidden = {4}, layers = {5},
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
  g.context = positions;
  g.header = formatv("// rotary_pct = {0} with base {1}: tally's rope has no fraction yet, so it "
                     "rotates whole heads (no parameters either way); activation {2}; "
                     "max_position_embeddings = {3}\n",
                     Config::fmt(rotary), Config::fmt(base), activationName(act, op), positions)
                 .str();
  std::string residual = parallel ? "    return x + attn(ln1(x)) + mlp(ln2(x))   // parallel residual\n"
                                  : "    x = x + attn(ln1(x))\n    return x + mlp(ln2(x))\n";
  g.blocks = fillText(R"(// Self-attention with one fused q, k, v projection and rotary positions.
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
  g.model = fillText(R"(model GPTNeoX(vocab = {0}, d = {1}, heads = {2}, hidden = {3}, n_layers = {4}, eps = {5}) {
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
  g.context = positions;
  g.encoder = true;
  g.header = formatv("// activation {0}; every sequence is segment 0 (token_type_ids all zero)\n",
                     activationName(act, op))
                 .str();
  g.blocks = fillText(R"(block BertAttention(d, heads) {
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
    members = fillText(R"(  transform  = Linear(d, d)
  transform_norm = LayerNorm(d, eps = eps)
  param decoder_bias: [vocab]   // the decoder's weight is the word embedding
)");
    body = fillText(R"(    y = transform_norm({0}(transform(x)))
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
  g.model = fillText(R"(model {0}(vocab = {1}, ctx = {2}, types = {3}, d = {4}, heads = {5}, hidden = {6},
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

/// falcon (Falcon-7B/40B/180B, Falcon-RW): LayerNorm with biases, one fused query_key_value
/// projection laid out per key-value group, rotary positions or ALiBi, a GELU MLP, attention
/// and MLP side by side (parallel_attn) and a head tied to the word embedding.
std::optional<Generated> falconFamily(Config &c) {
  int64_t vocab = c.size("vocab_size");
  int64_t d = c.size("hidden_size");
  int64_t layers = c.sizeEither("num_hidden_layers", "n_layer");
  int64_t heads = c.sizeEither("num_attention_heads", "n_head");
  c.divisible("hidden_size", d, "num_attention_heads", heads);
  bool newArch = c.flag("new_decoder_architecture", false);
  bool multiQuery = c.flag("multi_query", true);
  bool parallel = c.flag("parallel_attn", true);
  bool bias = c.flag("bias", false);
  bool alibi = c.flag("alibi", false);
  double eps = c.number("layer_norm_epsilon", 1e-5);
  int64_t hidden = d > 0 ? c.size("ffn_hidden_size", 4 * d, "4 * hidden_size") : 0;
  bool tie = c.flag("tie_word_embeddings", true);
  int64_t positions = c.size("max_position_embeddings", 2048, "");
  std::string act = c.text("activation", "gelu");
  std::string op = activationOp(act);
  // FalconAttention's key-value heads: num_kv_heads (n_head_kv) with the new decoder
  // architecture, else one (multi-query) or one per head.
  int64_t kv = multiQuery ? 1 : heads;
  int64_t norms = 1;
  if (newArch) {
    kv = c.has("num_kv_heads") || c.has("n_head_kv") ? c.sizeEither("num_kv_heads", "n_head_kv")
                                                      : heads;
    c.divisible("num_attention_heads", heads, "num_kv_heads", kv);
    norms = c.size("num_ln_in_parallel_attn", 2, "FalconConfig's default with the new decoder");
    if (norms > 2)
      c.invalid("num_ln_in_parallel_attn", "1 or 2");
    if (!parallel)
      c.unsupported("parallel_attn", "false with new_decoder_architecture is a layout "
                                     "transformers' Falcon does not run (it needs parallel_attn)");
  }
  if (op.empty() || vocab == 0 || d == 0 || hidden == 0 || layers == 0 || heads == 0 || kv == 0 ||
      d % heads != 0 || heads % kv != 0 || norms > 2 || (newArch && !parallel))
    return std::nullopt;
  double theta = alibi ? 0 : c.number("rope_theta", 10000);
  int64_t headDim = d / heads, group = heads / kv;
  Generated g;
  g.modelCall = "Falcon()";
  g.seq = std::min<int64_t>(positions, 2048);
  g.context = positions;
  g.header = (alibi ? std::string("// ALiBi positions (alibi = true): no rotary embedding")
                    : "// rotary embeddings with theta = " + Config::fmt(theta)) +
             fillText("; {0}; max_position_embeddings = {1}\n", activationNote(act, op), positions);
  g.header += "// apply_residual_connection_post_layernorm is not read: transformers' Falcon "
              "ignores it\n";
  std::string pos = alibi ? "ALiBi position biases" : "rotary positions";
  std::string q = alibi ? "q" : "rope(q)", k = alibi ? "k" : "rope(k)";
  g.blocks = fillText(R"(// Falcon's self-attention with {0}: one fused query_key_value projection laid out
// per key-value group ({1} query heads of the group, then its key head and its value head).
block FalconAttention(d, heads, kv_heads, head_dim) {
  query_key_value = Linear(d, (heads + 2 * kv_heads) * head_dim, bias = {2})
  dense           = Linear(heads * head_dim, d, bias = {2})
  forward(x) {
    t = reshape(query_key_value(x), (batch, seq, kv_heads, heads / kv_heads + 2, head_dim))
    q = reshape(t[:, :, :, 0:heads / kv_heads], (batch, seq, heads * head_dim))
    k = reshape(t[:, :, :, heads / kv_heads], (batch, seq, kv_heads * head_dim))
    v = reshape(t[:, :, :, heads / kv_heads + 1], (batch, seq, kv_heads * head_dim))
    y = attention({3}, {4}, v, heads = heads, kv_heads = kv_heads, causal = true{5})
    return dense(y)
  }
}

block FalconMLP(d, hidden) {
  dense_h_to_4h = Linear(d, hidden, bias = {2})
  dense_4h_to_h = Linear(hidden, d, bias = {2})
  forward(x) { return dense_4h_to_h({6}(dense_h_to_4h(x))) }
}

)",
                  pos, group, boolText(bias), q, k, alibi ? ", alibi = true" : "", op);
  std::string members, body, what;
  if (parallel && norms == 2) {
    what = "attention and MLP side by side, each with its own LayerNorm";
    members = "  ln_attn        = LayerNorm(d, eps = eps)\n  ln_mlp         = LayerNorm(d, eps = eps)\n";
    body = "    return x + self_attention(ln_attn(x)) + mlp(ln_mlp(x))\n";
  } else if (parallel) {
    what = "attention and MLP side by side on one LayerNorm";
    members = "  input_layernorm = LayerNorm(d, eps = eps)\n";
    body = "    h = input_layernorm(x)\n    return x + self_attention(h) + mlp(h)\n";
  } else {
    what = "attention, then the MLP";
    members = "  input_layernorm = LayerNorm(d, eps = eps)\n"
              "  post_attention_layernorm = LayerNorm(d, eps = eps)\n";
    body = "    x = x + self_attention(input_layernorm(x))\n"
           "    return x + mlp(post_attention_layernorm(x))\n";
  }
  g.blocks += fillText(R"(// One Falcon layer: {0}.
block FalconLayer(d, heads, kv_heads, head_dim, hidden, eps) {
{1}  self_attention = FalconAttention(d, heads, kv_heads, head_dim)
  mlp            = FalconMLP(d, hidden)
  forward(x) {
{2}  }
}
)",
                   what, members, body);
  std::string head = tie ? "" : "  lm_head         = Linear(d, vocab, bias = false)\n";
  std::string logits = tie ? "ln_f(h(word_embeddings(tokens))) @ transpose(word_embeddings.weight)  // tied head"
                           : "lm_head(ln_f(h(word_embeddings(tokens))))";
  g.model = fillText(R"(model Falcon(vocab = {0}, d = {1}, heads = {2}, kv_heads = {3}, head_dim = {4},
       hidden = {5}, n_layers = {6}, eps = {7}) {
  word_embeddings = Embedding(vocab, d)
  h               = repeat(n_layers) FalconLayer(d, heads, kv_heads, head_dim, hidden, eps)
  ln_f            = LayerNorm(d, eps = eps)
{8}  forward(tokens: i32[batch, seq]) {
    logits = {9}
    return cross_entropy(logits, next_tokens(tokens))
  }
}
)",
                 vocab, d, heads, kv, headDim, hidden, layers, Config::fmt(eps), head, logits);
  return g;
}
} // namespace tally::importhf
