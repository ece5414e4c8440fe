// Every way a Trainer can fail ends in a gpipe::Error that says what was expected, nothing
// hangs, and device memory and the numbers recover, on the CUDA backend: the backend-conformance
// suite of tests/support/conformance_errors.hpp, with K virtual devices (K streams of one GPU,
// or spread over several).

#include <doctest/doctest.h>

#include "gpipe/cuda.cuh"
#include "support/conformance_errors.hpp"
#include "support/cuda_factory.cuh"
#include "support/faulty_layer.hpp"

static_assert(gpipe::layer_for<gpipe::test::FaultyIdentity<8>, gpipe::cuda::Kernels>);

TEST_SUITE_BEGIN("cuda errors");
GPIPE_CONFORMANCE_ERRORS(::gpipe::test::CudaFactory);
TEST_SUITE_END();
