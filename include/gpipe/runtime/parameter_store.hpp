#pragma once
// The trainer's parameter store: each stage's flat parameter and gradient arrays on its device
// (and under gpipe::MixedBf16 their bf16 copy, runtime/bf16_weights.hpp), the parameters' names,
// initialization, weight ties, and safetensors load and save. It knows the model only as data
// (stage sizes, ParameterInfo, the stages' init functions), so it is compiled once per backend.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpipe/backend/concepts.hpp"
#include "gpipe/error.hpp"
#include "gpipe/io/safetensors.hpp"
#include "gpipe/model/layer.hpp"
#include "gpipe/model/names.hpp"
#include "gpipe/model/pipeline.hpp"
#include "gpipe/model/precision.hpp"
#include "gpipe/runtime/bf16_weights.hpp"
#include "gpipe/runtime/stage_program.hpp"
#include "gpipe/transport/transport.hpp"

namespace gpipe {

/// Weight tying: `parameter` is the same tensor as `to` (GPT-2's LM head weight and its token
/// embedding, on the last and the first stage). Both are kept equal: at initialization, load,
/// set_parameter and after every optimizer step. Each forward_backward sums the two gradients
/// (d loss / d shared tensor) into both. The file that save and save_gradients write holds the
/// tensor once, under `to`; load accepts a file without `parameter` (or with it, equal to `to`).
struct Tie {
  /// The follower's name (as in `parameter_info()`): its values are copied from `to`'s, and files
  /// leave it out. A parameter follows at most one other.
  std::string parameter;
  /// The leader's name, of the same shape: the tensor that files hold. A leader follows none (no
  /// chains of ties).
  std::string to;
};

namespace detail {

// "[3, 4]"
inline std::string shape_string(const std::vector<std::size_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

template <class Backend>
class ParameterStore {
 public:
  template <class T>
  using Buffer = typename Backend::template Buffer<T>;
  using Kernels = typename Backend::Kernels;

  // stages[s]: stage s's program (its parameter count and initializer), device_of_stage[s] its
  // device; infos: every tensor (Pipeline::parameters()). Allocates the parameters and gradients
  // of every stage this process runs (with bf16_weights, for gpipe::MixedBf16, their bf16 copy
  // too) and checks the ties (gpipe::Error for an unknown name, a shape mismatch, a self-tie or
  // a chain); initialize() sets the values. With several processes they agree on the
  // allocations (transport::together): where one process runs out of memory, every process
  // throws OutOfMemory, and none waits for it. `stages` outlives the store.
  ParameterStore(Backend& backend, std::span<const StageProgram<Kernels>> stages,
                 std::vector<std::size_t> device_of_stage, std::vector<ParameterInfo> infos,
                 std::span<const Tie> ties, bool bf16_weights);
  ParameterStore(const ParameterStore&) = delete;
  ParameterStore& operator=(const ParameterStore&) = delete;

  std::size_t num_stages() const { return device_of_stage_.size(); }
  std::size_t device_of_stage(std::size_t s) const { return device_of_stage_[s]; }
  // Whether this process holds stage s (always, in one process).
  bool local(std::size_t s) const { return transport_.is_local(device_of_stage_[s]); }
  const std::vector<ParameterInfo>& infos() const { return infos_; }
  // The parameters; who writes them through this (the optimizer state) first invalidates the
  // bf16 copies of the stages it writes (bf16_weights.hpp's invariant).
  std::vector<Buffer<float>>& params() { return params_; }
  std::vector<Buffer<float>>& grads() { return grads_; }

  Bf16Weights<Backend>& bf16_weights() { return bf16_; }

  // Every parameter from `seed` in nn.Sequential order (each stage's initializer), tied followers
  // from their leaders, gradients zero.
  void initialize(std::uint64_t seed);

  // Every gradient of this process's stages <- 0; waits for the devices.
  void zero_grad();

  // For checkpoints: the parameter whose name files use for info (its tie partner, or itself);
  // the values of a local tensor; and a local tensor set without its tie partner (a checkpoint
  // gives every process the values of both).
  const ParameterInfo& saved_as(const ParameterInfo& info) const { return *leader_of(info); }
  std::vector<float> local_values(const ParameterInfo& info) const { return read(params_, info); }
  void set_local(const ParameterInfo& info, std::span<const float> values) {
    write(params_, info, values);
    backend_.synchronize();
  }

  // The gradients' L2 norm (a tied pair counted once), the same on every process, summed in a
  // fixed order (Trainer::clip_grad_norm's contract); keeps each tensor's sum of squares for
  // non_finite_tensors().
  double grad_norm();
  // Trainer::clip_grad_norm's contract: grad_norm(); when it is finite and max_norm / (norm +
  // 1e-6) < 1, every gradient is scaled by that factor.
  double clip_grad_norm(double max_norm);
  // The tensors whose sum of squares was not finite at the last grad_norm(), in parameter order
  // (a tied pair under its leader's name).
  std::vector<std::string> non_finite_tensors() const {
    std::vector<std::string> out;
    for (std::size_t i = 0; i < squares_.size(); ++i)
      if (!std::isfinite(squares_[i]) && leader_of(infos_[i]) == &infos_[i])
        out.push_back(infos_[i].name);
    return out;
  }
  // Trainer::scale_gradients's contract: every gradient of this process's stages *= factor (both
  // tensors of a tie hold the same sum, so both are scaled).
  void scale_gradients(float factor);

  const ParameterInfo& find(std::string_view name) const {
    for (const ParameterInfo& info : infos_)
      if (info.name == name) return info;
    throw Error("gpipe: the model has no parameter \"" + std::string(name) + "\"");
  }
  std::vector<float> parameter(std::string_view name) const;
  std::vector<float> gradient(std::string_view name) const;

  // Trainer::set_parameter's contract.
  void set_parameter(std::string_view name, std::span<const float> values);

  // Trainer::load's and save's contract.
  void load(const std::filesystem::path& path, const NameMap& names = {});
  void save(const std::filesystem::path& path, const NameMap& names = {}) const;
  void save_gradients(const std::filesystem::path& path) const;

  // Before a step: a tied pair holds the same gradient sum; the follower's copy restarts from 0
  // so that the sum after the step counts every earlier step once.
  void restart_tied_gradients() {
    for (const auto& tie : ties_)
      if (local(tie.first->stage)) fill(grads_, *tie.first, 0.0f);
  }
  // After a step: both tensors of each tie <- the sum of both gradients. A pair on two processes
  // swaps the two device to device (the transport's exchange: MPI or NCCL) and each adds the
  // other's on its device; a + b is b + a in floating point, so one process and several give the
  // same bits.
  void sum_tied_gradients() {
    for (const auto& [follower, leader] : ties_) {
      const bool has_follower = local(follower->stage), has_leader = local(leader->stage);
      if (has_follower && has_leader) {
        // On the devices (never through the host): the leader's += the follower's, brought to
        // the leader's device first when the two differ; then the follower's <- the sum.
        const std::size_t dl = device_of_stage_[leader->stage];
        const std::size_t df = device_of_stage_[follower->stage];
        const std::span<float> gl = tensor(grads_, *leader), gf = tensor(grads_, *follower);
        Buffer<float> moved;
        std::span<const float> other = gf;
        if (dl != df) {
          moved = backend_.template allocate<float>(dl, gf.size(), MemoryKind::workspace);
          transport_.copy({"sum tied gradients", follower->stage}, df, gf, dl,
                          {moved.data(), gf.size()});
          other = {moved.data(), gf.size()};
        }
        backend_.submit(dl, {"sum tied gradients", leader->stage}, [gl, other](Kernels& k) {
          k.accumulate(gl.size(), other.data(), gl.data());
        });
        transport_.copy({"sum tied gradients", follower->stage}, dl, gl, df, gf);
      } else if (has_follower || has_leader) {
        const ParameterInfo& mine = has_leader ? *leader : *follower;
        const ParameterInfo& peer = has_leader ? *follower : *leader;
        const std::size_t d = device_of_stage_[mine.stage];
        Buffer<float> theirs =
            backend_.template allocate<float>(d, mine.size, MemoryKind::workspace);
        float* g = grads_[mine.stage].data() + mine.offset;
        exchange_with(peer.stage, {g, mine.size}, {theirs.data(), mine.size});
        backend_.submit(
            d, {"sum tied gradients", mine.stage},
            [g, n = mine.size, t = theirs.data()](Kernels& k) { k.accumulate(n, t, g); });
        backend_.synchronize();  // before `theirs` goes
      }
    }
  }
  // Every follower <- its leader's values. A pair on two processes exchanges them; a pair on
  // neither is that process's business.
  void sync_tied_parameters() {
    for (const auto& tie : ties_) sync_tie(tie);
  }

 private:
  using TiePair = std::pair<const ParameterInfo*, const ParameterInfo*>;  // (follower, leader)

  bool has(std::string_view name) const {
    for (const ParameterInfo& info : infos_)
      if (info.name == name) return true;
    return false;
  }
  void require_local(const ParameterInfo& info) const {
    require(local(info.stage), "parameter \"" + info.name + "\" is on stage " +
                                   std::to_string(info.stage) + ", device " +
                                   std::to_string(device_of_stage_[info.stage]) +
                                   ", which another process runs");
  }

  std::vector<float> read(const std::vector<Buffer<float>>& where,
                          const ParameterInfo& info) const {
    require_local(info);
    std::vector<float> out(info.size);
    backend_.submit(device_of_stage_[info.stage], {"read parameter", info.stage},
                    [&out, src = where[info.stage].data() + info.offset](Kernels& k) {
                      k.download(out.size(), src, out.data());
                    });
    backend_.synchronize();
    return out;
  }
  // Issues the copy; the caller synchronizes before `values` goes away.
  void write(std::vector<Buffer<float>>& where, const ParameterInfo& info,
             std::span<const float> values) {
    require_local(info);
    if (&where == &params_) bf16_.invalidate(info.stage);
    backend_.submit(device_of_stage_[info.stage], {"write parameter", info.stage},
                    [values, dst = where[info.stage].data() + info.offset](Kernels& k) {
                      k.upload(values.size(), values.data(), dst);
                    });
  }
  // info's values in `where`, on its stage's device
  std::span<float> tensor(std::vector<Buffer<float>>& where, const ParameterInfo& info) const {
    require_local(info);
    return {where[info.stage].data() + info.offset, info.size};
  }
  void fill(std::vector<Buffer<float>>& where, const ParameterInfo& info, float value) {
    require_local(info);
    backend_.submit(device_of_stage_[info.stage], {"fill tied gradient", info.stage},
                    [value, n = info.size, dst = where[info.stage].data() + info.offset](
                        Kernels& k) { k.fill(n, value, dst); });
  }

  // Every tensor once: a tied parameter is saved under its partner's name only.
  void save_all(const std::vector<Buffer<float>>& where, const std::filesystem::path& path,
                const NameMap& names = {}) const {
    check_names(names);
    std::vector<const ParameterInfo*> saved;
    for (const ParameterInfo& info : infos_)
      if (leader_of(info) == &info) saved.push_back(&info);
    std::vector<std::vector<float>> data;
    data.reserve(saved.size());
    for (const ParameterInfo* info : saved) {
      data.push_back(local(info->stage) ? read(where, *info) : std::vector<float>(info->size));
      transport_.broadcast(device_of_stage_[info->stage], std::span<float>(data.back()));
    }
    if (!transport_.writes_files()) return;
    std::vector<io::TensorView> views;
    for (std::size_t i = 0; i < saved.size(); ++i)
      views.push_back({names.file_name(saved[i]->name), saved[i]->shape, data[i]});
    io::save_safetensors(path, views);
  }
  // A NameMap renames only the model's parameters, and to distinct names.
  void check_names(const NameMap& names) const {
    for (const auto& [model_name, file_name] : names.renames())
      require(has(model_name), "the name map renames \"" + model_name + "\" (to \"" + file_name +
                                   "\"), which the model does not have");
    std::map<std::string, const ParameterInfo*, std::less<>> owner;
    for (const ParameterInfo& info : infos_) {
      const auto [it, fresh] = owner.emplace(names.file_name(info.name), &info);
      require(fresh, "the name map gives \"" + info.name + "\" and \"" + it->second->name +
                         "\" the same name \"" + it->first + "\"");
    }
  }

  // Checks the ties and resolves their names: every tie joins two distinct parameters of one
  // shape, a parameter follows at most one other, and a followed one follows none.
  void resolve_ties(std::span<const Tie> ties) {
    for (const Tie& tie : ties) {
      const ParameterInfo& follower = find(tie.parameter);
      const ParameterInfo& leader = find(tie.to);
      const std::string what = "tie of \"" + tie.parameter + "\" to \"" + tie.to + "\": ";
      require(&follower != &leader, what + "a parameter cannot be tied to itself");
      require(follower.shape == leader.shape, what + "their shapes differ (" +
                                                  shape_string(follower.shape) + " and " +
                                                  shape_string(leader.shape) + ")");
      for (const auto& [f, l] : ties_) {
        require(f != &follower,
                what + "\"" + tie.parameter + "\" is already tied to \"" + l->name + "\"");
        require(f != &leader && l != &follower,
                what + "chains of ties are not supported: tie every parameter to the same one");
      }
      ties_.emplace_back(&follower, &leader);  // on every process: files name the tensor once
    }
  }
  // The parameter that holds info's values in files: its tie partner, or itself.
  const ParameterInfo* leader_of(const ParameterInfo& info) const {
    for (const auto& [follower, leader] : ties_)
      if (follower == &info) return leader;
    return &info;
  }
  // The tie that `info` belongs to, either side (nullptr if none).
  const TiePair* tie_of(const ParameterInfo& info) const {
    for (const TiePair& tie : ties_)
      if (tie.first == &info || tie.second == &info) return &tie;
    return nullptr;
  }
  // The follower's bf16 copy stays current where both stages' copies are and the tensor's part
  // of the leader's copy goes along with its values; otherwise the follower's stage rounds again.
  void sync_tie(const TiePair& tie) {
    const auto& [follower, leader] = tie;
    const bool has_follower = local(follower->stage), has_leader = local(leader->stage);
    const bool both_current = bf16_.current(leader->stage) && bf16_.current(follower->stage);
    if (has_follower) bf16_.invalidate(follower->stage);
    if (has_follower && has_leader) {
      transport_.copy({"sync tied parameter", follower->stage}, device_of_stage_[leader->stage],
                      tensor(params_, *leader), device_of_stage_[follower->stage],
                      tensor(params_, *follower));
      if (both_current && copy_bf16(*follower, *leader)) bf16_.mark_current(follower->stage);
    } else if (has_leader) {
      exchange_with(follower->stage, {params_[leader->stage].data() + leader->offset, leader->size},
                    {});
    } else if (has_follower) {
      exchange_with(leader->stage, {},
                    {params_[follower->stage].data() + follower->offset, follower->size});
    }
    backend_.synchronize();
  }
  // The leader's part of its stage's bf16 copy into the follower's, both of this process, where
  // the transport copies bf16 (in one process); false where it does not.
  bool copy_bf16(const ParameterInfo& follower, const ParameterInfo& leader) {
    const std::span<const bf16> src(bf16_.data(leader.stage) + leader.offset, leader.size);
    const std::span<bf16> dst(bf16_.data(follower.stage) + follower.offset, follower.size);
    const std::size_t from = device_of_stage_[leader.stage], to = device_of_stage_[follower.stage];
    if constexpr (requires { transport_.copy(WorkLabel{}, from, src, to, dst); }) {
      transport_.copy({"sync tied parameter", follower.stage}, from, src, to, dst);
      return true;
    } else {
      return false;
    }
  }
  // Between steps: sends `mine` to the process of `stage`, receives `theirs` from it (arrays on
  // this process's device, after the work issued on it).
  void exchange_with(std::size_t stage, std::span<const float> mine, std::span<float> theirs) {
    transport_.exchange(device_of_stage_[stage], mine, theirs);
  }

  Backend& backend_;
  transport::Transport<Backend> transport_;
  std::span<const StageProgram<Kernels>> stages_;
  std::vector<std::size_t> device_of_stage_;
  std::vector<ParameterInfo> infos_;
  std::vector<Buffer<float>> params_, grads_;
  Bf16Weights<Backend> bf16_;  // MixedBf16: the parameters in bf16, per stage
  std::vector<TiePair> ties_;
  std::vector<double> squares_;  // [parameter] its gradient's sum of squares at grad_norm()
};

template <class Backend>
ParameterStore<Backend>::ParameterStore(Backend& backend,
                                        std::span<const StageProgram<Kernels>> stages,
                                        std::vector<std::size_t> device_of_stage,
                                        std::vector<ParameterInfo> infos, std::span<const Tie> ties,
                                        bool bf16_weights)
    : backend_(backend),
      transport_(backend),
      stages_(stages),
      device_of_stage_(std::move(device_of_stage)),
      infos_(std::move(infos)) {
  transport::together(transport_, "allocate its stages' parameters and gradients", [&] {
    for (std::size_t s = 0; s < device_of_stage_.size(); ++s) {
      // Another process's stage keeps no memory here (a multi_process_backend).
      if (!local(s)) {
        params_.emplace_back();
        grads_.emplace_back();
        continue;
      }
      const std::size_t d = device_of_stage_[s];
      const std::size_t n = stages_[s].num_params;
      params_.push_back(backend_.template allocate<float>(d, n, MemoryKind::parameters));
      grads_.push_back(backend_.template allocate<float>(d, n, MemoryKind::gradients));
    }
    if (bf16_weights)  // from now on, a bf16 copy of every local stage's parameters
      for (std::size_t s = 0; s < num_stages(); ++s)
        bf16_.keep(backend_, s, device_of_stage_[s], local(s) ? stages_[s].num_params : 0);
  });
  resolve_ties(ties);
}

template <class Backend>
void ParameterStore<Backend>::initialize(std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::vector<float>> host(num_stages());
  for (std::size_t s = 0; s < num_stages(); ++s) {
    host[s].resize(stages_[s].num_params);
    // every process draws every stage, so that each stage's values are those of one process
    stages_[s].init(std::span<float>(host[s]), rng);
  }
  bf16_.invalidate();
  for (std::size_t s = 0; s < num_stages(); ++s) {
    if (!local(s)) continue;
    backend_.submit(
        device_of_stage_[s], {"initialize", s},
        [&h = host[s], p = params_[s].data()](Kernels& k) { k.upload(h.size(), h.data(), p); });
  }
  backend_.synchronize();
  sync_tied_parameters();
  zero_grad();
}

template <class Backend>
void ParameterStore<Backend>::zero_grad() {
  for (std::size_t s = 0; s < num_stages(); ++s) {
    if (!local(s)) continue;
    backend_.submit(
        device_of_stage_[s], {"zero_grad", s},
        [g = grads_[s].data(), n = grads_[s].size()](Kernels& k) { k.fill(n, 0.0f, g); });
  }
  backend_.synchronize();
}

template <class Backend>
double ParameterStore<Backend>::clip_grad_norm(double max_norm) {
  require(max_norm >= 0, "clip_grad_norm's max_norm must be >= 0, got " + std::to_string(max_norm));
  const double norm = grad_norm();
  // a non-finite norm leaves the gradients as they are (an inf norm would zero them, inf times
  // 0 being NaN): the caller decides (Trainer::Options::skip_non_finite)
  const double factor = max_norm / (norm + 1e-6);
  if (std::isfinite(norm) && factor < 1) scale_gradients(static_cast<float>(factor));
  return norm;
}

template <class Backend>
double ParameterStore<Backend>::grad_norm() {
  // Per stage, the tensors whose squares count (a tied pair: its leader's) and their sums, each
  // on the stage's device in the fixed order of backend/common.hpp, then on every process.
  std::vector<std::vector<std::size_t>> counted(num_stages());
  for (std::size_t i = 0; i < infos_.size(); ++i)
    if (leader_of(infos_[i]) == &infos_[i]) counted[infos_[i].stage].push_back(i);
  std::vector<std::vector<double>> sums(num_stages());
  std::vector<Buffer<double>> on_device(num_stages());
  for (std::size_t s = 0; s < num_stages(); ++s) {
    sums[s].resize(counted[s].size());
    if (!local(s) || counted[s].empty()) continue;
    const std::size_t d = device_of_stage_[s];
    on_device[s] = backend_.template allocate<double>(d, counted[s].size(), MemoryKind::workspace);
    backend_.submit(d, {"sum of squares", s}, [this, s, &counted, &sums, &on_device](Kernels& k) {
      for (std::size_t j = 0; j < counted[s].size(); ++j) {
        const ParameterInfo& info = infos_[counted[s][j]];
        k.sum_of_squares(info.size, grads_[s].data() + info.offset, on_device[s].data() + j);
      }
      k.download(counted[s].size(), on_device[s].data(), sums[s].data());
    });
  }
  backend_.synchronize();
  for (std::size_t s = 0; s < num_stages(); ++s)
    transport_.broadcast(device_of_stage_[s], std::span<double>(sums[s]));
  // the tensors' sums added in parameter order: the same bits however the model is split
  squares_.assign(infos_.size(), 0.0);
  for (std::size_t s = 0; s < num_stages(); ++s)
    for (std::size_t j = 0; j < counted[s].size(); ++j) squares_[counted[s][j]] = sums[s][j];
  double total = 0;
  for (const double q : squares_) total += q;
  return std::sqrt(total);
}

template <class Backend>
void ParameterStore<Backend>::scale_gradients(float factor) {
  for (std::size_t s = 0; s < num_stages(); ++s) {
    if (!local(s)) continue;
    backend_.submit(device_of_stage_[s], {"scale gradients", s},
                    [g = grads_[s].data(), n = grads_[s].size(), factor](Kernels& k) {
                      k.scale(n, factor, g);
                    });
  }
  backend_.synchronize();
}

template <class Backend>
std::vector<float> ParameterStore<Backend>::parameter(std::string_view name) const {
  return read(params_, find(name));
}

template <class Backend>
std::vector<float> ParameterStore<Backend>::gradient(std::string_view name) const {
  return read(grads_, find(name));
}

template <class Backend>
void ParameterStore<Backend>::set_parameter(std::string_view name, std::span<const float> values) {
  const ParameterInfo& info = find(name);
  require(values.size() == info.size, "parameter \"" + info.name + "\" has " +
                                          std::to_string(info.size) + " elements, got " +
                                          std::to_string(values.size()));
  const TiePair* tie = tie_of(info);
  const ParameterInfo& leader = *leader_of(info);
  // The leader's process writes (write() is an Error where it is not local), except that the
  // follower's process of a pair on two processes only receives, in sync_tie.
  const bool only_receives = tie != nullptr && !local(leader.stage) && local(tie->first->stage);
  if (!only_receives) write(params_, leader, values);
  backend_.synchronize();
  if (tie != nullptr) sync_tie(*tie);
}

template <class Backend>
void ParameterStore<Backend>::load(const std::filesystem::path& path, const NameMap& names) {
  check_names(names);
  const auto tensors = io::load_safetensors(path);
  const auto in_file = [&](const ParameterInfo& info) -> const io::Tensor* {
    const auto it = tensors.find(names.file_name(info.name));
    return it == tensors.end() ? nullptr : &it->second;
  };
  // Where each leader's values come from: its own tensor, else its tie partner's (a file may
  // hold a tied tensor under either name).
  std::vector<const io::Tensor*> source(infos_.size());
  for (std::size_t i = 0; i < infos_.size(); ++i) {
    const ParameterInfo& info = infos_[i];
    const io::Tensor* tensor = in_file(info);
    const TiePair* tie = tie_of(info);
    if (tensor == nullptr && tie != nullptr) {
      if (leader_of(info) != &info) continue;  // a follower: its leader's check covers it
      tensor = in_file(*tie->first);
    }
    require(tensor != nullptr, path.string() + " has no tensor \"" + names.file_name(info.name) +
                                   "\" that the model needs");
    require(tensor->shape == info.shape,
            path.string() + ": tensor \"" + names.file_name(info.name) + "\" has shape " +
                shape_string(tensor->shape) + ", the model expects " + shape_string(info.shape));
    source[i] = tensor;
  }
  for (const auto& entry : tensors) {
    const std::string& name = entry.first;  // not a structured binding: clang 14 cannot capture one
    const bool known = std::any_of(infos_.begin(), infos_.end(), [&](const ParameterInfo& info) {
      return names.file_name(info.name) == name;
    });
    require(known || names.skipped(name),
            path.string() + " has a tensor \"" + name + "\" that the model does not have");
  }
  for (const auto& [follower, leader] : ties_) {
    const io::Tensor* a = in_file(*follower);
    const io::Tensor* b = in_file(*leader);
    require(a == nullptr || b == nullptr || a->data == b->data,
            path.string() + ": \"" + names.file_name(follower->name) + "\" is tied to \"" +
                names.file_name(leader->name) + "\", but the file holds different values for them");
  }
  for (std::size_t i = 0; i < infos_.size(); ++i)
    if (leader_of(infos_[i]) == &infos_[i] && local(infos_[i].stage))
      write(params_, infos_[i], source[i]->data);
  backend_.synchronize();
  sync_tied_parameters();
}

template <class Backend>
void ParameterStore<Backend>::save(const std::filesystem::path& path, const NameMap& names) const {
  save_all(params_, path, names);
}

template <class Backend>
void ParameterStore<Backend>::save_gradients(const std::filesystem::path& path) const {
  save_all(grads_, path);
}

}  // namespace detail
}  // namespace gpipe
