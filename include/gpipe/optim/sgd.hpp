#pragma once
// gpipe::optim::SGD: torch.optim.SGD (momentum, dampening, weight decay, Nesterov). What an
// optimizer provides is the `optimizer` concept's (optim/optimizer.hpp).

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpipe/error.hpp"
#include "gpipe/optim/optimizer.hpp"

namespace gpipe::optim {

/// SGD's hyperparameters, with PyTorch's defaults (plain gradient descent at lr 1e-3);
/// `SGD::check` states their valid ranges.
struct SGDOptions {
  double lr = 1e-3;         ///< learning rate, >= 0
  double momentum = 0;      ///< factor of the momentum buffer, >= 0; 0 keeps no buffer
  double dampening = 0;     ///< the buffer adds `(1 - dampening) d` from the second step on
  double weight_decay = 0;  ///< L2 penalty added to the gradient: `d = g + weight_decay p`, >= 0
  bool nesterov = false;    ///< Nesterov momentum; needs momentum > 0 and dampening == 0
};

/// torch.optim.SGD, applied by `Trainer::step`. At step t = 1, 2, ... each parameter p with
/// gradient g becomes, in float as PyTorch's single-tensor implementation does:
///
///     d = g + wd p
///     if momentum != 0:  buf = (t == 1) ? d : momentum buf + (1 - dampening) d
///                        d = nesterov ? d + momentum buf : buf
///     p -= lr d
///
/// The buffer lives on each stage's device (`state_per_param` = 1).
class SGD {
 public:
  /// The hyperparameters' type, so that generic code can write `Optimizer::Options`.
  using Options = SGDOptions;

  /// Throws `gpipe::Error` when a hyperparameter is out of range (see `check`).
  explicit SGD(Options options = {}) : options(options) { check(); }

  static constexpr std::size_t state_per_param = 1;  ///< momentum buffer
  /// The kind a checkpoint records; its state under PyTorch's name (`<param>.momentum_buffer`).
  static constexpr std::string_view name = "SGD";
  /// PyTorch's name of the state plane, as checkpoints write it.
  static constexpr std::array<std::string_view, 1> state_names{"momentum_buffer"};

  /// The hyperparameters as a checkpoint records them (shortest round-trip decimals).
  std::vector<std::pair<std::string, std::string>> hyperparameters() const {
    return {{"lr", detail::decimal(options.lr)},
            {"momentum", detail::decimal(options.momentum)},
            {"dampening", detail::decimal(options.dampening)},
            {"weight_decay", detail::decimal(options.weight_decay)},
            {"nesterov", options.nesterov ? "true" : "false"}};
  }

  /// Throws `gpipe::Error` naming the first hyperparameter out of range: lr, momentum or
  /// weight_decay < 0, or nesterov without momentum > 0 and dampening == 0. `Trainer::step` calls
  /// it, so edits to `options` between steps are checked too.
  void check() const {
    detail::require(options.lr >= 0, "SGD lr must be >= 0, got " + std::to_string(options.lr));
    detail::require(options.momentum >= 0,
                    "SGD momentum must be >= 0, got " + std::to_string(options.momentum));
    detail::require(options.weight_decay >= 0,
                    "SGD weight_decay must be >= 0, got " + std::to_string(options.weight_decay));
    detail::require(!options.nesterov || (options.momentum > 0 && options.dampening == 0),
                    "SGD nesterov needs momentum > 0 and dampening == 0");
  }

  /// One update of `n` parameters in place on the device whose kernels `k` are: `params` (n) from
  /// `grads` (n), with `state` (n, the momentum buffer) updated in place; `step` >= 1 counts this
  /// optimizer's updates (step 1 starts the buffer from `d`).
  template <class Kernels, class T>
  void update(Kernels& k, std::size_t n, T* params, const T* grads, T* state,
              std::size_t step) const {
    k.sgd_update(n, params, grads, state, options.lr, options.momentum, options.dampening,
                 options.weight_decay, options.nesterov, step == 1);
  }

  Options options;  ///< may be changed between steps (e.g. a learning-rate schedule)
};

}  // namespace gpipe::optim
