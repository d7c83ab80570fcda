// Semantic analysis: the `target` setting of a plan, `N x NAME { data = N, ... }` (or --target):
// the device count, the target it names, and its record of parallel degrees, ZeRO stage,
// rank order, stack and the target's per-plan adjustments (links, latencies, kernel launch),
// read through a table with one handler per setting name; then the degrees are checked
// against the device count (docs/time.md §4, "Nodes and collectives").
#include "frontend/Sema.h"
#include "support/Suggest.h"
#include "support/Format.h"

#include "llvm/Support/MathExtras.h"

#include <algorithm>

namespace tally {
namespace {

/// One `key = value` of the target's record, and where it was written.
struct LayoutItem {
  const std::string &key;
  const ConstValue &value;
  llvm::SMRange range;
};

/// Reads the target's record into the plan's Parallelism and Target; each handler reports
/// and returns false on a wrong value (the first one ends the setting).
struct LayoutReader {
  Sema &sema;
  Plan &plan;
  Parallelism &par;
  bool dataGiven = false;
  llvm::SMRange expertRange, expertTensorRange, expertOverlapRange;
  /// Where a ZeRO-3 setting (reshard_after_forward, prefetch) was written (invalid: none was).
  llvm::SMRange zeroThreeRange;

  bool boolean(const LayoutItem &it, bool &flag) {
    if (it.value.kind != ConstValue::Bool) {
      sema.diags.report(DiagKind::TypeMismatch, it.range.Start, it.key + " is true or false")
          .range(it.range);
      return false;
    }
    flag = it.value.boolean;
    return true;
  }

  /// A positive whole number (a degree, gpus_per_node, interleave).
  bool count(const LayoutItem &it, int64_t &slot) {
    auto n = sema.positiveInt(it.value, ("'" + it.key + "'").c_str());
    if (!n)
      return false;
    slot = *n;
    return true;
  }

  bool zero(const LayoutItem &it) {
    const ConstValue &e = it.value;
    if (e.kind != ConstValue::Number || !e.isInteger || e.intValue < 0 || e.intValue > 3) {
      sema.diags.report(DiagKind::InvalidValue, it.range.Start,
                        "zero is a ZeRO stage: 0, 1, 2 or 3")
          .range(it.range);
      return false;
    }
    par.zero = static_cast<int>(e.intValue);
    return true;
  }

  /// The value of `it` when it is one of `names` (a word or a string); otherwise an error at the
  /// value, `what` followed by "not 'x'; did you mean 'y'?" and a fix-it, and "".
  std::string oneOf(const LayoutItem &it, const std::vector<std::string> &names,
                    const std::string &what) {
    const ConstValue &e = it.value;
    std::string s = e.kind == ConstValue::Word || e.kind == ConstValue::String ? e.text : "";
    if (std::find(names.begin(), names.end(), s) != names.end())
      return s;
    std::string close = closestName(s, names);
    auto d = sema.diags.report(DiagKind::InvalidValue, it.range.Start,
                               what + (s.empty() ? std::string()
                                                 : ", not '" + s + "'" + didYouMean(close)));
    d.range(it.range);
    if (!s.empty() && !close.empty())
      d.fixit(e.range, close);
    return "";
  }

  bool stack(const LayoutItem &it) {
    par.stack = oneOf(it, {"megatron", "deepspeed", "fsdp", "fsdp2", "ddp"},
                      "stack is the framework that runs the step: megatron, deepspeed, fsdp, "
                      "fsdp2 or ddp");
    return !par.stack.empty();
  }

  /// attention_kernel = flash2 | native | flash1_triton (docs/time.md, "Framework stacks").
  bool attentionKernel(const LayoutItem &it) {
    std::string s = oneOf(it, {"flash2", "native", "flash1_triton"},
                          "attention_kernel is the fused attention kernel the step runs: flash2 "
                          "(FlashAttention-2), native (the GPU's own: FlashAttention-3, cuDNN) or "
                          "flash1_triton (the FlashAttention-1-era Triton kernel)");
    if (s.empty())
      return false;
    if (s == "native" && !(plan.target.nativeAttention > 0)) {
      sema.diags
          .report(DiagKind::InvalidValue, it.range.Start,
                  "attention_kernel = native: " + plan.target.name +
                      " has no native fused attention kernel in tally's catalogue (Hopper "
                      "parts do: FlashAttention-3, cuDNN); flash2 is what PyTorch runs there")
          .range(it.range);
      return false;
    }
    par.attentionKernel = s;
    return true;
  }

  /// cross_entropy = fused | eager | megatron (docs/memory.md, "The loss as frameworks run it").
  bool crossEntropy(const LayoutItem &it) {
    par.crossEntropy = oneOf(it, {"fused", "eager", "megatron"},
                             "cross_entropy is how the step runs its loss: fused (one kernel on the "
                             "logits as they are), eager (PyTorch's F.cross_entropy on an fp32 copy) "
                             "or megatron (Megatron-LM's fp32 copy, softmax in place)");
    return !par.crossEntropy.empty();
  }

  /// norm_kernel = fused | eager (docs/time.md, "The norm as frameworks run it").
  bool normKernel(const LayoutItem &it) {
    par.normKernel = oneOf(it, {"fused", "eager"},
                           "norm_kernel is how the step runs rms_norm: fused (one kernel forward, one "
                           "backward) or eager (PyTorch model code: cast, pow, mean, rsqrt, multiply, "
                           "cast back, weight, each a kernel)");
    return !par.normKernel.empty();
  }

  bool bucket(const LayoutItem &it) {
    const ConstValue &e = it.value;
    if (e.kind != ConstValue::Number || e.dim != UnitDim::Bytes || e.number <= 0) {
      sema.diags.report(DiagKind::InvalidValue, it.range.Start,
                        "bucket is the gradient bytes each data-parallel reduction carries, "
                        "such as 25 MiB")
          .range(it.range);
      return false;
    }
    par.bucketBytes = e.number;
    return true;
  }

  /// network, link (bandwidths) and link_latency, network_latency (times) of the target.
  bool link(const LayoutItem &it, double &slot, bool time) {
    const ConstValue &e = it.value;
    UnitDim want = time ? UnitDim::Time : UnitDim::ByteRate;
    if (e.kind != ConstValue::Number || e.dim != want || e.number <= 0) {
      sema.diags.report(DiagKind::InvalidValue, it.range.Start,
                        it.key + " must be a positive " +
                            (time ? std::string("time such as 5 us")
                                  : std::string("bandwidth such as 400 Gb/s or 25 GB/s")))
          .range(it.range);
      return false;
    }
    slot = e.number;
    return true;
  }

  bool kernelLaunch(const LayoutItem &it) { // 0 is allowed: launches that cost nothing (CUDA graphs)
    const ConstValue &e = it.value;
    if (e.kind != ConstValue::Number || e.dim != UnitDim::Time || e.number < 0) {
      sema.diags.report(DiagKind::InvalidValue, it.range.Start,
                        "kernel_launch is the time one kernel launch takes, such as 3.8 us, or "
                        "0 us under CUDA graphs")
          .range(it.range);
      return false;
    }
    plan.target.kernelLaunch = e.number;
    return true;
  }

  bool clock(const LayoutItem &it) {
    const ConstValue &e = it.value;
    if (e.kind != ConstValue::Number || e.dim != UnitDim::Frequency || !(e.number > 0)) {
      sema.diags.report(DiagKind::InvalidValue, it.range.Start,
                        "clock is the clock the GPU sustains, such as 1.6 GHz (a part held "
                        "below its boost clock by a power cap)")
          .range(it.range);
      return false;
    }
    if (!(plan.target.clock > 0)) {
      sema.diags.report(DiagKind::InvalidValue, it.range.Start,
                        "clock scales a catalogue GPU's peaks from its datasheet clock; " +
                            plan.target.name + " states none (give its peaks instead)")
          .range(it.range);
      return false;
    }
    withClock(plan.target, e.number);
    return true;
  }

  bool order(const LayoutItem &it) {
    const ConstValue &e = it.value;
    std::string o = e.kind == ConstValue::Word || e.kind == ConstValue::String ? e.text : "";
    std::string sorted = o;
    std::sort(sorted.begin(), sorted.end());
    if (sorted != "dpt" && sorted != "cdpt") {
      sema.diags.report(DiagKind::InvalidValue, it.range.Start,
                        "order places ranks innermost first: the letters t (tensor), p "
                        "(pipeline) and d (data) once each, and c (context) if you place it, "
                        "such as tpd or tcpd")
          .range(it.range);
      return false;
    }
    if (sorted == "dpt") // the context ranks go right outside the tensor group
      o.insert(o.find('t') + 1, "c");
    par.order = o;
    return true;
  }
};

/// One setting of the target's record and the handler that checks and applies it.
struct LayoutSetting {
  const char *key;
  bool (*read)(LayoutReader &r, const LayoutItem &it);
};

/// Every setting of the target's record, in the order an unknown one's suggestions are weighed.
const std::vector<LayoutSetting> &layoutSettings() {
  using R = LayoutReader;
  using I = LayoutItem;
  static const std::vector<LayoutSetting> table = {
      {"data",
       [](R &r, const I &it) {
         if (!r.count(it, r.par.data))
           return false;
         r.dataGiven = true;
         return true;
       }},
      {"tensor", [](R &r, const I &it) { return r.count(it, r.par.tensor); }},
      {"pipeline", [](R &r, const I &it) { return r.count(it, r.par.pipeline); }},
      {"context", [](R &r, const I &it) { return r.count(it, r.par.context); }},
      {"expert",
       [](R &r, const I &it) {
         if (!r.count(it, r.par.expert))
           return false;
         r.expertRange = it.range;
         return true;
       }},
      {"expert_tensor",
       [](R &r, const I &it) {
         if (!r.count(it, r.par.expertTensor))
           return false;
         r.expertTensorRange = it.range;
         return true;
       }},
      {"zero", [](R &r, const I &it) { return r.zero(it); }},
      {"interleave", [](R &r, const I &it) { return r.count(it, r.par.interleave); }},
      // Topology and layout settings (docs/time.md §4, "Nodes and collectives").
      {"sequence_parallel", [](R &r, const I &it) { return r.boolean(it, r.par.sequenceParallel); }},
      {"overlap",
       [](R &r, const I &it) {
         if (!r.boolean(it, r.par.overlap))
           return false;
         r.par.overlapGiven = true;
         return true;
       }},
      {"tensor_overlap", [](R &r, const I &it) { return r.boolean(it, r.par.tensorOverlap); }},
      {"expert_overlap",
       [](R &r, const I &it) {
         r.expertOverlapRange = it.range;
         return r.boolean(it, r.par.expertOverlap);
       }},
      {"reduce_every_micro_batch",
       [](R &r, const I &it) {
         r.par.reduceEveryGiven = true;
         return r.boolean(it, r.par.reduceEveryMicroBatch);
       }},
      {"reshard_after_forward",
       [](R &r, const I &it) {
         r.zeroThreeRange = it.range;
         return r.boolean(it, r.par.reshardAfterForward);
       }},
      {"prefetch",
       [](R &r, const I &it) {
         r.zeroThreeRange = it.range;
         return r.boolean(it, r.par.prefetch);
       }},
      {"order", [](R &r, const I &it) { return r.order(it); }},
      {"gpus_per_node", [](R &r, const I &it) { return r.count(it, r.plan.target.gpusPerNode); }},
      {"link", [](R &r, const I &it) { return r.link(it, r.plan.target.interconnect, false); }},
      {"network", [](R &r, const I &it) { return r.link(it, r.plan.target.network, false); }},
      {"link_latency", [](R &r, const I &it) { return r.link(it, r.plan.target.linkLatency, true); }},
      {"network_latency",
       [](R &r, const I &it) { return r.link(it, r.plan.target.networkLatency, true); }},
      {"kernel_launch", [](R &r, const I &it) { return r.kernelLaunch(it); }},
      {"clock", [](R &r, const I &it) { return r.clock(it); }},
      {"stack", [](R &r, const I &it) { return r.stack(it); }},
      {"bucket", [](R &r, const I &it) { return r.bucket(it); }},
      {"attention_kernel", [](R &r, const I &it) { return r.attentionKernel(it); }},
      {"cross_entropy", [](R &r, const I &it) { return r.crossEntropy(it); }},
      {"norm_kernel", [](R &r, const I &it) { return r.normKernel(it); }},
      // NCCL's NVLS and CollNet algorithms.
      {"nvls", [](R &r, const I &it) { return r.boolean(it, r.plan.target.nvlinkSwitch); }},
      {"sharp", [](R &r, const I &it) { return r.boolean(it, r.plan.target.collnet); }},
      {"compiled", [](R &r, const I &it) { return r.boolean(it, r.par.compiled); }},
  };
  return table;
}

/// The target name and device count of `NAME` or `N x NAME { ... }`.
bool deviceCount(DiagnosticEngine &diags, const ConstValue &v, std::string &targetName,
                 int64_t &devices) {
  if (v.kind == ConstValue::Word || v.kind == ConstValue::String) {
    targetName = v.text;
  } else if (v.kind == ConstValue::Device) {
    targetName = v.text;
    if (!v.isInteger || v.number < 1) {
      diags.report(DiagKind::NotInteger, v.range.Start,
                   "the device count must be a positive whole number, but it is " +
                       significant(v.number))
          .range(v.range);
      return false;
    }
    devices = v.intValue;
  } else {
    diags.report(DiagKind::TypeMismatch, v.range.Start,
                 "target is a target name such as H100_SXM, or N x NAME { data = N }, not " +
                     v.describe())
        .range(v.range);
    return false;
  }
  return true;
}

/// The degrees against the device count: interleave needs a pipeline, data × tensor ×
/// pipeline × context is the device count (data, when not given, is what is left), and the
/// expert degree divides the data degree.
bool checkDegrees(DiagnosticEngine &diags, const ConstValue &v, const LayoutReader &reader) {
  Parallelism &par = reader.par;
  int64_t devices = par.devices;
  if (par.interleave > 1 && par.pipeline <= 1) {
    diags.report(DiagKind::InvalidValue, v.range.Start,
                 "interleave = " + std::to_string(par.interleave) +
                     " splits each pipeline stage into virtual stages, but pipeline = 1")
        .range(v.range);
    return false;
  }
  // Degrees are positive and at most the device count's magnitude each; a product past int64
  // cannot match the device count, so it is reported as a mismatch rather than computed.
  int64_t modelParallel = 0;
  bool fits = !llvm::MulOverflow(par.tensor, par.pipeline, modelParallel) &&
              !llvm::MulOverflow(modelParallel, par.context, modelParallel);
  std::string cp = par.context > 1 ? " × context" : "";
  std::string cpValue = par.context > 1 ? " × " + std::to_string(par.context) : "";
  if (!reader.dataGiven) {
    if (!fits || devices % modelParallel != 0) {
      diags.report(DiagKind::InvalidValue, v.range.Start,
                   std::to_string(devices) + " devices cannot be split into tensor × pipeline" +
                       cp + " = " + (fits ? std::to_string(modelParallel) : "more than that"))
          .range(v.range);
      return false;
    }
    par.data = devices / modelParallel;
  }
  int64_t product = 0;
  bool over = !fits || llvm::MulOverflow(par.data, modelParallel, product);
  if (over || product != devices) {
    diags.report(DiagKind::InvalidValue, v.range.Start,
                 "data × tensor × pipeline" + cp + " = " + std::to_string(par.data) + " × " +
                     std::to_string(par.tensor) + " × " + std::to_string(par.pipeline) +
                     cpValue + " = " +
                     (over ? std::string("more") : std::to_string(product)) + ", but there are " +
                     std::to_string(devices) + " devices")
        .range(v.range);
    return false;
  }
  // reshard_after_forward and prefetch decide how ZeRO 3 gathers a block's parameters; with
  // the parameters not sharded there is nothing to gather.
  if (reader.zeroThreeRange.isValid() && par.zero != 3) {
    diags.report(DiagKind::InvalidValue, reader.zeroThreeRange.Start,
                 "reshard_after_forward and prefetch say how ZeRO 3 gathers a block's parameters, but "
                 "this plan has zero = " + std::to_string(par.zero))
        .range(reader.zeroThreeRange);
    return false;
  }
  // The expert layout against Megatron-Core's rules (ir/Plan.h, expertFit: the layout search
  // skips what is refused here).
  bool folded = expertLayout(par).folded;
  switch (expertFit(par)) {
  case ExpertFit::Ok:
    return true;
  case ExpertFit::TensorNotModelled:
    diags.report(DiagKind::InvalidValue, reader.expertTensorRange.Start,
                 "expert_tensor = " + std::to_string(par.expertTensor) +
                     " is not modelled: write 1 (MoE parallel folding, the experts whole on each rank) or "
                     "the tensor degree " + std::to_string(par.tensor) + " (the default)")
        .range(reader.expertTensorRange);
    return false;
  case ExpertFit::FoldNeedsSequenceParallel:
    diags.report(DiagKind::InvalidValue, reader.expertTensorRange.Start,
                 "expert_tensor = 1 under tensor = " + std::to_string(par.tensor) +
                     " needs sequence_parallel = true: each rank dispatches its sequence shard's tokens "
                     "(Megatron-Core requires sequence parallelism for MoE with tensor parallelism)")
        .range(reader.expertTensorRange);
    return false;
  case ExpertFit::OverlapNeedsExperts:
  case ExpertFit::OverlapNeedsInterleave:
    diags.report(DiagKind::InvalidValue, reader.expertOverlapRange.Start,
                 par.expert <= 1 ? std::string("expert_overlap overlaps the expert all-to-alls, but this plan has "
                                               "expert = 1")
                                 : "expert_overlap under pipeline = " + std::to_string(par.pipeline) +
                                       " needs interleave > 1: Megatron-Core's combined 1F1B extends the "
                                       "interleaved schedule")
        .range(reader.expertOverlapRange);
    return false;
  case ExpertFit::GroupDoesNotDivide:
    break;
  }
  int64_t ranks = folded ? par.tensor * par.context * par.data : par.data;
  auto diag = diags.report(DiagKind::InvalidValue, reader.expertRange.Start,
                           "expert = " + std::to_string(par.expert) + " must divide " +
                               (folded ? "tensor × context × data = " + std::to_string(ranks) +
                                             ": the folded expert group is drawn from those ranks"
                                       : "data = " + std::to_string(par.data) +
                                             ": the expert-parallel group is carved out of the "
                                             "data-parallel ranks"));
  diag.range(reader.expertRange);
  if (!folded && par.tensor > 1 && (par.tensor * par.context * par.data) % par.expert == 0)
    diag.note(llvm::SMLoc(), "with expert_tensor = 1 (Megatron-Core's MoE parallel folding, "
                             "--expert-tensor-parallel-size 1) the expert group is drawn from the tensor, "
                             "context and data ranks together, which " +
                                 std::to_string(par.expert) + " divides");
  return false;
}

} // namespace

bool Sema::parallel(const Program &p, const ConstValue &v, Plan &plan) {
  plan.parallel.range = v.range;
  std::string targetName;
  int64_t devices = 1;
  if (!deviceCount(diags, v, targetName, devices))
    return false;
  auto t = resolveTarget(p, targetName, v.nameRange.isValid() ? v.nameRange : v.range);
  if (!t)
    return false;
  plan.target = *t;
  Parallelism &par = plan.parallel;
  par.devices = devices;
  LayoutReader reader{*this, plan, par, false, v.range, {}};
  if (v.kind == ConstValue::Device && !v.elems.empty()) {
    const ConstValue &rec = v.elems[0];
    for (size_t i = 0; i < rec.elems.size(); ++i) {
      LayoutItem item{rec.names[i], rec.elems[i], rec.ranges[i]};
      const std::vector<LayoutSetting> &table = layoutSettings();
      auto setting = std::find_if(table.begin(), table.end(), [&](const LayoutSetting &s) {
        return item.key == s.key;
      });
      if (setting == table.end()) {
        std::vector<std::string> keys;
        for (const LayoutSetting &s : table)
          keys.push_back(s.key);
        unknownName(rec.nameRanges[i], "parallelism setting", item.key, keys);
        return false;
      }
      if (!setting->read(reader, item))
        return false;
    }
  }
  return checkDegrees(diags, v, reader);
}

} // namespace tally
