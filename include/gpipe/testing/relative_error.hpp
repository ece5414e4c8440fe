#pragma once
// The error measure of gpipe's numerical checks (and of gpipe::testing::check_layer): how far a
// result is from its reference, relative to the reference's magnitude.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

namespace gpipe::testing {

/// max_k |a_k - b_k| / max(max_k |b_k|, floor). NaN anywhere in a or b gives NaN, which fails
/// every `<` and `<=` comparison (std::max alone would drop it: max(d, NaN) is d); sizes that
/// differ give infinity.
template <class A, class B>
double relative_error(const std::vector<A>& a, const std::vector<B>& b, double floor = 1e-12) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double diff = 0, scale = floor;
  for (std::size_t k = 0; k < a.size(); ++k) {
    const double d = std::abs(static_cast<double>(a[k]) - static_cast<double>(b[k]));
    if (std::isnan(d)) return std::numeric_limits<double>::quiet_NaN();
    diff = std::max(diff, d);
    scale = std::max(scale, std::abs(static_cast<double>(b[k])));
  }
  return diff / scale;
}

}  // namespace gpipe::testing
