#pragma once
// gpipe: GPipe-style pipeline-parallel training. The core library and the host backend; never
// includes a CUDA header (the CUDA backend is <gpipe/cuda.cuh>).

#include "gpipe/backend/host.hpp"
#include "gpipe/error.hpp"
#include "gpipe/io/chrome_trace.hpp"
#include "gpipe/io/llmc.hpp"
#include "gpipe/io/safetensors.hpp"
#include "gpipe/io/svg_timeline.hpp"
#include "gpipe/model.hpp"
#include "gpipe/optim.hpp"
#include "gpipe/runtime/llmc.hpp"
#include "gpipe/runtime/memory_model.hpp"
#include "gpipe/runtime/remat.hpp"
#include "gpipe/runtime/trace_stats.hpp"
#include "gpipe/runtime/trainer.hpp"
#include "gpipe/schedule.hpp"
