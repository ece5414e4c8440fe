#pragma once
// gpipe::host::Team: the threads one device computes on. A device's worker is the team's first
// thread; a team of n owns n - 1 helper threads, which a kernel hands parts of its work to
// (host::gemm splits a large GEMM's output into column or row blocks, one per thread). The worker
// runs part 0 itself and returns once every part is done, so a kernel still runs in stream order
// and a device still looks like one in-order worker from outside.
//
//   gpipe::host::Team team(2);   // the calling thread and one helper
//   team.run(2, [&](std::size_t part) { ... });   // part 0 here, part 1 on the helper
//
// With K devices of n threads each, K * n threads compute: give a device more than one only where
// cores would otherwise idle (K below the core count); host::BackendOptions::threads_per_device.

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gpipe/error.hpp"

namespace gpipe::host {

/// The threads one device computes on: the thread that calls run() and `size() - 1` helpers the
/// team owns, started at construction and joined by the destructor. Not copyable; run() is called
/// by one thread at a time (the device's worker); a run() from inside a part runs its parts one
/// after the other on that thread, since the team is busy.
class Team {
 public:
  /// The most threads a team may have.
  static constexpr std::size_t max_threads = 256;

  /// A team of `threads` (1 to max_threads, else throws `gpipe::Error`): the caller of run() and
  /// `threads - 1` helper threads, started here.
  explicit Team(std::size_t threads) {
    if (threads == 0 || threads > max_threads)
      throw Error("gpipe: a host device computes on 1 to " + std::to_string(max_threads) +
                  " threads, got " + std::to_string(threads));
    helpers_.reserve(threads - 1);
    try {
      for (std::size_t i = 1; i < threads; ++i) helpers_.emplace_back([this, i] { help(i); });
    } catch (...) {  // a thread that could not start: stop the ones that did
      stop();
      throw;
    }
  }
  Team(const Team&) = delete;
  Team& operator=(const Team&) = delete;
  /// Stops and joins the helpers (run() must not be in progress).
  ~Team() { stop(); }

  /// The number of threads, the caller of run() included.
  std::size_t size() const { return helpers_.size() + 1; }

  /// Calls `part(i)` for i in [0, parts), parts <= size(): part 0 on the calling thread, part i on
  /// helper i, all at once; returns when every call has returned. If calls throw, rethrows the
  /// exception of the lowest-numbered part that threw, after all have finished.
  template <class F>
  void run(std::size_t parts, const F& part) {
    if (parts > size())
      throw Error("gpipe: a team of " + std::to_string(size()) + " threads cannot run " +
                  std::to_string(parts) + " parts at once");
    bool started = false;
    if (parts > 1) {
      std::lock_guard lock(mu_);
      if (!busy_) {  // busy: a part of a run in progress runs a team kernel itself
        busy_ = started = true;
        job_ = {[](const void* f, std::size_t i) { (*static_cast<const F*>(f))(i); }, &part, parts};
        errors_.assign(parts, nullptr);
        remaining_ = parts - 1;
        ++generation_;
      }
    }
    if (!started) {
      for (std::size_t i = 0; i < parts; ++i) part(i);
      return;
    }
    start_cv_.notify_all();
    std::exception_ptr first;
    try {
      part(std::size_t{0});
    } catch (...) {
      first = std::current_exception();
    }
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return remaining_ == 0; });
    for (std::size_t i = 1; i < parts && !first; ++i) first = errors_[i];
    job_ = {};
    busy_ = false;
    lock.unlock();
    if (first) std::rethrow_exception(first);
  }

 private:
  struct Job {
    void (*call)(const void* fn, std::size_t part) = nullptr;
    const void* fn = nullptr;
    std::size_t parts = 0;
  };

  void stop() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    start_cv_.notify_all();
    for (std::thread& t : helpers_) t.join();
  }

  // Helper `index` (1..size()-1): waits for each new job, runs its part if the job has one.
  void help(std::size_t index) {
    std::uint64_t seen = 0;
    for (;;) {
      Job job;
      {
        std::unique_lock lock(mu_);
        start_cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
        job = job_;
      }
      if (index >= job.parts) continue;
      std::exception_ptr error;
      try {
        job.call(job.fn, index);
      } catch (...) {
        error = std::current_exception();
      }
      bool last = false;
      {
        std::lock_guard lock(mu_);
        // moved, not copied: the helper keeps no reference to the exception once the caller can
        // see it, so the caller's side (rethrow, then errors_.assign) frees it, not this thread
        errors_[index] = std::move(error);
        last = --remaining_ == 0;
      }
      if (last) done_cv_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  Job job_;                                 ///< guarded by mu_
  std::vector<std::exception_ptr> errors_;  ///< per part; guarded by mu_
  std::size_t remaining_ = 0;               ///< helper parts not yet finished; guarded by mu_
  std::uint64_t generation_ = 0;            ///< counts jobs; guarded by mu_
  bool busy_ = false;                       ///< a run() is in progress; guarded by mu_
  bool stopping_ = false;                   ///< guarded by mu_
  std::vector<std::thread> helpers_;        ///< last: they start after the members they use
};

/// How a kernel cuts `units` units of work (columns, rows, elements) over a team: `parts` blocks
/// of `block` units, the last one possibly shorter; parts = 1 runs on the calling thread alone.
struct BlockSplit {
  std::size_t parts = 1;  ///< the number of blocks, at most the team's size
  std::size_t block = 0;  ///< units per block (all of them when parts = 1)
};

/// The split of `units` units of `unit_work` work each (multiply-adds, elements) over `threads`
/// threads: as many blocks as threads, fewer where a block would get less than `min_work` work or
/// fewer than `align` units; blocks are whole multiples of `align` units but for the last.
constexpr BlockSplit block_split(std::size_t units, std::size_t unit_work, std::size_t threads,
                                 std::size_t align, std::size_t min_work) {
  BlockSplit split{1, units};
  if (threads <= 1 || units == 0 || unit_work == 0 || align == 0) return split;
  const std::size_t min_units = (min_work + unit_work - 1) / unit_work;  // per block, for min_work
  std::size_t parts = threads;
  if (units / align < parts) parts = units / align;
  if (min_units > 0 && units / min_units < parts) parts = units / min_units;
  if (parts <= 1) return split;
  std::size_t block = (units + parts - 1) / parts;
  block = (block + align - 1) / align * align;
  return {(units + block - 1) / block, block};
}

/// Calls `f(first, count)` for each block of `split` over `units` units: on `team`'s threads, or
/// on the calling thread alone when there is one block (or no team).
template <class F>
void run_blocks(Team* team, std::size_t units, BlockSplit split, const F& f) {
  if (split.parts <= 1 || team == nullptr) {
    if (units > 0) f(std::size_t{0}, units);
    return;
  }
  team->run(split.parts, [&](std::size_t part) {
    const std::size_t first = part * split.block;
    f(first, units - first < split.block ? units - first : split.block);
  });
}

}  // namespace gpipe::host
