#pragma once
// Events of the CUDA backend, and the queues in which each virtual device's work, event records
// and event waits are held until they can be issued in an order that respects every event.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/work_queue.cuh is CUDA code: compile it with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/backend/cuda/error.cuh"
#include "gpipe/backend/cuda/kernels.cuh"
#include "gpipe/backend/failure.hpp"
#include "gpipe/error.hpp"

namespace gpipe::cuda {

namespace detail {

// What all copies of an Event share: the CUDA event, made on the GPU of its first record (and
// made again when a record moves it to another GPU).
struct EventState {
  EventState() = default;
  EventState(const EventState&) = delete;
  EventState& operator=(const EventState&) = delete;
  ~EventState() {
    if (event != nullptr) (void)cudaEventDestroy(event);
  }

  // Records the event on `stream`, a stream of GPU `on_gpu` (which is current).
  void record(int on_gpu, cudaStream_t stream) {
    if (event != nullptr && gpu != on_gpu) {
      GPIPE_CUDA_CHECK(cudaEventDestroy(event));
      event = nullptr;
    }
    if (event == nullptr) {
      GPIPE_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
      gpu = on_gpu;
    }
    GPIPE_CUDA_CHECK(cudaEventRecord(event, stream));
    recorded = true;
  }

  cudaEvent_t event = nullptr;
  int gpu = -1;
  bool recorded = false;  // a record has been issued (waits may be enqueued)
};

}  // namespace detail

/// A marker in a virtual device's compute stream; copyable handle (all copies are the same
/// event). Record it on one device, wait for it on others.
class Event {
 public:
  Event() : state_(std::make_shared<detail::EventState>()) {}

 private:
  friend class Backend;
  std::shared_ptr<detail::EventState> state_;
};

namespace detail {

// Each virtual device's items, in submission order, held until they can be issued: a wait for an
// event that no record has reached yet holds back its device's later items, so that its CUDA wait
// is enqueued after the record. Then items run in an order that respects every event whatever
// order the devices' items were submitted in, as the host backend's threads would run them.
class WorkQueues {
 public:
  using Work = std::function<void(KernelContext<float>&)>;
  struct Item {
    // copy_work: work on the device's copy stream (Backend::submit_copy)
    enum class Kind : std::uint8_t { work, record, wait, copy_work };
    Kind kind;
    WorkLabel label;
    Work work;                          // for work and copy_work
    std::shared_ptr<EventState> event;  // for a record or a wait; copy_work's record, or null
  };

  explicit WorkQueues(std::size_t devices) : queues_(devices) {}

  void push(std::size_t device, Item item) { queues_[device].push_back(std::move(item)); }

  // Runs `run(device, item)` for every item that can run: each device's queue in order, up to a
  // wait whose event has no record yet, over the devices until none can go on. Once `latch` has
  // failed, items are dropped instead. Work that submits more work from inside (a re-entrant
  // call) only queues it; the outer call runs it.
  template <class Run>
  void pump(const gpipe::detail::FailureLatch& latch, Run&& run) {
    if (pumping_) return;
    pumping_ = true;
    for (bool progress = true; progress;) {
      progress = false;
      for (std::size_t d = 0; d < queues_.size(); ++d) {
        std::deque<Item>& q = queues_[d];
        while (!q.empty()) {
          const bool skip = latch.failed();
          if (!skip && q.front().kind == Item::Kind::wait && !q.front().event->recorded) break;
          Item item = std::move(q.front());
          q.pop_front();
          if (!skip) run(d, item);
          progress = true;
        }
      }
    }
    pumping_ = false;
  }

  // After pump(), only waits that no record will reach are left (on the host they would hang):
  // fails `latch` naming the first device's held item (device d named first_device + d), and
  // drops them all.
  void drop_held(gpipe::detail::FailureLatch& latch, std::size_t first_device) {
    for (std::size_t d = 0; d < queues_.size(); ++d) {
      if (queues_[d].empty()) continue;
      latch.fail(std::make_exception_ptr(
                     Error("gpipe: it waits for an event that is never recorded; the device's "
                           "work after the wait was dropped")),
                 describe(queues_[d].front().label, first_device + d));
      queues_[d].clear();
    }
  }

  // No item is queued (after pump(): none is held by a wait).
  bool empty() const {
    for (const auto& q : queues_)
      if (!q.empty()) return false;
    return true;
  }

  // Drops every item, and the buffers their work holds.
  void clear() {
    for (auto& q : queues_) q.clear();
  }

 private:
  std::vector<std::deque<Item>> queues_;
  bool pumping_ = false;
};

}  // namespace detail
}  // namespace gpipe::cuda
