// The precision presets and the optimizers by name: the one table Sema (a plan's settings)
// and the solvers (`tally solve --precision --optimizer`) both read.
#include "ir/Plan.h"

#include <algorithm>

namespace tally {

const std::vector<std::string> &precisionPresetNames() {
  static const std::vector<std::string> names = {"fp32",       "tf32",       "bf16",
                                                 "fp16",       "mixed_bf16", "mixed_fp16",
                                                 "fp8_hybrid", "fp8_e4m3"};
  return names;
}

std::optional<PrecisionPolicy> precisionPreset(llvm::StringRef n) {
  PrecisionPolicy p;
  p.preset = n.str();
  auto set = [&](Dtype params, Dtype master, Dtype opt) {
    p.params = p.grads = p.activations = params;
    p.master = master;
    p.optimizer = opt;
  };
  if (n == "fp32" || n == "f32" || n == "tf32") // tf32: fp32 storage, matmuls at the tf32 rate
    set(Dtype::F32, Dtype::Invalid, Dtype::F32);
  else if (n == "bf16")
    set(Dtype::BF16, Dtype::Invalid, Dtype::F32);
  else if (n == "fp16" || n == "f16")
    set(Dtype::F16, Dtype::Invalid, Dtype::F32);
  else if (n == "mixed_bf16")
    set(Dtype::BF16, Dtype::F32, Dtype::F32);
  else if (n == "mixed_fp16")
    set(Dtype::F16, Dtype::F32, Dtype::F32), p.lossScaling = true;
  else if (n == "fp8_hybrid" || n == "fp8_e4m3") {
    // Transformer Engine's fp8 training: mixed_bf16's states (bf16 weights beside an fp32
    // master copy, fp32 moments) with the GEMMs in fp8 under delayed scaling.
    set(Dtype::BF16, Dtype::F32, Dtype::F32);
    p.fp8.format = n == "fp8_hybrid" ? Fp8Recipe::Format::Hybrid : Fp8Recipe::Format::E4M3;
  } else
    return std::nullopt;
  return p;
}

const std::vector<std::string> &optimizerNames() {
  static const std::vector<std::string> names = {"SGD", "SGDM", "AdaGrad", "RMSprop",
                                                 "Adam", "AdamW", "Lion"};
  return names;
}

std::optional<OptimizerSpec> optimizerPreset(llvm::StringRef name) {
  struct Known {
    const char *spelling, *canonical;
    unsigned states;
    double momentum, beta1, beta2, eps;
  };
  static const Known known[] = {
      {"SGD", "SGD", 0, 0, 0, 0, 0},           {"SGDM", "SGD", 1, 0.9, 0, 0, 0},
      {"AdaGrad", "AdaGrad", 1, 0, 0, 0, 1e-10}, {"RMSprop", "RMSprop", 1, 0, 0, 0, 1e-10},
      {"Adam", "Adam", 2, 0, 0.9, 0.999, 1e-8},  {"AdamW", "AdamW", 2, 0, 0.9, 0.999, 1e-8},
      {"Lion", "Lion", 1, 0, 0.9, 0.99, 0}};
  for (const Known &k : known)
    if (name.equals_insensitive(k.spelling)) {
      OptimizerSpec o;
      o.name = k.canonical;
      o.states = k.states;
      o.momentum = k.momentum;
      o.beta1 = k.beta1;
      o.beta2 = k.beta2;
      o.eps = k.eps;
      return o;
    }
  return std::nullopt;
}

unsigned optimizerStates(const OptimizerSpec &o) {
  if (o.name == "SGD")
    return o.momentum > 0 ? 1 : 0;
  if (o.name == "Adam" || o.name == "AdamW")
    return 2;
  if (o.name == "RMSprop")
    return o.momentum > 0 ? 2 : 1; // the running mean of g², and PyTorch's momentum buffer
  return 1; // AdaGrad: a sum of squares; Lion: momentum
}

LoweringKey loweringKey(const Plan &plan) {
  LoweringKey k;
  k.isTrain = plan.isTrain;
  k.microBatch = plan.microBatch;
  k.seq = plan.seq;
  k.seqGiven = plan.settingRanges.count("seq") > 0;
  k.params = plan.precision.params;
  k.activations = plan.precision.activations;
  k.frozen = plan.precision.frozen.dtype;
  k.lora = plan.lora;
  k.loss = crossEntropyKernel(plan);
  k.norm = normKernel(plan);
  return k;
}

ExpertFit expertFit(const Parallelism &par) {
  // --expert-tensor-parallel-size: the tensor degree (its default) or 1, MoE parallel folding.
  if (par.expertTensor != 0 && par.expertTensor != 1 && par.expertTensor != par.tensor)
    return ExpertFit::TensorNotModelled;
  ExpertLayout l = expertLayout(par);
  // Megatron-Core requires sequence parallelism for MoE with tensor and expert parallelism
  // (megatron/core/transformer/moe/README.md): a folded rank dispatches its sequence shard.
  if (l.folded && !par.sequenceParallel)
    return ExpertFit::FoldNeedsSequenceParallel;
  // Combined 1F1B (megatron docs/user-guide/features/moe_a2a_overlap.md, "Hard requirements").
  if (par.expertOverlap && par.expert <= 1)
    return ExpertFit::OverlapNeedsExperts;
  if (par.expertOverlap && par.pipeline > 1 && par.interleave <= 1)
    return ExpertFit::OverlapNeedsInterleave;
  // The expert group adds no devices: it is carved out of the data ranks, folded out of the
  // tensor × context × data ranks of a pipeline stage.
  int64_t ranks = l.folded ? par.tensor * par.context * par.data : par.data;
  if (ranks % std::max<int64_t>(1, par.expert) != 0)
    return ExpertFit::GroupDoesNotDivide;
  return ExpertFit::Ok;
}

std::string stackName(const Plan &plan, std::string *why) {
  const Parallelism &par = plan.parallel;
  if (why)
    why->clear();
  if (!par.stack.empty())
    return par.stack;
  // ZeRO 3 is sharded per block whoever runs it (PyTorch FSDP, Megatron's FSDP), so it decides
  // first; then model parallelism, which is Megatron's; then DeepSpeed's ZeRO.
  bool model = par.tensor > 1 || par.pipeline > 1 || par.context > 1 || par.expert > 1;
  if (why)
    *why = par.zero == 3   ? "ZeRO 3"
           : model         ? "tensor, pipeline, context or expert parallelism"
           : par.zero >= 1 ? "ZeRO " + std::to_string(par.zero)
                           : "data parallelism alone";
  return par.zero == 3 ? "fsdp" : model ? "megatron" : par.zero >= 1 ? "deepspeed" : "ddp";
}

namespace {

/// Whose code runs the model in a plan's step, for the kernels that differ by it (the loss,
/// the RMS norm; each of crossEntropyKernel and normKernel says what it gets): tally's
/// generated step, a compiled step, Megatron, Megatron-DeepSpeed (DeepSpeed with tensor or
/// pipeline parallelism: DeepSpeed's own engine splits no layers) or a PyTorch stack running
/// the model's modules eagerly.
enum class ModelCode { Generated, Compiled, Megatron, MegatronDeepSpeed, PyTorch };
ModelCode modelCode(const Plan &plan) {
  if (plan.generatedStep)
    return ModelCode::Generated;
  if (plan.parallel.compiled)
    return ModelCode::Compiled;
  std::string stack = stackName(plan);
  if (stack == "megatron")
    return ModelCode::Megatron;
  if (stack == "deepspeed" && (plan.parallel.tensor > 1 || plan.parallel.pipeline > 1))
    return ModelCode::MegatronDeepSpeed;
  return ModelCode::PyTorch;
}

/// Returns kernel `k`, and sets `*why` (when given) to what decided it.
template <class K> K decided(std::string *why, const char *text, K k) {
  if (why)
    *why = text;
  return k;
}

} // namespace

CrossEntropyKernel crossEntropyKernel(const Plan &plan, std::string *why) {
  auto say = [why](const char *text, CrossEntropyKernel k) { return decided(why, text, k); };
  const std::string &written = plan.parallel.crossEntropy;
  if (!written.empty())
    return say("cross_entropy", written == "eager"      ? CrossEntropyKernel::Eager
                                : written == "megatron" ? CrossEntropyKernel::Megatron
                                                        : CrossEntropyKernel::Fused);
  switch (modelCode(plan)) {
  case ModelCode::Generated: return say("tally's generated step", CrossEntropyKernel::Fused);
  case ModelCode::Compiled: return say("compiled = true", CrossEntropyKernel::Fused);
  case ModelCode::Megatron: return say("stack megatron", CrossEntropyKernel::Megatron);
  // Megatron's loss (megatron/model/gpt_model.py, vocab_parallel_cross_entropy of output.float()).
  case ModelCode::MegatronDeepSpeed:
    return say("Megatron-DeepSpeed (stack deepspeed with tensor or pipeline parallelism)",
               CrossEntropyKernel::Megatron);
  case ModelCode::PyTorch: break;
  }
  return say("the stack's PyTorch loss", CrossEntropyKernel::Eager);
}

NormKernel normKernel(const Plan &plan, std::string *why) {
  auto say = [why](const char *text, NormKernel k) { return decided(why, text, k); };
  const std::string &written = plan.parallel.normKernel;
  if (!written.empty())
    return say("norm_kernel", written == "eager" ? NormKernel::Eager : NormKernel::Fused);
  if (!plan.isTrain) // tally generates training steps only
    return say("an inference plan (a serving engine's fused norm)", NormKernel::Fused);
  // --fuse prices tally's fused kernels, whose runs end in the norm's own kernel (Fusion.cpp).
  if (plan.fuseKernels && !plan.parallel.compiled)
    return say("--fuse (tally's fused kernels)", NormKernel::Fused);
  switch (modelCode(plan)) {
  case ModelCode::Generated: return say("tally's generated step", NormKernel::Fused);
  case ModelCode::Compiled: return say("compiled = true", NormKernel::Fused);
  case ModelCode::Megatron:
    return say("stack megatron (Transformer Engine's or Apex's fused RMSNorm)", NormKernel::Fused);
  case ModelCode::MegatronDeepSpeed:
    return say("Megatron-DeepSpeed (Megatron's model code and its fused norms)", NormKernel::Fused);
  case ModelCode::PyTorch: break;
  }
  return say("the stack's PyTorch model code (an nn.Module RMSNorm run by autograd)", NormKernel::Eager);
}

double memoryLimit(const Plan &plan) {
  double limit = plan.target.memoryBytes > 0 ? plan.target.memoryBytes : 0;
  for (const BudgetSpec &b : plan.budgets)
    if (b.metric == BudgetMetric::MemoryPerDevice && b.atMost && b.value > 0)
      limit = limit > 0 ? std::min(limit, b.value) : b.value;
  return limit;
}

void overrideBudgets(Plan &plan, const std::vector<BudgetSpec> &flags) {
  for (const BudgetSpec &f : flags) {
    auto &b = plan.budgets;
    b.erase(std::remove_if(b.begin(), b.end(),
                           [&](const BudgetSpec &x) { return x.metric == f.metric; }),
            b.end());
    b.push_back(f);
  }
}

} // namespace tally
