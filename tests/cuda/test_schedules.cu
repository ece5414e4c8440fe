// Every schedule on the CUDA backend gives the GPipe schedule's loss and gradients: the
// backend-conformance suite of tests/support/conformance_schedules.hpp (1F1B, ZB-H1 and
// interleaved 1F1B, every M and remat policy, on virtual devices spread over the GPUs there are).

#include <doctest/doctest.h>

#include "gpipe/cuda.cuh"
#include "support/conformance_schedules.hpp"
#include "support/cuda_factory.cuh"

TEST_CASE_TEMPLATE_APPLY(conformance_schedules,
                         gpipe::test::conformance::ScheduleCases<gpipe::test::CudaFactory>);
