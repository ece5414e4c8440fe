// Pipeline and Stage as types: shapes, parameter counts and PyTorch names of the public-contract
// model and of composite layers, width-generic layers binding to the width before them, the layer
// concept (positive and negative), a user-defined layer inside a Pipeline, and Rng.

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "gpipe/backend/host.hpp"
#include "gpipe/model.hpp"
#include "support/finite_difference.hpp"

namespace {

using gpipe::GELU;
using gpipe::LayerNorm;
using gpipe::Linear;
using gpipe::Pipeline;
using gpipe::ReLU;
using gpipe::Residual;
using gpipe::Rng;
using gpipe::Stage;
using HostFloat = gpipe::host::Kernels<float>;
using HostDouble = gpipe::host::Kernels<double>;

// The public-contract model: the three-stage model whose names and sizes users rely on.
using ContractModel =
    Pipeline<Stage<Linear<64, 256>, ReLU>, Stage<Linear<256, 256>, GELU, LayerNorm<256>>,
             Stage<Linear<256, 10>>>;

// What Model::parameters() says about one tensor.
struct Expected {
  std::string name;
  std::vector<std::size_t> shape;
  std::size_t stage;
  std::size_t offset;
};

template <class Model>
void check_parameters(const std::vector<Expected>& expected) {
  const std::vector<gpipe::ParameterInfo> got = Model::parameters();
  REQUIRE(got.size() == expected.size());
  std::array<std::size_t, Model::num_stages> stage_total{};
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(expected[i].name);
    CHECK(got[i].name == expected[i].name);
    CHECK(got[i].shape == expected[i].shape);
    CHECK(got[i].stage == expected[i].stage);
    CHECK(got[i].offset == expected[i].offset);
    std::size_t size = 1;
    for (std::size_t d : expected[i].shape) size *= d;
    CHECK(got[i].size == size);
    stage_total[got[i].stage] += got[i].size;
  }
  // The tensors tile each stage's flat parameter array.
  for (std::size_t s = 0; s < Model::num_stages; ++s)
    CHECK(stage_total[s] == Model::stage_num_params[s]);
}

// ---- The layer concept, negatively: each type lacks one piece of a layer. -------------------

struct Features {
  static constexpr std::size_t in_features = 3;
  static constexpr std::size_t out_features = 3;
};
struct Stash {
  static constexpr std::size_t stash_per_row = 0;
  static constexpr std::size_t grad_stash_per_row = 0;
};
struct Ops {  // identity
  template <class Ctx>
  static void forward(Ctx& ctx, const gpipe::ForwardArgs<typename Ctx::value_type>& a) {
    ctx.copy(a.rows * 3, a.x, a.y);
  }
  template <class Ctx>
  static void backward_input(Ctx& ctx,
                             const gpipe::BackwardInputArgs<typename Ctx::value_type>& a) {
    ctx.copy(a.rows * 3, a.dy, a.dx);
  }
};

// The control: all pieces together are a layer, so each negative below fails for its one gap.
struct CompleteLayer : Features, gpipe::ParameterFree, Stash, Ops {};

struct MissingInFeatures : gpipe::ParameterFree, Stash, Ops {
  static constexpr std::size_t out_features = 3;
};
struct ZeroFeatures : gpipe::ParameterFree, Stash, Ops {
  static constexpr std::size_t in_features = 0;
  static constexpr std::size_t out_features = 3;
};
struct MissingInit : Features, Stash, Ops {
  static constexpr std::size_t num_params = 0;
  static constexpr std::array<gpipe::ParamSpec, 0> param_specs() { return {}; }
};
struct MissingStashSizes : Features, gpipe::ParameterFree, Ops {};
struct MissingGradStashSize : Features, gpipe::ParameterFree, Ops {
  static constexpr std::size_t stash_per_row = 0;
};
struct MissingBackwardInput : Features, gpipe::ParameterFree, Stash {
  template <class Ctx>
  static void forward(Ctx&, const gpipe::ForwardArgs<typename Ctx::value_type>&) {}
};
struct NotALayer {};

static_assert(gpipe::layer<CompleteLayer>);
static_assert(gpipe::layer_for<CompleteLayer, HostFloat>);

static_assert(MissingInFeatures::out_features == 3 && !gpipe::has_features<MissingInFeatures>);
static_assert(!gpipe::layer<MissingInFeatures>);
static_assert(!gpipe::has_features<ZeroFeatures>);
static_assert(!gpipe::layer<ZeroFeatures>);
static_assert(!gpipe::has_parameters<MissingInit>);
static_assert(!gpipe::layer<MissingInit>);
static_assert(!gpipe::has_stash<MissingStashSizes>);
static_assert(!gpipe::layer<MissingStashSizes>);
static_assert(!gpipe::has_stash<MissingGradStashSize>);
static_assert(!gpipe::layer<MissingGradStashSize>);
static_assert(gpipe::layer<MissingBackwardInput>);  // the compile-time part is there ...
static_assert(!gpipe::layer_for<MissingBackwardInput, HostFloat>);  // ... the ops are not
static_assert(!gpipe::layer<NotALayer>);
static_assert(!gpipe::layer_spec<NotALayer>);
static_assert(!gpipe::layer_spec<int>);
static_assert(!gpipe::layer<int>);

// ---- A user-defined layer: y = x * w, one weight per feature, in plain loops over host memory.

template <std::size_t N>
struct Scale {
  static constexpr std::size_t in_features = N;
  static constexpr std::size_t out_features = N;
  static constexpr std::size_t num_params = N;
  static constexpr std::size_t stash_per_row = 0;
  static constexpr std::size_t grad_stash_per_row = 0;

  static constexpr std::array<gpipe::ParamSpec, 1> param_specs() {
    return {gpipe::ParamSpec{.name = "weight", .shape = {N, 0}, .rank = 1, .offset = 0}};
  }
  static void init(std::span<float> params, Rng& rng) {
    for (float& w : params) w = rng.uniform(0.5f, 1.5f);
  }

  template <class Ctx>
  static void forward(Ctx&, const gpipe::ForwardArgs<typename Ctx::value_type>& a) {
    for (std::size_t r = 0; r < a.rows; ++r)
      for (std::size_t k = 0; k < N; ++k) a.y[r * N + k] = a.x[r * N + k] * a.params[k];
  }
  template <class Ctx>
  static void backward_input(Ctx&, const gpipe::BackwardInputArgs<typename Ctx::value_type>& a) {
    for (std::size_t r = 0; r < a.rows; ++r)
      for (std::size_t k = 0; k < N; ++k) a.dx[r * N + k] = a.dy[r * N + k] * a.params[k];
  }
  template <class Ctx>
  static void backward_weight(Ctx&, const gpipe::BackwardWeightArgs<typename Ctx::value_type>& a) {
    for (std::size_t r = 0; r < a.rows; ++r)
      for (std::size_t k = 0; k < N; ++k) a.grads[k] += a.dy[r * N + k] * a.x[r * N + k];
  }
};

// Layers: 0 Linear, 1 Scale | 2 GELU, 3 Scale, 4 Linear.
using UserModel = Pipeline<Stage<Linear<4, 6>, Scale<6>>, Stage<GELU, Scale<6>, Linear<6, 3>>>;

// f = sum(c * y) and its gradients for random inputs to L, against central differences.
template <gpipe::layer L>
void check_against_finite_differences(std::uint64_t seed) {
  constexpr std::size_t rows = 3;
  Rng rng(seed);
  const auto x = gpipe::test::uniform_values(rng, rows * L::in_features, -1.0f, 1.0f);
  const auto params = gpipe::test::perturbed_params<L>(rng, 0.25f);
  const auto c = gpipe::test::uniform_values(rng, rows * L::out_features, -1.0f, 1.0f);
  const auto check = gpipe::test::check_gradients<L>(x, params, c, rows, 1e-6);
  CAPTURE(check.dx_error);
  CAPTURE(check.params_error);
  CHECK(check.max_dx > 1e-2);
  CHECK(check.max_grad > 1e-2);
  CHECK(check.dx_error <= 1e-8);
  CHECK(check.params_error <= 1e-8);
}

}  // namespace

TEST_SUITE("model pipeline") {
  TEST_CASE("the contract model's shapes and parameter counts are known at compile time") {
    using M = ContractModel;
    static_assert(M::num_stages == 3);
    static_assert(M::num_layers == 6);
    static_assert(M::in_features == 64 && M::out_features == 10);
    static_assert(M::stage_t<0>::in_features == 64 && M::stage_t<0>::out_features == 256);
    static_assert(M::stage_t<1>::in_features == 256 && M::stage_t<1>::out_features == 256);
    static_assert(M::stage_t<2>::in_features == 256 && M::stage_t<2>::out_features == 10);
    // Linear<64, 256>: 64 * 256 + 256; ReLU: 0 | Linear<256, 256>: 256 * 256 + 256; GELU: 0;
    // LayerNorm<256>: 2 * 256 | Linear<256, 10>: 256 * 10 + 10.
    static_assert(M::stage_num_params == std::array<std::size_t, 3>{16640, 66304, 2570});
    static_assert(M::num_params == 85514);
    static_assert(M::layer_offset == std::array<std::size_t, 3>{0, 2, 5});
    static_assert(gpipe::layer_for<M::stage_t<1>, HostFloat>);
    CHECK(M::num_params == 85514);
  }

  TEST_CASE("the contract model's parameters are named as in a PyTorch nn.Sequential") {
    check_parameters<ContractModel>({
        {"0.weight", {256, 64}, 0, 0},
        {"0.bias", {256}, 0, 16384},
        {"2.weight", {256, 256}, 1, 0},
        {"2.bias", {256}, 1, 65536},
        {"4.weight", {256}, 1, 65792},
        {"4.bias", {256}, 1, 66048},
        {"5.weight", {10, 256}, 2, 0},
        {"5.bias", {10}, 2, 2560},
    });
  }

  TEST_CASE("a Residual names its children i.j.weight, and a nested Residual i.j.k.weight") {
    using M =
        Pipeline<Stage<Linear<4, 6>, Residual<Linear<6, 6>, GELU, LayerNorm<6>>>,
                 Stage<Residual<Linear<6, 6>, Residual<LayerNorm<6>, Linear<6, 6>>>, Linear<6, 3>>>;
    static_assert(M::num_layers == 4);
    static_assert(M::layer_offset == std::array<std::size_t, 2>{0, 2});
    static_assert(M::stage_num_params ==
                  std::array<std::size_t, 2>{30 + 42 + 12, 42 + 12 + 42 + 21});
    check_parameters<M>({
        {"0.weight", {6, 4}, 0, 0},
        {"0.bias", {6}, 0, 24},
        {"1.0.weight", {6, 6}, 0, 30},
        {"1.0.bias", {6}, 0, 66},
        {"1.2.weight", {6}, 0, 72},
        {"1.2.bias", {6}, 0, 78},
        {"2.0.weight", {6, 6}, 1, 0},
        {"2.0.bias", {6}, 1, 36},
        {"2.1.0.weight", {6}, 1, 42},
        {"2.1.0.bias", {6}, 1, 48},
        {"2.1.1.weight", {6, 6}, 1, 54},
        {"2.1.1.bias", {6}, 1, 90},
        {"3.weight", {3, 6}, 1, 96},
        {"3.bias", {3}, 1, 114},
    });
  }

  TEST_CASE("composite layers nest as deep as ParamSpec::max_depth names") {
    // Stage -> Residual -> Residual -> Residual -> Linear: a path of ParamSpec::max_depth indices.
    using M = Pipeline<Stage<Linear<3, 2>>, Stage<Residual<Residual<Residual<Linear<2, 2>>>>>>;
    static_assert(gpipe::ParamSpec::max_depth == 4);
    check_parameters<M>({
        {"0.weight", {2, 3}, 0, 0},
        {"0.bias", {2}, 0, 6},
        {"1.0.0.0.weight", {2, 2}, 1, 0},
        {"1.0.0.0.bias", {2}, 1, 4},
    });
  }

  TEST_CASE("a stage that opens with a width-generic layer takes the width of the stage before") {
    using M = Pipeline<Stage<Linear<4, 6>>, Stage<ReLU, Linear<6, 2>>, Stage<GELU>,
                       Stage<Residual<GELU, Linear<2, 2>>, LayerNorm<2>>>;
    static_assert(std::is_same_v<M::stage_t<1>, Stage<ReLU, Linear<6, 2>>::bound<6>>);
    static_assert(M::stage_t<1>::in_features == 6 && M::stage_t<1>::out_features == 2);
    static_assert(M::stage_t<2>::in_features == 2 && M::stage_t<2>::out_features == 2);
    static_assert(M::stage_t<3>::in_features == 2 && M::stage_t<3>::out_features == 2);
    static_assert(M::out_features == 2);
    static_assert(M::stage_num_params == std::array<std::size_t, 4>{30, 14, 0, 6 + 4});
    static_assert(M::layer_offset == std::array<std::size_t, 4>{0, 1, 3, 4});
    check_parameters<M>({
        {"0.weight", {6, 4}, 0, 0},
        {"0.bias", {6}, 0, 24},
        {"2.weight", {2, 6}, 1, 0},
        {"2.bias", {2}, 1, 12},
        {"4.1.weight", {2, 2}, 3, 0},
        {"4.1.bias", {2}, 3, 4},
        {"5.weight", {2}, 3, 6},
        {"5.bias", {2}, 3, 8},
    });
  }

  TEST_CASE("a pipeline may open with a Residual or LayerNorm, whose width is its own") {
    using M = Pipeline<Stage<Residual<Linear<8, 8>>>, Stage<LayerNorm<8>, Linear<8, 1>>>;
    static_assert(M::in_features == 8 && M::out_features == 1);
    using N = Pipeline<Stage<LayerNorm<5>, ReLU>>;
    static_assert(N::in_features == 5 && N::out_features == 5 && N::num_params == 10);
    CHECK(M::parameters().front().name == "0.0.weight");
  }

  TEST_CASE("built-in layers satisfy gpipe::layer and run with the host kernels") {
    static_assert(gpipe::layer<Linear<3, 2>>);
    static_assert(gpipe::layer<LayerNorm<4>>);
    static_assert(gpipe::layer<ReLU::with_features<5>>);
    static_assert(gpipe::layer<GELU::with_features<5>>);
    static_assert(gpipe::layer<Residual<Linear<4, 4>, ReLU>::with_features<4>>);
    static_assert(gpipe::layer<Stage<Linear<4, 8>, ReLU, LayerNorm<8>>::bound<4>>);
    // Width-generic specs are not layers until bound, but a Stage accepts them.
    static_assert(!gpipe::layer<ReLU> && !gpipe::layer<GELU>);
    static_assert(gpipe::width_generic_layer<ReLU> && gpipe::layer_spec<ReLU>);
    static_assert(gpipe::layer_spec<Residual<Linear<4, 4>>>);
    static_assert(gpipe::layer_spec<Linear<3, 2>> && !gpipe::width_generic_layer<Linear<3, 2>>);
    static_assert(gpipe::stage<Stage<ReLU>> && !gpipe::stage<Linear<3, 2>>);

    static_assert(gpipe::layer_for<Linear<3, 2>, HostFloat>);
    static_assert(gpipe::layer_for<Linear<3, 2>, HostDouble>);
    static_assert(gpipe::layer_for<LayerNorm<4>, HostFloat>);
    static_assert(gpipe::layer_for<GELU::with_features<5>, HostFloat>);
    static_assert(gpipe::layer_for<ContractModel::stage_t<0>, HostFloat>);
    static_assert(gpipe::layer_for<ContractModel::stage_t<2>, HostDouble>);
    CHECK(gpipe::layer<Linear<3, 2>>);
  }

  TEST_CASE("a user-defined layer satisfies gpipe::layer and has correct gradients") {
    static_assert(gpipe::layer<Scale<5>>);
    static_assert(gpipe::layer_for<Scale<5>, HostFloat>);
    static_assert(gpipe::layer_for<Scale<5>, HostDouble>);
    check_against_finite_differences<Scale<5>>(1);
  }

  TEST_CASE("a user-defined layer works inside a Stage and a Pipeline") {
    using M = UserModel;
    static_assert(M::num_stages == 2 && M::num_layers == 5);
    static_assert(M::in_features == 4 && M::out_features == 3);
    static_assert(M::stage_num_params == std::array<std::size_t, 2>{30 + 6, 6 + 21});
    static_assert(gpipe::layer_for<M::stage_t<0>, HostFloat>);
    static_assert(gpipe::layer_for<M::stage_t<1>, HostFloat>);
    check_parameters<M>({
        {"0.weight", {6, 4}, 0, 0},
        {"0.bias", {6}, 0, 24},
        {"1.weight", {6}, 0, 30},
        {"3.weight", {6}, 1, 0},
        {"4.weight", {3, 6}, 1, 6},
        {"4.bias", {3}, 1, 24},
    });
    // Each stage, and the two stages run one after the other as one unpipelined model.
    check_against_finite_differences<M::stage_t<0>>(2);
    check_against_finite_differences<M::stage_t<1>>(3);
    check_against_finite_differences<gpipe::detail::Chain<M::stage_t<0>, M::stage_t<1>>>(4);
  }

  TEST_CASE("Rng gives the same sequence for the same seed, on every platform") {
    Rng a(42), b(42), other(43);
    bool differs = false;
    for (int i = 0; i < 100; ++i) {
      const std::uint64_t va = a.next_u64();
      CHECK(va == b.next_u64());
      differs = differs || va != other.next_u64();
    }
    CHECK(differs);
    // SplitMix64's published first outputs for seed 0.
    Rng zero(0);
    CHECK(zero.next_u64() == 0xE220A8397B1DCDAFull);
    CHECK(zero.next_u64() == 0x6E789E6AA1B965F4ull);
    // Usable in constant expressions.
    static_assert([] {
      Rng r(7), s(7);
      return r.next_u64() == s.next_u64() && r.uniform(-1, 1) == s.uniform(-1, 1);
    }());
  }

  TEST_CASE("Rng::uniform draws from [lo, hi) and covers it evenly") {
    Rng rng(5);
    constexpr int n = 100000;
    constexpr float lo = -0.75f, hi = 2.25f;
    double sum = 0;
    float min = hi, max = lo;
    std::array<int, 10> bins{};
    for (int i = 0; i < n; ++i) {
      const float u = rng.uniform(lo, hi);
      min = std::min(min, u);
      max = std::max(max, u);
      sum += u;
      ++bins[std::min<std::size_t>(9, static_cast<std::size_t>((u - lo) / (hi - lo) * 10))];
    }
    CHECK(min >= lo);
    CHECK(max < hi);
    CHECK(min < lo + 0.001f);
    CHECK(max > hi - 0.001f);
    CHECK(sum / n == doctest::Approx((lo + hi) / 2).epsilon(0.01));
    for (int count : bins) CHECK(std::abs(count - n / 10) < n / 100);  // ~10 sigma
  }

  TEST_CASE("layer initialization is deterministic and follows PyTorch's default bounds") {
    using L = Linear<16, 8>;
    std::vector<float> p(L::num_params), q(L::num_params);
    Rng r1(9), r2(9);
    L::init(p, r1);
    L::init(q, r2);
    CHECK(p == q);
    const float bound = 0.25f;  // 1 / sqrt(16)
    CHECK(std::ranges::all_of(p, [&](float v) { return v >= -bound && v < bound; }));
    CHECK(std::ranges::any_of(p, [&](float v) { return v > bound / 2; }));
    CHECK(std::ranges::any_of(p, [&](float v) { return v < -bound / 2; }));
  }
}
