#pragma once
// The schedule layer: schedules as data (op.hpp), the generators and their tag types (GPipe
// fill-drain, 1F1B, interleaved 1F1B, looped BFS, ZB-H1, ZB-H2, and the V-shaped ZB-V and
// DualPipeV; what a tag provides: kind.hpp; search_schedule), the validator that
// proves a schedule runnable (at run time, or while compiling: compile_time.hpp; with buffered or
// rendezvous sends, and order_for_rendezvous for the second), and the simulator that times it. All
// of it is constexpr and independent of backends and models. inference.hpp: the forward-only
// program that predict runs.

#include "gpipe/schedule/compile_time.hpp"
#include "gpipe/schedule/dual_pipe_v.hpp"
#include "gpipe/schedule/gpipe.hpp"
#include "gpipe/schedule/inference.hpp"
#include "gpipe/schedule/interleaved.hpp"
#include "gpipe/schedule/kind.hpp"
#include "gpipe/schedule/looped_bfs.hpp"
#include "gpipe/schedule/one_f_one_b.hpp"
#include "gpipe/schedule/op.hpp"
#include "gpipe/schedule/rendezvous.hpp"
#include "gpipe/schedule/search.hpp"
#include "gpipe/schedule/simulator.hpp"
#include "gpipe/schedule/validator.hpp"
#include "gpipe/schedule/zero_bubble.hpp"
#include "gpipe/schedule/zero_bubble_v.hpp"
