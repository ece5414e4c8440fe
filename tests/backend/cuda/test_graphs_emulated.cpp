// CUDA Graphs on the CPU emulator: the emulator's stream capture (what it replays, what it
// refuses, as CUDA does), then training steps that cuda::Backend replays from a graph against the
// same steps issued op by op (BackendOptions::graphs = false): the same losses and parameters bit
// for bit, every op still timed, the same memory counts, for several schedules, remat policies,
// MixedBf16, packed documents, one GPU and two, and steps whose shape changes.

#include "support/cuda_emulation.hpp"
// The emulated runtime first: it defines what the CUDA headers leave to nvcc.

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gpipe/cuda.cuh"
#include "gpipe/optim/adamw.hpp"
#include "support/errors.hpp"
#include "support/faulty_layer.hpp"
#include "support/tiny_gpt.hpp"

// Named, so that every emulated test compiles into one program (tests/CMakeLists.txt).
namespace emulated_graphs {

using namespace gpipe;

// ---- the emulator's graphs ----

// A kernel-free stand-in for work: dst[i] = 2 src[i] + 1 on the stream, as a host function.
struct Twice {
  const float* src;
  float* dst;
  std::size_t n;
  static void run(void* p) {
    auto* t = static_cast<Twice*>(p);
    for (std::size_t i = 0; i < t->n; ++i) t->dst[i] = 2 * t->src[i] + 1;
  }
};

TEST_CASE("emulated CUDA graphs: a capture over two streams replays with each launch's inputs") {
  constexpr std::size_t n = 64;
  cudaStream_t a = nullptr, b = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
  cudaEvent_t fork = nullptr, join = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&join, cudaEventDisableTiming) == cudaSuccess);
  void *in = nullptr, *out = nullptr;
  REQUIRE(cudaHostAlloc(&in, n * sizeof(float), 0) == cudaSuccess);
  REQUIRE(cudaHostAlloc(&out, n * sizeof(float), 0) == cudaSuccess);
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location = {cudaMemLocationTypeDevice, 0};
  cudaMemPool_t pool = nullptr;
  REQUIRE(cudaMemPoolCreate(&pool, &props) == cudaSuccess);

  // a: upload, fork to b; b: y = 2x + 1 on the device copy; a: waits for b, downloads
  REQUIRE(cudaStreamBeginCapture(a, cudaStreamCaptureModeRelaxed) == cudaSuccess);
  void *x = nullptr, *y = nullptr;
  REQUIRE(cudaMallocFromPoolAsync(&x, n * sizeof(float), pool, a) == cudaSuccess);
  REQUIRE(cudaMallocFromPoolAsync(&y, n * sizeof(float), pool, a) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(x, in, n * sizeof(float), cudaMemcpyHostToDevice, a) == cudaSuccess);
  REQUIRE(cudaEventRecord(fork, a) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(b, fork, 0) == cudaSuccess);
  Twice job{static_cast<const float*>(x), static_cast<float*>(y), n};
  REQUIRE(cudaLaunchHostFunc(b, &Twice::run, &job) == cudaSuccess);
  REQUIRE(cudaEventRecord(join, b) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(a, join, 0) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(out, y, n * sizeof(float), cudaMemcpyDeviceToHost, a) == cudaSuccess);
  REQUIRE(cudaFreeAsync(x, a) == cudaSuccess);
  REQUIRE(cudaFreeAsync(y, a) == cudaSuccess);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(a, &graph) == cudaSuccess);
  cudaStreamCaptureStatus status{};
  REQUIRE(cudaStreamIsCapturing(b, &status) == cudaSuccess);
  CHECK(status == cudaStreamCaptureStatusNone);
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);

  auto* host_in = static_cast<float*>(in);
  auto* host_out = static_cast<float*>(out);
  for (int launch = 0; launch < 3; ++launch) {
    CAPTURE(launch);
    for (std::size_t i = 0; i < n; ++i) host_in[i] = static_cast<float>(launch * 100 + i);
    std::memset(out, 0, n * sizeof(float));
    REQUIRE(cudaGraphLaunch(exec, a) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(a) == cudaSuccess);
    for (std::size_t i = 0; i < n; ++i) REQUIRE(host_out[i] == 2 * host_in[i] + 1);
  }
  CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  CHECK(cudaMemPoolDestroy(pool) == cudaSuccess);
  CHECK(cudaFreeHost(in) == cudaSuccess);
  CHECK(cudaFreeHost(out) == cudaSuccess);
  CHECK(cudaEventDestroy(fork) == cudaSuccess);
  CHECK(cudaEventDestroy(join) == cudaSuccess);
  CHECK(cudaStreamDestroy(a) == cudaSuccess);
  CHECK(cudaStreamDestroy(b) == cudaSuccess);
}

TEST_CASE("emulated CUDA graphs: captures that CUDA refuses are refused") {
  cudaStream_t a = nullptr, b = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
  cudaEvent_t fork = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming) == cudaSuccess);
  cudaGraph_t graph = nullptr;
  void* device = nullptr;
  REQUIRE(cudaMalloc(&device, 64) == cudaSuccess);

  SUBCASE("a stream that joined and was not joined back") {
    REQUIRE(cudaStreamBeginCapture(a, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    REQUIRE(cudaEventRecord(fork, a) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(b, fork, 0) == cudaSuccess);
    REQUIRE(cudaMemsetAsync(device, 0, 64, b) == cudaSuccess);
    CHECK(cudaStreamEndCapture(a, &graph) == cudaErrorStreamCaptureUnjoined);
    CHECK(graph == nullptr);
  }
  SUBCASE("a copy from pageable host memory") {
    std::vector<char> pageable(64);
    REQUIRE(cudaStreamBeginCapture(a, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    CHECK(cudaMemcpyAsync(device, pageable.data(), 64, cudaMemcpyHostToDevice, a) ==
          cudaErrorStreamCaptureUnsupported);
    CHECK(cudaStreamEndCapture(a, &graph) == cudaErrorStreamCaptureUnsupported);
  }
  SUBCASE("waiting for a capturing stream") {
    REQUIRE(cudaStreamBeginCapture(a, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    CHECK(cudaStreamSynchronize(a) == cudaErrorStreamCaptureUnsupported);
    CHECK(cudaStreamEndCapture(a, &graph) == cudaErrorStreamCaptureUnsupported);
  }
  SUBCASE("freeing memory that the graph does not own") {
    REQUIRE(cudaStreamBeginCapture(a, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    CHECK(cudaFreeAsync(device, a) == cudaErrorInvalidValue);
    CHECK(cudaStreamEndCapture(a, &graph) == cudaErrorInvalidValue);
  }
  (void)cudaGetLastError();
  CHECK(cudaFree(device) == cudaSuccess);
  CHECK(cudaEventDestroy(fork) == cudaSuccess);
  CHECK(cudaStreamDestroy(a) == cudaSuccess);
  CHECK(cudaStreamDestroy(b) == cudaSuccess);
}

// ---- training steps replayed ----

using namespace gpipe::test::tiny_gpt;

// What a run of steps gives: each step's loss, each step's compute ops per device, the peak
// memory of each device over the run, and the parameters at the end.
struct Run {
  std::vector<float> losses;
  std::vector<std::vector<std::size_t>> ops;
  std::vector<std::size_t> peaks;
  std::vector<std::vector<float>> parameters;
  std::size_t launches = 0;
  std::string refusal;
};

// How a case lays its virtual devices out: all on GPU 0, or device d on GPU d % 2.
enum class Gpus { one, two };

// `steps` AdamW steps of Model on K virtual devices, with graphs on or off; step i's batch has
// samples(i) samples (a change of shape), documents where `documents`.
template <class Model, class Schedule = GPipe, class Precision = Fp32>
Run run(bool graphs, Gpus gpus, std::size_t micro_batches, Remat remat, bool documents,
        std::size_t steps, std::size_t (*samples)(std::size_t)) {
  constexpr std::size_t K = Model::num_stages / Schedule::chunks_per_device;
  std::vector<int> mapping(K, 0);
  for (std::size_t d = 0; d < K && gpus == Gpus::two; ++d) mapping[d] = static_cast<int>(d % 2);
  cuda::Backend backend(K, {.gpus = mapping, .graphs = graphs});
  Trainer<Model, SoftmaxCrossEntropy, cuda::Backend, Schedule, Precision> trainer(
      backend, {.micro_batches = micro_batches, .remat = remat, .seed = 5});
  optim::AdamW optimizer({.lr = 1e-2});
  Run out;
  backend.reset_peak();
  for (std::size_t i = 0; i < steps; ++i) {
    const std::size_t n = samples(i) * T;
    const std::vector<std::int32_t> x = random_ids(n, 10 + i), y = random_ids(n, 50 + i);
    std::vector<std::int32_t> doc(n);
    for (std::size_t j = 0; j < n; ++j) doc[j] = static_cast<std::int32_t>((j + i) / 3);
    trainer.zero_grad();
    out.losses.push_back(documents ? trainer.forward_backward(x, y, doc)
                                   : trainer.forward_backward(x, y));
    std::vector<std::size_t> ops;
    for (const ComputeTiming& t : trainer.last_step().devices) ops.push_back(t.ops);
    out.ops.push_back(ops);
    trainer.step(optimizer);
  }
  for (std::size_t d = 0; d < K; ++d) out.peaks.push_back(backend.memory_stats(d).peak);
  for (const ParameterInfo& p : trainer.parameter_info())
    out.parameters.push_back(trainer.parameter(p.name));
  out.launches = backend.graph_launches();
  out.refusal = backend.graph_refusal();
  return out;
}

std::size_t always_4(std::size_t) { return 4; }
// 4 samples, then 5 twice (a new shape: issued, captured, launched), then 4 again
std::size_t changing(std::size_t i) { return i == 3 || i == 4 ? 5 : 4; }

template <class Model, class Schedule = GPipe, class Precision = Fp32>
void check_replay(std::size_t micro_batches, Remat remat, bool documents,
                  std::size_t (*samples)(std::size_t), std::size_t expected_launches,
                  Gpus gpus = Gpus::one) {
  constexpr std::size_t steps = 7;
  const Run eager =
      run<Model, Schedule, Precision>(false, gpus, micro_batches, remat, documents, steps, samples);
  const Run graphs =
      run<Model, Schedule, Precision>(true, gpus, micro_batches, remat, documents, steps, samples);
  CHECK(eager.launches == 0);
  INFO("why the last capture gave no graph: ", graphs.refusal);
  CHECK(graphs.launches == expected_launches);
  CHECK(graphs.losses == eager.losses);  // bit for bit
  CHECK(graphs.ops == eager.ops);        // every op of a replayed step still timed
  CHECK(graphs.peaks == eager.peaks);
  CHECK(graphs.parameters == eager.parameters);
}

TEST_CASE("emulated CUDA graphs: replayed steps equal steps issued op by op, bit for bit") {
  // 7 steps of one shape: issued, captured (and launched), then launched 5 times
  SUBCASE("GPipe, K 4, M 2") { check_replay<Gpt4>(2, Remat::never, false, always_4, 6); }
  SUBCASE("1F1B, K 2, M 4, remat always, packed documents") {
    check_replay<Gpt2, OneFOneB>(4, Remat::always, true, always_4, 6);
  }
  SUBCASE("ZB-H1, K 2, M 2, remat except_last") {
    check_replay<Gpt2, ZeroBubbleH1>(2, Remat::except_last, false, always_4, 6);
  }
  SUBCASE("Interleaved<2>, K 2, M 2") {
    check_replay<Gpt4, Interleaved<2>>(2, Remat::never, false, always_4, 6);
  }
  SUBCASE("MixedBf16, 1F1B, K 2, M 2: the optimizer's bf16 copies and the rounded ones") {
    // the first step rounds the initial weights to bf16, later ones use AdamW's fused copies:
    // another key, so the graph comes a step later
    check_replay<Gpt2, OneFOneB, MixedBf16>(2, Remat::never, false, always_4, 5);
  }
  SUBCASE("GPipe, K 4 on two GPUs: the peer copies between them in the graph") {
    check_replay<Gpt4>(2, Remat::never, false, always_4, 6, Gpus::two);
  }
  SUBCASE("ZB-H1, K 2 on two GPUs, MixedBf16") {
    check_replay<Gpt2, ZeroBubbleH1, MixedBf16>(2, Remat::always, false, always_4, 5, Gpus::two);
  }
  SUBCASE("a change of shape drops the graph; the new shape is captured on its second step") {
    // steps 0-2 of 4 samples: eager, capture, replay; 3-4 of 5: eager, capture; 5-6 of 4:
    // eager, capture
    check_replay<Gpt2, OneFOneB>(2, Remat::never, false, changing, 4);
  }
}

TEST_CASE("emulated CUDA graphs: a step that fails while captured fails as it does op by op") {
  using test::Fault;
  using test::injected_fault;
  cuda::Backend backend(3, {.gpus = {0, 0, 0}});
  Trainer<test::FaultyModel, SoftmaxCrossEntropy, cuda::Backend, OneFOneB> trainer(
      backend, {.micro_batches = test::faulty_micro_batches, .seed = 1});
  std::vector<float> x(test::faulty_batch * 4);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * static_cast<float>(i % 7);
  const std::vector<std::int32_t> y{0, 1, 2, 0, 1};
  const float first = trainer.forward_backward(x, y);  // issued op by op
  for (Fault fault : {Fault::forward, Fault::backward_input}) {
    CAPTURE(static_cast<int>(fault));
    injected_fault = fault;  // the next step would be captured: its ops throw while captured
    const std::string message = test::error_of([&] { (void)trainer.forward_backward(x, y); });
    injected_fault = Fault::none;
    // the error of the step issued op by op: the stage, device and micro-batch that failed
    CAPTURE(message);
    CHECK(test::contains(message, "stage 1"));
    CHECK(test::contains(message, "micro-batch 2"));
    CHECK(test::contains(message, fault == Fault::forward ? "injected forward failure"
                                                          : "injected backward failure"));
    trainer.zero_grad();
    CHECK(trainer.forward_backward(x, y) == first);  // and the trainer goes on
  }
  // a failed step starts its shape afresh: issued (above), captured, launched
  for (int step = 0; step < 2; ++step) {
    trainer.zero_grad();
    CHECK(trainer.forward_backward(x, y) == first);
  }
  CHECK(backend.graph_launches() == 2);
}

}  // namespace emulated_graphs
