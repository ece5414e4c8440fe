#pragma once
// gpipe without a backend: models, schedules, the Trainer and its runtime, optimizers, and the
// safetensors files the Trainer reads and writes. <gpipe/gpipe.hpp> adds the host backend,
// <gpipe/cuda.cuh> the CUDA backend; <gpipe/io.hpp> has the other file formats.

#include "gpipe/error.hpp"
#include "gpipe/model.hpp"
#include "gpipe/optim.hpp"
#include "gpipe/runtime/memory_model.hpp"
#include "gpipe/runtime/remat.hpp"
#include "gpipe/runtime/step_stats.hpp"
#include "gpipe/runtime/trace_stats.hpp"
#include "gpipe/runtime/trainer.hpp"
#include "gpipe/schedule.hpp"
