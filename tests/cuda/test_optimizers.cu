// Optimizer steps on a pipeline of virtual devices equal PyTorch's update rules applied to the
// unpipelined model's gradients: the backend-conformance suite of
// tests/support/conformance_optimizers.hpp on the CUDA backend.

#include <doctest/doctest.h>

#include "gpipe/cuda.cuh"
#include "support/conformance_optimizers.hpp"
#include "support/cuda_factory.cuh"

using gpipe::test::CudaFactory;

TEST_CASE_TEMPLATE_INVOKE(conformance_sgd, CudaFactory);
TEST_CASE_TEMPLATE_INVOKE(conformance_sgd_momentum, CudaFactory);
TEST_CASE_TEMPLATE_INVOKE(conformance_sgd_nesterov, CudaFactory);
TEST_CASE_TEMPLATE_INVOKE(conformance_adamw, CudaFactory);
TEST_CASE_TEMPLATE_INVOKE(conformance_adamw_matrices, CudaFactory);
TEST_CASE_TEMPLATE_INVOKE(conformance_adamw_ranges, CudaFactory);
TEST_CASE_TEMPLATE_INVOKE(conformance_bf16_weights, CudaFactory);
