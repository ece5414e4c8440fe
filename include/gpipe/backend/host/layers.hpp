#pragma once
// The host backend's built-in layers' kernels (their LayerKernels specializations, in layers/),
// the one list of them: backend.hpp includes it, so that host::Backend runs every built-in layer.

#include "gpipe/backend/host/layers/activation.hpp"
#include "gpipe/backend/host/layers/attention.hpp"
#include "gpipe/backend/host/layers/embedding.hpp"
#include "gpipe/backend/host/layers/gelu_tanh.hpp"
#include "gpipe/backend/host/layers/layer_norm.hpp"
#include "gpipe/backend/host/layers/llama.hpp"
#include "gpipe/backend/host/layers/rms_norm.hpp"
