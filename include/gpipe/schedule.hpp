#pragma once
// The schedule layer: schedules as data (op.hpp), the GPipe fill-drain generator and its tag
// type, the validator that proves a schedule runnable, and the simulator that times it. All of
// it is constexpr and independent of backends and models.

#include "gpipe/schedule/gpipe.hpp"
#include "gpipe/schedule/op.hpp"
#include "gpipe/schedule/simulator.hpp"
#include "gpipe/schedule/validator.hpp"
