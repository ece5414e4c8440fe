#pragma once
// The host backend: threads as devices, oneDNN GEMMs, and the kernels of the layers that bring
// their own (LayerKernels specializations, in layers/).

#include "gpipe/backend/host/backend.hpp"
#include "gpipe/backend/host/kernels.hpp"
#include "gpipe/backend/host/layers/activation.hpp"
#include "gpipe/backend/host/layers/attention.hpp"
#include "gpipe/backend/host/layers/embedding.hpp"
#include "gpipe/backend/host/layers/gelu_tanh.hpp"
#include "gpipe/backend/host/layers/layer_norm.hpp"
#include "gpipe/backend/host/memory.hpp"
#include "gpipe/backend/host/stream.hpp"
