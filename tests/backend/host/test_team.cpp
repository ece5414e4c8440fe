// The threads a host device computes on (host::Team): each part of a run runs exactly once, part 0
// on the caller and the others each on a helper of its own, all at once; a run returns only when
// every part has; an exception in any part reaches the caller after the others finished, and the
// team runs on; a run inside a part does not deadlock; bad sizes are clear errors. ThreadSanitizer
// runs this file in CI.

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gpipe/backend/host/kernels/team.hpp"
#include "gpipe/error.hpp"
#include "support/errors.hpp"

using gpipe::host::Team;
using gpipe::test::contains;
using gpipe::test::error_of;

TEST_SUITE("backend host team") {
  TEST_CASE("each part runs once, part 0 on the caller, the others on distinct helpers") {
    for (std::size_t size : {1u, 2u, 3u, 5u}) {
      Team team(size);
      CHECK(team.size() == size);
      for (std::size_t parts = 0; parts <= size; ++parts) {
        INFO("team of ", size, ", ", parts, " parts");
        std::vector<std::thread::id> ran_on(parts);
        std::vector<int> runs(parts, 0);
        team.run(parts, [&](std::size_t i) {
          ++runs[i];
          ran_on[i] = std::this_thread::get_id();
        });
        for (std::size_t i = 0; i < parts; ++i) CHECK(runs[i] == 1);
        if (parts > 0) CHECK(ran_on[0] == std::this_thread::get_id());
        CHECK(std::set<std::thread::id>(ran_on.begin(), ran_on.end()).size() == parts);
      }
    }
  }

  TEST_CASE("the parts of a run run at once: each can wait for all the others") {
    Team team(4);
    std::atomic<std::size_t> arrived{0};
    team.run(4, [&](std::size_t) {
      ++arrived;
      while (arrived.load() < 4) std::this_thread::yield();  // hangs if parts ran one by one
    });
    CHECK(arrived.load() == 4);
  }

  TEST_CASE("a run returns after every part, over many runs in a row") {
    Team team(3);
    std::vector<long> sums(3, 0);
    for (long run = 1; run <= 2000; ++run) {
      const std::size_t parts = 1 + static_cast<std::size_t>(run % 3);
      team.run(parts, [&](std::size_t i) { sums[i] += run; });
    }
    long expected[3] = {0, 0, 0};
    for (long run = 1; run <= 2000; ++run)
      for (std::size_t i = 0; i < 1 + static_cast<std::size_t>(run % 3); ++i) expected[i] += run;
    for (std::size_t i = 0; i < 3; ++i) CHECK(sums[i] == expected[i]);
  }

  TEST_CASE("an exception in a part reaches the caller once all parts are done") {
    Team team(3);
    for (std::size_t thrower : {0u, 1u, 2u}) {
      INFO("part ", thrower, " throws");
      std::atomic<int> finished{0};
      try {
        team.run(3, [&](std::size_t i) {
          if (i == thrower) throw std::runtime_error("part " + std::to_string(i) + " failed");
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
          ++finished;
        });
        FAIL_CHECK("run() did not throw");
      } catch (const std::runtime_error& e) {
        CHECK(std::string(e.what()) == "part " + std::to_string(thrower) + " failed");
      }
      CHECK(finished.load() == 2);  // the other parts ran to their end before run() threw
    }
    // Two parts throw: the lower-numbered part's exception is the one rethrown.
    CHECK_THROWS_WITH_AS(team.run(3,
                                  [](std::size_t i) {
                                    if (i > 0) throw std::runtime_error(std::to_string(i));
                                  }),
                         "1", std::runtime_error);
    int ran = 0;
    team.run(3, [&](std::size_t i) {
      if (i == 0) ran = 1;
    });
    CHECK(ran == 1);  // the team runs on
  }

  TEST_CASE("a run inside a part runs its parts one after the other, without a deadlock") {
    Team team(2);
    std::atomic<int> inner{0};
    std::vector<std::thread::id> inner_on(4);
    team.run(2, [&](std::size_t i) {
      team.run(2, [&](std::size_t j) {
        ++inner;
        inner_on[2 * i + j] = std::this_thread::get_id();
      });
    });
    CHECK(inner.load() == 4);
    CHECK(inner_on[0] == inner_on[1]);  // each part ran both inner parts on its own thread
    CHECK(inner_on[2] == inner_on[3]);
    CHECK(inner_on[0] != inner_on[2]);
  }

  TEST_CASE("bad sizes are clear errors") {
    CHECK(contains(error_of([] { Team team(0); }), "1 to 256 threads, got 0"));
    CHECK(
        contains(error_of([] { Team team(Team::max_threads + 1); }), "1 to 256 threads, got 257"));
    Team team(2);
    CHECK(contains(error_of([&] { team.run(3, [](std::size_t) {}); }),
                   "a team of 2 threads cannot run 3 parts at once"));
  }
}
