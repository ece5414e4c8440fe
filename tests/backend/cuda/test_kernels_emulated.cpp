// The CUDA backend's kernels, compiled by the host compiler and run on the CPU emulator of
// tests/support/cuda_emulation/device.hpp, against the host kernels, twice:
//   - tests/cuda/test_kernels.cu as it is: through cuda::Backend on the emulated runtime
//     (tests/support/cuda_emulation.hpp), with the GEMMs on its cuBLAS (every transposition,
//     TF32) and the staged uploads and downloads;
//   - the kernel conformance suite again, each launcher called directly (all but the GEMM) on
//     memory that ends at an inaccessible page, so that a kernel that reads or writes past a
//     buffer's end faults; the bytes between a buffer's end and that page hold NaN and must be
//     unchanged after each kernel.
// Then the emulator's own checks: what it must catch, so that a pass means something.

#include "support/cuda_emulation.hpp"
// The emulated runtime first: it defines what the CUDA headers leave to nvcc.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cuda/test_kernels.cu"
#include "gpipe/backend/cuda/kernels/bias.cuh"
#include "gpipe/backend/cuda/kernels/elementwise.cuh"
#include "gpipe/backend/cuda/kernels/layer_norm.cuh"
#include "gpipe/backend/cuda/kernels/loss.cuh"
#include "gpipe/backend/cuda/kernels/optimizer.cuh"
#include "gpipe/model/linear.hpp"
#include "support/conformance_cuda_kernels.hpp"
#include "support/errors.hpp"
#include "support/guarded_buffer.hpp"
#include "support/layer_kernels.hpp"

namespace {

namespace cu = gpipe::cuda;

// Fresh NaN-filled host scratch per call: a kernel that reads scratch it did not write sees NaN.
class EmulatedScratch {
 public:
  float* scratch(std::size_t floats) {
    scratch_.assign(floats, std::nanf(""));
    return floats == 0 ? nullptr : scratch_.data();
  }

 private:
  std::vector<float> scratch_;
};

// The members of gpipe::cuda::Bf16Kernels that the conformance suite calls, as that class
// forwards them to the launchers.
class EmulatedBf16Kernels : public EmulatedScratch {
 public:
  cudaStream_t stream() const { return nullptr; }
  void softmax_cross_entropy(std::size_t rows, std::size_t classes, const gpipe::bf16* logits,
                             const std::int32_t* targets, float grad_scale, gpipe::bf16* dlogits,
                             float* loss_sum) {
    cu::softmax_cross_entropy_forward(rows, classes, logits, targets, grad_scale, dlogits, loss_sum,
                                      scratch(cu::softmax_cross_entropy_scratch(rows)), nullptr);
  }
  void mse(std::size_t n, const gpipe::bf16* y, const float* target, float grad_scale,
           gpipe::bf16* dy, float* loss_sum) {
    cu::mse_forward(n, y, target, grad_scale, dy, loss_sum, scratch(cu::mse_scratch()), nullptr);
  }
};

// The members of gpipe::cuda::Kernels that the conformance suite calls, forwarding to the same
// launchers with the same scratch sizes; scratch is host memory here. The layers' kernels
// (LayerKernels of ReLU, GELU and LayerNorm) follow, as the backend's layers/activation.cuh.
class EmulatedKernels : public EmulatedScratch {
 public:
  EmulatedBf16Kernels& bf16_context() { return bf16_; }
  cudaStream_t stream() const { return nullptr; }  // the launchers' stream, as Kernels::stream()
  void bias_add(std::size_t rows, std::size_t cols, const float* bias, float* y) {
    cu::bias_add_forward(rows, cols, bias, y, nullptr);
  }
  void bias_grad(std::size_t rows, std::size_t cols, const float* dy, float* db) {
    cu::bias_grad_backward(rows, cols, dy, db, scratch(cu::bias_grad_scratch(rows, cols)), nullptr);
  }
  void add(std::size_t n, const float* a, const float* b, float* y) {
    cu::add(n, a, b, y, nullptr);
  }
  void accumulate(std::size_t n, const float* x, float* y) { cu::accumulate(n, x, y, nullptr); }
  void copy(std::size_t n, const float* src, float* dst) {
    std::memcpy(dst, src, n * sizeof(float));
  }
  void fill(std::size_t n, float value, float* dst) { cu::fill(n, value, dst, nullptr); }
  void scale(std::size_t n, float alpha, float* x) { cu::scale(n, alpha, x, nullptr); }
  void sum_of_squares(std::size_t n, const float* x, double* out) {
    const std::size_t chunks =
        (n + gpipe::detail::squares_chunk - 1) / gpipe::detail::squares_chunk;
    cu::sum_of_squares(n, x, out,
                       reinterpret_cast<double*>(scratch(2 * std::max<std::size_t>(chunks, 1))),
                       nullptr);
  }
  void softmax_cross_entropy(std::size_t rows, std::size_t classes, const float* logits,
                             const std::int32_t* targets, float grad_scale, float* dlogits,
                             float* loss_sum) {
    cu::softmax_cross_entropy_forward(rows, classes, logits, targets, grad_scale, dlogits, loss_sum,
                                      scratch(cu::softmax_cross_entropy_scratch(rows)), nullptr);
  }
  void mse(std::size_t n, const float* y, const float* target, float grad_scale, float* dy,
           float* loss_sum) {
    cu::mse_forward(n, y, target, grad_scale, dy, loss_sum, scratch(cu::mse_scratch()), nullptr);
  }
  void sgd_update(std::size_t n, float* p, const float* g, float* momentum_buf, double lr,
                  double momentum, double dampening, double weight_decay, bool nesterov,
                  bool first_step) {
    cu::sgd_update(n, p, g, momentum_buf, lr, momentum, dampening, weight_decay, nesterov,
                   first_step, nullptr);
  }
  void adamw_update(std::size_t n, float* p, const float* g, float* m, float* v, double lr,
                    double beta1, double beta2, double eps, double weight_decay, std::size_t step) {
    cu::adamw_update(n, p, g, m, v, lr, beta1, beta2, eps, weight_decay, step, nullptr);
  }

 private:
  EmulatedBf16Kernels bf16_;
};

}  // namespace

template <>
struct gpipe::LayerKernels<gpipe::ReluOp, EmulatedKernels> {
  static void forward(EmulatedKernels& k, std::size_t n, const float* x, float* y) {
    cu::activation_forward<cu::ReluMath>(n, x, y, k.stream());
  }
  static void backward(EmulatedKernels& k, std::size_t n, const float* x, const float* dy,
                       float* dx) {
    cu::activation_backward<cu::ReluMath>(n, x, dy, dx, k.stream());
  }
};
template <>
struct gpipe::LayerKernels<gpipe::GeluOp, EmulatedKernels> {
  static void forward(EmulatedKernels& k, std::size_t n, const float* x, float* y) {
    cu::activation_forward<cu::GeluMath>(n, x, y, k.stream());
  }
  static void backward(EmulatedKernels& k, std::size_t n, const float* x, const float* dy,
                       float* dx) {
    cu::activation_backward<cu::GeluMath>(n, x, dy, dx, k.stream());
  }
};
template <>
struct gpipe::LayerKernels<gpipe::LayerNormOp, EmulatedKernels> {
  static void forward(EmulatedKernels& k, std::size_t rows, std::size_t cols, double eps,
                      const float* x, const float* gamma, const float* beta, float* y,
                      float* stats) {
    cu::layer_norm_forward(rows, cols, eps, x, gamma, beta, y, stats, k.stream());
  }
  static void backward_input(EmulatedKernels& k, std::size_t rows, std::size_t cols, const float* x,
                             const float* dy, const float* gamma, const float* stats, float* dx) {
    cu::layer_norm_backward_input(rows, cols, x, dy, gamma, stats, dx, k.stream());
  }
  static void backward_weight(EmulatedKernels& k, std::size_t rows, std::size_t cols,
                              const float* x, const float* dy, const float* stats, float* dgamma,
                              float* dbeta) {
    cu::layer_norm_backward_weight(rows, cols, x, dy, stats, dgamma, dbeta,
                                   k.scratch(cu::layer_norm_backward_weight_scratch(rows, cols)),
                                   k.stream());
  }
};

// LayerNorm's kernels on bf16, as the backend's (one template for both types there).
template <>
struct gpipe::LayerKernels<gpipe::LayerNormOp, EmulatedBf16Kernels> {
  using bf16 = gpipe::bf16;
  static void forward(EmulatedBf16Kernels& k, std::size_t rows, std::size_t cols, double eps,
                      const bf16* x, const float* gamma, const float* beta, bf16* y, bf16* stats) {
    cu::layer_norm_forward(rows, cols, eps, x, gamma, beta, y, stats, k.stream());
  }
  static void backward_input(EmulatedBf16Kernels& k, std::size_t rows, std::size_t cols,
                             const bf16* x, const bf16* dy, const float* gamma, const bf16* stats,
                             bf16* dx) {
    cu::layer_norm_backward_input(rows, cols, x, dy, gamma, stats, dx, k.stream());
  }
  static void backward_weight(EmulatedBf16Kernels& k, std::size_t rows, std::size_t cols,
                              const bf16* x, const bf16* dy, const bf16* stats, float* dgamma,
                              float* dbeta) {
    cu::layer_norm_backward_weight(
        rows, cols, x, dy, stats, dgamma, dbeta,
        k.scratch(cu::layer_norm_backward_weight_scratch<bf16>(rows, cols)), k.stream());
  }
};

namespace {

class EmulatedDevice {
 public:
  template <class T>
  T* put(const std::vector<T>& v, std::size_t offset = 0) {
    buffers_.push_back(
        std::make_unique<gpipe::test::GuardedBuffer>(v.size() * sizeof(T), offset * 4));
    T* p = static_cast<T*>(buffers_.back()->data());
    if (!v.empty()) std::memcpy(p, v.data(), v.size() * sizeof(T));
    return p;
  }
  float* make(std::size_t n, std::size_t offset = 0) {
    return put(std::vector<float>(n, std::nanf("")), offset);
  }
  template <class T>
  std::vector<T> get(const T* p, std::size_t n) {
    return std::vector<T>(p, p + n);
  }
  template <class F>
  void run(F&& f) {
    f(kernels_);
    for (const auto& b : buffers_)
      REQUIRE_MESSAGE(b->tail_intact(), "a kernel wrote past a buffer");
  }

 private:
  EmulatedKernels kernels_;
  std::vector<std::unique_ptr<gpipe::test::GuardedBuffer>> buffers_;
};

}  // namespace

TEST_CASE_TEMPLATE_INVOKE(kernels_elementwise, EmulatedDevice);
TEST_CASE_TEMPLATE_INVOKE(kernels_bias, EmulatedDevice);
TEST_CASE_TEMPLATE_INVOKE(kernels_layer_norm, EmulatedDevice);
TEST_CASE_TEMPLATE_INVOKE(kernels_layer_norm_bf16, EmulatedDevice);
TEST_CASE_TEMPLATE_INVOKE(kernels_residual_layer_norm, EmulatedDevice);
TEST_CASE_TEMPLATE_INVOKE(kernels_loss, EmulatedDevice);
TEST_CASE_TEMPLATE_INVOKE(kernels_loss_bf16, EmulatedDevice);
TEST_CASE_TEMPLATE_INVOKE(kernels_empty_loss, EmulatedDevice);
TEST_CASE_TEMPLATE_INVOKE(kernels_optimizers, EmulatedDevice);

// The resident kernels loop over the rows past their grid (the launchers cap it at 2^20 blocks,
// more rows than any test here has): a grid of 3 blocks must give the launcher's bits.
TEST_CASE("a resident LayerNorm kernel given fewer blocks than rows covers every row") {
  using gpipe::test::conformance::random_floats;
  EmulatedDevice dev;
  constexpr std::size_t rows = 37;
  for (const std::size_t cols : {std::size_t{1024}, std::size_t{4096}}) {  // a warp, a block a row
    CAPTURE(cols);
    const cu::detail::RowLayout layout(cols);
    REQUIRE(layout.threads != 0);
    float* x = dev.put(random_floats(rows * cols, 1, 2, 4));
    float* dy = dev.put(random_floats(rows * cols, 2));
    float* gamma = dev.put(random_floats(cols, 3, 0.5, 1.5));
    float* beta = dev.put(random_floats(cols, 4));
    float *y = dev.make(rows * cols), *stats = dev.make(2 * rows), *dx = dev.make(rows * cols);
    dev.run([&](auto& k) {
      gpipe::test::layer_kernels<gpipe::LayerNormOp>(k).forward(k, rows, cols, 1e-5, x, gamma, beta,
                                                                y, stats);
      gpipe::test::layer_kernels<gpipe::LayerNormOp>(k).backward_input(k, rows, cols, x, dy, gamma,
                                                                       stats, dx);
    });
    float *y3 = dev.make(rows * cols), *stats3 = dev.make(2 * rows), *dx3 = dev.make(rows * cols);
    layout.dispatch([&](auto packs, auto whole_block) {
      constexpr int p = decltype(packs)::value;
      constexpr bool b = decltype(whole_block)::value;
      constexpr auto forward = &cu::layer_norm_forward_resident_kernel<p, b, float>;
      constexpr auto backward = &cu::layer_norm_backward_input_resident_kernel<p, b, float>;
      GPIPE_CUDA_LAUNCH(forward, 3, layout.block(), nullptr)
      (rows, cols, 1e-5f, x, gamma, beta, y3, stats3);
      GPIPE_CUDA_LAUNCH(backward, 3, layout.block(), nullptr)
      (rows, cols, x, dy, gamma, stats3, dx3);
    });
    REQUIRE(cudaGetLastError() == cudaSuccess);
    CHECK(dev.get(y3, rows * cols) == dev.get(y, rows * cols));
    CHECK(dev.get(stats3, 2 * rows) == dev.get(stats, 2 * rows));
    CHECK(dev.get(dx3, rows * cols) == dev.get(dx, rows * cols));
  }
}

// Host logic, for every width rather than the conformance suite's few shapes.
TEST_CASE("a LayerNorm row of up to 16384 floats has a register layout that holds it") {
  for (std::size_t cols = 1; cols <= 20000; ++cols) {
    CAPTURE(cols);
    const cu::detail::RowLayout layout(cols);
    if (cols % 4 != 0 || cols > 16384) {
      CHECK(layout.threads == 0);  // the streaming kernels
      continue;
    }
    const unsigned t = layout.threads;
    REQUIRE(t >= 32);
    CHECK(t <= cu::detail::max_row_threads);
    CHECK((t & (t - 1)) == 0);
    CHECK((layout.packs == 1 || layout.packs == 2 || layout.packs == 4 || layout.packs == 8));
    CHECK(std::size_t{t} * layout.packs * 4 >= cols);       // the row fits
    CHECK((t == 32 || std::size_t{t} / 2 * 8 * 4 < cols));  // no larger group than needed
    CHECK((layout.packs == 1 || std::size_t{t} * layout.packs * 2 < cols));  // nor more packs
    CHECK(layout.whole_block() == (t > 32));
    CHECK(layout.block().x == (t > 32 ? t : 32 * cu::detail::rows_per_block));
    CHECK(layout.block().x <= (layout.whole_block()
                                   ? cu::detail::RowGroup<true>::max_block_threads
                                   : cu::detail::RowGroup<false>::max_block_threads));
  }
}

// The emulator itself: what it must catch, so that a pass above means something.
namespace emulator_checks {

__global__ void sum_lanes_kernel(float* out) {
  __shared__ float buf[32];
  const float v = cu::detail::block_sum(static_cast<float>(threadIdx.x), buf);
  out[threadIdx.x] = v;
}

__global__ void early_exit_shuffle_kernel(float* out) {
  if (threadIdx.x == 5) return;  // lane 5 leaves; the rest of its warp shuffles with it
  out[threadIdx.x] = cu::detail::warp_sum(1.0f);
}

__global__ void divergent_barrier_kernel(float* out) {
  if (threadIdx.x < 32) {
    out[threadIdx.x] = cu::detail::warp_sum(1.0f);
  } else {
    __syncthreads();
  }
}

// Thread 7 of each block throws from inside its coroutine, after a barrier, with a frame of
// floating-point work on its stack.
__global__ void throwing_kernel(float* out) {
  const float before = static_cast<float>(threadIdx.x) * 0.5f;
  __syncthreads();
  if (threadIdx.x == 7) (void)__shfl_xor_sync(0xffffffffu, before, 1, 16);  // width 16: refused
  out[threadIdx.x] = before + 1.0f;
}

// Thread 32 (warp 1) sets a flag that thread 0 (warp 0) reads, with no barrier in between: on a
// GPU thread 0 may see either value.
__global__ void unordered_read_kernel(int* seen) {
  __shared__ int flag;
  if (threadIdx.x == 0) flag = 0;
  __syncthreads();
  if (threadIdx.x == 32) flag = 1;
  if (threadIdx.x == 0) seen[blockIdx.x] = flag;
}

__global__ void grid_index_kernel(std::size_t n, unsigned* out) {
  for (std::size_t i = cu::detail::global_thread(); i < n; i += cu::detail::grid_threads())
    out[i] += 1;
}

}  // namespace emulator_checks

TEST_SUITE("cuda emulator") {
  TEST_CASE("a block sum gives every thread the sum of all threads") {
    std::vector<float> out(1024, -1.0f);
    GPIPE_CUDA_LAUNCH(emulator_checks::sum_lanes_kernel, 1, 1024, nullptr)(out.data());
    CHECK(out == std::vector<float>(1024, 1023.0f * 1024.0f / 2.0f));
  }

  TEST_CASE("a grid-stride loop visits every index once") {
    std::vector<unsigned> out(10007, 0);
    GPIPE_CUDA_LAUNCH(emulator_checks::grid_index_kernel, 3, 64, nullptr)(out.size(), out.data());
    CHECK(out == std::vector<unsigned>(out.size(), 1u));
  }

  TEST_CASE("a shuffle that names an exited lane is an error") {
    std::vector<float> out(64);
    const std::string message = gpipe::test::error_of([&] {
      GPIPE_CUDA_LAUNCH(emulator_checks::early_exit_shuffle_kernel, 1, 64, nullptr)(out.data());
    });
    CHECK(gpipe::test::contains(message, "names lane 5, which has exited"));
  }

  TEST_CASE("an exception inside a CUDA thread ends the launch with it; the next launch runs") {
    std::vector<float> out(64, -1.0f);
    const std::string message = gpipe::test::error_of([&] {
      GPIPE_CUDA_LAUNCH(emulator_checks::throwing_kernel, 2, 64, nullptr)(out.data());
    });
    CHECK(gpipe::test::contains(message, "width != 32"));
    std::vector<float> sums(1024, -1.0f);
    GPIPE_CUDA_LAUNCH(emulator_checks::sum_lanes_kernel, 1, 1024, nullptr)(sums.data());
    CHECK(sums == std::vector<float>(1024, 1023.0f * 1024.0f / 2.0f));
  }

  TEST_CASE("warps run in varying orders between barriers, as on a GPU") {
    std::vector<int> seen(64, -1);
    GPIPE_CUDA_LAUNCH(emulator_checks::unordered_read_kernel, 64, 64, nullptr)(seen.data());
    const auto ones = std::count(seen.begin(), seen.end(), 1);
    CHECK(ones > 0);   // warp 1 went first in some blocks
    CHECK(ones < 64);  // and warp 0 in others
    CHECK(std::count(seen.begin(), seen.end(), 0) == 64 - ones);
  }

  TEST_CASE("a barrier in divergent code is an error") {
    std::vector<float> out(64);
    // Only warp 1 reaches __syncthreads: undefined behaviour on a GPU.
    const std::string message = gpipe::test::error_of([&] {
      GPIPE_CUDA_LAUNCH(emulator_checks::divergent_barrier_kernel, 1, 64, nullptr)(out.data());
    });
    CHECK(gpipe::test::contains(message, "passed different numbers of __syncthreads"));
  }

  TEST_CASE("a kernel that writes past a device allocation fails its stream") {
    gpipe::cuda::Backend backend(1);
    {
      auto buffer = backend.allocate<float>(0, 10);
      backend.submit(0, {"overrun"},
                     [&](gpipe::cuda::Kernels& k) { k.fill(11, 1.0f, buffer.data()); });
    }  // freed in stream order, after the fill
    const std::string message = gpipe::test::error_of([&] { backend.synchronize(); });
    CHECK(gpipe::test::contains(message, "cudaErrorLaunchFailure"));
  }

  TEST_CASE("a kernel given host memory, or memory freed before it runs, fails its stream") {
    gpipe::cuda::Backend backend(1);
    std::vector<float> host(16, 0.0f);
    backend.submit(0, {"host pointer"},
                   [&](gpipe::cuda::Kernels& k) { k.fill(host.size(), 1.0f, host.data()); });
    CHECK(gpipe::test::contains(gpipe::test::error_of([&] { backend.synchronize(); }),
                                "cudaErrorLaunchFailure"));
    CHECK(host[0] == 0.0f);

    gpipe::cuda::Backend fresh(1);
    float* stale = nullptr;
    {
      auto buffer = fresh.allocate<float>(0, 16);
      stale = buffer.data();
    }  // the free is enqueued first: the fill below comes after it in stream order
    fresh.submit(0, {"use after free"}, [&](gpipe::cuda::Kernels& k) { k.fill(16, 1.0f, stale); });
    CHECK(gpipe::test::contains(gpipe::test::error_of([&] { fresh.synchronize(); }),
                                "cudaErrorLaunchFailure"));
  }

  TEST_CASE("a kernel given another GPU's memory fails its stream unless that GPU granted access") {
    cudaMemPool_t pool = nullptr;
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    REQUIRE(cudaMemPoolCreate(&pool, &props) == cudaSuccess);
    void* memory = nullptr;
    REQUIRE(cudaMallocFromPoolAsync(&memory, 64 * sizeof(unsigned), pool, nullptr) == cudaSuccess);
    auto* on_gpu0 = static_cast<unsigned*>(memory);
    REQUIRE(cudaSetDevice(1) == cudaSuccess);
    auto launch_on_gpu1 = [&] {
      cudaStream_t stream = nullptr;
      REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
      GPIPE_CUDA_LAUNCH(emulator_checks::grid_index_kernel, 1, 64, stream)(64, on_gpu0);
      const cudaError_t error = cudaStreamSynchronize(stream);
      (void)cudaStreamDestroy(stream);
      return error;
    };
    CHECK(launch_on_gpu1() == cudaErrorLaunchFailure);
    cudaMemAccessDesc access{};
    access.location.type = cudaMemLocationTypeDevice;
    access.location.id = 1;
    access.flags = cudaMemAccessFlagsProtReadWrite;
    REQUIRE(cudaMemPoolSetAccess(pool, &access, 1) == cudaSuccess);
    CHECK(launch_on_gpu1() == cudaSuccess);
    access.flags = cudaMemAccessFlagsProtNone;
    REQUIRE(cudaMemPoolSetAccess(pool, &access, 1) == cudaSuccess);
    CHECK(launch_on_gpu1() == cudaErrorLaunchFailure);
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    CHECK(cudaFreeAsync(memory, nullptr) == cudaSuccess);
    CHECK(cudaMemPoolDestroy(pool) == cudaSuccess);
  }

  TEST_CASE("streams and events keep to their GPU as CUDA's multi-device rules require") {
    cudaStream_t stream0 = nullptr, stream1 = nullptr;
    cudaEvent_t event0 = nullptr, event1 = nullptr;
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    REQUIRE(cudaStreamCreateWithFlags(&stream0, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaEventCreate(&event0) == cudaSuccess);
    REQUIRE(cudaSetDevice(1) == cudaSuccess);
    REQUIRE(cudaStreamCreateWithFlags(&stream1, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaEventCreate(&event1) == cudaSuccess);

    // GPU 1 current: a kernel into GPU 0's stream fails; an event of GPU 0 may not be recorded
    // on GPU 1's stream (nor on the null stream, GPU 1's), but GPU 1's stream may wait for it.
    std::vector<unsigned> out(1);
    GPIPE_CUDA_LAUNCH(emulator_checks::grid_index_kernel, 1, 1, stream0)(1, out.data());
    CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
    CHECK(cudaEventRecord(event0, stream1) == cudaErrorInvalidResourceHandle);
    CHECK(cudaEventRecord(event0, nullptr) == cudaErrorInvalidResourceHandle);
    (void)cudaGetLastError();
    CHECK(cudaEventRecord(event0, stream0) == cudaSuccess);  // its own GPU's stream
    CHECK(cudaEventRecord(event1, stream1) == cudaSuccess);
    CHECK(cudaStreamWaitEvent(stream1, event0, 0) == cudaSuccess);
    CHECK(cudaStreamSynchronize(stream0) == cudaSuccess);
    CHECK(cudaStreamSynchronize(stream1) == cudaSuccess);
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, event0, event1) == cudaErrorInvalidResourceHandle);
    (void)cudaGetLastError();

    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    CHECK(cudaEventDestroy(event0) == cudaSuccess);
    CHECK(cudaEventDestroy(event1) == cudaSuccess);
    CHECK(cudaStreamDestroy(stream0) == cudaSuccess);
    CHECK(cudaStreamDestroy(stream1) == cudaSuccess);
  }

  TEST_CASE("a stream that failed still completes its events: nothing that waits on it hangs") {
    gpipe::cuda::Backend backend(2);
    std::vector<float> host(16, 0.0f);
    auto x = backend.allocate<float>(0, 1 << 18);
    auto y = backend.allocate<float>(1, 16);
    gpipe::cuda::Event done;
    // A long kernel first, so that the record below is queued behind the failing one.
    backend.submit(0, {"fails"}, [&](gpipe::cuda::Kernels& k) {
      k.fill(1 << 18, 0.0f, x.data());
      k.fill(host.size(), 1.0f, host.data());
    });
    backend.record(0, done);
    backend.wait(1, done);
    backend.submit(1, {"waits"}, [&](gpipe::cuda::Kernels& k) { k.fill(16, 2.0f, y.data()); });
    CHECK(gpipe::test::contains(gpipe::test::error_of([&] { backend.synchronize(); }),
                                "cudaErrorLaunchFailure"));
  }

  TEST_CASE(
      "Linear's forward and weight gradient are one cublasLtMatmul each, in both precisions") {
    using L = gpipe::Linear<3, 4>;
    gpipe::cuda::Backend backend(1);
    const std::size_t rows = 5;
    auto x = backend.allocate<float>(0, rows * 3), y = backend.allocate<float>(0, rows * 4),
         params = backend.allocate<float>(0, L::num_params),
         grads = backend.allocate<float>(0, L::num_params);
    auto x16 = backend.allocate<gpipe::bf16>(0, rows * 3),
         y16 = backend.allocate<gpipe::bf16>(0, rows * 4);
    backend.submit(0, {"inputs"}, [&](gpipe::cuda::Kernels& k) {
      for (auto* buffer : {&x, &y, &params, &grads}) k.fill(buffer->size(), 0.5f, buffer->data());
      k.bf16_context().fill(x16.size(), 0.5f, x16.data());
      k.bf16_context().fill(y16.size(), 0.5f, y16.data());
    });
    const std::size_t before = gpipe::test::cuda_emulation::lt_matmuls();
    backend.submit(0, {"linear"}, [&](gpipe::cuda::Kernels& k) {
      L::forward(k, gpipe::ForwardArgs<float>{rows, x.data(), y.data(), params.data(), nullptr});
      L::backward_weight(
          k, gpipe::BackwardWeightArgs<float>{rows, x.data(), y.data(), params.data(), nullptr,
                                              nullptr, grads.data()});
      gpipe::cuda::Bf16Kernels& k16 = k.bf16_context();
      L::forward(k16, gpipe::ForwardArgs<gpipe::bf16>{rows, x16.data(), y16.data(), params.data(),
                                                      nullptr});
      L::backward_weight(
          k16, gpipe::BackwardWeightArgs<gpipe::bf16>{rows, x16.data(), y16.data(), params.data(),
                                                      nullptr, nullptr, grads.data()});
    });
    backend.synchronize();
    CHECK(gpipe::test::cuda_emulation::lt_matmuls() == before + 4);
  }

  TEST_CASE("cuBLASLt rejects what the emulator does not model, and misaligned operands") {
    cublasLtHandle_t handle = nullptr;
    REQUIRE(cublasLtCreate(&handle) == CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulDesc_t desc = nullptr;
    REQUIRE(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) ==
            CUBLAS_STATUS_SUCCESS);
    const std::int32_t host_pointers = CUBLASLT_POINTER_MODE_HOST;
    CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &host_pointers,
                                         sizeof host_pointers) == CUBLAS_STATUS_NOT_SUPPORTED);
    const std::uint64_t wrong_size = CUBLAS_OP_T;
    CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &wrong_size,
                                         sizeof wrong_size) == CUBLAS_STATUS_INVALID_VALUE);
    cublasLtMatrixLayout_t a = nullptr, b16 = nullptr, d = nullptr;  // (4, 4) each
    REQUIRE(cublasLtMatrixLayoutCreate(&a, CUDA_R_32F, 4, 4, 4) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutCreate(&b16, CUDA_R_16BF, 4, 4, 4) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutCreate(&d, CUDA_R_32F, 4, 4, 4) == CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulPreference_t pref = nullptr;
    REQUIRE(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    auto heuristic = [&](cublasLtMatrixLayout_t b) {
      return cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, d, d, pref, 1, &result, &found);
    };
    CHECK(heuristic(b16) == CUBLAS_STATUS_NOT_SUPPORTED);  // float A with bf16 B
    const std::uint32_t relu = CUBLASLT_EPILOGUE_RELU;
    REQUIRE(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &relu,
                                           sizeof relu) == CUBLAS_STATUS_SUCCESS);
    CHECK(heuristic(a) == CUBLAS_STATUS_NOT_SUPPORTED);  // an epilogue not modelled
    void* memory = nullptr;
    REQUIRE(cudaMalloc(&memory, 1024) == cudaSuccess);
    auto* m = static_cast<float*>(memory);
    // DGELU needs its auxiliary matrix, with a leading dimension of a multiple of 8 rows or more
    const std::uint32_t dgelu = CUBLASLT_EPILOGUE_DGELU;
    REQUIRE(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &dgelu,
                                           sizeof dgelu) == CUBLAS_STATUS_SUCCESS);
    CHECK(heuristic(a) == CUBLAS_STATUS_NOT_SUPPORTED);  // no auxiliary matrix
    const void* aux = m + 128;
    REQUIRE(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                           sizeof aux) == CUBLAS_STATUS_SUCCESS);
    for (const std::int64_t ld : {4, 12}) {
      REQUIRE(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                             sizeof ld) == CUBLAS_STATUS_SUCCESS);
      CHECK(heuristic(a) == CUBLAS_STATUS_NOT_SUPPORTED);  // not a multiple of 8
    }
    const std::int64_t ld8 = 8;
    REQUIRE(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld8,
                                           sizeof ld8) == CUBLAS_STATUS_SUCCESS);
    CHECK(heuristic(a) == CUBLAS_STATUS_SUCCESS);
    const float one = 1, zero = 0;
    auto matmul = [&](float* d_ptr) {
      return cublasLtMatmul(handle, desc, &one, m, a, m, a, &zero, d_ptr, d, d_ptr, d, &result.algo,
                            nullptr, 0, nullptr);
    };
    const void* misaligned_aux = m + 129;
    REQUIRE(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                           &misaligned_aux,
                                           sizeof misaligned_aux) == CUBLAS_STATUS_SUCCESS);
    CHECK(matmul(m + 64) == CUBLAS_STATUS_INVALID_VALUE);  // auxiliary matrix not 16-byte aligned
    const std::uint32_t plain = CUBLASLT_EPILOGUE_DEFAULT;
    REQUIRE(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &plain,
                                           sizeof plain) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(heuristic(a) == CUBLAS_STATUS_SUCCESS);  // 256-byte alignment, no workspace
    REQUIRE(found == 1);
    CHECK(matmul(m + 1) == CUBLAS_STATUS_INVALID_VALUE);  // D not as aligned as promised
    CHECK(matmul(m + 64) == CUBLAS_STATUS_SUCCESS);       // 256 bytes on (the null stream: at once)
    CHECK(cudaFree(memory) == cudaSuccess);
    for (cublasLtMatrixLayout_t l : {a, b16, d}) CHECK(cublasLtMatrixLayoutDestroy(l) == 0);
    CHECK(cublasLtMatmulPreferenceDestroy(pref) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtMatmulDescDestroy(desc) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtDestroy(handle) == CUBLAS_STATUS_SUCCESS);
  }

  TEST_CASE("a launch outside CUDA's limits fails as the runtime's would") {
    std::vector<unsigned> out(1);
    GPIPE_CUDA_LAUNCH(emulator_checks::grid_index_kernel, 1, 2048, nullptr)(1, out.data());
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(out[0] == 0);
  }
}
