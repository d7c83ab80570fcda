// StepSupport.h — what the runtime tests (step_tests) share: deterministic random inputs, the
// registry of which API.md kernels each test covers (gradient tests and value tests; checked by
// the coverage test against the names parsed from codegen/runtime/API.md), element-wise
// comparison with a tolerance, and central finite differences in fp64.
#pragma once

#include <catch.hpp>

#include "tally_rt.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace step {

using Vec = std::vector<double>;

/// n values uniform in [lo, hi) from a fixed seed.
inline Vec uniform(size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  Vec v(n);
  for (auto& x : v) x = d(g);
  return v;
}

/// The kernels of API.md that some test checks: `gradient` by finite differences, `value` by
/// known answers or PyTorch. Filled at static-initialisation time by Covers objects.
struct Registry {
  std::set<std::string> gradient, value;
  static Registry& get() {
    static Registry r;
    return r;
  }
};

/// Declares, next to a test case, the API.md kernels it checks.
struct Covers {
  Covers(bool gradient, std::initializer_list<const char*> kernels) {
    for (const char* k : kernels) (gradient ? Registry::get().gradient : Registry::get().value).insert(k);
  }
};

/// A tolerance for |got − want| <= atol + rtol·|want|.
struct Tol {
  double rtol;
  double atol;
};

/// Checks got ≈ want element-wise; on failure reports the first bad index and the worst error.
inline void expect_close(const std::string& what, const Vec& got, const Vec& want, Tol tol) {
  REQUIRE(got.size() == want.size());
  size_t bad = got.size();
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    double err = std::fabs(got[i] - want[i]);
    double lim = tol.atol + tol.rtol * std::fabs(want[i]);
    if (!(err <= lim) && bad == got.size()) bad = i;
    if (err > worst || std::isnan(err)) worst = err;
  }
  INFO(what << ": " << got.size() << " elements, worst |error| " << worst << ", tolerance rtol "
            << tol.rtol << " atol " << tol.atol);
  if (bad < got.size()) {
    INFO("first mismatch at " << bad << ": got " << got[bad] << ", want " << want[bad]);
    CHECK(false);
  } else {
    CHECK(true);
  }
}

/// Central finite differences of loss() with respect to every element of x (restored after).
inline Vec numgrad(Vec& x, const std::function<double()>& loss, double h = 1e-5) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double keep = x[i];
    x[i] = keep + h;
    double lp = loss();
    x[i] = keep - h;
    double lm = loss();
    x[i] = keep;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

/// Σ a·b.
inline double dotv(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

/// Converts a double vector to storage type T (rounding) and back.
template <class T> std::vector<T> to(const Vec& v) {
  std::vector<T> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = rt::store<T>(static_cast<rt::acc_t<T>>(v[i]));
  return r;
}
template <class T> Vec from(const std::vector<T>& v) {
  Vec r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = static_cast<double>(rt::load(v[i]));
  return r;
}

} // namespace step
