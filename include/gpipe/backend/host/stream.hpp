#pragma once
// Streams and events of the host backend, mirroring CUDA's model: a Stream is a worker thread
// that runs its queue of work in order; an Event, recorded by one stream and waited on by
// others, orders work across streams.
//
// Failure: the first piece of work that throws trips the shared StreamGroup's latch
// (backend/failure.hpp). From then on every stream skips its remaining work and every event wait
// returns, so nothing hangs; the owner collects the error with StreamGroup::take_error() after
// synchronizing.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gpipe/backend/common.hpp"
#include "gpipe/backend/failure.hpp"
#include "gpipe/backend/host/kernels.hpp"
#include "gpipe/error.hpp"

namespace gpipe::host {

/// An event's state: recorded yet, and the condition variables of the streams blocked on it.
struct EventState {
  std::atomic<bool> recorded{false};  ///< written under the group's mutex
  /// The condition variables of the streams blocked on the event, which its record wakes;
  /// guarded by the group's mutex.
  std::vector<std::condition_variable*> waiters;
};

/// State shared by the streams of one backend: event states, and the failure latch. A failure
/// wakes every attached stream, so that it releases its blocked wait; a record wakes only the
/// streams that wait for that event.
class StreamGroup {
 public:
  /// The first failure of the group's work; both members empty when there was none.
  using Failure = gpipe::detail::FailureLatch::Failure;

  /// Marks the group failed, keeping `error` and `where` unless a failure is already kept, and
  /// wakes every attached stream. A null `error` (a cancel, a stream's destruction) only makes
  /// the streams skip their remaining work and release their waits.
  void fail(std::exception_ptr error, std::string where) {
    latch_.fail(std::move(error), std::move(where));
    // Notified under mu_ after the latch is tripped: a wait that checked failed() under mu_
    // before is blocked by now, and wakes.
    std::lock_guard lock(mu_);
    for (std::condition_variable* cv : streams_) cv->notify_all();
  }
  /// Lock-free: every stream asks before every piece of work.
  bool failed() const { return latch_.failed(); }
  /// Returns the failure (empty if none) and clears it, so that the group can run again.
  Failure take_error() { return latch_.take(); }

  /// A stream's condition variable for event waits, woken on failure.
  void attach(std::condition_variable* cv) {
    std::lock_guard lock(mu_);
    streams_.push_back(cv);
  }
  /// Undoes attach(), before the stream that owns `cv` goes.
  void detach(std::condition_variable* cv) {
    std::lock_guard lock(mu_);
    std::erase(streams_, cv);
  }

  /// Marks `event` recorded and wakes the streams blocked on it.
  void record(EventState& event) {
    std::lock_guard lock(mu_);
    event.recorded.store(true, std::memory_order_release);
    for (std::condition_variable* cv : event.waiters) cv->notify_one();
  }
  /// Blocks the calling stream until the event is recorded or the group has failed. Polls
  /// (yielding the core) for up to spin_time first, or for the whole wait where set_spin(true):
  /// a hand-over between pipeline stages is usually that close, and waking a blocked thread
  /// costs microseconds more; past the poll it sleeps on `cv`. Throws gpipe::Error naming the
  /// work that should have recorded it (`awaited` on `awaited_device`, when it has a name) once
  /// wait_timeout() has passed without either.
  void wait(EventState& event, std::condition_variable& cv, const WorkLabel& awaited,
            std::size_t awaited_device) {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + timeout_;
    const auto stop_polling = spin_ ? deadline : start + spin_time;
    do {
      if (event.recorded.load(std::memory_order_acquire) || failed()) return;
      std::this_thread::yield();
    } while (std::chrono::steady_clock::now() < stop_polling);
    if (!spin_) {  // sleep out the rest of the wait
      std::unique_lock lock(mu_);
      if (event.recorded || failed()) return;
      event.waiters.push_back(&cv);
      const bool done = cv.wait_until(lock, deadline, [&] { return event.recorded || failed(); });
      std::erase(event.waiters, &cv);
      if (done) return;
    }
    throw Error(
        "gpipe: waited " + std::to_string(timeout_.count()) + " ms for " +
        (awaited.what.empty() ? std::string("an event") : describe(awaited, awaited_device)) +
        " (host::BackendOptions::wait_timeout): is that device stuck in its work?");
  }
  /// How long wait() waits before it throws.
  std::chrono::milliseconds wait_timeout() const { return timeout_; }
  /// Sets wait_timeout(); before any work is submitted.
  void set_wait_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

  /// Whether wait() polls until the event (true) or for spin_time only (false, at construction).
  bool spin() const { return spin_; }
  /// Sets spin(); before any work is submitted.
  void set_spin(bool spin) { spin_ = spin; }

  /// How long wait() polls before it blocks, unless spin().
  static constexpr std::chrono::microseconds spin_time{100};

 private:
  gpipe::detail::FailureLatch latch_;
  std::mutex mu_;  ///< guards the event states and streams_
  std::vector<std::condition_variable*> streams_;
  std::chrono::milliseconds timeout_{std::chrono::minutes(10)};
  bool spin_ = false;
};

/// A marker in a stream; copyable handle. Record it on one stream, wait for it on others.
class Event {
 public:
  Event() : state_(std::make_shared<EventState>()) {}

 private:
  friend class Stream;
  std::shared_ptr<EventState> state_;
};

/// One device's in-order queue of work, run by its own thread.
class Stream {
 public:
  /// A piece of work: called on the stream's thread with the device's kernel context.
  using Work = std::function<void(KernelContext<float>&)>;

  /// The clock of traces and timings.
  using Clock = std::chrono::steady_clock;

  /// Starts the worker thread of `device` (the number the device goes by in traces and failure
  /// messages), attached to `group`; trace and timing microseconds count from `epoch`. The work's
  /// kernels compute on `threads` threads (1 to Team::max_threads, else throws `gpipe::Error`):
  /// the worker and `threads - 1` helpers of the stream's own Team (kernels/team.hpp).
  Stream(std::size_t device, StreamGroup& group, Clock::time_point epoch = Clock::now(),
         std::size_t threads = 1)
      : device_(device),
        group_(group),
        epoch_(epoch),
        team_(threads == 1 ? nullptr : std::make_unique<Team>(threads)),
        kernels_(device, team_.get()) {
    group_.attach(&event_cv_);
    thread_ = std::thread([this] { run(); });
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  /// Drops work not yet started and joins the thread.
  ~Stream() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      queue_.clear();
    }
    work_cv_.notify_all();
    group_.fail(nullptr, {});  // wakes a worker blocked in an event wait
    thread_.join();
    group_.detach(&event_cv_);
  }

  /// Enqueues `work` and returns at once. It is skipped if the group has failed by its turn; if
  /// it throws, the group fails with `describe(label, device())` as where.
  void submit(WorkLabel label, Work work) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back({label, std::move(work)});
      ++pending_;
    }
    work_cv_.notify_one();
  }
  /// Enqueues the recording of `event`, once the work submitted before it has run (an internal
  /// item: neither traced nor timed).
  void record(const Event& event) {
    submit({.what = "record event", .internal = true},
           [this, state = event.state_](KernelContext<float>&) { group_.record(*state); });
  }
  /// Enqueues a wait for `event`: the work submitted after it runs once `event` is recorded, or
  /// once the group has failed; after the group's wait_timeout() the group fails with an Error
  /// naming the awaited work (`awaited` on device `awaited_device`, when it has a name).
  void wait(const Event& event, WorkLabel awaited = {}, std::size_t awaited_device = 0) {
    submit({.what = "wait event", .internal = true},
           [this, state = event.state_, awaited, awaited_device](KernelContext<float>&) {
             group_.wait(*state, event_cv_, awaited, awaited_device);
           });
  }

  /// Blocks until every piece of work submitted so far has run (or been skipped).
  void synchronize() {
    std::unique_lock lock(mu_);
    idle_cv_.wait(lock, [&] { return pending_ == 0; });
  }

  /// The number the device goes by, as given to the constructor.
  std::size_t device() const { return device_; }

  /// Tracing: while on, every piece of work (not event records and waits) that runs is recorded
  /// with its start and end. Costs one clock read at each end of a piece of work when on, one
  /// relaxed load when off.
  void set_tracing(bool on) { tracing_.store(on, std::memory_order_relaxed); }
  /// The records so far, oldest first; call after synchronize().
  std::vector<TraceEvent> take_trace() {
    std::lock_guard lock(mu_);
    return std::exchange(trace_, {});
  }
  /// Compute time since the last call (always measured: two clock reads per compute item).
  ComputeTiming take_timing() {
    std::lock_guard lock(mu_);
    return std::exchange(timing_, {});
  }

 private:
  struct Item {
    WorkLabel label;
    Work work;
  };

  void run() {
    for (;;) {
      Item item;
      {
        std::unique_lock lock(mu_);
        work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (stopping_) return;
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      const bool traced = tracing_.load(std::memory_order_relaxed) && !item.label.internal;
      const bool timed = traced || item.label.compute;
      double start_us = 0, end_us = 0;
      if (!group_.failed()) {
        if (timed) start_us = since_epoch();
        try {
          item.work(kernels_);
        } catch (...) {
          group_.fail(std::current_exception(), describe(item.label, device_));
        }
        if (timed) end_us = since_epoch();
      }
      item.work = nullptr;  // release captured resources before reporting idle
      {
        std::lock_guard lock(mu_);
        if (traced && end_us > 0) trace_.push_back({device_, item.label, start_us, end_us});
        if (item.label.compute && end_us > 0) {
          if (timing_.ops++ == 0) timing_.first_start_us = start_us;
          timing_.busy_us += end_us - start_us;
          timing_.last_end_us = end_us;
        }
        if (--pending_ != 0) continue;
      }
      idle_cv_.notify_all();
    }
  }

  double since_epoch() const {
    return std::chrono::duration<double, std::micro>(Clock::now() - epoch_).count();
  }

  std::size_t device_;
  StreamGroup& group_;
  Clock::time_point epoch_;
  std::atomic<bool> tracing_{false};
  std::vector<TraceEvent> trace_;
  ComputeTiming timing_;
  std::unique_ptr<Team> team_;  ///< null for one thread; outlives kernels_, which points to it
  KernelContext<float> kernels_;
  std::mutex mu_;
  std::condition_variable work_cv_, idle_cv_, event_cv_;
  std::deque<Item> queue_;
  std::size_t pending_ = 0;
  bool stopping_ = false;
  std::thread thread_;  ///< last: starts after the members it uses are constructed
};

}  // namespace gpipe::host
