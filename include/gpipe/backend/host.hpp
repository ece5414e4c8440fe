#pragma once
// The host backend: threads as devices, OpenBLAS GEMMs.

#include "gpipe/backend/host/backend.hpp"
#include "gpipe/backend/host/kernels.hpp"
#include "gpipe/backend/host/memory.hpp"
#include "gpipe/backend/host/stream.hpp"
