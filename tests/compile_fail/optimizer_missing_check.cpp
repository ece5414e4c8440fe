// expect: an optimizer needs check\(\) const
// A user's optimizer without check() (its hyperparameters' validation), given to Trainer::step:
// the error names the missing piece (gpipe::optimizer_for, optim/optimizer.hpp) at the call.
#include <cstddef>
#include <cstdint>
#include <gpipe/gpipe.hpp>
#include <vector>

struct PlainDescent {
  static constexpr std::size_t state_per_param = 0;
  double lr = 0.1;
  template <class Kernels, class T>
  void update(Kernels& k, std::size_t n, T* params, const T* grads, T*, std::size_t) const {
    k.sgd_update(n, params, grads, nullptr, lr, 0, 0, 0, false, false);
  }
};

using Model = gpipe::Pipeline<gpipe::Stage<gpipe::Linear<4, 2>>>;
void train(gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, gpipe::host::Backend>& trainer) {
  trainer.step(PlainDescent{});
}
