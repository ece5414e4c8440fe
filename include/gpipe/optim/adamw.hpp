#pragma once
// gpipe::optim::AdamW: torch.optim.AdamW (decoupled weight decay, bias-corrected moments,
// amsgrad off). Defaults are PyTorch's. See sgd.hpp for what an optimizer provides.

#include <cstddef>
#include <string>

#include "gpipe/error.hpp"

namespace gpipe::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

class AdamW {
 public:
  using Options = AdamWOptions;

  explicit AdamW(Options options = {}) : options(options) { check(); }

  static constexpr std::size_t state_per_param = 2;  ///< (m, v), each a block of n floats

  void check() const {
    detail::require(options.lr >= 0, "AdamW lr must be >= 0, got " + std::to_string(options.lr));
    detail::require(options.beta1 >= 0 && options.beta1 < 1,
                    "AdamW beta1 must be in [0, 1), got " + std::to_string(options.beta1));
    detail::require(options.beta2 >= 0 && options.beta2 < 1,
                    "AdamW beta2 must be in [0, 1), got " + std::to_string(options.beta2));
    detail::require(options.eps >= 0, "AdamW eps must be >= 0, got " + std::to_string(options.eps));
    detail::require(options.weight_decay >= 0,
                    "AdamW weight_decay must be >= 0, got " + std::to_string(options.weight_decay));
  }

  template <class Kernels, class T>
  void update(Kernels& k, std::size_t n, T* params, const T* grads, T* state,
              std::size_t step) const {
    k.adamw_update(n, params, grads, state, state + n, options.lr, options.beta1, options.beta2,
                   options.eps, options.weight_decay, step);
  }

  Options options;
};

}  // namespace gpipe::optim
