// expect: a loss needs static normalizer
// A user's loss that lacks one piece (here normalizer, the divisor of the summed loss), given to
// a Trainer: the error names the missing piece (gpipe::loss_for, model/loss.hpp) where the Trainer
// is named, not deep inside its step runner.
#include <cstddef>
#include <cstdint>
#include <gpipe/gpipe.hpp>
#include <span>

struct CountingLoss {
  using target_type = std::int32_t;
  static constexpr std::size_t targets_per_row(std::size_t) { return 1; }
  static void check(std::span<const std::int32_t>, std::size_t) {}
  template <class Ctx, class T>
  static void apply(Ctx& ctx, std::size_t rows, std::size_t classes, const T* logits,
                    const std::int32_t* targets, T grad_scale, T* dlogits, T* loss_sum) {
    ctx.softmax_cross_entropy(rows, classes, logits, targets, grad_scale, dlogits, loss_sum);
  }
};

using Model = gpipe::Pipeline<gpipe::Stage<gpipe::Linear<4, 2>>>;
using Broken = gpipe::Trainer<Model, CountingLoss, gpipe::host::Backend>;
void use(Broken* trainer) { (void)trainer->options(); }
