// Semantic analysis: targets. A `target NAME { memory = 80 GB, ... }` declaration becomes a
// Target through a table of its settings (one entry per setting name: a positive quantity of
// one unit, a positive whole number, or a handler for the records peak, efficiency and
// matmul_curve and the fractions and curves); resolveTarget finds a name among the user's
// targets, the built-in catalogue and the targets the tally binary loads (host, files).
#include "frontend/Sema.h"
#include "ir/OpRules.h"
#include "support/Suggest.h"

#include <algorithm>

namespace tally {

/// `matmul_curve { fp32 = [(FLOPs, efficiency), ...], bf16 = [...] }` (written by `tally
/// calibrate`): per dtype, points with strictly increasing FLOPs per call and efficiencies in
/// (0, 1].
bool Sema::matmulCurves(const ConstValue &rec, Target &t) {
  bool ok = true;
  for (size_t i = 0; i < rec.elems.size(); ++i) {
    std::optional<Dtype> dt = parseDtype(rec.names[i]);
    if (!dt) {
      suggest(DiagKind::UnknownDtype, rec.nameRanges[i],
              "unknown dtype '" + rec.names[i] + "' in matmul_curve", rec.names[i],
              dtypeSpellings());
      ok = false;
      continue;
    }
    MatmulCurve curve;
    curve.dtype = *dt;
    if (!curvePoints(rec.elems[i], rec.ranges[i], "a matmul curve", curve.points)) {
      ok = false;
      continue;
    }
    t.matmulCurves.push_back(std::move(curve));
  }
  return ok;
}

bool Sema::curvePoints(const ConstValue &list, llvm::SMRange r, const char *what,
                       std::vector<CurvePoint> &points) {
  bool good = list.kind == ConstValue::Tuple && !list.elems.empty();
  for (size_t j = 0; good && j < list.elems.size(); ++j) {
    const ConstValue &p = list.elems[j];
    good = p.kind == ConstValue::Tuple && p.elems.size() == 2 &&
           p.elems[0].kind == ConstValue::Number && p.elems[1].kind == ConstValue::Number &&
           (p.elems[0].dim == UnitDim::None || p.elems[0].dim == UnitDim::Flops) &&
           (p.elems[1].dim == UnitDim::None || p.elems[1].dim == UnitDim::Ratio);
    if (!good)
      break;
    CurvePoint pt{p.elems[0].number, p.elems[1].number};
    good = pt.flops > 0 && pt.efficiency > 0 && pt.efficiency <= 1 &&
           (points.empty() || pt.flops > points.back().flops);
    points.push_back(pt);
  }
  if (!good)
    diags.report(DiagKind::InvalidValue, r.Start,
                 std::string(what) + " is a list of (FLOPs per call, efficiency) pairs with the "
                 "FLOPs increasing and each efficiency in (0, 1]")
        .range(r);
  return good;
}

/// Reads the settings of one `target` declaration into a Target; `ok` is cleared by any
/// setting that is wrong (each is still read, so every mistake is reported).
struct TargetReader {
  Sema &sema;
  Target &t;
  bool ok = true;

  /// `v` as a positive quantity of dimension `dim`, reported under `key` when it is not one.
  double need(const ConstValue &v, UnitDim dim, const std::string &key) {
    if (v.kind != ConstValue::Number || v.dim != dim) {
      sema.diags.report(DiagKind::UnitMismatch, v.range.Start,
                        "'" + key + "' must be " + describe(dim).str() + ", not " + v.describe())
          .range(v.range);
      ok = false;
      return 0;
    }
    if (v.number <= 0) {
      sema.diags.report(DiagKind::InvalidValue, v.range.Start, "'" + key + "' must be positive")
          .range(v.range);
      ok = false;
    }
    return v.number;
  }

  void allocatorReserve(const ConstValue &v) {
    bool fraction = v.kind == ConstValue::Number &&
                    (v.dim == UnitDim::None || v.dim == UnitDim::Ratio) && v.number >= 0 &&
                    v.number < 1;
    if (!fraction) {
      sema.diags.report(DiagKind::InvalidValue, v.range.Start,
                        "'allocator_reserve' is a fraction in [0, 1), such as 0.05 or 5%")
          .range(v.range);
      ok = false;
    }
    t.allocatorReserve = v.number;
  }

  void attentionCurve(const ConstValue &v) {
    if (!sema.curvePoints(v, v.range, "an attention curve", t.attentionCurve))
      ok = false;
  }

  /// `peak { fp32 = 67 TFLOP/s, bf16 = ... }`: the dense peak of each dtype.
  void peak(const ConstValue &v) {
    for (size_t i = 0; i < v.elems.size(); ++i) {
      auto dt = parseDtype(v.names[i]);
      double rate = need(v.elems[i], UnitDim::FlopRate, "peak " + v.names[i]);
      if (!dt) {
        sema.suggest(DiagKind::UnknownDtype, v.nameRanges[i],
                     "unknown dtype '" + v.names[i] + "' in peak rates", v.names[i],
                     dtypeSpellings());
        ok = false;
        continue;
      }
      switch (*dt) {
      case Dtype::F64: t.peakF64 = rate; break;
      case Dtype::F32: t.peakF32 = rate; break;
      case Dtype::TF32: t.peakTF32 = rate; break;
      case Dtype::F16: t.peakF16 = rate; break;
      case Dtype::BF16: t.peakBF16 = rate; break;
      case Dtype::FP8E4M3: case Dtype::FP8E5M2: t.peakFP8 = rate; break;
      case Dtype::I8: t.peakINT8 = rate; break;
      default: break;
      }
    }
  }

  /// `efficiency { matmul = 0.7, ... }`: the share of the peak each class of kernel reaches.
  void efficiency(const ConstValue &v) {
    for (size_t i = 0; i < v.elems.size(); ++i) {
      const ConstValue &e = v.elems[i];
      double f = e.number;
      if (e.kind != ConstValue::Number || (e.dim != UnitDim::None && e.dim != UnitDim::Ratio) ||
          f <= 0 || f > 1) {
        sema.diags.report(DiagKind::InvalidValue, v.ranges[i].Start,
                          "an efficiency is a fraction in (0, 1], such as 0.7 or 70%")
            .range(v.ranges[i]);
        ok = false;
        continue;
      }
      const std::string &k = v.names[i];
      if (k == "matmul") t.efficiency.matmul = f;
      else if (k == "attention") t.efficiency.attention = f;
      else if (k == "elementwise") t.efficiency.elementwise = f;
      else if (k == "communication") t.efficiency.communication = f;
      else if (k == "host_link") t.efficiency.hostLink = f;
      else {
        sema.unknownName(v.nameRanges[i], "efficiency class", k,
                         {"matmul", "attention", "elementwise", "communication", "host_link"});
        ok = false;
      }
    }
  }

  void matmulCurve(const ConstValue &v) { ok &= sema.matmulCurves(v, t); }

  /// `elementwise_time { gelu = 0.9 ns, gelu_grad = 1 ns, ... }`: per unary kind of
  /// ir/ops/Unary.def (its name, `_grad` for its gradient), `dropout` (its forward: the random
  /// numbers and the mask; its backward reads the mask) and the row kernels (layer_norm,
  /// rms_norm, softmax, cross_entropy), a positive time per element.
  void elementwiseTime(const ConstValue &v) {
    std::vector<std::string> names;
    for (const UnaryDef &u : unaryDefs())
      withGradient(names, opName(u.kind).str());
    names.push_back(opName(OpKind::Dropout).str());
    for (const std::string &r : Target::rowKernelNames())
      withGradient(names, r);
    readKernelTimes(v, "elementwise_time", "unary op", names, /*perRow=*/false);
  }

  /// `name` and `name_grad`, a kernel's forward and gradient keys in a kernel-time record.
  static void withGradient(std::vector<std::string> &names, const std::string &name) {
    names.push_back(name);
    names.push_back(name + "_grad");
  }

  /// `row_time { layer_norm = 15 ns, layer_norm_grad = 20 ns, ... }`: per row kernel
  /// (Target::rowKernelNames; `_grad` for its gradient), a positive time per row.
  void rowTime(const ConstValue &v) {
    std::vector<std::string> names;
    for (const std::string &r : Target::rowKernelNames())
      withGradient(names, r);
    readKernelTimes(v, "row_time", "row kernel", names, /*perRow=*/true);
  }

  /// The entries of a `{ name = time, ... }` record of kernel times into Target::unaryTimes:
  /// `name` (forward) or `name_grad` (gradient), per element or, `perRow`, per row.
  void readKernelTimes(const ConstValue &v, const std::string &record, const char *what,
                       const std::vector<std::string> &names, bool perRow) {
    for (size_t i = 0; i < v.elems.size(); ++i) {
      const std::string &k = v.names[i];
      if (std::find(names.begin(), names.end(), k) == names.end()) {
        sema.unknownName(v.nameRanges[i], what, k, names);
        ok = false;
        continue;
      }
      double seconds = need(v.elems[i], UnitDim::Time, record + "." + k);
      bool gradient = llvm::StringRef(k).endswith("_grad");
      std::string op = gradient ? k.substr(0, k.size() - 5) : k;
      auto it = std::find_if(t.unaryTimes.begin(), t.unaryTimes.end(),
                             [&](const Target::UnaryTime &u) { return u.op == op; });
      if (it == t.unaryTimes.end())
        it = t.unaryTimes.insert(t.unaryTimes.end(), Target::UnaryTime{op});
      if (perRow)
        (gradient ? it->gradientRow : it->forwardRow) = seconds;
      else
        (gradient ? it->gradient : it->forward) = seconds;
    }
  }
};

namespace {

/// One setting of a `target` declaration: a positive quantity of one unit stored in `quantity`,
/// a positive whole number stored in `count`, or a value that `read` checks and stores.
struct TargetSetting {
  const char *key;
  double Target::*quantity = nullptr;
  UnitDim dim = UnitDim::None;
  int64_t Target::*count = nullptr;
  void (TargetReader::*read)(const ConstValue &v) = nullptr;
  bool record = false; ///< only a record is this setting (any other value is an unknown setting)
};

TargetSetting quantity(const char *key, double Target::*field, UnitDim dim) {
  return {key, field, dim};
}
TargetSetting count(const char *key, int64_t Target::*field) {
  return {key, nullptr, UnitDim::None, field};
}
TargetSetting custom(const char *key, void (TargetReader::*read)(const ConstValue &),
                     bool record = false) {
  return {key, nullptr, UnitDim::None, nullptr, read, record};
}

/// Every target setting, in the order an unknown one's suggestions are weighed.
const std::vector<TargetSetting> &targetSettings() {
  static const std::vector<TargetSetting> table = {
      quantity("memory", &Target::memoryBytes, UnitDim::Bytes),
      quantity("bandwidth", &Target::bandwidth, UnitDim::ByteRate),
      custom("peak", &TargetReader::peak, true),
      quantity("host_link", &Target::hostLink, UnitDim::ByteRate),
      quantity("interconnect", &Target::interconnect, UnitDim::ByteRate),
      quantity("host_memory", &Target::hostMemoryBytes, UnitDim::Bytes),
      custom("efficiency", &TargetReader::efficiency, true),
      quantity("network", &Target::network, UnitDim::ByteRate),
      count("gpus_per_node", &Target::gpusPerNode),
      quantity("link_latency", &Target::linkLatency, UnitDim::Time),
      quantity("network_latency", &Target::networkLatency, UnitDim::Time),
      custom("matmul_curve", &TargetReader::matmulCurve, true),
      quantity("cuda_context", &Target::contextBytes, UnitDim::Bytes),
      quantity("comm_buffer", &Target::commBufferBytes, UnitDim::Bytes),
      custom("allocator_reserve", &TargetReader::allocatorReserve),
      // Written by `tally calibrate` (docs/targets.md).
      quantity("kernel_overhead", &Target::kernelOverhead, UnitDim::Time),
      quantity("fork_overhead", &Target::forkOverhead, UnitDim::Time),
      quantity("optimizer_bandwidth", &Target::optimizerBandwidth, UnitDim::ByteRate),
      quantity("kernel_launch", &Target::kernelLaunch, UnitDim::Time),
      quantity("transcendental", &Target::transcendentalTime, UnitDim::Time),
      custom("elementwise_time", &TargetReader::elementwiseTime, true),
      custom("row_time", &TargetReader::rowTime, true),
      quantity("cache", &Target::cacheBytes, UnitDim::Bytes),
      quantity("cache_bandwidth", &Target::cacheBandwidth, UnitDim::ByteRate),
      count("threads", &Target::threads), // the OpenMP threads a calibration measured with
      custom("attention_curve", &TargetReader::attentionCurve),
      count("attention_tile", &Target::attentionTile),
  };
  return table;
}

const TargetSetting *findTargetSetting(const std::string &key, const ConstValue &v) {
  for (const TargetSetting &s : targetSettings())
    if (key == s.key)
      return s.record && v.kind != ConstValue::Record ? nullptr : &s;
  return nullptr;
}

} // namespace

std::optional<Target> Sema::userTarget(const TargetDecl &d) {
  Target t;
  t.name = d.name;
  t.description = "user-defined target " + d.name;
  t.source = "declared in the input file";
  ConstEnv env;
  TargetReader reader{*this, t};
  for (const SettingAST &s : d.settings) {
    ConstValue v = eval(*s.value, env);
    if (v.kind == ConstValue::Invalid) {
      reader.ok = false;
      continue;
    }
    const TargetSetting *setting = findTargetSetting(s.key, v);
    if (!setting) {
      std::vector<std::string> keys;
      for (const TargetSetting &known : targetSettings())
        keys.push_back(known.key);
      suggest(DiagKind::UnknownSetting, s.keyRange, "unknown target setting '" + s.key + "'",
              s.key, keys);
      reader.ok = false;
    } else if (setting->quantity) {
      t.*setting->quantity = reader.need(v, setting->dim, s.key);
    } else if (setting->count) {
      if (auto n = positiveInt(v, ("'" + s.key + "'").c_str()))
        t.*setting->count = *n;
      else
        reader.ok = false;
    } else {
      (reader.*setting->read)(v);
    }
  }
  if (!reader.ok)
    return std::nullopt;
  const char *missing = t.memoryBytes == 0 ? "memory" : t.bandwidth == 0 ? "bandwidth" : nullptr;
  if (!missing && t.peakF32 == 0 && t.peakBF16 == 0 && t.peakF16 == 0)
    missing = "peak";
  if (missing) {
    diags.report(DiagKind::MissingSetting, d.nameRange.Start,
                 "target '" + d.name + "' does not say its " + missing)
        .range(d.nameRange);
    return std::nullopt;
  }
  return t;
}

std::optional<Target> Sema::resolveTarget(const Program &p, llvm::StringRef name,
                                          llvm::SMRange r) {
  auto it = p.targets.find(name);
  if (it != p.targets.end())
    return userTarget(*it->second);
  if (const Target *t = findTarget(name))
    return *t;
  // `host` (this machine, from `tally calibrate`) and target files come from the loader that
  // the tally binary installs (ir/Target.h).
  if (isExternalTargetName(name)) {
    std::string error;
    if (std::optional<Target> t = loadExternalTarget(name, error))
      return t;
    diags.report(DiagKind::UnknownTarget, r.Start,
                 "cannot load target '" + name.str() + "': " + error)
        .range(r);
    return std::nullopt;
  }
  std::vector<std::string> names;
  for (const Target &t : targetCatalogue())
    names.push_back(t.name);
  for (const auto &kv : p.targets)
    names.push_back(kv.getKey().str());
  suggest(DiagKind::UnknownTarget, r, "unknown target '" + name.str() + "'", name, names)
      .note(llvm::SMLoc(), "the targets are: " + choiceList(names) +
                               ", host (this machine, from `tally calibrate`) or a target file; "
                               "`tally targets` describes the built-in ones");
  return std::nullopt;
}

} // namespace tally
