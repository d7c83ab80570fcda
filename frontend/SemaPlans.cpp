// Semantic analysis: plans. resolvePlan reads a train/infer declaration into a checked Plan:
// each setting goes through a table with one handler per setting name (the plans that take
// it, and the function that checks its value and applies it), then the budgets; the
// command-line overrides (PlanOverrides: --batch, --micro-batch, --checkpoint, --precision,
// --target) go through the same handlers. The precision and optimizer records are read here;
// the target's record is SemaParallel.cpp, the checkpoint policies SemaCheckpoint.cpp.
#include "frontend/Parser.h"
#include "frontend/Sema.h"
#include "support/Format.h"
#include "support/Suggest.h"

#include <algorithm>
#include <cmath>

namespace tally {

std::optional<Dtype> Sema::dtypeSetting(const ConstValue &v, const char *what) {
  if (v.kind == ConstValue::Word) {
    if (auto d = parseDtype(v.text))
      return d;
  }
  std::string message =
      std::string(what) + " must be a dtype such as fp32, bf16 or fp16, not " + v.describe();
  if (v.kind == ConstValue::Word)
    suggest(DiagKind::UnknownDtype, v.range, message, v.text, dtypeSpellings())
        .note(llvm::SMLoc(), "the dtypes are: " + choiceList(dtypeNames()));
  else
    diags.report(DiagKind::UnknownDtype, v.range.Start, message).range(v.range);
  return std::nullopt;
}

bool Sema::precision(const ConstValue &v, PrecisionPolicy &out) {
  out.range = v.range;
  if (v.kind == ConstValue::Word) {
    auto preset = precisionPreset(v.text);
    if (!preset) {
      unknownChoice(v.range, "precision", "precisions", v.text, precisionPresetNames());
      return false;
    }
    out = *preset;
    out.range = v.range;
    return true;
  }
  if (v.kind != ConstValue::Record) {
    diags.report(DiagKind::TypeMismatch, v.range.Start,
                 "precision is a preset (fp32, bf16, mixed_bf16, ...) or a record such as "
                 "{ params = bf16, optimizer = fp32 }, not " + v.describe())
        .range(v.range);
    return false;
  }
  out.preset = "custom";
  out.master = Dtype::Invalid;
  bool ok = true, sawActivations = false, sawGrads = false;
  for (size_t i = 0; i < v.elems.size(); ++i) {
    const std::string &k = v.names[i];
    const ConstValue &e = v.elems[i];
    bool host = v.placements[i] == "host";
    if (k == "loss_scaling") {
      if (e.kind != ConstValue::Bool) {
        diags.report(DiagKind::TypeMismatch, e.range.Start, "loss_scaling is true or false")
            .range(e.range);
        ok = false;
      }
      out.lossScaling = e.boolean;
      continue;
    }
    if (k == "base") {
      if (host) {
        diags.report(DiagKind::InvalidValue, v.ranges[i].Start,
                     "the frozen base weights cannot live on the host in this version")
            .range(v.ranges[i]);
        ok = false;
      }
      ok &= frozenStorage(e, out.frozen);
      out.frozenRange = v.ranges[i];
      continue;
    }
    if (k == "fp8") {
      ok &= fp8Recipe(e, out.fp8);
      out.fp8.range = v.ranges[i];
      continue;
    }
    if (k == "master" && e.kind == ConstValue::Word && e.text == "none") {
      out.master = Dtype::Invalid;
      continue;
    }
    Dtype *slot = k == "params" ? &out.params
                  : k == "grads" ? &out.grads
                  : k == "activations" ? &out.activations
                  : k == "master" ? &out.master
                  : k == "optimizer" ? &out.optimizer
                                     : nullptr;
    if (!slot) {
      unknownName(v.nameRanges[i], "tensor class", k,
                  {"params", "grads", "activations", "master", "optimizer", "loss_scaling",
                   "base", "fp8"});
      ok = false;
      continue;
    }
    auto d = dtypeSetting(e, ("'" + k + "'").c_str());
    if (!d) {
      ok = false;
      continue;
    }
    if (!isFloat(*d)) {
      diags.report(DiagKind::UnknownDtype, e.range.Start,
                   "'" + k + "' must be a floating-point dtype (fp32, tf32, bf16, fp16, fp8_e4m3, "
                   "fp8_e5m2), not " + nameOf(*d).str())
          .range(e.range);
      ok = false;
      continue;
    }
    *slot = *d;
    sawActivations |= k == "activations";
    sawGrads |= k == "grads";
    if (k == "params") out.paramsOnHost = host;
    if (k == "grads") out.gradsOnHost = host;
    if (k == "master") out.masterOnHost = host;
    if (k == "optimizer") out.optimizerOnHost = host;
    if (k == "activations" && host) {
      diags.report(DiagKind::InvalidValue, v.ranges[i].Start,
                   "activations cannot live on the host in this version")
          .range(v.ranges[i]);
      ok = false;
    }
  }
  if (!sawActivations)
    out.activations = out.params;
  if (!sawGrads)
    out.grads = out.params;
  return ok;
}

namespace {

/// A positive integer setting of a record (a block size, a rank); nullopt after reporting.
std::optional<int64_t> positiveInteger(DiagnosticEngine &diags, const ConstValue &e,
                                       const std::string &what) {
  if (e.kind == ConstValue::Number && e.isInteger && e.dim == UnitDim::None && e.intValue > 0)
    return e.intValue;
  diags.report(DiagKind::InvalidValue, e.range.Start,
               what + " must be a positive integer, not " + e.describe())
      .range(e.range);
  return std::nullopt;
}

} // namespace

bool Sema::frozenStorage(const ConstValue &v, QuantSpec &out) {
  auto storage = [&](const ConstValue &e) -> bool {
    auto d = dtypeSetting(e, "'base'");
    if (!d)
      return false;
    if (!isQuantized(*d) && !isFloat(*d)) {
      diags.report(DiagKind::UnknownDtype, e.range.Start,
                   "'base' must be a quantized storage dtype (nf4, int4, int8) or a float "
                   "dtype, not " + nameOf(*d).str())
          .range(e.range);
      return false;
    }
    out = isQuantized(*d) ? defaultQuant(*d) : QuantSpec{};
    out.dtype = *d;
    return true;
  };
  if (v.kind != ConstValue::Record)
    return storage(v);
  bool ok = true, sawDtype = false;
  for (size_t i = 0; i < v.elems.size(); ++i)
    if (v.names[i] == "dtype")
      ok &= sawDtype = storage(v.elems[i]);
  if (!sawDtype && ok) {
    diags.report(DiagKind::MissingSetting, v.range.Start,
                 "a 'base' record names its storage dtype: { dtype = nf4, block = 64 }")
        .range(v.range);
    return false;
  }
  for (size_t i = 0; i < v.elems.size() && ok; ++i) {
    const std::string &k = v.names[i];
    const ConstValue &e = v.elems[i];
    if (k == "dtype")
      continue;
    if (k == "block") {
      auto n = positiveInteger(diags, e, "'block'");
      ok &= n.has_value();
      out.block = n.value_or(out.block);
    } else if (k == "scale") {
      auto d = dtypeSetting(e, "'scale'");
      if (d && !isFloat(*d)) {
        diags.report(DiagKind::UnknownDtype, e.range.Start,
                     "'scale' must be a floating-point dtype, not " + nameOf(*d).str())
            .range(e.range);
        d.reset();
      }
      ok &= d.has_value();
      out.scale = d.value_or(out.scale);
    } else if (k == "double_quant") {
      if (e.kind == ConstValue::Bool) {
        out.doubleBlock = e.boolean ? 256 : 0;
      } else {
        auto n = positiveInteger(diags, e, "'double_quant' (true, false or a block size)");
        ok &= n.has_value();
        out.doubleBlock = n.value_or(out.doubleBlock);
      }
    } else {
      unknownName(v.nameRanges[i], "base weight storage setting", k,
                  {"dtype", "block", "scale", "double_quant"});
      ok = false;
    }
  }
  if (ok && !isQuantized(out.dtype) && v.elems.size() > 1) {
    diags.report(DiagKind::InvalidValue, v.range.Start,
                 "block, scale and double_quant describe quantized storage (nf4, int4, int8), "
                 "not " + nameOf(out.dtype).str())
        .range(v.range);
    ok = false;
  }
  return ok;
}

bool Sema::fp8Recipe(const ConstValue &v, Fp8Recipe &out) {
  static const std::vector<std::string> formats = {"hybrid", "e4m3"};
  static const std::vector<std::string> scalings = {"delayed", "mxfp8", "current"};
  auto word = [&](const ConstValue &e, const char *what, const char *plural,
                  const std::vector<std::string> &choices) -> int {
    for (size_t c = 0; e.kind == ConstValue::Word && c < choices.size(); ++c)
      if (e.text == choices[c])
        return static_cast<int>(c);
    if (e.kind == ConstValue::Word)
      unknownChoice(e.range, what, plural, e.text, choices);
    else
      diags.report(DiagKind::TypeMismatch, e.range.Start,
                   std::string(what) + " is one of " + choiceList(choices) + ", not " + e.describe())
          .range(e.range);
    return -1;
  };
  auto format = [&](const ConstValue &e) {
    int f = word(e, "fp8 format", "fp8 formats", formats);
    out.format = f == 0 ? Fp8Recipe::Format::Hybrid : Fp8Recipe::Format::E4M3;
    return f >= 0;
  };
  if (v.kind != ConstValue::Record)
    return format(v);
  bool ok = true, sawFormat = false;
  out.format = Fp8Recipe::Format::Hybrid; // Transformer Engine's default (Format.HYBRID)
  for (size_t i = 0; i < v.elems.size(); ++i) {
    const std::string &k = v.names[i];
    const ConstValue &e = v.elems[i];
    if (k == "format") {
      ok &= sawFormat = format(e);
    } else if (k == "scaling") {
      int s = word(e, "fp8 scaling", "fp8 scalings", scalings);
      ok &= s >= 0;
      out.scaling = s == 1 ? Fp8Recipe::Scaling::Block : s == 2 ? Fp8Recipe::Scaling::Current : Fp8Recipe::Scaling::Delayed;
    } else if (k == "amax_history") {
      auto n = positiveInteger(diags, e, "'amax_history'");
      ok &= n.has_value();
      out.amaxHistory = n.value_or(out.amaxHistory);
    } else if (k == "keep_first_last_bf16") {
      if (e.kind != ConstValue::Bool) {
        diags.report(DiagKind::TypeMismatch, e.range.Start, "keep_first_last_bf16 is true or false")
            .range(e.range);
        ok = false;
      }
      out.keepFirstLastBf16 = e.boolean;
    } else if (k == "param_gather") {
      if (e.kind != ConstValue::Bool) {
        diags.report(DiagKind::TypeMismatch, e.range.Start, "param_gather is true or false").range(e.range);
        ok = false;
      }
      out.paramGather = e.boolean;
    } else {
      unknownName(v.nameRanges[i], "fp8 recipe setting", k,
                  {"format", "amax_history", "scaling", "keep_first_last_bf16", "param_gather"});
      ok = false;
    }
  }
  (void)sawFormat;
  return ok;
}

bool Sema::lora(const ConstValue &v, LoraSpec &out) {
  if (v.kind != ConstValue::Record) {
    diags.report(DiagKind::TypeMismatch, v.range.Start,
                 "lora is a record such as { r = 16, alpha = 32, targets = [q, v] }, not " +
                     v.describe())
        .range(v.range);
    return false;
  }
  bool ok = true, sawR = false, sawTargets = false, sawAlpha = false;
  for (size_t i = 0; i < v.elems.size(); ++i) {
    const std::string &k = v.names[i];
    const ConstValue &e = v.elems[i];
    if (k == "r") {
      auto n = positiveInteger(diags, e, "the LoRA rank 'r'");
      ok &= sawR = n.has_value();
      out.r = n.value_or(0);
    } else if (k == "alpha") {
      if (e.kind != ConstValue::Number || e.dim != UnitDim::None || !(e.number > 0)) {
        diags.report(DiagKind::InvalidValue, e.range.Start,
                     "'alpha' must be a positive number, not " + e.describe())
            .range(e.range);
        ok = false;
        continue;
      }
      sawAlpha = true;
      out.alpha = e.number;
    } else if (k == "targets") {
      std::vector<const ConstValue *> words;
      if (e.kind == ConstValue::Tuple)
        for (const ConstValue &w : e.elems)
          words.push_back(&w);
      else
        words.push_back(&e);
      for (const ConstValue *w : words) {
        if (w->kind != ConstValue::Word) {
          diags.report(DiagKind::TypeMismatch, w->range.Start,
                       "lora targets are the member names of Linear layers, such as [q, v], not " +
                           w->describe())
              .range(w->range);
          ok = false;
          continue;
        }
        out.targets.push_back(w->text);
        out.targetRanges.push_back(w->range);
      }
      sawTargets = !out.targets.empty();
    } else {
      unknownName(v.nameRanges[i], "lora setting", k, {"r", "alpha", "targets"});
      ok = false;
    }
  }
  if (ok && (!sawR || !sawTargets)) {
    diags.report(DiagKind::MissingSetting, v.range.Start,
                 std::string("lora needs ") + (!sawR ? "its rank r" : "its targets") +
                     ": { r = 16, alpha = 32, targets = [q, v] }")
        .range(v.range);
    ok = false;
  }
  if (ok && !sawAlpha)
    out.alpha = static_cast<double>(out.r); // PEFT's default lora_alpha is 8 = its default r
  return ok;
}

bool Sema::optimizer(const ConstValue &v, OptimizerSpec &out) {
  std::string name = v.kind == ConstValue::Call || v.kind == ConstValue::Word ? v.text : "";
  auto preset = optimizerPreset(name);
  if (!preset) {
    if (name.empty())
      diags.report(DiagKind::TypeMismatch, v.range.Start,
                   "optimizer must be SGD, AdaGrad, RMSprop, Adam, AdamW or Lion, not " +
                       v.describe())
          .range(v.range);
    else
      unknownChoice(v.nameRange.isValid() ? v.nameRange : v.range, "optimizer", "optimizers",
                    name, optimizerNames());
    return false;
  }
  out = *preset;
  out.range = v.range;
  bool ok = true;
  for (size_t i = 0; i < v.elems.size(); ++i) {
    const std::string &k = i < v.names.size() ? v.names[i] : "";
    const ConstValue &e = v.elems[i];
    llvm::SMRange r = v.ranges[i];
    std::string key = k.empty() && i == 0 ? "lr" : k;
    if (key == "betas") {
      if (e.kind != ConstValue::Tuple || e.elems.size() != 2 ||
          e.elems[0].kind != ConstValue::Number || e.elems[1].kind != ConstValue::Number) {
        diags.report(DiagKind::TypeMismatch, r.Start, "betas is a pair such as (0.9, 0.95)")
            .range(r);
        ok = false;
        continue;
      }
      out.beta1 = e.elems[0].number;
      out.beta2 = e.elems[1].number;
      continue;
    }
    double *slot = key == "lr" ? &out.lr
                   : key == "momentum" ? &out.momentum
                   : key == "eps" ? &out.eps
                   : key == "weight_decay" ? &out.weightDecay
                                           : nullptr;
    if (!slot) {
      std::string close = closestName(key, {"lr", "momentum", "betas", "eps", "weight_decay"});
      llvm::SMRange at = i < v.nameRanges.size() ? v.nameRanges[i] : r;
      auto d = diags.report(DiagKind::UnknownArgument, at.Start,
                            key.empty() ? "only the learning rate may be given without a name"
                                        : "unknown optimizer argument '" + key + "'" +
                                              didYouMean(close));
      d.range(at);
      if (!key.empty() && !close.empty())
        d.fixit(at, close);
      ok = false;
      continue;
    }
    if (e.kind != ConstValue::Number || e.dim != UnitDim::None) {
      diags.report(DiagKind::TypeMismatch, r.Start,
                   "'" + key + "' must be a plain number, not " + e.describe())
          .range(r);
      ok = false;
      continue;
    }
    *slot = e.number;
    if (key == "eps")
      out.epsRange = r;
  }
  out.states = optimizerStates(out);
  return ok;
}

const BlockDecl *Sema::planModel(const Program &p, const PlanDecl &d, ConstValue &call) {
  for (const SettingAST &s : d.settings) {
    if (s.key != "model")
      continue;
    ConstEnv env;
    call = eval(*s.value, env);
    if (call.kind == ConstValue::Invalid)
      return nullptr;
    if (call.kind != ConstValue::Call && call.kind != ConstValue::Word) {
      diags.report(DiagKind::TypeMismatch, call.range.Start,
                   "model is a model name, optionally with arguments: GPT2(layers = 24)")
          .range(call.range);
      return nullptr;
    }
    auto it = p.blocks.find(call.text);
    if (it == p.blocks.end()) {
      std::vector<std::string> names;
      for (const auto &kv : p.blocks)
        names.push_back(kv.getKey().str());
      unknownName(call.nameRange.isValid() ? call.nameRange : call.range, "model", call.text,
                  names);
      return nullptr;
    }
    return it->second;
  }
  diags.report(DiagKind::MissingSetting, d.nameRange.Start,
               "plan '" + d.name + "' does not say which model it runs (for example "
               "model = GPT2())")
      .range(d.nameRange);
  return nullptr;
}

/// The state of one train/infer declaration while resolvePlan reads it. Each handler checks
/// one setting and applies it to `plan`, returning false (after reporting) when it is wrong.
struct PlanResolver {
  PlanResolver(Sema &sema, const Program &program, const PlanDecl &decl, const PlanOverrides &o)
      : sema(sema), program(program), decl(decl), o(o) {
    plan.isTrain = decl.isTrain;
    plan.name = decl.name;
    plan.range = decl.range;
  }

  Sema &sema;
  const Program &program;
  const PlanDecl &decl;
  const PlanOverrides &o;
  Plan plan;
  ConstEnv env;
  bool sawTarget = false, sawPrecision = false, sawBatch = false;
  Dtype gradDtype = Dtype::Invalid; // `grad_dtype`, checked against the final precision below
  llvm::SMRange maxContextRange;    // `max_context`, checked against prompt + generate below
  llvm::SMRange gradDtypeRange;

  /// An fp8 recipe needs a target with FP8 tensor cores (Transformer Engine refuses fp8 below
  /// compute capability 8.9, so such a plan cannot run at all: an error, not a bf16 estimate),
  /// and MXFP8 block scaling a Blackwell part (compute capability 10.0 or later).
  bool checkFp8Target() {
    const Fp8Recipe &r = plan.precision.fp8;
    if (!r.enabled())
      return true;
    llvm::SMRange at = r.range.isValid() ? r.range : plan.precision.range;
    if (!at.isValid())
      at = decl.nameRange;
    const Target &t = plan.target;
    if (t.peakFP8 <= 0) {
      sema.diags.report(DiagKind::InvalidValue, at.Start,
                        "fp8 training needs FP8 tensor cores, and " + t.name +
                            " states no fp8 rate: its GEMMs would run at the bf16 rate, "
                            "and Transformer Engine refuses fp8 on it")
          .range(at)
          .note(llvm::SMLoc(), "Transformer Engine runs fp8 on compute capability 8.9 and later "
                               "(Ada, Hopper, Blackwell); on this target use precision = "
                               "mixed_bf16, or give a declared target an fp8 peak");
      return false;
    }
    if (r.scaling == Fp8Recipe::Scaling::Block && t.computeCapability < 100) {
      std::string cc = t.computeCapability > 0
                           ? "compute capability " + std::to_string(t.computeCapability / 10) +
                                 "." + std::to_string(t.computeCapability % 10)
                           : "no stated compute capability";
      sema.diags.report(DiagKind::InvalidValue, at.Start,
                        "scaling = mxfp8 (block scaling) needs a Blackwell GPU (compute capability 10.0 "
                        "or later); " + t.name + " has " + cc)
          .range(at)
          .note(llvm::SMLoc(), "MXFP8's E8M0 block scales are a Blackwell tensor-core format; "
                               "on Hopper use scaling = delayed");
      return false;
    }
    return true;
  }

  // Settings read from their expression.
  bool model(const Expr &) {
    ConstValue call;
    const BlockDecl *b = sema.planModel(program, decl, call);
    if (!b)
      return false;
    plan.modelName = b->name;
    return true;
  }
  bool checkpoint(const Expr &e) {
    auto policy = sema.checkpointPolicy(e, env);
    if (!policy)
      return false;
    plan.checkpoint = *policy;
    return true;
  }

  // Settings read from their constant value.
  std::optional<int64_t> count(const ConstValue &v, const char *key) {
    return sema.positiveInt(v, key);
  }
  /// `batch = N`, or `concurrent = N` (`key`), its serving name in an infer plan (issue 45;
  /// passes/Inference.cpp servingCapacity): the sequences decoded together. The file may say
  /// one of the two (`other`).
  bool sequences(const ConstValue &v, const std::string &key, const std::string &other) {
    auto n = count(v, ("'" + key + "'").c_str());
    if (!n)
      return false;
    auto at = plan.settingRanges.find(other);
    if (at != plan.settingRanges.end() && at->second.isValid() && v.range.isValid()) {
      sema.diags.report(DiagKind::DuplicateName, v.range.Start,
                        "'" + key + "' and '" + other + "' both say how many sequences an infer "
                        "plan decodes together; give one of them")
          .range(v.range)
          .note(at->second.Start, other + " is given here");
      return false;
    }
    plan.batch = *n, sawBatch = true;
    return true;
  }
  bool seq(const ConstValue &v) {
    auto n = count(v, "'seq'");
    if (n)
      plan.seq = *n;
    return n.has_value();
  }
  bool microBatch(const ConstValue &v) {
    auto n = count(v, "'micro_batch'");
    if (n)
      plan.microBatch = *n, plan.microBatchGiven = true;
    return n.has_value();
  }
  bool prompt(const ConstValue &v) {
    auto n = count(v, "'prompt'");
    if (n)
      plan.prompt = *n;
    return n.has_value();
  }
  bool generate(const ConstValue &v) {
    auto n = count(v, "'generate'");
    if (n)
      plan.generate = *n;
    return n.has_value();
  }
  bool batch(const ConstValue &v) { return sequences(v, "batch", "concurrent"); }
  bool concurrent(const ConstValue &v) { return sequences(v, "concurrent", "batch"); }
  bool maxContext(const ConstValue &v) {
    auto n = count(v, "'max_context'");
    if (n)
      plan.maxContext = *n, maxContextRange = v.range;
    return n.has_value();
  }
  /// `kv_block = 16`: tokens per block of the paged cache; a power of two, as the block sizes
  /// of vLLM's paged-attention kernels (8, 16, 32, ...) are.
  bool kvBlock(const ConstValue &v) {
    auto n = count(v, "'kv_block'");
    if (!n)
      return false;
    if ((*n & (*n - 1)) != 0) {
      sema.diags.report(DiagKind::InvalidValue, v.range.Start,
                        "kv_block = " + std::to_string(*n) +
                            " is not a power of two: paged-attention kernels (vLLM's) take "
                            "blocks of 8, 16, 32, ... tokens")
          .range(v.range);
      return false;
    }
    plan.kvBlock = *n;
    return true;
  }
  /// `kv_dtype = fp8_e4m3`: the dtype K and V are cached in: a float dtype a KV cache is kept
  /// in (vLLM's kv_cache_dtype: the model's, or fp8 e4m3 / e5m2).
  bool kvDtype(const ConstValue &v) {
    std::optional<Dtype> d = sema.dtypeSetting(v, "'kv_dtype'");
    if (!d)
      return false;
    static const Dtype kCache[] = {Dtype::F32, Dtype::BF16, Dtype::F16, Dtype::FP8E4M3,
                                   Dtype::FP8E5M2};
    if (std::find(std::begin(kCache), std::end(kCache), *d) == std::end(kCache)) {
      std::string choices;
      for (Dtype c : kCache)
        choices += (choices.empty() ? "" : ", ") + nameOf(c).str();
      sema.diags.report(DiagKind::UnknownDtype, v.range.Start,
                        "kv_dtype " + nameOf(*d).str() +
                            " is not a dtype a KV cache is kept in; the choices are " + choices)
          .range(v.range);
      return false;
    }
    plan.kvDtype = *d;
    return true;
  }
  bool tokens(const ConstValue &v) {
    if (v.kind != ConstValue::Number || v.dim != UnitDim::None || v.number <= 0) {
      sema.diags.report(DiagKind::UnitMismatch, v.range.Start,
                        "tokens is a positive count such as 10B, not " + v.describe())
          .range(v.range);
      return false;
    }
    if (v.number < 1 || v.number != std::floor(v.number)) { // 1.5B is a count, 0.5 is not
      sema.diags.report(DiagKind::InvalidValue, v.range.Start,
                        "tokens is a whole number of tokens such as 10B, not " + significant(v.number))
          .range(v.range);
      return false;
    }
    plan.tokens = v.number;
    return true;
  }
  bool optimizer(const ConstValue &v) { return sema.optimizer(v, plan.optimizer); }
  bool precision(const ConstValue &v) {
    sawPrecision = true;
    return sema.precision(v, plan.precision);
  }
  bool lora(const ConstValue &v) { return sema.lora(v, plan.lora); }
  bool gradDtypeSetting(const ConstValue &v) {
    std::optional<Dtype> d = sema.dtypeSetting(v, "'grad_dtype'");
    gradDtypeRange = v.range;
    if (d && !isFloat(*d)) {
      sema.diags.report(DiagKind::UnknownDtype, v.range.Start,
                        "'grad_dtype' must be a floating-point dtype such as fp32")
          .range(v.range);
      d.reset();
    }
    gradDtype = d.value_or(Dtype::Invalid);
    return d.has_value();
  }
  bool target(const ConstValue &v) {
    sawTarget = true;
    return sema.parallel(program, v, plan);
  }

  bool readSettings();
  bool readBudget(const BudgetItemAST &b);
  bool applyOverrides();
  std::optional<Plan> finish();
};

namespace {

/// One setting of a plan: the plans that take it, and the handler that checks and applies
/// it, from its constant value (`apply`) or from its expression (`read`).
struct PlanSetting {
  const char *key;
  bool train, infer;
  bool (PlanResolver::*apply)(const ConstValue &v) = nullptr;
  bool (PlanResolver::*read)(const Expr &e) = nullptr;
};

/// Every plan setting, in the order an unknown one's suggestions are weighed.
const std::vector<PlanSetting> &planSettings() {
  using R = PlanResolver;
  static const std::vector<PlanSetting> table = {
      {"model", true, true, nullptr, &R::model},
      {"batch", true, true, &R::batch},
      {"seq", true, false, &R::seq},
      {"micro_batch", true, false, &R::microBatch},
      {"prompt", false, true, &R::prompt},
      {"generate", false, true, &R::generate},
      {"concurrent", false, true, &R::concurrent},
      {"max_context", false, true, &R::maxContext},
      {"kv_block", false, true, &R::kvBlock},
      {"kv_dtype", false, true, &R::kvDtype},
      {"tokens", true, false, &R::tokens},
      {"optimizer", true, false, &R::optimizer},
      {"precision", true, true, &R::precision},
      {"checkpoint", true, false, nullptr, &R::checkpoint},
      {"target", true, true, &R::target},
      {"grad_dtype", true, false, &R::gradDtypeSetting},
      {"lora", true, false, &R::lora},
  };
  return table;
}

/// The setting `key` of a train (or infer) plan; nullptr when that plan has no such setting.
const PlanSetting *findPlanSetting(llvm::StringRef key, bool isTrain) {
  for (const PlanSetting &s : planSettings())
    if (key == s.key)
      return (isTrain ? s.train : s.infer) ? &s : nullptr;
  return nullptr;
}

std::vector<std::string> planSettingNames(bool isTrain) {
  std::vector<std::string> keys;
  for (const PlanSetting &s : planSettings())
    if (isTrain ? s.train : s.infer)
      keys.push_back(s.key);
  return keys;
}

/// Command-line overrides of plain settings become settings of their own, read after the
/// file's: the same handlers validate both (so --checkpoint=foo and --batch 0 are errors, as in
/// a file). They have no source location, so their diagnostics print as "tally: error: ...".
std::vector<SettingAST> overrideSettings(const PlanOverrides &o) {
  std::vector<SettingAST> cli;
  auto addCli = [&](const char *key, ExprKind k, const std::string &text, double number) {
    SettingAST s;
    s.key = key;
    s.value = std::make_unique<Expr>(k, llvm::SMRange());
    s.value->text = text;
    s.value->number = number;
    s.value->isInteger = k == ExprKind::Number;
    cli.push_back(std::move(s));
  };
  if (!o.checkpoint.empty())
    addCli("checkpoint", ExprKind::Name, o.checkpoint, 0);
  if (o.batch)
    addCli("batch", ExprKind::Number, std::to_string(*o.batch), double(*o.batch));
  if (o.microBatch)
    addCli("micro_batch", ExprKind::Number, std::to_string(*o.microBatch), double(*o.microBatch));
  if (o.maxContext)
    addCli("max_context", ExprKind::Number, std::to_string(*o.maxContext), double(*o.maxContext));
  return cli;
}

/// --target: "8 x H100_SXM" is a device count and a name, anything else a name.
ConstValue targetOverride(const std::string &target) {
  ConstValue v;
  llvm::StringRef spec(target);
  auto x = spec.find('x');
  int64_t n = 0;
  if (x != llvm::StringRef::npos && !spec.substr(0, x).trim().getAsInteger(10, n)) {
    v.kind = ConstValue::Device;
    v.number = static_cast<double>(n);
    v.intValue = n;
    v.isInteger = true;
    v.text = spec.substr(x + 1).trim().str();
  } else {
    v.kind = ConstValue::Word;
    v.text = target;
  }
  return v;
}

} // namespace

/// The file's settings, then the overrides of plain settings; false when any is wrong.
bool PlanResolver::readSettings() {
  bool ok = true;
  std::vector<SettingAST> cli = overrideSettings(o);
  std::vector<const SettingAST *> settings;
  for (const SettingAST &s : decl.settings)
    settings.push_back(&s);
  for (const SettingAST &s : cli)
    settings.push_back(&s);
  for (const SettingAST *sp : settings) {
    const SettingAST &s = *sp;
    bool fromCli = sp >= cli.data() && sp < cli.data() + cli.size();
    const PlanSetting *setting = findPlanSetting(s.key, decl.isTrain);
    if (fromCli && !setting)
      continue; // e.g. --checkpoint on an infer plan: nothing to override
    if (!fromCli && plan.settingRanges.count(s.key)) {
      sema.diags.report(DiagKind::DuplicateName, s.keyRange.Start,
                        "setting '" + s.key + "' is given twice")
          .range(s.keyRange)
          .note(plan.settingRanges[s.key].Start, "first given here");
      ok = false;
      continue;
    }
    // An override has no place in the file: diagnostics about it carry no location.
    plan.settingRanges[s.key] = fromCli ? llvm::SMRange() : s.range;
    if (!setting) {
      sema.suggest(DiagKind::UnknownSetting, s.keyRange,
                   "unknown setting '" + s.key + "' in " +
                       (decl.isTrain ? "a train" : "an infer") + " plan",
                   s.key, planSettingNames(decl.isTrain));
      ok = false;
      continue;
    }
    if (setting->read) {
      ok &= (this->*setting->read)(*s.value);
      continue;
    }
    ConstValue v = sema.eval(*s.value, env);
    if (v.kind == ConstValue::Invalid) {
      ok = false;
      continue;
    }
    // --precision and --target replace the file's value (applyOverrides): it is not checked.
    if ((s.key == "precision" && !o.precision.empty()) || (s.key == "target" && !o.target.empty()))
      continue;
    ok &= (this->*setting->apply)(v);
  }
  return ok;
}

namespace {

/// A budget's metric: its names in a file and the unit its bound is in.
struct BudgetKind {
  const char *name;
  BudgetMetric metric;
  UnitDim unit;
};

const BudgetKind kBudgets[] = {
    {"memory per device", BudgetMetric::MemoryPerDevice, UnitDim::Bytes},
    {"memory", BudgetMetric::MemoryPerDevice, UnitDim::Bytes},
    {"step time", BudgetMetric::StepTime, UnitDim::Time},
    {"mfu", BudgetMetric::Mfu, UnitDim::Ratio},
    {"run time", BudgetMetric::RunTime, UnitDim::Time},
};

} // namespace

bool PlanResolver::readBudget(const BudgetItemAST &b) {
  BudgetSpec spec;
  spec.range = b.range;
  spec.atMost = b.op[0] == '<';
  const BudgetKind *kind = std::find_if(std::begin(kBudgets), std::end(kBudgets),
                                        [&](const BudgetKind &k) { return b.metric == k.name; });
  if (kind == std::end(kBudgets)) {
    std::string close =
        closestName(b.metric, {"memory per device", "step time", "mfu", "run time"});
    sema.diags.report(DiagKind::UnknownSetting, b.range.Start,
                      "unknown budget '" + b.metric + "'" +
                          didYouMean(close))
        .range(b.range);
    return false;
  }
  spec.metric = kind->metric;
  UnitDim want = kind->unit;
  ConstValue v = sema.eval(*b.value, env);
  if (v.kind == ConstValue::Invalid)
    return false;
  bool fits = v.kind == ConstValue::Number &&
              (v.dim == want || (want == UnitDim::Ratio && v.dim == UnitDim::None &&
                                 v.number > 0 && v.number <= 1));
  if (!fits) {
    sema.diags.report(DiagKind::UnitMismatch, v.range.Start,
                      "budget '" + b.metric + "' is " + describe(want).str() + ", not " +
                          v.describe())
        .range(v.range);
    return false;
  }
  spec.value = v.number;
  plan.budgets.push_back(spec);
  return true;
}

/// --precision and --target replace what the file says, through the same handlers, after the
/// budgets (their diagnostics come last).
bool PlanResolver::applyOverrides() {
  bool ok = true;
  if (!o.precision.empty()) {
    ConstValue v;
    v.kind = ConstValue::Word;
    v.text = o.precision;
    ok &= (this->*findPlanSetting("precision", decl.isTrain)->apply)(v);
  }
  if (!o.target.empty()) {
    ConstValue v = targetOverride(o.target);
    if (o.target.find('{') != std::string::npos) {
      // A layout record, as in a file: parsed from a buffer of its own (one per text, shared
      // by the plans), so its diagnostics point into it.
      llvm::SourceMgr &sm = sema.diags.sourceMgr();
      unsigned id = 0;
      for (unsigned b = 1; b <= sm.getNumBuffers() && !id; ++b)
        if (sm.getMemoryBuffer(b)->getBufferIdentifier() == "--target" &&
            sm.getMemoryBuffer(b)->getBuffer() == o.target)
          id = b;
      if (!id)
        id = sm.AddNewSourceBuffer(llvm::MemoryBuffer::getMemBufferCopy(o.target, "--target"),
                                   llvm::SMLoc());
      ExprPtr e = parseExpression(id, sema.diags);
      v = e ? sema.eval(*e, env) : ConstValue();
      if (v.kind == ConstValue::Invalid)
        return false;
    }
    ok &= (this->*findPlanSetting("target", decl.isTrain)->apply)(v);
  }
  return ok;
}

/// What the settings must say together: a model, a target, a batch (train) or a prompt
/// (infer), a grad_dtype no narrower than the gradients; and the defaults that follow.
std::optional<Plan> PlanResolver::finish() {
  const PlanDecl &d = decl;
  if (plan.modelName.empty()) {
    ConstValue call;
    sema.planModel(program, d, call);
    return std::nullopt;
  }
  if (!sawTarget) {
    sema.diags.report(DiagKind::MissingSetting, d.nameRange.Start,
                      "plan '" + d.name +
                          "' does not say its target (for example target = H100_SXM)")
        .range(d.nameRange);
    return std::nullopt;
  }
  // On the calibrated host, every rank has its part of the one machine (docs/targets.md).
  plan.target.shareHost(plan.parallel.devices, o.hostThreads);
  plan.fuseKernels = o.fuseKernels || plan.parallel.compiled;
  plan.cudaStep = o.cudaStep, plan.padHead = o.padHead, plan.tensorStep = o.tensorStep && plan.isTrain && plan.parallel.tensor > 1;
  plan.generatedStep = o.generatedStep || o.cudaStep; // the CUDA step is tally's own too
  if (!sawPrecision)
    plan.precision.preset = "fp32";
  if (gradDtype != Dtype::Invalid && bytesOf(gradDtype) < bytesOf(plan.precision.grads)) {
    sema.diags.report(DiagKind::InvalidValue, gradDtypeRange.Start,
                      "grad_dtype " + nameOf(gradDtype).str() +
                          " is narrower than the gradients (" +
                          nameOf(plan.precision.grads).str() +
                          "): an accumulation buffer must hold at least their precision")
        .range(gradDtypeRange);
    return std::nullopt;
  }
  plan.precision.gradAccum = gradDtype;
  if (!checkFp8Target())
    return std::nullopt;
  if (!sawBatch && d.isTrain) {
    sema.diags.report(DiagKind::MissingSetting, d.nameRange.Start,
                      "plan '" + d.name + "' does not say its batch size")
        .range(d.nameRange);
    return std::nullopt;
  }
  if (!d.isTrain && plan.prompt == 0) {
    sema.diags.report(DiagKind::MissingSetting, d.nameRange.Start,
                      "infer plan '" + d.name + "' does not say its prompt length")
        .range(d.nameRange);
    return std::nullopt;
  }
  if (!d.isTrain) {
    plan.seq = plan.prompt;
    // A sequence holds its prompt and what it generates: max_context is at least both.
    double need = static_cast<double>(plan.prompt) + static_cast<double>(plan.generate);
    if (plan.maxContext == 0) {
      if (need > 9.2e18) {
        sema.diags.report(DiagKind::Overflow, d.nameRange.Start,
                          "prompt + generate does not fit in 64 bits")
            .range(d.nameRange);
        return std::nullopt;
      }
      plan.maxContext = plan.prompt + plan.generate;
    } else if (static_cast<double>(plan.maxContext) < need) {
      llvm::SMRange at = maxContextRange;
      sema.diags.report(DiagKind::InvalidValue, at.Start,
                        "max_context = " + std::to_string(plan.maxContext) +
                            " is shorter than prompt + generate = " + std::to_string(plan.prompt) +
                            " + " + std::to_string(plan.generate) +
                            ": a sequence would not fit in its cache")
          .range(at);
      return std::nullopt;
    }
  }
  if (!plan.microBatchGiven)
    plan.microBatch = d.isTrain ? std::max<int64_t>(1, plan.batch / plan.parallel.data)
                                : plan.batch;
  // Sequences per accumulation step, micro_batch × data-parallel devices, is int64 arithmetic
  // downstream (the accumulation check); a device count near 2^63 must not wrap it.
  int64_t perStep = 0;
  if (d.isTrain && __builtin_mul_overflow(plan.microBatch,
                                          std::max<int64_t>(1, plan.parallel.data), &perStep)) {
    auto at = plan.settingRanges.find("target");
    llvm::SMRange r = at != plan.settingRanges.end() ? at->second : d.nameRange;
    sema.diags.report(DiagKind::Overflow, r.Start,
                      "micro_batch × data-parallel devices = " + std::to_string(plan.microBatch) +
                          " × " + std::to_string(plan.parallel.data) + " does not fit in 64 bits")
        .range(r);
    return std::nullopt;
  }
  return plan;
}

std::optional<Plan> Sema::resolvePlan(const Program &p, const PlanDecl &d,
                                      const PlanOverrides &o) {
  PlanResolver r(*this, p, d, o);
  bool ok = r.readSettings();
  for (const BudgetItemAST &b : d.budgets)
    ok &= r.readBudget(b);
  ok &= r.applyOverrides();
  return ok ? r.finish() : std::nullopt;
}

} // namespace tally
