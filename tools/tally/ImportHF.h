// Private to `tally import-hf` (tools/tally/ImportHF*.cpp): typed access to a config.json's keys
// with diagnostics that name the key and the file, the pieces a family fills, and the family
// writers. ImportHF.cpp reads the file, picks the family and writes the result;
// ImportHFDecoder.cpp writes the RMSNorm/LayerNorm decoder families (llama and its relatives,
// the Qwen, Gemma, OLMo, Phi-3 and StarCoder2 lines, the mixtures of experts);
// ImportHFClassic.cpp writes gpt2, gpt_neox, bert and falcon; ImportHFDeepSeek.cpp deepseek_v2
// and deepseek_v3 (multi-head latent attention, DeepSeekMoE).
#pragma once

#include "support/Diagnostics.h"
#include "support/Format.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"

#include <cctype>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tally::importhf {

/// Typed access to the config's keys with diagnostics that name the key and the file.
class Config {
public:
  Config(const llvm::json::Object &obj, std::string file, std::string family,
         DiagnosticEngine &diags)
      : obj_(obj), file_(std::move(file)), family_(std::move(family)), diags_(diags) {}

  /// A required positive integer; 0 after a diagnostic.
  int64_t size(llvm::StringRef key);
  /// An optional positive integer: `fallback` when absent or null (noted in `defaults`).
  int64_t size(llvm::StringRef key, int64_t fallback, llvm::StringRef why);
  /// An optional integer >= 0: `fallback` when absent or null (noted in `defaults`).
  int64_t count(llvm::StringRef key, int64_t fallback, llvm::StringRef why);
  /// A required positive integer under one of two names (transformers' attribute_map: Falcon's
  /// `n_head` is `num_attention_heads`); the first name is the one a message gives.
  int64_t sizeEither(llvm::StringRef key, llvm::StringRef alias);
  /// An optional positive number (or, with `zeroOk`, a number >= 0).
  double number(llvm::StringRef key, double fallback, bool zeroOk = false);
  /// An optional positive number that may be null: nullopt when absent or null (no default
  /// noted: null is the config's own "off").
  std::optional<double> optionalNumber(llvm::StringRef key);
  /// An optional boolean.
  bool flag(llvm::StringRef key, bool fallback);
  /// An optional string.
  std::string text(llvm::StringRef key, llvm::StringRef fallback);
  /// An optional list of integers in [0, limit): empty when absent or null.
  std::vector<int64_t> indices(llvm::StringRef key, int64_t limit);
  /// True when `key` is present and not null.
  bool has(llvm::StringRef key) const;
  /// True when `key` is present and null (the config's explicit "none").
  bool isNull(llvm::StringRef key) const;
  /// An optional list of strings: empty when absent or null.
  std::vector<std::string> strings(llvm::StringRef key);
  /// `a` must be a multiple of `b` (both keys named in the message).
  void divisible(llvm::StringRef aKey, int64_t a, llvm::StringRef bKey, int64_t b);
  /// Reports that `key` must be `what` (a value outside what tally can express).
  void invalid(llvm::StringRef key, llvm::StringRef what);
  /// Reports a key whose value tally cannot express, with why.
  void unsupported(llvm::StringRef key, llvm::StringRef why);
  /// The "// key: not given, default" lines the generated file starts with.
  const std::vector<std::string> &defaults() const { return defaults_; }
  const std::string &family() const { return family_; }
  /// The whole config (deepseek's check that every key is one it knows).
  const llvm::json::Object &object() const { return obj_; }
  /// True once an error was reported.
  bool diagnosed() const { return diags_.hasErrors(); }

  /// The shortest decimal text that reads back as `v` ("1e-05", "10000", "0.25").
  static std::string fmt(double v) {
    return isExactInteger(v, 1e15) ? integerText(v) : roundTrip(v);
  }

private:
  void missing(llvm::StringRef key);
  int64_t positive(llvm::StringRef key, const llvm::json::Value &v);
  void noteDefault(llvm::StringRef key, const std::string &value, llvm::StringRef why);

  const llvm::json::Object &obj_;
  std::string file_, family_;
  DiagnosticEngine &diags_;
  std::vector<std::string> defaults_;
};

/// True for transformers' tanh approximations of GELU (gelu_new, gelu_pytorch_tanh, gelu_fast,
/// gelu_accurate), which tally writes as `gelu_tanh`.
bool isTanhGelu(llvm::StringRef act);

/// The activation op tally has for a Hugging Face activation name (transformers' ACT2FN
/// names, matched exactly); empty when none.
std::string activationOp(llvm::StringRef act);

/// The config's activation name, followed for a tanh GELU by which form tally writes.
std::string activationName(llvm::StringRef act, llvm::StringRef op);

/// "activation gelu_new (tally's `gelu_tanh`, ...)": the header's words for an activation.
std::string activationNote(llvm::StringRef act, llvm::StringRef op);

/// The pieces a family fills; ImportHF.cpp lays them out so every imported file reads the same
/// way.
struct Generated {
  std::string header;          ///< the comment at the top
  std::string blocks;          ///< block declarations
  std::string model;           ///< the model declaration
  std::string modelCall;       ///< "Llama()"
  int64_t seq = 2048;          ///< the plan's sequence length
  int64_t context = 8192;      ///< the context the model takes (max_position_embeddings)
  std::string target = "8 x H100_SXM { data = 8, zero = 3 }"; ///< the plan's target
  bool encoder = false;        ///< no causal attention (bert): the infer plan generates nothing
};

/// Fills a template of tally text: "{N}" becomes the N-th argument; every other brace is
/// literal (formatv would read the blocks' braces as replacement fields).
template <typename... Args> std::string fillText(llvm::StringRef tpl, const Args &...args) {
  std::vector<std::string> values{llvm::formatv("{0}", args).str()...};
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

inline std::string boolText(bool b) { return b ? "true" : "false"; }

/// True for the families decoderFamily writes.
bool isDecoderFamily(llvm::StringRef family);

/// The families: each reads its keys through `c` and returns the pieces, or nullopt after a
/// diagnostic (or, with none, for an activation tally has no op for: the caller reports it).
std::optional<Generated> decoderFamily(Config &c, llvm::StringRef family);
std::optional<Generated> gpt2Family(Config &c);
std::optional<Generated> neoxFamily(Config &c);
std::optional<Generated> bertFamily(Config &c, bool maskedLM);
std::optional<Generated> falconFamily(Config &c);
std::optional<Generated> deepseekFamily(Config &c, bool v3); // ImportHFDeepSeek.cpp

} // namespace tally::importhf
