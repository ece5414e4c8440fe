#pragma once
// gpipe's file formats: safetensors (io/safetensors.hpp), a trace as Chrome's trace-event JSON
// (io/chrome_trace.hpp) or as an SVG timeline (io/svg_timeline.hpp), llm.c's token shards and
// GPT-2 checkpoints (io/llmc.hpp), and an llm.c checkpoint loaded into a Trainer
// (runtime/llmc.hpp).

#include "gpipe/io/chrome_trace.hpp"
#include "gpipe/io/llmc.hpp"
#include "gpipe/io/safetensors.hpp"
#include "gpipe/io/svg_timeline.hpp"
#include "gpipe/runtime/llmc.hpp"
