// The primitive ops a model can call, listed once: the op kind a call appends (its name in
// the language is the kind's name in ir/Ops.def) and its parameters in positional order, how
// many are required and their defaults. The lowering binds every call's arguments from this
// table (frontend/LowerPrimitives.cpp); name lookup, suggestions and editor completions list
// primitives from it. The operators (`+`, `@`, `-x`, `x[...]`) append ops too but are not
// calls, so they are not here.
#pragma once

#include "ir/Graph.h"

#include <cmath>
#include <string>
#include <vector>

namespace tally {

/// One parameter of a primitive.
struct PrimitiveParam {
  const char *name;
  /// The default as a model would write it ("1e-5", "-1", "false", "heads", "kernel"), or
  /// null when there is none: a required parameter, or an optional one whose absence means
  /// something else (no bias, no mask, `sum` over every element).
  const char *defaultText = nullptr;
  /// The default's value when it is a number (true and false are 1 and 0); NaN when there is
  /// none or it names another parameter (the lowering computes those).
  double defaultValue;

  PrimitiveParam(const char *name, const char *defaultText = nullptr);
  bool hasNumericDefault() const { return !std::isnan(defaultValue); }
};

/// One callable primitive.
struct Primitive {
  OpKind kind;                        ///< the op a call appends; its name is the primitive's
  std::vector<PrimitiveParam> params; ///< in positional order
  unsigned required;                  ///< the first `required` parameters must be given
  bool variadic = false;              ///< extra positional arguments join the first (concat)

  llvm::StringRef name() const { return opName(kind); }
  /// The parameter's position, or params.size() when the primitive has no such parameter.
  size_t index(llvm::StringRef param) const;
  /// How a model calls it, defaults shown: "layer_norm(x, weight, bias, eps = 1e-5)".
  std::string signature() const;
};

/// Every callable primitive, in the order name suggestions list them.
const std::vector<Primitive> &primitives();
/// The primitive a model calls by `name`, or null.
const Primitive *findPrimitive(llvm::StringRef name);
/// The primitives' names, in the table's order.
const std::vector<std::string> &primitiveNames();

} // namespace tally
