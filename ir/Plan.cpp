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

CrossEntropyKernel crossEntropyKernel(const Plan &plan, std::string *why) {
  auto say = [&](const char *text) {
    if (why)
      *why = text;
  };
  const std::string &written = plan.parallel.crossEntropy;
  if (!written.empty()) {
    say("cross_entropy");
    return written == "eager"      ? CrossEntropyKernel::Eager
           : written == "megatron" ? CrossEntropyKernel::Megatron
                                   : CrossEntropyKernel::Fused;
  }
  if (plan.generatedStep) {
    say("tally's generated step");
    return CrossEntropyKernel::Fused;
  }
  if (plan.parallel.compiled) {
    say("compiled = true");
    return CrossEntropyKernel::Fused;
  }
  std::string stack = stackName(plan);
  if (stack == "megatron") {
    say("stack megatron");
    return CrossEntropyKernel::Megatron;
  }
  // DeepSpeed with tensor or pipeline parallelism is Megatron-DeepSpeed (DeepSpeed's own engine
  // splits no layers): Megatron's loss (megatron/model/gpt_model.py, vocab_parallel_cross_entropy
  // of output.float()).
  if (stack == "deepspeed" && (plan.parallel.tensor > 1 || plan.parallel.pipeline > 1)) {
    say("Megatron-DeepSpeed (stack deepspeed with tensor or pipeline parallelism)");
    return CrossEntropyKernel::Megatron;
  }
  say("the stack's PyTorch loss");
  return CrossEntropyKernel::Eager;
}

NormKernel normKernel(const Plan &plan, std::string *why) {
  auto say = [&](const char *text) {
    if (why)
      *why = text;
  };
  const std::string &written = plan.parallel.normKernel;
  if (!written.empty()) {
    say("norm_kernel");
    return written == "eager" ? NormKernel::Eager : NormKernel::Fused;
  }
  if (plan.generatedStep) {
    say("tally's generated step");
    return NormKernel::Fused;
  }
  if (!plan.isTrain) {
    say("an inference plan (a serving engine's fused norm)");
    return NormKernel::Fused;
  }
  if (plan.parallel.compiled) {
    say("compiled = true");
    return NormKernel::Fused;
  }
  std::string stack = stackName(plan);
  if (stack == "megatron") {
    say("stack megatron (Transformer Engine's or Apex's fused RMSNorm)");
    return NormKernel::Fused;
  }
  if (stack == "deepspeed" && (plan.parallel.tensor > 1 || plan.parallel.pipeline > 1)) {
    say("Megatron-DeepSpeed (Megatron's model code and its fused norms)");
    return NormKernel::Fused;
  }
  say("the stack's PyTorch model code (an nn.Module RMSNorm run by autograd)");
  return NormKernel::Eager;
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
