#pragma once
// Costs measured on a backend: each layer's forward and backward (the measured variant of the
// balanced cut, gpipe/model/cost.hpp, printed as the Pipeline type to paste), and a trainer's
// F, B and W op times per device (what search_schedule takes) or per stage.
//
//   auto costs = gpipe::measure_layer_costs<Emb, Block, Block, Norm, Head>(backend, samples);
//   auto cut = gpipe::balanced_cut(gpipe::totals(costs), K);
//   std::cout << gpipe::pipeline_type_name<Emb, Block, Block, Norm, Head>(cut, K);
//
// Each layer runs alone on device 0 of the backend, bound as a Pipeline binds it, on `samples`
// samples of random inputs (token ids for an Embedding), after one warm-up: forward, then
// backward_input and backward_weight, each pass timed with the host clock around the backend's
// synchronize; the median of `repeats`. What a layer costs inside a whole step (transfers, the
// executor's overhead) is not in it.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpipe/backend/concepts.hpp"
#include "gpipe/error.hpp"
#include "gpipe/model/cost.hpp"
#include "gpipe/model/detail/chain.hpp"
#include "gpipe/model/layer.hpp"
#include "gpipe/schedule/op.hpp"
#include "gpipe/schedule/simulator.hpp"

namespace gpipe {

namespace detail {

// The name of type T as the compiler spells it ("gpipe::Linear<768, 3072>").
template <class T>
constexpr std::string_view spelled_type_name() {
#if defined(__clang__) || defined(__GNUC__)
  constexpr std::string_view f = __PRETTY_FUNCTION__;
#if defined(__clang__)
  constexpr std::string_view key = "T = ";
  constexpr std::string_view end = "]";
#else
  constexpr std::string_view key = "with T = ";
  constexpr std::string_view end = ";]";
#endif
  const std::size_t start = f.find(key) + key.size();
  return f.substr(start, f.find_first_of(end, start) - start);
#else
  return "?";
#endif
}

// Layer L bound on device 0 of `backend` to buffers for `rows` rows, as a Pipeline binds it.
template <class L, class Backend>
class BoundLayer {
  using Kernels = typename Backend::Kernels;
  using T = typename Kernels::value_type;
  using Array = typename Backend::template Buffer<T>;

 public:
  BoundLayer(Backend& backend, std::size_t rows) : backend_(backend), rows_(rows) {}

  // Uploads the parameters, the input x and the output gradient dy, and zeroes the gradients.
  void upload(const std::vector<T>& params, const std::vector<T>& x, const std::vector<T>& dy) {
    backend_.submit(0, {"measure: upload"}, [&](Kernels& k) {
      k.upload(params.size(), params.data(), params_.data());
      k.upload(x.size(), x.data(), x_.data());
      k.upload(dy.size(), dy.data(), dy_.data());
      k.fill(L::num_params, T{0}, grads_.data());
    });
    backend_.synchronize();
  }
  void forward(Kernels& k) {
    L::forward(k, ForwardArgs<T>{rows_, x_.data(), y_.data(), params_.data(), stash_.data(),
                                 workspace_.data()});
  }
  // B, then W.
  void backward(Kernels& k) {
    L::backward_input(k,
                      BackwardInputArgs<T>{rows_, x_.data(), dy_.data(), dx_.data(), params_.data(),
                                           stash_.data(), grad_stash_.data(), workspace_.data()});
    L::backward_weight(
        k, BackwardWeightArgs<T>{rows_, x_.data(), dy_.data(), params_.data(), stash_.data(),
                                 grad_stash_.data(), grads_.data(), workspace_.data()});
  }

 private:
  Array allocate(std::size_t n, MemoryKind kind = MemoryKind::activations) {
    return backend_.template allocate<T>(0, std::max<std::size_t>(n, 1), kind);
  }

  Backend& backend_;
  std::size_t rows_;
  Array params_ = allocate(L::num_params, MemoryKind::parameters);
  Array grads_ = allocate(L::num_params, MemoryKind::gradients);
  Array x_ = allocate(rows_ * L::in_features), dy_ = allocate(rows_ * L::out_features),
        y_ = allocate(rows_ * L::out_features), dx_ = allocate(rows_ * L::in_features),
        stash_ = allocate(rows_ * L::stash_per_row),
        grad_stash_ = allocate(rows_ * L::grad_stash_per_row),
        workspace_ = allocate(rows_ * workspace_per_row_v<L>, MemoryKind::workspace);
};

// Seconds of forward and of backward (B then W) of the bound layer L on `rows` rows, on device 0.
template <class L, bool TokenIds, class Backend>
LayerCost time_layer(Backend& backend, std::size_t rows, std::size_t vocab, std::size_t repeats) {
  using Kernels = typename Backend::Kernels;
  static_assert(std::is_same_v<typename Kernels::value_type, float>,
                "gpipe: measure_layer_costs times float layers");
  Rng rng(1);
  auto random = [&](std::size_t n, bool ids) {
    std::vector<float> v(n);
    for (float& x : v)
      x = ids ? static_cast<float>(rng.next_u64() % vocab) : rng.uniform(-1.0f, 1.0f);
    return v;
  };
  std::vector<float> params(L::num_params);
  L::init(params, rng);
  const std::vector<float> x = random(rows * L::in_features, TokenIds);
  const std::vector<float> dy = random(rows * L::out_features, false);
  BoundLayer<L, Backend> layer(backend, rows);
  layer.upload(params, x, dy);
  auto seconds = [&](auto&& work) {
    const auto start = std::chrono::steady_clock::now();
    backend.submit(0, {"measure"}, work);
    backend.synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const auto forward = [&](Kernels& k) { layer.forward(k); };
  const auto backward = [&](Kernels& k) { layer.backward(k); };
  seconds(forward);  // warm-up: first touches, caches, kernels' setup
  seconds(backward);
  std::vector<double> f, b;
  for (std::size_t r = 0; r < repeats; ++r) {
    f.push_back(seconds(forward));
    b.push_back(seconds(backward));
  }
  auto median = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  return {median(f), median(b)};
}

template <class Backend, class... Bs>
std::vector<LayerCost> time_chain(Backend& backend, std::size_t rows, std::size_t vocab,
                                  std::size_t repeats, const Chain<Bs...>*) {
  std::vector<LayerCost> out;
  std::size_t index = 0;
  (
      [&] {
        const bool ids = index++ == 0 && tokens_per_sample_v<Bs> > 0 && vocab > 0;
        out.push_back(ids ? time_layer<Bs, true>(backend, rows, vocab, repeats)
                          : time_layer<Bs, false>(backend, rows, vocab, repeats));
      }(),
      ...);
  return out;
}

}  // namespace detail

/// Each of Layers (in order, bound as a Pipeline of them binds them) timed on device 0 of
/// `backend` on `samples` samples (T tokens each in a token model): seconds of forward and of
/// backward (B and W), medians of `repeats` after a warm-up. Throws gpipe::Error for 0 samples
/// or repeats.
template <layer_spec... Layers, class Backend>
std::array<LayerCost, sizeof...(Layers)> measure_layer_costs(Backend& backend, std::size_t samples,
                                                             std::size_t repeats = 3) {
  if (samples == 0 || repeats == 0)
    throw Error("gpipe: measure_layer_costs needs at least one sample and one repeat");
  using first = std::tuple_element_t<0, std::tuple<Layers...>>;
  static_assert(detail::natural_in_features_v<first> > 0,
                "gpipe: the first layer must fix its input width");
  constexpr std::size_t T = detail::tokens_per_sample_v<first>;
  using bound = detail::bind_chain_t<detail::natural_in_features_v<first>, T, Layers...>;
  std::size_t vocab = 0;
  if constexpr (requires { first::vocab_size; }) vocab = first::vocab_size;
  const std::vector<LayerCost> timed = detail::time_chain(
      backend, samples * (T > 0 ? T : 1), vocab, repeats, static_cast<const bound*>(nullptr));
  std::array<LayerCost, sizeof...(Layers)> out{};
  std::copy(timed.begin(), timed.end(), out.begin());
  return out;
}

/// [event] each event's duration as work on a core of its own, microseconds: where devices share
/// `cores` cores (simulate_on_cores' model), the time an event ran while n > cores compute events
/// (of any device) ran at once counts cores / n of itself; `cores` 0 (or at least the events'
/// most at once) gives each event's duration. Work that is not compute (WorkLabel::compute false)
/// keeps its duration and is not counted among those running. So simulate_on_cores with these
/// costs and `cores` reproduces the trace's stretched durations where the OS shares cores evenly.
inline std::vector<double> core_work(std::span<const TraceEvent> events, double cores) {
  std::vector<double> out;
  for (const TraceEvent& e : events) out.push_back(e.end_us - e.start_us);
  if (!(cores > 0)) return out;
  // (time, +1 at a start / -1 at an end) of compute events; effective[i]: the work a running
  // event does from the first edge to times[i]
  std::vector<std::pair<double, int>> edges;
  for (const TraceEvent& e : events)
    if (e.label.compute) edges.insert(edges.end(), {{e.start_us, 1}, {e.end_us, -1}});
  std::sort(edges.begin(), edges.end());
  std::vector<double> times, effective;
  int running = 0;
  for (std::size_t i = 0; i < edges.size(); ++i) {
    if (times.empty() || edges[i].first != times.back()) {
      const double rate =
          running > cores ? cores / static_cast<double>(running) : 1.0;  // since times.back()
      effective.push_back(
          times.empty() ? 0.0 : effective.back() + (edges[i].first - times.back()) * rate);
      times.push_back(edges[i].first);
    }
    running += edges[i].second;
  }
  const auto at = [&](double t) {
    return effective[static_cast<std::size_t>(std::lower_bound(times.begin(), times.end(), t) -
                                              times.begin())];
  };
  for (std::size_t i = 0; i < events.size(); ++i)
    if (events[i].label.compute) out[i] = at(events[i].end_us) - at(events[i].start_us);
  return out;
}

namespace detail {

// The mean F, B and W durations (microseconds) over `steps` traced steps of `trainer`, grouped
// by key(event) (n groups; a key of n or more drops the event), each as core_work counts it
// under `cores`, then the gradients zeroed.
template <class TrainerT, class X, class Y, class Key>
std::vector<OpCosts> mean_op_costs(TrainerT& trainer, const X& x, const Y& y, std::size_t steps,
                                   std::size_t n, double cores, Key key) {
  if (steps == 0) throw Error("gpipe: measure_op_costs needs at least one step");
  if (!(cores >= 0)) throw Error("gpipe: measure_op_costs needs cores >= 0");
  auto& backend = trainer.backend();
  std::vector<std::array<double, 3>> sum(n, {0, 0, 0});
  std::vector<std::array<std::size_t, 3>> count(n, {0, 0, 0});
  backend.set_tracing(true);
  for (std::size_t i = 0; i < steps; ++i) trainer.forward_backward(x, y);
  backend.set_tracing(false);
  const std::vector<TraceEvent> trace = backend.take_trace();
  const std::vector<double> work = core_work(trace, cores);
  for (std::size_t i = 0; i < trace.size(); ++i) {
    const TraceEvent& e = trace[i];
    const std::size_t kind = e.label.what == to_string(OpKind::forward)           ? 0
                             : e.label.what == to_string(OpKind::backward_input)  ? 1
                             : e.label.what == to_string(OpKind::backward_weight) ? 2
                                                                                  : 3;
    const std::size_t group = key(e);
    if (kind == 3 || group >= n) continue;
    sum[group][kind] += work[i];
    ++count[group][kind];
  }
  trainer.zero_grad();
  std::vector<OpCosts> out(n);
  for (std::size_t g = 0; g < n; ++g) {
    auto mean = [&](std::size_t kind) {
      return count[g][kind] > 0 ? sum[g][kind] / static_cast<double>(count[g][kind]) : 0.0;
    };
    out[g] = {.forward = mean(0), .backward_input = mean(1), .backward_weight = mean(2)};
  }
  return out;
}

}  // namespace detail

/// Per device the mean duration, in microseconds, of its forward, backward_input and
/// backward_weight ops over `steps` traced forward_backward steps of `trainer` on (x, y): the
/// costs search_schedule takes (transfer left 0: hand-overs are not timed apart). Uses the
/// backend's tracing (on for these steps, off after) and leaves the trainer's gradients zero.
/// Only this process's devices are timed; a device that ran none of an op kind gets 0 for it.
/// `cores` > 0: the devices share that many cores, and each op's duration is taken as its work
/// on a core of its own (core_work), what simulate_on_cores with the same `cores` takes; 0: as
/// the ops ran. Throws gpipe::Error for 0 steps or negative cores.
template <class TrainerT, class X, class Y>
std::vector<OpCosts> measure_op_costs(TrainerT& trainer, const X& x, const Y& y,
                                      std::size_t steps = 2, double cores = 0) {
  return detail::mean_op_costs(trainer, x, y, steps, TrainerT::num_devices, cores,
                               [](const TraceEvent& e) { return e.device; });
}

/// As measure_op_costs, per stage instead of per device, [stage]: what simulate takes for a
/// schedule with several stages per device (its two stages on one device may cost differently).
/// With one stage per device the same numbers as measure_op_costs. Only this process's stages
/// are timed; the others get 0.
template <class TrainerT, class X, class Y>
std::vector<OpCosts> measure_stage_costs(TrainerT& trainer, const X& x, const Y& y,
                                         std::size_t steps = 2, double cores = 0) {
  return detail::mean_op_costs(trainer, x, y, steps, TrainerT::num_stages, cores,
                               [](const TraceEvent& e) { return e.label.stage; });
}

/// Each cost's total (forward + backward): balanced_cut's input.
template <std::size_t N>
constexpr std::array<double, N> totals(const std::array<LayerCost, N>& costs) {
  std::array<double, N> out{};
  for (std::size_t i = 0; i < N; ++i) out[i] = costs[i].total();
  return out;
}

/// The Pipeline type of Layers cut by `cut` into `stages` stages (entries as balanced_cut gives
/// them), spelled as C++ to paste: "gpipe::Pipeline<gpipe::Stage<A, B>, gpipe::Stage<C>>".
template <layer_spec... Layers>
std::string pipeline_type_name(const std::array<std::size_t, sizeof...(Layers) + 1>& cut,
                               std::size_t stages) {
  bool valid =
      stages > 0 && stages <= sizeof...(Layers) && cut[0] == 0 && cut[stages] == sizeof...(Layers);
  for (std::size_t s = 0; valid && s < stages; ++s) valid = cut[s] < cut[s + 1];
  if (!valid)
    throw Error("gpipe: pipeline_type_name: not a cut of these layers into that many stages");
  const std::array<std::string_view, sizeof...(Layers)> names{
      detail::spelled_type_name<Layers>()...};
  std::string out = "gpipe::Pipeline<";
  for (std::size_t s = 0; s < stages; ++s) {
    out += s == 0 ? "gpipe::Stage<" : ", gpipe::Stage<";
    for (std::size_t l = cut[s]; l < cut[s + 1]; ++l) {
      if (l > cut[s]) out += ", ";
      out += names[l];
    }
    out += ">";
  }
  return out + ">";
}

}  // namespace gpipe
