#pragma once
// gpipe::optim::SGD: torch.optim.SGD (momentum, dampening, weight decay, Nesterov).
// An optimizer provides state_per_param (floats of state it keeps per parameter, allocated and
// zeroed by the Trainer on each stage's device), check() for its hyperparameters, and
// update(kernels, n, params, grads, state, step) with step = 1, 2, ... counted by the Trainer.

#include <cstddef>
#include <string>

#include "gpipe/error.hpp"

namespace gpipe::optim {

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
};

class SGD {
 public:
  using Options = SGDOptions;

  explicit SGD(Options options = {}) : options(options) { check(); }

  static constexpr std::size_t state_per_param = 1;  ///< momentum buffer

  void check() const {
    detail::require(options.lr >= 0, "SGD lr must be >= 0, got " + std::to_string(options.lr));
    detail::require(options.momentum >= 0,
                    "SGD momentum must be >= 0, got " + std::to_string(options.momentum));
    detail::require(options.weight_decay >= 0,
                    "SGD weight_decay must be >= 0, got " + std::to_string(options.weight_decay));
    detail::require(!options.nesterov || (options.momentum > 0 && options.dampening == 0),
                    "SGD nesterov needs momentum > 0 and dampening == 0");
  }

  template <class Kernels, class T>
  void update(Kernels& k, std::size_t n, T* params, const T* grads, T* state,
              std::size_t step) const {
    k.sgd_update(n, params, grads, state, options.lr, options.momentum, options.dampening,
                 options.weight_decay, options.nesterov, step == 1);
  }

  Options options;  ///< may be changed between steps (e.g. a learning-rate schedule)
};

}  // namespace gpipe::optim
