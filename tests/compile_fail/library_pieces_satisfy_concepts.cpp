// expect-compiles
// Control for the loss, optimizer and schedule-kind compile-fail tests: the library's own losses,
// optimizers and schedule tags satisfy the concepts those tests break (gpipe::loss_for,
// gpipe::optimizer_for, gpipe::schedule_kind), with the host backend's kernel context.
#include <gpipe/gpipe.hpp>

namespace {

template <class Ctx>
constexpr bool library_runs_on() {
  static_assert(gpipe::loss_for<gpipe::SoftmaxCrossEntropy, Ctx>);
  static_assert(gpipe::loss_for<gpipe::MSELoss, Ctx>);
  static_assert(gpipe::optimizer_for<gpipe::optim::SGD, Ctx>);
  static_assert(gpipe::optimizer_for<gpipe::optim::AdamW, Ctx>);
  return true;
}
static_assert(library_runs_on<gpipe::host::Kernels<float>>());

static_assert(gpipe::schedule_kind<gpipe::GPipe>);
static_assert(gpipe::schedule_kind<gpipe::OneFOneB>);
static_assert(gpipe::schedule_kind<gpipe::Interleaved<2>>);
static_assert(gpipe::schedule_kind<gpipe::ZeroBubbleH1>);

// and a type that is none of them is refused by each concept, not accepted by accident
struct Nothing {};
static_assert(!gpipe::loss<Nothing> && !gpipe::optimizer<Nothing> &&
              !gpipe::schedule_kind<Nothing>);

}  // namespace

int main() {}
