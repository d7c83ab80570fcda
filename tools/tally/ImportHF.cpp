// `tally import-hf config.json [-o model.tally]`: turns a Hugging Face `config.json` into a
// readable .tally file — the model written with the standard library's blocks (Linear,
// Embedding, LayerNorm, RMSNorm, MoE) plus a few blocks of its own, and a `train` plan of
// stated defaults to edit. docs/import-hf.md lists the families and the keys read.
//
// 1. Read and parse the JSON (io-error, syntax-error with llvm::json's line:column).
// 2. Pick the family from `model_type`, else from `architectures[0]`. The decoder families
//    (ImportHFDecoder.cpp: llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3_text, phi3,
//    olmo, olmo2, starcoder2 and the mixtures of experts mixtral, qwen2_moe, qwen3_moe) share
//    one writer; gpt2, gpt_neox, bert and falcon have their own (ImportHFClassic.cpp).
//    DeepSeek's latent attention is refused: the language cannot write it yet.
// 3. Read each key the family needs: a required key that is missing is `missing-setting`
//    naming the key and the file; a key of the wrong type, a non-positive size or sizes that do
//    not divide (hidden_size by num_attention_heads, heads by key-value heads) is
//    `invalid-value`, and so is a key whose value changes the shape or the cost in a way tally
//    cannot write. Optional keys take the defaults of the transformers library's config
//    classes, and the generated file says which defaults were used.
// 4. Write the model text. The parameter count is the real model's because every weight and
//    bias of the checkpoint is declared with its shape (tests/lit/import-hf-*.tally pin the
//    published counts); what the language cannot express yet (NeoX's partial rotary, the
//    pooler's first-token slice) is said in a comment where it applies. Sliding windows,
//    soft-capping and the tanh GELU are written as the config says (ImportHFDecoder.cpp).
// 5. Write two plans: `train pretrain` of stated defaults and `infer serve`, one sequence of the
//    model's context (8192 tokens, or fewer when the model takes fewer) prefilled in bf16, whose
//    report shows the KV cache per token. Its target is the fewest H100s, a power of two, that
//    hold the bf16 weights in three quarters of each device; the training plan's devices are
//    doubled from the family's until AdamW's states fit the same (trainTarget, serveTarget:
//    the count is tally's own, from the generated text compiled under a stand-in plan).
//
// Exit codes: 0 written; 1 an error in the config (or a file that cannot be read); 2 bad
// usage or an output that cannot be written.
#include "tools/tally/ImportHF.h"

#include "driver/Compiler.h"
#include "passes/Passes.h"
#include "report/Output.h"
#include "tools/tally/Commands.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"

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


namespace importhf {

int64_t Config::size(StringRef key) {
  if (!has(key)) {
    missing(key);
    return 0;
  }
  return positive(key, *obj_.get(key));
}

int64_t Config::size(StringRef key, int64_t fallback, StringRef why) {
  if (!has(key)) {
    noteDefault(key, std::to_string(fallback), why);
    return fallback;
  }
  return positive(key, *obj_.get(key));
}

int64_t Config::count(StringRef key, int64_t fallback, StringRef why) {
  if (!has(key)) {
    noteDefault(key, std::to_string(fallback), why);
    return fallback;
  }
  auto i = obj_.get(key)->getAsInteger();
  if (!i || *i < 0 || *i > (int64_t(1) << 40)) {
    invalid(key, "an integer >= 0");
    return fallback;
  }
  return *i;
}

int64_t Config::sizeEither(StringRef key, StringRef alias) {
  if (!has(key) && has(alias))
    return positive(alias, *obj_.get(alias));
  return size(key);
}

double Config::number(StringRef key, double fallback, bool zeroOk) {
  if (!has(key)) {
    noteDefault(key, fmt(fallback), "");
    return fallback;
  }
  auto d = obj_.get(key)->getAsNumber();
  if (!d || !(*d > 0 || (zeroOk && *d == 0)) || !std::isfinite(*d)) {
    invalid(key, zeroOk ? "a number >= 0" : "a positive number");
    return fallback;
  }
  return *d;
}

std::optional<double> Config::optionalNumber(StringRef key) {
  if (!has(key))
    return std::nullopt;
  auto d = obj_.get(key)->getAsNumber();
  if (!d || !(*d > 0) || !std::isfinite(*d)) {
    invalid(key, "a positive number or null");
    return std::nullopt;
  }
  return *d;
}

bool Config::flag(StringRef key, bool fallback) {
  if (!has(key)) {
    noteDefault(key, fallback ? "true" : "false", "");
    return fallback;
  }
  auto b = obj_.get(key)->getAsBoolean();
  if (!b) {
    invalid(key, "true or false");
    return fallback;
  }
  return *b;
}

std::string Config::text(StringRef key, StringRef fallback) {
  if (!has(key)) {
    noteDefault(key, ("\"" + fallback + "\"").str(), "");
    return fallback.str();
  }
  auto s = obj_.get(key)->getAsString();
  if (!s) {
    invalid(key, "a string");
    return fallback.str();
  }
  return s->str();
}

std::vector<int64_t> Config::indices(StringRef key, int64_t limit) {
  std::vector<int64_t> out;
  if (!has(key))
    return out;
  const json::Array *a = obj_.get(key)->getAsArray();
  if (!a) {
    invalid(key, "a list of layer indices");
    return out;
  }
  for (const json::Value &v : *a) {
    auto i = v.getAsInteger();
    if (!i || *i < 0 || *i >= limit) {
      invalid(key, "a list of layer indices from 0 to " + std::to_string(limit - 1));
      return {};
    }
    out.push_back(*i);
  }
  return out;
}

bool Config::isNull(StringRef key) const {
  const json::Value *v = obj_.get(key);
  return v && v->kind() == json::Value::Null;
}

std::vector<std::string> Config::strings(StringRef key) {
  std::vector<std::string> out;
  if (!has(key))
    return out;
  const json::Array *a = obj_.get(key)->getAsArray();
  if (!a) {
    invalid(key, "a list of strings");
    return out;
  }
  for (const json::Value &v : *a) {
    auto s = v.getAsString();
    if (!s) {
      invalid(key, "a list of strings");
      return {};
    }
    out.push_back(s->str());
  }
  return out;
}

bool Config::has(StringRef key) const {
  const json::Value *v = obj_.get(key);
  return v && v->kind() != json::Value::Null;
}

void Config::divisible(StringRef aKey, int64_t a, StringRef bKey, int64_t b) {
  if (a > 0 && b > 0 && a % b != 0)
    diags_.report(DiagKind::InvalidValue, SMLoc(),
                  formatv("{0}: {1} = {2} is not a multiple of {3} = {4}", file_, aKey, a, bKey, b)
                      .str());
}

void Config::invalid(StringRef key, StringRef what) {
  diags_.report(DiagKind::InvalidValue, SMLoc(),
                (file_ + ": key '" + key + "' must be " + what).str());
}

void Config::unsupported(StringRef key, StringRef why) {
  diags_.report(DiagKind::InvalidValue, SMLoc(),
                (file_ + ": key '" + key + "' of model_type '" + family_ + "': " + why).str());
}

void Config::missing(StringRef key) {
  diags_.report(DiagKind::MissingSetting, SMLoc(),
                (file_ + ": missing key '" + key + "' (needed for model_type '" + family_ + "')")
                    .str());
}

int64_t Config::positive(StringRef key, const json::Value &v) {
  auto i = v.getAsInteger();
  // Sizes beyond 2^40 are no real model; the bound keeps every product tally forms checked.
  if (!i || *i <= 0 || *i > (int64_t(1) << 40)) {
    invalid(key, "a positive integer");
    return 0;
  }
  return *i;
}

void Config::noteDefault(StringRef key, const std::string &value, StringRef why) {
  defaults_.push_back((key + ": not given, " + value + (why.empty() ? "" : " (" + why + ")")).str());
}

// transformers' activations.py (ACT2CLS): gelu_new (NewGELUActivation), gelu_pytorch_tanh
// (PytorchGELUTanh: nn.functional.gelu(approximate="tanh")), gelu_fast (FastGELUActivation:
// tanh(x * 0.7978845608 * (1 + 0.044715 x^2)), the same polynomial with sqrt(2/pi) rounded to
// ten digits) and gelu_accurate (AccurateGELUActivation) are all
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): tally's `gelu_tanh`. `gelu`
// (GELUActivation: nn.functional.gelu) and `gelu_python` (x/2 (1 + erf(x / sqrt 2))) are the erf
// form: tally's `gelu`.
bool isTanhGelu(StringRef act) {
  return act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast" ||
         act == "gelu_accurate";
}

std::string activationOp(StringRef act) {
  if (act == "silu" || act == "swish")
    return "silu";
  if (isTanhGelu(act))
    return "gelu_tanh";
  if (act == "gelu" || act == "gelu_python")
    return "gelu"; // the erf form (ir/ops/Unary.def)
  if (act == "relu")
    return "relu";
  if (act == "tanh")
    return "tanh";
  if (act == "sigmoid")
    return "sigmoid";
  return "";
}

std::string activationName(StringRef act, StringRef op) {
  if (!isTanhGelu(act))
    return act.str();
  return (act + " (tally's `" + op + "`, the tanh approximation of GELU)").str();
}

std::string activationNote(StringRef act, StringRef op) {
  if (isTanhGelu(act))
    return "activation " + activationName(act, op);
  return ("activation " + act + " (tally's `" + op + "`)").str();
}

namespace {

/// The families tally imports, for messages.
constexpr const char *kFamilies =
    "llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3_text, phi3, olmo, olmo2, starcoder2, "
    "mixtral, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3, gpt2, gpt_neox, falcon, bert";

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
  // Longer prefixes first: "Qwen2Moe" before "Qwen2", "Gemma3" before "Gemma".
  static const Prefix table[] = {
      {"GPTNeoX", "gpt_neox"}, {"GPT2", "gpt2"},           {"Llama", "llama"},
      {"Mistral", "mistral"},  {"Mixtral", "mixtral"},     {"Qwen2Moe", "qwen2_moe"},
      {"Qwen3Moe", "qwen3_moe"}, {"Qwen2", "qwen2"},       {"Qwen3", "qwen3"},
      {"Gemma3ForCausalLM", "gemma3_text"}, {"Gemma3Text", "gemma3_text"},
      {"Gemma2", "gemma2"},    {"Gemma", "gemma"},         {"Phi3", "phi3"},
      {"Olmo2", "olmo2"},      {"Olmo", "olmo"},           {"Starcoder2", "starcoder2"},
      {"Falcon", "falcon"},    {"Bert", "bert"},           {"DeepseekV2", "deepseek_v2"},
      {"DeepseekV3", "deepseek_v3"}};
  for (const Prefix &p : table)
    if (arch.startswith(p.prefix))
      return p.family;
  return "";
}

/// Step 5: what the plans' targets are sized from, counted by tally itself (countParams) on
/// the generated model under a stand-in one-token plan: all parameters, the experts' weights,
/// the fewest experts an MoE op stacks. Nothing (and the families' default targets) if that
/// does not compile.
struct Sizing {
  double params = 0, expertParams = 0;
  int64_t experts = 0;
};

std::optional<Sizing> sizeModel(const Generated &g, const std::string &text) {
  Compilation c;
  c.diags.setOutput(nullptr);
  std::string source = text + "infer sizing { model = " + g.modelCall +
                       " prompt = 1 precision = bf16 target = H100_SXM }\n";
  const PlanDecl *decl = c.addSource("import-hf sizing", source) ? c.pickPlan("sizing") : nullptr;
  if (!decl || !c.lower(*decl))
    return std::nullopt;
  Analysis a;
  a.graph = &*c.graph;
  a.plan = &*c.plan;
  countParams(a);
  Sizing z{a.params.total, a.params.expert, 0};
  for (const Op &op : c.graph->ops)
    if (op.kind == OpKind::Moe && op.inputs.size() >= 6) {
      int64_t e = c.graph->tensors[op.inputs[3]].shape[0].size;
      z.experts = z.experts == 0 ? e : std::min(z.experts, e);
    }
  return z;
}

/// Three quarters of an H100's 80 GB are left for the model's states or weights, the rest for
/// activations (or the cache and the prefill), the workspace and the allocator.
constexpr double kStatesPerDevice = 60e9;

/// The training plan's target: the family's (8 data-parallel devices, 16 for a mixture of
/// experts, ZeRO 3), doubled until mixed_bf16 AdamW's 16 bytes per parameter (bf16 weights and
/// gradients, fp32 master weights and two moments), sharded over the devices, fit
/// kStatesPerDevice (DeepSeek-V3: 671B × 16 B over 256 devices).
std::string trainTarget(const Generated &g, const std::optional<Sizing> &z) {
  int64_t n0 = 0;
  if (!z || StringRef(g.target).consumeInteger(10, n0) || n0 <= 0)
    return g.target;
  int64_t n = n0;
  while (16.0 * z->params / static_cast<double>(n) > kStatesPerDevice && n < (1 << 20))
    n *= 2;
  std::string from = std::to_string(n0), to = std::to_string(n);
  std::string t = g.target;
  StringRef rest = StringRef(t).drop_front(from.size());
  std::string out = to + rest.str();
  size_t at = out.find("data = " + from);
  if (at != std::string::npos)
    out.replace(at, 7 + from.size(), "data = " + to);
  return out;
}

/// The serving plan's target: the bf16 weights within kStatesPerDevice. A mixture of experts
/// puts n = 1, 2, 4, ... devices side by side (`data = n, expert = n`, n dividing the experts),
/// each holding the dense weights and 1/n of the experts; a dense model splits over up to 8
/// tensor ranks, then pipeline stages. One H100 when the model fits (or was not sized).
std::string serveTarget(const std::optional<Sizing> &z) {
  if (!z)
    return "H100_SXM";
  const double bytes = 2.0;
  double dense = (z->params - z->expertParams) * bytes, expert = z->expertParams * bytes;
  if (z->experts > 0) {
    int64_t n = 1;
    while (dense + expert / static_cast<double>(n) > kStatesPerDevice && n * 2 <= z->experts &&
           z->experts % (n * 2) == 0)
      n *= 2;
    return n == 1 ? "H100_SXM" : fillText("{0} x H100_SXM { data = {0}, expert = {0} }", n);
  }
  double need = (dense + expert) / kStatesPerDevice;
  int64_t t = 1, p = 1;
  while (static_cast<double>(t) < need && t < 8)
    t *= 2;
  while (static_cast<double>(t * p) < need && p < 64)
    p *= 2;
  if (t == 1)
    return "H100_SXM";
  if (p == 1)
    return fillText("{0} x H100_SXM { tensor = {0} }", t);
  return fillText("{0} x H100_SXM { tensor = {1}, pipeline = {2} }", t * p, t, p);
}

/// Step 5: the two plans, `train pretrain` and `infer serve`, after the model.
std::string planText(const Generated &g, const std::optional<Sizing> &sizing) {
  std::string text;
  text += fillText(R"(// A starting plan of stated defaults: edit the batch, sequence length, tokens, optimizer,
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
                 g.modelCall, g.seq, trainTarget(g, sizing));
  int64_t context = std::min<int64_t>(g.context, 8192);
  // An encoder (no causal attention) generates nothing and caches nothing: its plan is the
  // forward over the input (passes/Inference.cpp step 8), and it says so.
  std::string what = g.encoder
                         ? "Encoding one sequence of {1} tokens{2} in bf16: an encoder (no causal\n"
                           "// attention) keeps no KV cache and generates nothing, so the plan has no "
                           "`generate`;\n// `tally report --plan serve` shows its forward's FLOPs and "
                           "tokens per second."
                         : "Serving one sequence of {1} tokens{2} in bf16, prefilled:\n"
                           "// `tally report --plan serve` shows its FLOPs and its KV cache per token.";
  text += fillText("\n// " + what + R"( The target is the
// fewest H100s that hold the weights in three quarters of each.
infer serve {
  model     = {0}
  batch     = 1
  prompt    = {1}
  precision = bf16
  target    = {3}
}
)",
                 g.modelCall, context,
                 context < 8192 ? " (the model's whole context)" : "",
                 serveTarget(sizing));
  return text;
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
  if (family == "gemma3") {
    diags.report(DiagKind::InvalidValue, SMLoc(),
                 File + ": model_type 'gemma3' is the vision-language model; tally imports its "
                        "language model: write the config's text_config (model_type "
                        "'gemma3_text') as a file of its own");
    return 1;
  }

  // Step 3: the keys, family by family.
  Config c(*obj, File, family, diags);
  std::optional<Generated> g;
  std::string actKey = "hidden_act";
  if (isDecoderFamily(family)) {
    g = decoderFamily(c, family);
    if (family == "gemma" || family == "gemma2" || family == "gemma3_text")
      actKey = "hidden_activation";
  } else if (family == "gpt2") {
    g = gpt2Family(c);
    actKey = "activation_function";
  } else if (family == "gpt_neox") {
    g = neoxFamily(c);
  } else if (family == "deepseek_v2" || family == "deepseek_v3") {
    g = deepseekFamily(c, family == "deepseek_v3");
  } else if (family == "falcon") {
    g = falconFamily(c);
    actKey = "activation";
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
  std::string text;
  raw_string_ostream os(text);
  os << "// Imported by `tally import-hf` from " << sys::path::filename(File) << ": model_type '"
     << family << "'" << (arch.empty() ? "" : ", " + arch) << ".\n";
  os << g->header;
  for (const std::string &d : c.defaults())
    os << "// " << d << "\n";
  os << "\n" << g->blocks << "\n" << g->model << "\n";
  os << planText(*g, sizeModel(*g, os.str()));
  out->os() << os.str();
  if (!out->commit(error)) {
    diags.report(DiagKind::IoError, SMLoc(), error);
    return kOutputErrorExit;
  }
  return 0;
}

} // namespace
} // namespace importhf

int runImportHF() {
  if (!importopts::ImportHF)
    return -1;
  return importhf::importHF();
}

} // namespace tally
