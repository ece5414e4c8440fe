#pragma once
// The host backend: threads as devices, oneDNN GEMMs, and the kernels of the layers that bring
// their own (LayerKernels specializations, layers.hpp).

#include "gpipe/backend/host/backend.hpp"
#include "gpipe/backend/host/kernels.hpp"
#include "gpipe/backend/host/layers.hpp"
#include "gpipe/backend/host/memory.hpp"
#include "gpipe/backend/host/stream.hpp"
