#pragma once
// What every MPI backend gives, written once and run under mpirun for mpi::Backend against
// host::Backend (tests/mpi/test_pipeline.cpp) and for mpi::CudaBackend against cuda::Backend on
// the CUDA emulator and on GPUs (tests/mpi/test_cuda_pipeline.cu): with one rank per device, every
// schedule gives bit for bit the loss, the gradients of each rank's own stages, the predictions,
// the gradient norm and clipped gradients, the parameters after an optimizer step and the saved
// file of one process with as many devices (each rank runs that reference itself: same seed, same
// data); with data-parallel replicas two steps without zero_grad match one process on the whole
// batch to float rounding; a throw on rank 1 at micro-batch 2 ends the step on every rank with one
// Error naming rank, stage, micro-batch and the original message, and the next step is right; a
// rank that kills itself ends the job (run_killed_rank_step); GPT-2's tie between the first and the
// last rank gives one process's loss, gradients, norm, AdamW step (both decay groups) and file
// (check_ties_across_ranks); a checkpoint the ranks save loads into one process and back into
// the ranks, and the next step is one process's (check_checkpoints_on_ranks); bad input on one
// rank alone ends the step on every rank with that rank's Error (check_inputs_refused_on_one_rank);
// a training step's wall time is the same on every rank and spans them all
// (check_step_wall_times); packed documents and ignored targets give one process's step, with
// one rank per device and with replicas (check_packed_documents).
//
// CHECK only (no REQUIRE): a rank that left a test case early would leave the others waiting in a
// collective.

#include <doctest/doctest.h>
#include <mpi.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "gpipe/mpi.hpp"
#include "support/faulty_layer.hpp"
#include "support/models.hpp"
#include "support/mpi_test_main.hpp"
#include "support/relative_error.hpp"

namespace gpipe::test::mpi_conformance {

// Eight stages, for interleaved 1F1B with V = 2 on four ranks.
using Model8 = Pipeline<Stage<L0>, Stage<L1>, Stage<L2>, Stage<L3>, Stage<L4>, Stage<L5>, Stage<L6>,
                        Stage<Linear<5, 5>>>;

inline constexpr std::size_t rows = 16;
inline constexpr std::uint64_t seed = 7;

inline std::vector<char> file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The message of what `f` throws ("" if nothing).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// The one-process reference for `backend`'s pipeline of `devices`: as many devices, each with as
// many threads where the backend's devices have a team (a GEMM large enough to split over a team
// is one library call per block, which a library such as oneDNN may round otherwise than the
// whole; the split itself is the host backend's, tested in tests/backend/host and
// tests/runtime).
template <class OneProcess, class Backend>
OneProcess one_process_like(const Backend& backend, std::size_t devices) {
  if constexpr (requires { backend.threads_per_device(); })
    return OneProcess(devices, {.threads_per_device = backend.threads_per_device()});
  else
    return OneProcess(devices);
}

// GPT-2's tying across the first and the last rank: the LM head (no bias) is the token embedding.
constexpr std::size_t vocab = 7, context = 4, width = 8;
using Emb = Embedding<vocab, context, width>;
using Block = TransformerBlock<width, 2>;
using TiedHead = Linear<width, vocab, false>;
using TiedGpt2 = Pipeline<Stage<Emb, Block>, Stage<Block, LayerNorm<width>, TiedHead>>;
using TiedGpt4 =
    Pipeline<Stage<Emb, Block>, Stage<Block>, Stage<Block>, Stage<LayerNorm<width>, TiedHead>>;

template <class Model, class Backend, class OneProcess>
void check_tie_across_ranks(Backend& backend, const std::string& head) {
  using Kind = OneFOneB;
  constexpr std::size_t K = Model::num_stages;
  const std::vector<Tie> ties{{.parameter = head, .to = "0.wte.weight"}};
  const std::vector<std::int32_t> tokens = random_classes(5 * context, vocab, 1);
  const std::vector<std::int32_t> targets = random_classes(5 * context, vocab, 2);
  const bool first = backend.is_local(0), last = backend.is_local(K - 1);
  for (std::size_t m : {1u, 3u}) {
    CAPTURE(m);
    CAPTURE(backend.rank());
    OneProcess one_process = one_process_like<OneProcess>(backend, K);
    Trainer<Model, SoftmaxCrossEntropy, OneProcess, Kind> reference(
        one_process, {.micro_batches = m, .seed = 3, .ties = ties});
    Trainer<Model, SoftmaxCrossEntropy, Backend, Kind> trainer(
        backend, {.micro_batches = m, .seed = 3, .ties = ties});
    if (last) CHECK(trainer.parameter(head) == reference.parameter("0.wte.weight"));
    for (int step = 0; step < 2; ++step)  // the second adds each step's sum once more
      CHECK(trainer.forward_backward(tokens, targets) ==
            reference.forward_backward(tokens, targets));
    for (const ParameterInfo& info : trainer.parameter_info())
      if (backend.is_local(trainer.device_of_stage(info.stage)))
        CHECK(trainer.gradient(info.name) == reference.gradient(info.name));
    if (last) CHECK(trainer.gradient(head) == reference.gradient("0.wte.weight"));
    // clipping counts the pair once, on every rank as in one process
    const float norm = reference.clip_grad_norm(1e30);
    CHECK(trainer.clip_grad_norm(norm / 2) == norm);
    reference.clip_grad_norm(norm / 2);
    // nanoGPT's groups: the tied matrix decays, biases and LayerNorm do not
    const optim::AdamW adamw({.lr = 1e-2,
                              .weight_decay = 0.1,
                              .decay = m == 1 ? optim::Decay::all : optim::Decay::matrices});
    trainer.step(adamw);
    reference.step(adamw);
    for (const ParameterInfo& info : trainer.parameter_info())
      if (backend.is_local(trainer.device_of_stage(info.stage)))
        CHECK(trainer.parameter(info.name) == reference.parameter(info.name));
    trainer.save("tied.safetensors");
    if (backend.rank() == 0) {
      reference.save("tied_reference.safetensors");
      CHECK(file_bytes("tied.safetensors") == file_bytes("tied_reference.safetensors"));
    }
    // set_parameter of a pair on two ranks: both call it, both tensors take the values
    const std::vector<float> values(vocab * width, 0.25f);
    if (first || last) trainer.set_parameter(head, values);
    if (first) CHECK(trainer.parameter("0.wte.weight") == values);
    if (last) CHECK(trainer.parameter(head) == values);
    MPI_Barrier(backend.communicator());
  }
}

// A tie across ranks with data-parallel replicas (on 4 ranks: 2 replicas of 2 stages; others:
// nothing): each replica's pair holds one tensor, and the gradient is the whole batch's, summed
// over the replicas, as one process's (to rounding: the replicas' shares are added in another
// order); clipping and an SGD step then give one process's parameters.
template <class Backend, class OneProcess>
void check_tie_with_replicas() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 4) return;
  Backend backend(MPI_COMM_WORLD, {.data_parallel = 2});
  const std::string head = "4.weight";
  const std::vector<Tie> ties{{.parameter = head, .to = "0.wte.weight"}};
  const std::vector<std::int32_t> tokens = random_classes(6 * context, vocab, 4);
  const std::vector<std::int32_t> targets = random_classes(6 * context, vocab, 5);
  OneProcess one_process = one_process_like<OneProcess>(backend, 2);
  Trainer<TiedGpt2, SoftmaxCrossEntropy, OneProcess, OneFOneB> reference(
      one_process, {.micro_batches = 2, .seed = 3, .ties = ties});
  Trainer<TiedGpt2, SoftmaxCrossEntropy, Backend, OneFOneB> trainer(
      backend, {.micro_batches = 2, .seed = 3, .ties = ties});
  CAPTURE(backend.rank());
  const float loss = trainer.forward_backward(tokens, targets);
  CHECK(std::abs(loss - reference.forward_backward(tokens, targets)) <= 1e-6 * std::abs(loss));
  const bool last = backend.is_local(1);
  for (const ParameterInfo& info : trainer.parameter_info())
    if (backend.is_local(trainer.device_of_stage(info.stage))) {
      CAPTURE(info.name);
      CHECK(relative_error(trainer.gradient(info.name), reference.gradient(info.name)) < 1e-6);
    }
  if (last)
    CHECK(relative_error(trainer.gradient(head), reference.gradient("0.wte.weight")) < 1e-6);
  const float norm = reference.clip_grad_norm(1e30);
  CHECK(std::abs(trainer.clip_grad_norm(norm / 2) - norm) <= 1e-6 * norm);
  reference.clip_grad_norm(norm / 2);
  // SGD: AdamW would turn the rounding differences of gradients that are 0 in exact arithmetic
  // (attention's key biases) into steps of lr either way (tests/pytorch bounds those).
  const optim::SGD sgd({.lr = 0.1, .momentum = 0.9, .weight_decay = 0.1});
  trainer.step(sgd);
  reference.step(sgd);
  for (const ParameterInfo& info : trainer.parameter_info())
    if (backend.is_local(trainer.device_of_stage(info.stage))) {
      CAPTURE(info.name);
      CHECK(relative_error(trainer.parameter(info.name), reference.parameter(info.name)) < 1e-6);
    }
  if (last)
    CHECK(relative_error(trainer.parameter(head), reference.parameter("0.wte.weight")) < 1e-6);
  MPI_Barrier(MPI_COMM_WORLD);
}

// Ties between the first and the last rank's stages (on 2 or 4 ranks; others: nothing).
template <class Backend, class OneProcess>
void check_ties_across_ranks(Backend& backend) {
  if (backend.num_devices() == 2)
    check_tie_across_ranks<TiedGpt2, Backend, OneProcess>(backend, "4.weight");
  if (backend.num_devices() == 4)
    check_tie_across_ranks<TiedGpt4, Backend, OneProcess>(backend, "5.weight");
}

// A checkpoint saved by the ranks (each its own stages' shard) equals one process's run: it
// loads into one process with one device, and into the ranks, and the next step continues as one
// process's does, bit for bit.
template <class Model, class Backend, class OneProcess>
void check_checkpoint_on_ranks(Backend& backend) {
  constexpr std::size_t devices = Model::num_stages;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("gpipe_mpi_checkpoint_" + std::to_string(devices));
  if (backend.rank() == 0) {
    std::filesystem::remove_all(dir.string() + ".a");
    std::filesystem::remove_all(dir.string() + ".b");
    std::filesystem::remove(dir);
  }
  MPI_Barrier(backend.communicator());
  const std::vector<float> x = random_inputs(rows, Model::in_features, 61);
  const std::vector<std::int32_t> y = random_classes(rows, Model::out_features, 62);
  const optim::AdamW adamw({.lr = 1e-2, .weight_decay = 0.1, .decay = optim::Decay::matrices});
  const auto step = [&](auto& trainer) {
    trainer.zero_grad();
    trainer.forward_backward(x, y);
    trainer.step(adamw);
  };
  OneProcess one_process = one_process_like<OneProcess>(backend, devices);
  Trainer<Model, SoftmaxCrossEntropy, OneProcess> reference(one_process,
                                                            {.micro_batches = 3, .seed = seed});
  Trainer<Model, SoftmaxCrossEntropy, Backend> trainer(backend, {.micro_batches = 3, .seed = seed});
  for (int i = 0; i < 2; ++i) {
    step(reference);
    step(trainer);
  }
  trainer.save_checkpoint(dir, {{"ranks", std::to_string(backend.world_size())}});

  OneProcess single_device = one_process_like<OneProcess>(backend, 1);
  Trainer<Model1, SoftmaxCrossEntropy, OneProcess> single(single_device, {.seed = 99});
  CHECK(single.load_checkpoint(dir).at("ranks") == std::to_string(backend.world_size()));
  for (const ParameterInfo& info : single.parameter_info())
    CHECK(single.parameter(info.name) == reference.parameter(info.name));

  Trainer<Model, SoftmaxCrossEntropy, Backend> resumed(backend, {.micro_batches = 3, .seed = 98});
  resumed.load_checkpoint(dir);
  step(reference);
  step(resumed);
  for (const ParameterInfo& info : resumed.parameter_info())
    if (backend.is_local(resumed.device_of_stage(info.stage)))
      CHECK(resumed.parameter(info.name) == reference.parameter(info.name));
  MPI_Barrier(backend.communicator());
}

// A save that fails on one rank alone (rank 1's writes limited to 64 bytes, RLIMIT_FSIZE, so its
// shard's write fails with EFBIG): every rank throws at once, rank 1 its own error and the others
// that another process failed; the name still holds the previous checkpoint, which loads; the
// next save succeeds.
template <class Model, class Backend>
void check_save_failing_on_one_rank(Backend& backend) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("gpipe_mpi_failed_save_" + std::to_string(Model::num_stages));
  if (backend.rank() == 0) {
    std::filesystem::remove_all(dir.string() + ".a");
    std::filesystem::remove_all(dir.string() + ".b");
    std::filesystem::remove(dir);
  }
  MPI_Barrier(backend.communicator());
  const std::vector<float> x = random_inputs(rows, Model::in_features, 71);
  const std::vector<std::int32_t> y = random_classes(rows, Model::out_features, 72);
  const optim::AdamW adamw({.lr = 1e-2});
  Trainer<Model, SoftmaxCrossEntropy, Backend> trainer(backend, {.micro_batches = 2, .seed = seed});
  const auto local_parameters = [&](const auto& t) {
    std::vector<std::vector<float>> out;
    for (const ParameterInfo& info : t.parameter_info())
      if (backend.is_local(t.device_of_stage(info.stage))) out.push_back(t.parameter(info.name));
    return out;
  };
  trainer.forward_backward(x, y);
  trainer.step(adamw);
  trainer.save_checkpoint(dir, {{"version", "1"}});
  const auto first = local_parameters(trainer);
  trainer.forward_backward(x, y);
  trainer.step(adamw);

  rlimit before{};
  getrlimit(RLIMIT_FSIZE, &before);
  if (backend.rank() == 1) {
    std::signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG instead
    const rlimit small{64, before.rlim_max};
    setrlimit(RLIMIT_FSIZE, &small);
  }
  const std::string message = error_of([&] { trainer.save_checkpoint(dir, {{"version", "2"}}); });
  if (backend.rank() == 1) {
    setrlimit(RLIMIT_FSIZE, &before);
    std::signal(SIGXFSZ, SIG_DFL);
  }
  CAPTURE(message);
  CAPTURE(backend.rank());
  if (backend.rank() == 1)
    CHECK(message.find("write failed") != std::string::npos);
  else
    CHECK(message == "gpipe: another process could not write its shard (its error says why)");

  Trainer<Model, SoftmaxCrossEntropy, Backend> restored(backend, {.micro_batches = 2, .seed = 5});
  CHECK(restored.load_checkpoint(dir).at("version") == "1");
  CHECK(local_parameters(restored) == first);
  trainer.save_checkpoint(dir, {{"version", "2"}});
  CHECK(restored.load_checkpoint(dir).at("version") == "2");
  CHECK(local_parameters(restored) == local_parameters(trainer));
  MPI_Barrier(backend.communicator());
}

template <class Backend, class OneProcess>
void check_checkpoints_on_ranks(Backend& backend) {
  if (backend.num_devices() == 2) check_checkpoint_on_ranks<Model2, Backend, OneProcess>(backend);
  if (backend.num_devices() == 3) check_checkpoint_on_ranks<Model3, Backend, OneProcess>(backend);
  if (backend.num_devices() == 4) check_checkpoint_on_ranks<Model4, Backend, OneProcess>(backend);
}

// Backend: the MPI backend under test; OneProcess: the one-process backend of the same kernels;
// Precision: Fp32, or MixedBf16 (bf16 messages between the ranks).
template <class Model, class Kind, class Backend, class OneProcess, class Precision = Fp32>
void check_against_one_process(Backend& backend) {
  using Loss = SoftmaxCrossEntropy;
  constexpr std::size_t devices = Model::num_stages / Kind::chunks_per_device;
  CHECK(backend.num_devices() == devices);
  const std::vector<float> x = random_inputs(rows, Model::in_features, 3);
  const std::vector<std::int32_t> y = random_classes(rows, Model::out_features, 11);
  for (std::size_t m : {1u, 3u, 8u}) {
    if constexpr (std::is_same_v<Kind, DualPipeV>)
      if (m < 2 * devices) continue;  // DualPipeV needs M >= 2K
    // each policy on every stage, and at M 3 one per stage: stage s under mix[s % 3]
    constexpr Remat mix[] = {Remat::always, Remat::never, Remat::selective};
    std::vector<std::vector<Remat>> policies;
    for (Remat remat : {Remat::never, Remat::always, Remat::offload}) {
      // offload where both backends have a copy stream, at M 8 (where stashes wait the longest)
      if (remat == Remat::offload && (!gpipe::detail::Offload<Backend>::supported || m != 8))
        continue;
      policies.emplace_back(Model::num_stages, remat);
    }
    if (m == 3) {
      policies.emplace_back();
      for (std::size_t s = 0; s < Model::num_stages; ++s) policies.back().push_back(mix[s % 3]);
    }
    for (const std::vector<Remat>& stage_remat : policies) {
      CAPTURE(Kind::name);
      CAPTURE(m);
      std::string remat;
      for (const Remat r : stage_remat) remat += std::string(to_string(r)) + " ";
      CAPTURE(remat);
      CAPTURE(backend.rank());
      OneProcess one_process = one_process_like<OneProcess>(backend, devices);
      Trainer<Model, Loss, OneProcess, Kind, Precision> reference(
          one_process, {.micro_batches = m, .stage_remat = stage_remat, .seed = seed});
      Trainer<Model, Loss, Backend, Kind, Precision> trainer(
          backend, {.micro_batches = m, .stage_remat = stage_remat, .seed = seed});
      // the same ops; a transport whose sends wait for their receives (NCCL) places them for that
      if constexpr (transport::hand_over_for<Backend>::sends == Sends::rendezvous)
        CHECK(trainer.schedule() == order_for_rendezvous(reference.schedule()));
      else
        CHECK(trainer.schedule() == reference.schedule());

      CHECK(trainer.forward_backward(x, y) == reference.forward_backward(x, y));
      std::size_t mine = 0;
      for (const ParameterInfo& info : trainer.parameter_info()) {
        if (!backend.is_local(trainer.device_of_stage(info.stage))) {
          CHECK_THROWS_WITH_AS((void)trainer.gradient(info.name),
                               doctest::Contains("another process"), Error);
          continue;
        }
        CAPTURE(info.name);
        CHECK(trainer.gradient(info.name) == reference.gradient(info.name));
        ++mine;
      }
      CHECK(mine > 0);
      CHECK(trainer.predict(x) == reference.predict(x));

      // gradient clipping: the norm of one process, bit for bit, on every rank; clipped to half
      // of it, the same gradients
      const float norm = reference.clip_grad_norm(1e30);
      CHECK(trainer.clip_grad_norm(1e30) == norm);
      CHECK(trainer.clip_grad_norm(norm / 2) == reference.clip_grad_norm(norm / 2));
      for (const ParameterInfo& info : trainer.parameter_info())
        if (backend.is_local(trainer.device_of_stage(info.stage)))
          CHECK(trainer.gradient(info.name) == reference.gradient(info.name));

      const optim::SGD sgd({.lr = 0.1, .momentum = 0.9});
      trainer.step(sgd);
      reference.step(sgd);
      for (const ParameterInfo& info : trainer.parameter_info())
        if (backend.is_local(trainer.device_of_stage(info.stage)))
          CHECK(trainer.parameter(info.name) == reference.parameter(info.name));

      // one file for the whole model, written by device 0's rank, equal to one process's
      const std::string name = "saved_" + std::to_string(devices) + ".safetensors";
      trainer.save(name);
      if (backend.rank() == 0) {
        reference.save("reference_" + name);
        CHECK(file_bytes(name) == file_bytes("reference_" + name));
      }
      MPI_Barrier(backend.communicator());
      trainer.load(name);  // each rank keeps its own stages
    }
  }
}

// Two steps without zero_grad (gradients accumulate over both): the losses and this rank's
// gradients as one process's on the whole batch, to float rounding (a data-parallel step sums
// over the replicas in another order).
template <class Backend, class Trainer, class Reference>
void check_two_steps(const Backend& backend, Trainer& trainer, Reference& reference,
                     const std::vector<float>& x, const std::vector<std::int32_t>& y) {
  for (int step = 0; step < 2; ++step) {
    CAPTURE(step);
    const float loss = trainer.forward_backward(x, y);
    const float expected = reference.forward_backward(x, y);
    CHECK(std::abs(loss - expected) <= 1e-6 * std::abs(expected));
  }
  for (const ParameterInfo& info : trainer.parameter_info()) {
    if (!backend.is_local(trainer.device_of_stage(info.stage))) continue;
    CAPTURE(info.name);
    CHECK(relative_error(trainer.gradient(info.name), reference.gradient(info.name)) < 1e-6);
  }
}

template <class Model, class Kind, class Backend, class OneProcess>
void check_data_parallel(std::size_t replicas) {
  using Loss = SoftmaxCrossEntropy;
  constexpr std::size_t devices = Model::num_stages / Kind::chunks_per_device;
  Backend backend(MPI_COMM_WORLD, {.data_parallel = replicas});
  CHECK(backend.num_devices() == devices);
  CHECK(backend.replicas() == replicas);
  constexpr std::size_t batch = 23;  // shares differ by one row
  const std::vector<float> x = random_inputs(batch, Model::in_features, 5);
  const std::vector<std::int32_t> y = random_classes(batch, Model::out_features, 13);
  for (std::size_t m : {1u, 3u}) {
    for (Remat remat : {Remat::never, Remat::always, Remat::offload}) {
      // offload where both backends have a copy stream, at M 8 (where stashes wait the longest)
      if (remat == Remat::offload && (!gpipe::detail::Offload<Backend>::supported || m != 8))
        continue;
      CAPTURE(Kind::name);
      CAPTURE(replicas);
      CAPTURE(m);
      CAPTURE(to_string(remat));
      CAPTURE(backend.rank());
      OneProcess one_process = one_process_like<OneProcess>(backend, devices);
      Trainer<Model, Loss, OneProcess, Kind> reference(
          one_process, {.micro_batches = m, .remat = remat, .seed = seed});
      Trainer<Model, Loss, Backend, Kind> trainer(
          backend, {.micro_batches = m, .remat = remat, .seed = seed});
      check_two_steps(backend, trainer, reference, x, y);
      const optim::SGD sgd({.lr = 0.1});
      trainer.step(sgd);
      reference.step(sgd);
      for (const ParameterInfo& info : trainer.parameter_info())
        if (backend.is_local(trainer.device_of_stage(info.stage)))
          CHECK(relative_error(trainer.parameter(info.name), reference.parameter(info.name)) <
                1e-6);
    }
  }
}

template <class Kind, class Backend, class OneProcess>
void check_fault_ends_the_step_everywhere(Backend& backend) {
  const std::vector<float> x = random_inputs(faulty_batch, 4, 1);
  const std::vector<std::int32_t> y = random_classes(faulty_batch, 3, 2);
  for (Fault fault : {Fault::forward, Fault::backward_input}) {
    CAPTURE(Kind::name);
    CAPTURE(backend.rank());
    Trainer<FaultyModel, SoftmaxCrossEntropy, Backend, Kind> trainer(
        backend, {.micro_batches = faulty_micro_batches, .seed = 1});
    injected_fault = fault;
    const std::string message = error_of([&] { (void)trainer.forward_backward(x, y); });
    injected_fault = Fault::none;
    CAPTURE(message);
    CHECK(message.starts_with("gpipe: rank 1 failed: stage 1 (device 1), micro-batch 2, "));
    CHECK(message.ends_with(fault == Fault::forward ? "injected forward failure"
                                                    : "injected backward failure"));
    // the trainer goes on: the next step is the one-process step
    OneProcess one_process(3);
    Trainer<FaultyModel, SoftmaxCrossEntropy, OneProcess, Kind> reference(
        one_process, {.micro_batches = faulty_micro_batches, .seed = 1});
    trainer.zero_grad();
    CHECK(trainer.forward_backward(x, y) == reference.forward_backward(x, y));
  }
}

// Bad input found on one rank alone: the last rank's copy of the targets has a class id out of
// range, then rank 0's copy of predict's input has a float too many, while the other ranks' copies
// are right, so they issue their part of the step. Every rank throws the refusing rank's Error (at
// once: without the agreement the others would wait for its messages until peer_timeout), and
// the trainer goes on: the next step is the one-process step.
template <class Model, class Backend, class OneProcess>
void check_input_refused_on_one_rank(Backend& backend) {
  constexpr std::size_t K = Model::num_stages;
  const std::vector<float> x = random_inputs(rows, Model::in_features, 21);
  const std::vector<std::int32_t> y = random_classes(rows, Model::out_features, 22);
  std::vector<std::int32_t> bad_y = y;
  bad_y[5] = static_cast<std::int32_t>(Model::out_features);
  std::vector<float> bad_x = x;
  bad_x.push_back(0.5f);
  const std::size_t last = backend.world_size() - 1;
  CAPTURE(backend.rank());
  Trainer<Model, SoftmaxCrossEntropy, Backend, OneFOneB> trainer(
      backend, {.micro_batches = 4, .seed = seed});
  std::string message =
      error_of([&] { (void)trainer.forward_backward(x, backend.rank() == last ? bad_y : y); });
  CAPTURE(message);
  CHECK(message == "gpipe: rank " + std::to_string(last) +
                       " failed: SoftmaxCrossEntropy target 5 is " +
                       std::to_string(Model::out_features) + ", expected a class id in [0, " +
                       std::to_string(Model::out_features) + ") or -100 (ignored)");
  message = error_of([&] { (void)trainer.predict(backend.rank() == 0 ? bad_x : x); });
  CHECK(message.starts_with("gpipe: rank 0 failed: x has " + std::to_string(bad_x.size()) +
                            " floats, expected a positive multiple of in_features"));
  OneProcess one_process = one_process_like<OneProcess>(backend, K);
  Trainer<Model, SoftmaxCrossEntropy, OneProcess, OneFOneB> reference(
      one_process, {.micro_batches = 4, .seed = seed});
  trainer.zero_grad();
  CHECK(trainer.forward_backward(x, y) == reference.forward_backward(x, y));
  CHECK(trainer.predict(x) == reference.predict(x));
}

// With 2 replicas x 2 devices (4 ranks): the last rank alone refuses its targets after a good
// step, so that replica 0 runs its whole part and starts its gradient sums, which the refusing
// rank must start too: every rank throws its Error, and from zero two steps equal one process's
// (they would hang if the replicas' sums had fallen out of step).
template <class Backend, class OneProcess>
void check_input_refused_in_one_replica() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 4) return;
  Backend backend(MPI_COMM_WORLD, {.data_parallel = 2});
  const std::vector<float> x = random_inputs(rows, Model2::in_features, 25);
  const std::vector<std::int32_t> y = random_classes(rows, Model2::out_features, 26);
  std::vector<std::int32_t> bad_y = y;
  bad_y[3] = -1;
  CAPTURE(backend.rank());
  Trainer<Model2, SoftmaxCrossEntropy, Backend, OneFOneB> trainer(
      backend, {.micro_batches = 2, .seed = seed});
  OneProcess one_process = one_process_like<OneProcess>(backend, 2);
  Trainer<Model2, SoftmaxCrossEntropy, OneProcess, OneFOneB> reference(
      one_process, {.micro_batches = 2, .seed = seed});
  (void)trainer.forward_backward(x, y);
  const std::string message =
      error_of([&] { (void)trainer.forward_backward(x, backend.rank() == 3 ? bad_y : y); });
  CAPTURE(message);
  CHECK(message ==
        "gpipe: rank 3 failed: SoftmaxCrossEntropy target 3 is -1, expected a class id in [0, " +
            std::to_string(Model2::out_features) + ") or -100 (ignored)");
  trainer.zero_grad();
  check_two_steps(backend, trainer, reference, x, y);
}

template <class Backend, class OneProcess>
void check_inputs_refused_on_one_rank(Backend& backend) {
  if (backend.num_devices() == 2)
    check_input_refused_on_one_rank<Model2, Backend, OneProcess>(backend);
  if (backend.num_devices() == 3)
    check_input_refused_on_one_rank<Model3, Backend, OneProcess>(backend);
  if (backend.num_devices() == 4)
    check_input_refused_on_one_rank<Model4, Backend, OneProcess>(backend);
}

// A training step's wall time over the ranks (Trainer::last_step_seconds): the same on every
// rank; at least the pipeline's compute makespan and a pause that the last rank alone takes
// between its forward_backward and its step() (no collective in between, so the other ranks' own
// steps end before it); at most from the earliest rank's time before zero_grad to the latest
// rank's after step() (one machine here: the ranks share steady_clock; where MPI takes them for
// two machines, network namespaces, the wall time's ends are each within a rank's clock error);
// zero_grad before the first forward_backward is not part of it.
template <class Model, class Backend>
void check_step_wall_time(Backend& backend) {
  using Clock = std::chrono::steady_clock;
  const std::vector<float> x = random_inputs(rows, Model::in_features, 23);
  const std::vector<std::int32_t> y = random_classes(rows, Model::out_features, 24);
  Trainer<Model, SoftmaxCrossEntropy, Backend, OneFOneB> trainer(
      backend, {.micro_batches = 4, .seed = seed});
  const double before = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  trainer.zero_grad();
  (void)trainer.forward_backward(x, y);
  if (backend.rank() == backend.world_size() - 1)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  trainer.step(optim::SGD({.lr = 0.01}));
  const double after = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  const double wall = trainer.last_step_seconds();
  double span[2] = {-before, after}, widest[2] = {0, 0}, first = wall;
  MPI_Allreduce(span, widest, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Bcast(&first, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  CAPTURE(backend.rank());
  CAPTURE(wall);
  CHECK(wall == first);
  CHECK(wall >= 0.050);
  CHECK(wall >= trainer.last_step().makespan_us / 1e6);
  const double error = backend.clock_error_us();
  double most_error = 0;
  MPI_Allreduce(&error, &most_error, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  CHECK(wall <= widest[0] + widest[1] + 2 * most_error / 1e6);
}

template <class Backend>
void check_step_wall_times(Backend& backend) {
  if (backend.num_devices() == 2) check_step_wall_time<Model2, Backend>(backend);
  if (backend.num_devices() == 3) check_step_wall_time<Model3, Backend>(backend);
  if (backend.num_devices() == 4) check_step_wall_time<Model4, Backend>(backend);
}

// Every schedule on as many ranks as devices (2, 3 or 4), against one process; on one rank, the
// rank's device alone (no messages: what a machine with one GPU can run of mpi::CudaBackend).
template <class Backend, class OneProcess>
void check_every_schedule(Backend& backend) {
  switch (backend.num_devices()) {
    case 1:
      check_against_one_process<Model1, GPipe, Backend, OneProcess>(backend);
      check_against_one_process<Model1, OneFOneB, Backend, OneProcess>(backend);
      // both stages of the V on the one rank: the turn is a copy within the device
      check_against_one_process<Model2, ZeroBubbleV, Backend, OneProcess>(backend);
      break;
    case 2:
      check_against_one_process<Model2, GPipe, Backend, OneProcess>(backend);
      check_against_one_process<Model2, OneFOneB, Backend, OneProcess>(backend);
      check_against_one_process<Model2, ZeroBubbleH1, Backend, OneProcess>(backend);
      check_against_one_process<Model2, ZeroBubbleH2, Backend, OneProcess>(backend);
      check_against_one_process<Model4, Interleaved<2>, Backend, OneProcess>(backend);
      check_against_one_process<Model4, ZeroBubbleV, Backend, OneProcess>(backend);
      check_against_one_process<Model4, DualPipeV, Backend, OneProcess>(backend);
      if constexpr (requires(typename Backend::Kernels & k) { k.bf16_context(); })
        check_against_one_process<Model2, OneFOneB, Backend, OneProcess, MixedBf16>(backend);
      break;
    case 3:
      check_against_one_process<Model3, GPipe, Backend, OneProcess>(backend);
      check_against_one_process<Model3, OneFOneB, Backend, OneProcess>(backend);
      check_against_one_process<Model3, ZeroBubbleH1, Backend, OneProcess>(backend);
      break;
    case 4:
      check_against_one_process<Model4, GPipe, Backend, OneProcess>(backend);
      check_against_one_process<Model4, OneFOneB, Backend, OneProcess>(backend);
      check_against_one_process<Model4, ZeroBubbleH1, Backend, OneProcess>(backend);
      check_against_one_process<Model8, Interleaved<2>, Backend, OneProcess>(backend);
      check_against_one_process<Model8, ZeroBubbleV, Backend, OneProcess>(backend);
      if constexpr (requires(typename Backend::Kernels & k) { k.bf16_context(); })
        check_against_one_process<Model4, GPipe, Backend, OneProcess, MixedBf16>(backend);
      break;
    default:
      FAIL("run with 1, 2, 3 or 4 ranks, got " << backend.num_devices());
  }
}

// Replicas: 2 x 2 on four ranks (1F1B, GPipe, interleaved), and one replica per rank of a
// one-stage model (plain data parallelism) on every world.
template <class Backend, class OneProcess>
void check_replicas() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size == 4) {
    check_data_parallel<Model2, OneFOneB, Backend, OneProcess>(2);
    check_data_parallel<Model2, GPipe, Backend, OneProcess>(2);
    check_data_parallel<Model4, Interleaved<2>, Backend, OneProcess>(2);
  }
  check_data_parallel<Model1, GPipe, Backend, OneProcess>(static_cast<std::size_t>(size));
}

// Packed documents and ignored targets over the ranks: each rank gets the whole batch's token,
// target and document spans and uploads the ids of its own stages' micro-batches; the loss's
// normalizer is the whole batch's count of targets not ignored, on every rank and replica.
using PackedGpt1 = Pipeline<Stage<Emb, Block, LayerNorm<width>, Linear<width, vocab>>>;
using PackedGpt2 =
    Pipeline<Stage<Emb, Block>, Stage<Block, LayerNorm<width>, Linear<width, vocab>>>;
using PackedGpt3 =
    Pipeline<Stage<Emb, Block>, Stage<Block>, Stage<Block, LayerNorm<width>, Linear<width, vocab>>>;
using PackedGpt4 = Pipeline<Stage<Emb, Block>, Stage<Block>, Stage<Block>,
                            Stage<LayerNorm<width>, Linear<width, vocab>>>;

// 6 samples of `context` tokens: documents with runs inside samples, an id back after another
// and a run across a sample border; targets -100 on sample 0 whole and on every third token.
struct PackedBatch {
  std::vector<std::int32_t> tokens, targets, documents;
};
inline PackedBatch packed_batch() {
  PackedBatch b{random_classes(6 * context, vocab, 31),
                random_classes(6 * context, vocab, 32),
                {0, 0, 1, 1, 1, 2, 1, 1, 2, 2, 2, 2, 2, 0, 0, 3, 3, 3, 3, 0, 4, 5, 5, 4}};
  for (std::size_t i = 0; i < b.targets.size(); ++i)
    if (i < context || i % 3 == 0) b.targets[i] = -100;
  return b;
}

// One rank per device: the loss, this rank's gradients and the predictions of one process, bit
// for bit, for M 1 and 3 and remat never and always.
template <class Model, class Backend, class OneProcess>
void check_packed_against_one_process(Backend& backend) {
  constexpr std::size_t devices = Model::num_stages;
  CHECK(backend.num_devices() == devices);
  const PackedBatch b = packed_batch();
  for (std::size_t m : {1u, 3u}) {
    for (Remat remat : {Remat::never, Remat::always}) {
      CAPTURE(m);
      CAPTURE(to_string(remat));
      CAPTURE(backend.rank());
      OneProcess one_process = one_process_like<OneProcess>(backend, devices);
      Trainer<Model, SoftmaxCrossEntropy, OneProcess, OneFOneB> reference(
          one_process, {.micro_batches = m, .remat = remat, .seed = seed});
      Trainer<Model, SoftmaxCrossEntropy, Backend, OneFOneB> trainer(
          backend, {.micro_batches = m, .remat = remat, .seed = seed});
      CHECK(trainer.forward_backward(b.tokens, b.targets, b.documents) ==
            reference.forward_backward(b.tokens, b.targets, b.documents));
      std::size_t mine = 0;
      for (const ParameterInfo& info : trainer.parameter_info()) {
        if (!backend.is_local(trainer.device_of_stage(info.stage))) continue;
        CAPTURE(info.name);
        CHECK(trainer.gradient(info.name) == reference.gradient(info.name));
        ++mine;
      }
      CHECK(mine > 0);
      CHECK(trainer.predict(b.tokens, b.documents) == reference.predict(b.tokens, b.documents));
      // a wrong length is refused on every rank with the same Error, and the next step is right
      const std::vector<std::int32_t> short_ids(b.documents.begin(), b.documents.end() - 1);
      const std::string message =
          error_of([&] { (void)trainer.forward_backward(b.tokens, b.targets, short_ids); });
      CHECK(message.find("document_ids has 23 ids, expected 24") != std::string::npos);
    }
  }
}

// Data-parallel replicas of Model (each a share of the samples, the normalizer the whole
// batch's): two steps as one process's on the whole batch, to float rounding.
template <class Model, class Backend, class OneProcess>
void check_packed_replicas(std::size_t replicas) {
  Backend backend(MPI_COMM_WORLD, {.data_parallel = replicas});
  const PackedBatch b = packed_batch();
  CAPTURE(replicas);
  CAPTURE(backend.rank());
  OneProcess one_process = one_process_like<OneProcess>(backend, Model::num_stages);
  Trainer<Model, SoftmaxCrossEntropy, OneProcess, OneFOneB> reference(
      one_process, {.micro_batches = 1, .seed = seed});
  Trainer<Model, SoftmaxCrossEntropy, Backend, OneFOneB> trainer(
      backend, {.micro_batches = 1, .seed = seed});
  for (int step = 0; step < 2; ++step) {
    CAPTURE(step);
    const float loss = trainer.forward_backward(b.tokens, b.targets, b.documents);
    const float expected = reference.forward_backward(b.tokens, b.targets, b.documents);
    CHECK(std::abs(loss - expected) <= 1e-6 * std::abs(expected));
  }
  for (const ParameterInfo& info : trainer.parameter_info()) {
    if (!backend.is_local(trainer.device_of_stage(info.stage))) continue;
    CAPTURE(info.name);
    CHECK(relative_error(trainer.gradient(info.name), reference.gradient(info.name)) < 1e-6);
  }
}

template <class Backend, class OneProcess>
void check_packed_documents(Backend& backend) {
  switch (backend.num_devices()) {
    case 1:
      check_packed_against_one_process<PackedGpt1, Backend, OneProcess>(backend);
      break;
    case 2:
      check_packed_against_one_process<PackedGpt2, Backend, OneProcess>(backend);
      break;
    case 3:
      check_packed_against_one_process<PackedGpt3, Backend, OneProcess>(backend);
      break;
    case 4:
      check_packed_against_one_process<PackedGpt4, Backend, OneProcess>(backend);
      break;
    default:
      FAIL("run with 1, 2, 3 or 4 ranks, got " << backend.num_devices());
  }
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size == 4) check_packed_replicas<PackedGpt2, Backend, OneProcess>(2);
  if (size == 2 || size == 3)  // 6 samples: a share of 3 or 2 each
    check_packed_replicas<PackedGpt1, Backend, OneProcess>(static_cast<std::size_t>(size));
}

// Identity that kills its process (rank 1's) in the forward of micro-batch 2.
struct KillingIdentity : FaultyIdentity<8> {
  template <class Ctx>
  static void forward(Ctx& ctx, const ForwardArgs<typename Ctx::value_type>& a) {
    if (a.rows == faulty_rows) std::raise(SIGKILL);
    ctx.copy(a.rows * 8, a.x, a.y);
  }
};
using KillingModel = Pipeline<Stage<Linear<4, 8>, ReLU>, Stage<Linear<8, 8>, KillingIdentity, ReLU>,
                              Stage<Linear<8, 3>>>;

// With GPIPE_MPI_KILL_RANK=1 in the environment (CTest's killed-rank tests): a step in which rank
// 1 kills itself; mpirun must end the job with a failure, soon. Returns whether it ran (then main
// returns 0, which the test, expecting a failure, counts against it).
template <class Backend>
bool run_killed_rank_step() {
  if (std::getenv("GPIPE_MPI_KILL_RANK") == nullptr) return false;
  Backend backend;
  Trainer<KillingModel, SoftmaxCrossEntropy, Backend, OneFOneB> trainer(
      backend, {.micro_batches = faulty_micro_batches});
  (void)trainer.forward_backward(random_inputs(faulty_batch, 4, 1),
                                 random_classes(faulty_batch, 3, 2));
  std::fprintf(stderr, "rank %zu: the step ended although rank 1 died\n", backend.rank());
  return true;
}

}  // namespace gpipe::test::mpi_conformance
