#pragma once
// The host backend: threads as devices, oneDNN GEMMs.

#include "gpipe/backend/host/backend.hpp"
#include "gpipe/backend/host/kernels.hpp"
#include "gpipe/backend/host/memory.hpp"
#include "gpipe/backend/host/stream.hpp"
