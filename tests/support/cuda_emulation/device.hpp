#pragma once
// The kernel emulator: the CUDA kernels of gpipe/backend/cuda/kernels/ (GEMMs go to cublas.hpp)
// compile with the host compiler, and each launch runs here, block after block, every CUDA thread
// of a block a coroutine of its own (a stack switch on x86-64, ucontext elsewhere) on the
// emulating OS thread (the caller's, or a stream's). So the kernels' indexing, packing, tails,
// grid-stride loops and reductions are tested against the host kernels on a machine without a
// GPU, which the real CUDA tests then confirm on one.
//
// What it models, and checks:
//   - threadIdx, blockIdx, blockDim, gridDim; __shared__ memory shared by the block's threads.
//   - __syncthreads(): a thread waits until every thread of its block that has not exited has
//     arrived (exited threads count as arrived, as on sm_70 and later). Threads of a block that
//     pass different numbers of barriers (a barrier in divergent code) are an error.
//   - __shfl_xor_sync(mask, v, lane_mask): the lanes named by mask exchange values once all of
//     them have arrived. A lane of the mask that has exited or does not exist, lanes that differ
//     in mask or lane_mask, or a warp split between a shuffle and __syncthreads is an error
//     (undefined behaviour or a hang on a GPU), reported as a gpipe::Error from the launch.
//   - the tensor cores' mma.sync.aligned.m16n8k16 (bf16 in, float out; called by
//     gpipe/backend/cuda/kernels/mma.cuh): a warp-collective operation like a shuffle, over all
//     32 lanes, with the same errors; computed in float from the exact products (in an order of
//     its own: see complete_mma_m16n8k16_bf16); ldmatrix.m8n8.x4 (plain and .trans) likewise, its
//     rows' 16-byte alignment checked.
//   - cp.async (gpipe/backend/cuda/kernels/async_copy.cuh): a thread's group of copies lands at
//     the cp.async.wait_group that covers it, not before (the latest moment a GPU may land it):
//     a kernel that reads a tile before waiting reads stale data. Misaligned copies are errors.
//   - __fmul_rn(a, b), __fadd_rn(a, b): a product or sum rounded once, which the GPU never
//     contracts into an FMA (here, where nothing is contracted, a plain product or sum).
//   - launch configurations outside CUDA's limits fail as cudaErrorInvalidConfiguration, which
//     the next cudaGetLastError() returns (and GPIPE_CUDA_CHECK_LAUNCH turns into an Error).
//   - between barriers, warps run one at a time in a pseudo-random order, each as far as it can
//     alone (its threads in a random order too): a kernel that depends on an order of warps or
//     threads that no barrier gives gets wrong results here, as it may on a GPU.
// What it does not model: timing, memory ordering between threads without a barrier (threads of
// a block run one at a time, each until its next barrier, shuffle or mma), the float rounding of
// the GPU's math functions (the host's libm computes expf, erff, ...), fused multiply-adds.
//
// Use: through tests/support/cuda_emulation.hpp, which adds the runtime around it (streams on
// which launches run in order, events, memory, cuBLAS, NCCL) and must be included before any
// gpipe/backend/cuda header. A launch on the null stream runs at once, on the calling
// thread. Misaligned packed loads are caught by compiling with -fsanitize=alignment
// (tests/CMakeLists.txt does).

#define GPIPE_CUDA_EMULATION 1

#include <cuda_runtime.h>
#include <ucontext.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpipe/error.hpp"

// Device code spelled as the host compiler needs it. __global__ and __device__ are already empty
// in cuda_runtime.h's host view (so a non-template kernel in a header is defined in every
// translation unit that includes it, as nvcc's host stub is: a program of several does not link);
// shared memory is one object per emulating OS thread, which runs one block at a time.
#undef __shared__
#define __shared__ static thread_local
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;

// CUDA's device overloads of max and min for float: fmaxf and fminf (a NaN loses).
inline float max(float a, float b) { return std::fmax(a, b); }
inline float min(float a, float b) { return std::fmin(a, b); }

// Switching between the coroutines of CUDA threads. On x86-64, a switch saves the callee-saved
// registers and the floating-point control words on the current stack and loads another stack
// (no system call, unlike swapcontext, which saves and restores the signal mask each time: the
// emulator switches once or more per CUDA thread). Elsewhere, or with
// GPIPE_CUDA_EMULATION_UCONTEXT defined (e.g. where the kernel enforces shadow stacks, which a
// stack switch by `ret` violates), ucontext.
#if defined(__x86_64__) && !defined(GPIPE_CUDA_EMULATION_UCONTEXT)
#define GPIPE_CUDA_EMULATION_SWITCH 1
// gpipe_cuda_emulation_switch(save, load): *save = this context's stack pointer; continues the
// context whose stack pointer is load.
extern "C" void gpipe_cuda_emulation_switch(void** save, void* load);
#ifndef GPIPE_CUDA_EMULATION_LINKED  // else defined in the emulation library
asm(R"(
  .text
  .p2align 4
  .globl gpipe_cuda_emulation_switch
  .type gpipe_cuda_emulation_switch, @function
gpipe_cuda_emulation_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $16, %rsp
  fnstcw (%rsp)
  stmxcsr 8(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  fldcw (%rsp)
  ldmxcsr 8(%rsp)
  addq $16, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size gpipe_cuda_emulation_switch, .-gpipe_cuda_emulation_switch
)");
#endif  // GPIPE_CUDA_EMULATION_LINKED
#else
#define GPIPE_CUDA_EMULATION_SWITCH 0
#endif

namespace gpipe::test::cuda_emulation {

enum class State { ready, at_barrier, at_collective, exited };

struct Thread;
// A warp-collective operation in flight (__shfl_xor_sync, the tensor cores' mma): its name, the
// function that completes it once the lanes of `mask` wait in it, what its lanes must agree on,
// and where this lane's operands and results are (on the lane's own stack, which stays while
// the lane waits). `complete(warp, op, where)` gets the warp's first thread, the operation of
// one of its lanes and a description of the warp for its errors.
struct Collective {
  const char* name = nullptr;
  void (*complete)(Thread* warp, const Collective& op, const std::string& where) = nullptr;
  unsigned mask = 0;
  int parameter = 0;
  const void* operands = nullptr;
  void* results = nullptr;
};

// An asynchronous copy to shared memory in flight (cp.async): bytes from src, or zeros.
struct AsyncCopy {
  void* dst;
  const void* src;
  std::size_t bytes;
  bool fill;
};

struct Thread {
#if GPIPE_CUDA_EMULATION_SWITCH
  void* stack_pointer = nullptr;  // where gpipe_cuda_emulation_switch left it
#else
  ucontext_t context{};
#endif
  uint3 index{};
  State state = State::ready;
  Collective collective;     // while state is at_collective
  std::size_t barriers = 0;  // __syncthreads passed
  // cp.async: copies issued since the last commit, and the committed groups in flight, oldest
  // first; a group lands (is copied) at the wait that covers it
  std::vector<AsyncCopy> open_copies;
  std::deque<std::vector<AsyncCopy>> copy_groups;
};

// The emulator of one OS thread: runs a launch's blocks one after another.
class Emulator {
 public:
  static constexpr std::size_t stack_bytes = 64 * 1024;
  static constexpr unsigned warp_size = 32;

  static Emulator& instance() {
    static thread_local Emulator emulator;
    return emulator;
  }

  // Runs body (the kernel applied to its arguments) as every thread of every block of the grid.
  void run(dim3 grid, dim3 block, const std::function<void()>& body) {
    if (body_ != nullptr) throw Error("cuda emulator: a kernel launched another kernel");
    body_ = &body;
    struct Reset {
      Emulator* e;
      ~Reset() { e->body_ = nullptr; }
    } reset{this};
    gridDim = grid;
    blockDim = block;
    const std::size_t threads = static_cast<std::size_t>(block.x) * block.y * block.z;
    if (stack_threads_ < threads) {  // not initialized: only the pages a thread touches are used
      stacks_ = std::make_unique_for_overwrite<unsigned char[]>(threads * stack_bytes);
      stack_threads_ = threads;
    }
    threads_.assign(threads, Thread{});
    for (unsigned z = 0; z < grid.z; ++z)
      for (unsigned y = 0; y < grid.y; ++y)
        for (unsigned x = 0; x < grid.x; ++x) {
          blockIdx = uint3{x, y, z};
          run_block();
        }
  }

  // __syncthreads and the warp-collective operations: suspend the current thread until the
  // block's scheduler lets it go on.
  void barrier() { suspend(State::at_barrier); }

  // cp.async, cp.async.commit_group and cp.async.wait_group for the current thread (see Thread).
  void async_copy(const AsyncCopy& copy) { threads_[current_].open_copies.push_back(copy); }
  void async_commit() {
    Thread& self = threads_[current_];
    self.copy_groups.push_back(std::exchange(self.open_copies, {}));
  }
  void async_wait(std::size_t in_flight) {
    Thread& self = threads_[current_];
    for (; self.copy_groups.size() > in_flight; self.copy_groups.pop_front())
      for (const AsyncCopy& c : self.copy_groups.front()) {
        if (c.fill)
          std::memcpy(c.dst, c.src, c.bytes);
        else
          std::memset(c.dst, 0, c.bytes);
      }
  }

  // Waits in `op` until the lanes of its mask have arrived and one of them has completed it.
  void collective(const Collective& op) {
    threads_[current_].collective = op;
    suspend(State::at_collective);
  }

 private:
  void run_block() {
    const std::size_t n = threads_.size();
    for (std::size_t t = 0; t < n; ++t) prepare(t);
    // One warp at a time, picked at random among those that can go on, runs as far as it can
    // alone (to a barrier, or to its end); when no warp can go on, the block's barrier completes.
    // Nothing orders warps between barriers on a GPU either: a kernel that reads what another
    // warp writes without a barrier in between gets wrong results here.
    for (;;) {
      rethrow_kernel_error();
      if (step_a_warp()) continue;
      if (!release_barrier()) break;  // every thread has exited
    }
    rethrow_kernel_error();
    for (const Thread& th : threads_)
      if (th.barriers != threads_[0].barriers)
        throw Error("cuda emulator: threads of block (" + std::to_string(blockIdx.x) + ", " +
                    std::to_string(blockIdx.y) + ", " + std::to_string(blockIdx.z) +
                    ") passed different numbers of __syncthreads (" +
                    std::to_string(threads_[0].barriers) + " and " + std::to_string(th.barriers) +
                    "): a barrier in divergent code");
  }

  // One warp, picked at random among those with ready threads or threads in a shuffle, goes as
  // far as it can alone: its ready threads run in a random order (Fisher-Yates), each until it
  // exits or waits, its shuffles complete, and so on, until its threads have exited or wait at
  // a barrier. False when no warp can go on.
  bool step_a_warp() {
    const std::size_t n = threads_.size();
    candidates_.clear();
    for (std::size_t first = 0; first < n; first += warp_size)
      if (can_go_on(first)) candidates_.push_back(first);
    if (candidates_.empty()) return false;
    const std::size_t first = candidates_[next_random() % candidates_.size()];
    const std::size_t end = std::min(first + warp_size, n);
    while (can_go_on(first)) {
      order_.clear();
      for (std::size_t t = first; t < end; ++t)
        if (threads_[t].state == State::ready) order_.push_back(t);
      if (order_.empty()) {  // a warp's threads run together: all of them wait or have exited
        release_collective(first);
        continue;
      }
      for (std::size_t i = order_.size(); i > 1; --i)
        std::swap(order_[i - 1], order_[next_random() % i]);
      for (const std::size_t t : order_) resume(t);
      rethrow_kernel_error();
    }
    return true;
  }
  // Whether the warp whose first thread is `first` has a thread that is ready or in a shuffle.
  bool can_go_on(std::size_t first) const {
    for (std::size_t t = first; t < std::min(first + warp_size, threads_.size()); ++t)
      if (threads_[t].state == State::ready || threads_[t].state == State::at_collective)
        return true;
    return false;
  }
  // xorshift64, seeded per emulating thread: a run repeats itself.
  std::uint64_t next_random() {
    random_ ^= random_ << 13;
    random_ ^= random_ >> 7;
    random_ ^= random_ << 17;
    return random_;
  }

  void prepare(std::size_t t) {
    Thread& th = threads_[t];
    th = Thread{};
    const std::size_t plane = static_cast<std::size_t>(blockDim.x) * blockDim.y;
    th.index =
        uint3{static_cast<unsigned>(t % blockDim.x),
              static_cast<unsigned>(t / blockDim.x % blockDim.y), static_cast<unsigned>(t / plane)};
    unsigned char* stack = stacks_.get() + t * stack_bytes;
#if GPIPE_CUDA_EMULATION_SWITCH
    // The frame that the switch pops first: control words (x87: all exceptions masked, double
    // extended precision; SSE: all masked, round to nearest), six zeroed registers, then entry()
    // as the return address, entered with the stack aligned as after a call.
    auto* top = reinterpret_cast<std::uint64_t*>(stack + stack_bytes);  // 16-byte aligned
    std::uint64_t* sp = top - 10;
    sp[0] = 0x037f;  // fnstcw slot
    sp[1] = 0x1f80;  // stmxcsr slot
    for (int r = 2; r < 8; ++r) sp[r] = 0;
    sp[8] = reinterpret_cast<std::uint64_t>(&Emulator::entry);
    sp[9] = 0;  // entry's return address: it never returns
    th.stack_pointer = sp;
#else
    if (getcontext(&th.context) != 0) throw Error("cuda emulator: getcontext failed");
    th.context.uc_stack.ss_sp = stack;
    th.context.uc_stack.ss_size = stack_bytes;
    th.context.uc_link = &scheduler_;
    makecontext(&th.context, &Emulator::entry, 0);
#endif
  }

  // Completes the collective operation of the warp whose first thread is `first` (none of its
  // threads is ready); throws where it can never complete.
  void release_collective(std::size_t first) {
    const std::size_t lanes = std::min<std::size_t>(warp_size, threads_.size() - first);
    Thread* warp = &threads_[first];
    const Collective* leader = nullptr;
    for (std::size_t l = 0; l < lanes && leader == nullptr; ++l)
      if (warp[l].state == State::at_collective) leader = &warp[l].collective;
    const std::string op = leader->name;
    const std::string where = "warp " + std::to_string(first / warp_size) + " of block (" +
                              std::to_string(blockIdx.x) + ", " + std::to_string(blockIdx.y) +
                              ", " + std::to_string(blockIdx.z) + ")";
    for (std::size_t l = 0; l < warp_size; ++l) {
      if (!((leader->mask >> l) & 1u)) continue;
      const std::string lane = " names lane " + std::to_string(l);
      if (l >= lanes)
        throw Error("cuda emulator: " + op + " in " + where + lane +
                    ", which the block does not have");
      if (warp[l].state == State::exited)
        throw Error("cuda emulator: " + op + " in " + where + lane + ", which has exited");
      if (warp[l].state == State::at_barrier)
        throw Error("cuda emulator: " + where + " is split between " + op + " and __syncthreads");
      const Collective& c = warp[l].collective;
      if (c.complete != leader->complete || c.mask != leader->mask ||
          c.parameter != leader->parameter)
        throw Error("cuda emulator: lanes of " + where + " wait in " + op + " and " + c.name +
                    ", or with different masks or lane masks");
    }
    for (std::size_t l = 0; l < lanes; ++l)
      if (warp[l].state == State::at_collective && !((leader->mask >> l) & 1u))
        throw Error("cuda emulator: lane " + std::to_string(l) + " of " + where + " calls " + op +
                    " with a mask that leaves it out");
    leader->complete(warp, *leader, where);
    for (std::size_t l = 0; l < lanes; ++l)
      if (warp[l].state == State::at_collective) warp[l].state = State::ready;
  }

  // Ends __syncthreads once every thread that has not exited waits there.
  bool release_barrier() {
    bool any = false;
    for (Thread& th : threads_) {
      if (th.state == State::at_collective) return false;  // cannot be: all were released
      any = any || th.state == State::at_barrier;
    }
    for (Thread& th : threads_)
      if (th.state == State::at_barrier) {
        th.state = State::ready;
        ++th.barriers;
      }
    return any;
  }

  void resume(std::size_t t) {
    current_ = t;
    threadIdx = threads_[t].index;
#if GPIPE_CUDA_EMULATION_SWITCH
    gpipe_cuda_emulation_switch(&scheduler_, threads_[t].stack_pointer);
#else
    if (swapcontext(&scheduler_, &threads_[t].context) != 0)
      throw Error("cuda emulator: swapcontext failed");
#endif
  }

  void suspend(State state) {
    Thread& self = threads_[current_];
    self.state = state;
#if GPIPE_CUDA_EMULATION_SWITCH
    gpipe_cuda_emulation_switch(&self.stack_pointer, scheduler_);
#else
    swapcontext(&self.context, &scheduler_);
#endif
  }

  // A CUDA thread's coroutine: the kernel, then back to the scheduler for good. Every exception
  // stops here, so no unwinding goes past this frame.
  static void entry() {
    Emulator& e = instance();
    try {
      (*e.body_)();
    } catch (...) {
      if (!e.error_) e.error_ = std::current_exception();
    }
    e.threads_[e.current_].state = State::exited;
#if GPIPE_CUDA_EMULATION_SWITCH
    void* finished = nullptr;  // never resumed
    gpipe_cuda_emulation_switch(&finished, e.scheduler_);
    __builtin_unreachable();
#endif
    // Returning continues at uc_link: the scheduler.
  }

  void rethrow_kernel_error() {
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

  const std::function<void()>* body_ = nullptr;
  std::vector<Thread> threads_;
  std::unique_ptr<unsigned char[]> stacks_;
  std::size_t stack_threads_ = 0;
#if GPIPE_CUDA_EMULATION_SWITCH
  void* scheduler_ = nullptr;  // the scheduler's stack pointer while a CUDA thread runs
#else
  ucontext_t scheduler_{};
#endif
  std::size_t current_ = 0;
  std::vector<std::size_t> order_;       // threads of the warp that runs next
  std::vector<std::size_t> candidates_;  // first threads of the warps that may go next
  std::uint64_t random_ = 0x9e3779b97f4a7c15ull;
  std::exception_ptr error_;
};

// Runs `launch` (every block of one kernel launch) in the order of `stream`; the GPU whose memory
// holds p (-1: none); whether kernels on `gpu` may access `owner`'s memory (the same GPU, or
// granted by cudaMemPoolSetAccess); the GPU that runs work on `stream` (the null stream: the
// current one). Defined by runtime.hpp.
inline void enqueue_launch(cudaStream_t stream, std::function<void()> launch);
inline int gpu_of_memory(const void* p);
inline bool may_access(int gpu, int owner);
inline int gpu_of_stream(cudaStream_t stream);
// Kernel argument `index` of a launch on `gpu`, a pointer, when the kernel runs: an Error unless it
// is null or device memory that `gpu` may access (host memory, memory whose stream-ordered free
// came first, or another GPU's memory without access granted would fault on a GPU). Defined by
// runtime.hpp, once per program, so that each kernel's launch holds only the call.
void require_kernel_argument(const void* p, std::size_t index, int gpu);

// What the emulator has been asked to do so far: kernel launches, in all and per kernel (an
// instantiation, e.g. convert_kernel<4, float, bf16>), and cuBLAS and cuBLASLt GEMM calls, each
// accepted (a valid configuration). Tests count what an operation launches, and compare the
// totals with the backend's launch records.
class Counts {
 public:
  using Kernel = void (*)();  // any kernel, as one function pointer type

  void add_kernel(Kernel kernel) {
    const std::lock_guard lock(mutex_);
    ++per_kernel_[kernel];
    ++kernels_;
  }
  void add_gemm() {
    const std::lock_guard lock(mutex_);
    ++gemms_;
  }
  std::size_t kernels() const {
    const std::lock_guard lock(mutex_);
    return kernels_;
  }
  std::size_t gemms() const {
    const std::lock_guard lock(mutex_);
    return gemms_;
  }
  std::size_t of(Kernel kernel) const {
    const std::lock_guard lock(mutex_);
    const auto it = per_kernel_.find(kernel);
    return it == per_kernel_.end() ? 0 : it->second;
  }

 private:
  mutable std::mutex mutex_;
  std::map<Kernel, std::size_t> per_kernel_;
  std::size_t kernels_ = 0, gemms_ = 0;
};
inline Counts& counts() {
  static Counts c;
  return c;
}

// A dry run (GPIPE_CUDA_EMULATION_DRY_RUN=1 in the environment when the program starts): kernels,
// GEMMs, memsets and device-to-device copies are checked and counted but not run, device memory
// is neither filled nor checked for overruns, and the GPUs are H200-sized. For the launch records
// of full-size models (gpipe/backend/cuda/launch_log.cuh), whose kernels would take hours here;
// every result is garbage.
inline bool dry_run() {
  static const bool dry = [] {
    const char* v = std::getenv("GPIPE_CUDA_EMULATION_DRY_RUN");
    return v != nullptr && std::string(v) == "1";
  }();
  return dry;
}

// The error the next cudaGetLastError() returns.
inline cudaError_t& last_error() {
  static thread_local cudaError_t error = cudaSuccess;
  return error;
}

inline bool valid_configuration(dim3 grid, dim3 block) {
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  return grid.x >= 1 && grid.y >= 1 && grid.z >= 1 && grid.x <= 0x7fffffffu && grid.y <= 65535 &&
         grid.z <= 65535 && block.x >= 1 && block.y >= 1 && block.z >= 1 && block.x <= 1024 &&
         block.y <= 1024 && block.z <= 64 && threads <= 1024;
}

// Launches of `kernel` (an instantiation, e.g. convert_kernel<4, float, bf16>) issued so far.
template <class... Params>
std::size_t launches_of(void (*kernel)(Params...)) {
  return counts().of(reinterpret_cast<Counts::Kernel>(kernel));
}

// launch(kernel, grid, block, stream)(args...): the emulated kernel<<<grid, block, 0,
// stream>>>(args...). The arguments are converted to the kernel's parameter types and copied, as
// a launch does.
template <class... Params>
class Launch {
 public:
  Launch(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream)
      : kernel_(kernel), grid_(grid), block_(block), stream_(stream) {}

  template <class... Args>
  void operator()(Args&&... args) const {
    static_assert(sizeof...(Args) == sizeof...(Params), "wrong number of kernel arguments");
    if (!valid_configuration(grid_, block_)) {
      last_error() = cudaErrorInvalidConfiguration;
      return;
    }
    counts().add_kernel(reinterpret_cast<Counts::Kernel>(kernel_));
    if (dry_run()) return;
    enqueue_launch(stream_,
                   [kernel = kernel_, grid = grid_, block = block_, on_stream = stream_ != nullptr,
                    gpu = gpu_of_stream(stream_),
                    params = std::tuple<std::decay_t<Params>...>(std::forward<Args>(args)...)] {
                     if (on_stream) require_device_pointers(params, gpu);
                     Emulator::instance().run(grid, block, [&] { std::apply(kernel, params); });
                   });
  }

 private:
  // What would fault on a GPU: a pointer argument that is not device memory when the kernel
  // runs, or another GPU's memory that this GPU may not access (require_kernel_argument).
  static void require_device_pointers(const std::tuple<std::decay_t<Params>...>& params, int gpu) {
    std::apply(
        [gpu](const auto&... p) {
          std::size_t index = 0;
          (
              [&] {
                if constexpr (std::is_pointer_v<std::decay_t<decltype(p)>>)
                  require_kernel_argument(p, index, gpu);
                ++index;
              }(),
              ...);
        },
        params);
  }

  void (*kernel_)(Params...);
  dim3 grid_, block_;
  cudaStream_t stream_;
};

template <class... Params>
Launch<Params...> launch(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream) {
  return Launch<Params...>(kernel, grid, block, stream);
}

// __shfl_xor_sync's completion: each lane of the mask gets the value of lane ^ lane_mask, which
// must be in the mask too (else undefined on a GPU).
template <class T>
void complete_shuffle_xor(Thread* warp, const Collective& op, const std::string& where) {
  static_assert(std::is_trivially_copyable_v<T>);
  for (unsigned l = 0; l < Emulator::warp_size; ++l) {
    if (!((op.mask >> l) & 1u)) continue;
    const unsigned source = l ^ static_cast<unsigned>(op.parameter);
    if (source >= Emulator::warp_size || !((op.mask >> source) & 1u))
      throw Error("cuda emulator: lane " + std::to_string(l) + " of " + where + " reads lane " +
                  std::to_string(source) + ", which is not in the mask");
    std::memcpy(warp[l].collective.results, warp[source].collective.operands, sizeof(T));
  }
}

// A lane's fragments of an mma (layouts in gpipe/backend/cuda/kernels/mma.cuh).
struct MmaOperands {
  const std::uint32_t* a;  // 4 registers of two bf16 each
  const std::uint32_t* b;  // 2
  const float* c;          // 4
};

// mma.m16n8k16's completion: the 16 x 16 A, 16 x 8 B and C gathered from the 32 lanes' fragments,
// D = A B + C scattered back. Each product of two bf16 is exact in float (8-bit significands);
// they are added to C in k order, each sum rounded to float (to nearest even). The tensor cores
// add them in another order, with other rounding (products aligned to the largest exponent and
// truncated), so results agree to float's precision of a 16-term sum, not bit for bit; the
// sums of small integers, exact in either, agree exactly.
inline void complete_mma_m16n8k16_bf16(Thread* warp, const Collective&, const std::string&) {
  float a[16][16], b[16][8], c[16][8];
  const auto lo = [](std::uint32_t r) { return std::bit_cast<float>(r << 16); };
  const auto hi = [](std::uint32_t r) { return std::bit_cast<float>(r & 0xffff0000u); };
  for (unsigned lane = 0; lane < Emulator::warp_size; ++lane) {
    const auto& f = *static_cast<const MmaOperands*>(warp[lane].collective.operands);
    const unsigned g = lane / 4, q = 2 * (lane % 4);
    for (unsigned i = 0; i < 4; ++i) {  // a[i]: rows g (+8 if i odd), columns q, q+1 (+8 if i >= 2)
      const unsigned row = g + 8 * (i % 2), col = q + 8 * (i / 2);
      a[row][col] = lo(f.a[i]);
      a[row][col + 1] = hi(f.a[i]);
    }
    for (unsigned i = 0; i < 2; ++i) {  // b[i]: rows q, q+1 (+8 if i = 1), column g
      b[q + 8 * i][g] = lo(f.b[i]);
      b[q + 8 * i + 1][g] = hi(f.b[i]);
    }
    for (unsigned i = 0; i < 4; ++i) c[g + 8 * (i / 2)][q + i % 2] = f.c[i];
  }
  for (unsigned lane = 0; lane < Emulator::warp_size; ++lane) {
    auto* d = static_cast<float*>(warp[lane].collective.results);
    const unsigned g = lane / 4, q = 2 * (lane % 4);
    for (unsigned i = 0; i < 4; ++i) {
      const unsigned row = g + 8 * (i / 2), col = q + i % 2;
      float sum = c[row][col];
      for (unsigned k = 0; k < 16; ++k) sum += a[row][k] * b[k][col];
      d[i] = sum;
    }
  }
}

// ldmatrix.m8n8.x4's completion: lane 8 i + j addresses row j of matrix i (8 bf16, 16-byte
// aligned, else an error as the GPU's fault); each lane 4 g + q gets in register i elements 2q,
// 2q+1 of row g of matrix i, or (parameter 1, .trans) rows 2q, 2q+1 of column g.
inline void complete_ldmatrix_x4(Thread* warp, const Collective& op, const std::string& where) {
  std::uint16_t m[4][8][8];
  for (unsigned lane = 0; lane < Emulator::warp_size; ++lane) {
    const void* row = warp[lane].collective.operands;
    if (reinterpret_cast<std::uintptr_t>(row) % 16 != 0)
      throw Error("cuda emulator: ldmatrix in " + where + ": lane " + std::to_string(lane) +
                  " addresses a row that is not 16-byte aligned");
    std::memcpy(m[lane / 8][lane % 8], row, 16);
  }
  for (unsigned lane = 0; lane < Emulator::warp_size; ++lane) {
    auto* r = static_cast<std::uint32_t*>(warp[lane].collective.results);
    const unsigned g = lane / 4, q = 2 * (lane % 4);
    for (unsigned i = 0; i < 4; ++i) {
      const std::uint16_t lo = op.parameter ? m[i][q][g] : m[i][g][q];
      const std::uint16_t hi = op.parameter ? m[i][q + 1][g] : m[i][g][q + 1];
      r[i] = static_cast<std::uint32_t>(lo) | (static_cast<std::uint32_t>(hi) << 16);
    }
  }
}

}  // namespace gpipe::test::cuda_emulation

#define GPIPE_CUDA_LAUNCH(kernel, grid, block, stream) \
  ::gpipe::test::cuda_emulation::launch(kernel, dim3(grid), dim3(block), stream)

inline void __syncthreads() { ::gpipe::test::cuda_emulation::Emulator::instance().barrier(); }

inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }

template <class T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  namespace emulation = ::gpipe::test::cuda_emulation;
  if (width != 32) throw gpipe::Error("cuda emulator: __shfl_xor_sync with width != 32");
  T result;
  emulation::Emulator::instance().collective(
      {"__shfl_xor_sync", &emulation::complete_shuffle_xor<T>, mask, lane_mask, &value, &result});
  return result;
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (gpipe/backend/cuda/kernels/mma.cuh calls
// it for the PTX instruction): d = a b + c over the warp's fragments, once all 32 lanes arrived.
inline void gpipe_cuda_emulation_mma_m16n8k16_bf16(float (&d)[4], const std::uint32_t (&a)[4],
                                                   const std::uint32_t (&b)[2],
                                                   const float (&c)[4]) {
  namespace emulation = ::gpipe::test::cuda_emulation;
  const emulation::MmaOperands operands{a, b, c};
  emulation::Emulator::instance().collective({"mma.sync.aligned.m16n8k16",
                                              &emulation::complete_mma_m16n8k16_bf16, 0xffffffffu,
                                              0, &operands, d});
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (mma.cuh calls it for the PTX instruction):
// r from the rows that the warp's 32 lanes address, once all of them arrived.
inline void gpipe_cuda_emulation_ldmatrix_x4(std::uint32_t (&r)[4], const void* row,
                                             bool transposed) {
  namespace emulation = ::gpipe::test::cuda_emulation;
  emulation::Emulator::instance().collective({"ldmatrix.sync.aligned.m8n8.x4",
                                              &emulation::complete_ldmatrix_x4, 0xffffffffu,
                                              transposed ? 1 : 0, row, r});
}

// cp.async.cg.shared.global (async_copy.cuh calls it for the PTX instruction), commit_group and
// wait_group: the copies of a group land when a wait covers it, the latest moment a GPU may.
inline void gpipe_cuda_emulation_cp_async(void* dst, const void* src, std::size_t bytes,
                                          bool fill) {
  if (reinterpret_cast<std::uintptr_t>(dst) % bytes != 0 ||
      (fill && reinterpret_cast<std::uintptr_t>(src) % bytes != 0))
    throw gpipe::Error("cuda emulator: cp.async of " + std::to_string(bytes) +
                       " bytes between addresses not aligned to them");
  ::gpipe::test::cuda_emulation::Emulator::instance().async_copy({dst, src, bytes, fill});
}
inline void gpipe_cuda_emulation_cp_async_commit() {
  ::gpipe::test::cuda_emulation::Emulator::instance().async_commit();
}
inline void gpipe_cuda_emulation_cp_async_wait(int in_flight) {
  ::gpipe::test::cuda_emulation::Emulator::instance().async_wait(
      static_cast<std::size_t>(in_flight));
}
