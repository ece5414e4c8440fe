#pragma once
// The order of an MPI backend's gradient sums over the replicas, which every rank must start
// alike: a collective cannot be cancelled, so after a failure the sums not yet started are started
// anyway, on whatever their arrays hold.

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gpipe/error.hpp"

namespace gpipe::detail {

/// A step's gradient sums in the order they start: expect() announces them, next() hands out
/// each as it starts, and the step's end starts those left (all_started) and clears them.
class SumOrder {
 public:
  /// The step's arrays, in the order they will start; throws `gpipe::Error` naming `backend`
  /// while the previous step's are not all started.
  void expect(std::vector<std::span<float>> values, const char* backend) {
    require(started_ == values_.size(),
            std::string(backend) + ": a step's gradient sums are still open");
    values_ = std::move(values);
    started_ = 0;
  }
  /// The next array to sum; none once all have started.
  std::optional<std::span<float>> next() {
    if (started_ == values_.size()) return std::nullopt;
    return values_[started_++];
  }
  /// Whether every expected sum has started.
  bool all_started() const { return started_ == values_.size(); }
  /// The step's sums are over.
  void clear() {
    values_.clear();
    started_ = 0;
  }

 private:
  std::vector<std::span<float>> values_;
  std::size_t started_ = 0;
};

}  // namespace gpipe::detail
