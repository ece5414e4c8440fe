#pragma once
// Faults injected into a training run for scripts/soak, from the environment variable
// GPIPE_TRAIN_GPT_INJECT: a comma-separated list of KIND@STEP (STEP as the progress lines count
// them, 1 to --steps), e.g. "nan@120,throw@300". Kinds:
//   nan    after the step's forward_backward every gradient that is not 0 becomes NaN (scaled past
//          float's range, then by 0), as a bad micro-batch would leave them: the Trainer's
//          skip_non_finite skips the update
//   throw  a piece of work on stage 1's device throws before the step's own work there, as a
//          layer that throws would: the step fails with a gpipe::Error and is run again. Once
//          per run directory (a file fault-thrown-STEP in --out marks it). In one process only:
//          under MPI, work that throws between steps is not agreed on by the other ranks' next
//          step (they wait for the thrower until peer_timeout), so example_train_gpt_mpi refuses it
//   skip   the update is skipped (Trainer::skip_step) without a fault: a clean run that skips
//          the steps another run's nan faults skip, to compare that run's weights with
// Testing only: no such variable, no fault.

#include <cstddef>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

#include "gpipe/error.hpp"

namespace train_gpt {

struct Faults {
  std::set<std::size_t> nan, thrown, skip;

  // The faults that `spec` (the variable's value; null: none) lists; throw faults are an Error
  // under `mpi`.
  static Faults parse(const char* spec, bool mpi) {
    Faults f;
    if (spec == nullptr) return f;
    std::string_view rest = spec;
    while (!rest.empty()) {
      const std::size_t comma = rest.find(',');
      const std::string_view item = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
      const std::size_t at = item.find('@');
      const std::string_view kind = item.substr(0, at);
      const std::string step(at == std::string_view::npos ? "" : item.substr(at + 1));
      char* end = nullptr;
      const unsigned long long n = std::strtoull(step.c_str(), &end, 10);
      if (step.empty() || *end != '\0' || (kind != "nan" && kind != "throw" && kind != "skip"))
        throw gpipe::Error("train_gpt: GPIPE_TRAIN_GPT_INJECT has \"" + std::string(item) +
                           "\", expected nan@STEP, throw@STEP or skip@STEP");
      if (kind == "throw" && mpi)
        throw gpipe::Error(
            "train_gpt: GPIPE_TRAIN_GPT_INJECT's throw@STEP works in one process "
            "only (example_train_gpt), not under MPI");
      (kind == "nan" ? f.nan : kind == "throw" ? f.thrown : f.skip).insert(n);
    }
    return f;
  }
  static Faults from_environment(bool mpi) {
    return parse(std::getenv("GPIPE_TRAIN_GPT_INJECT"), mpi);
  }
};

}  // namespace train_gpt
