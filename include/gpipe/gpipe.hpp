#pragma once
// gpipe: GPipe-style pipeline-parallel training. The core library (<gpipe/core.hpp>) and the host
// backend; never includes a CUDA header (the CUDA backend is <gpipe/cuda.cuh>). The file formats
// beyond the Trainer's safetensors (Chrome trace, SVG timeline, llm.c files) are <gpipe/io.hpp>,
// so that a program that only trains does not compile them.

#include "gpipe/backend/host.hpp"
#include "gpipe/backend/host/compiled.hpp"
#include "gpipe/core.hpp"
