// A pipelined step equals the unpipelined model on the CUDA backend: the backend-conformance
// suite of tests/support/conformance_equivalence.hpp with K virtual devices (on one GPU, K
// streams of it; on several, spread over them), and, with at least two GPUs, again with every
// virtual device on GPU 0 and with NCCL hand-overs.

#include <doctest/doctest.h>

#include "gpipe/cuda.cuh"
#include "support/conformance_equivalence.hpp"
#include "support/cuda_factory.cuh"

using gpipe::test::CudaFactory;
using gpipe::test::conformance::ModelCases;

TEST_CASE_TEMPLATE_APPLY(conformance_cross_entropy_equivalence, ModelCases<CudaFactory>);
TEST_CASE_TEMPLATE_APPLY(conformance_mse_equivalence, ModelCases<CudaFactory>);
TEST_CASE_TEMPLATE_INVOKE(conformance_gradient_accumulation, CudaFactory);
TEST_CASE_TEMPLATE_INVOKE(conformance_memory_after_step, CudaFactory);
TEST_CASE_TEMPLATE_INVOKE(conformance_remat_peak, CudaFactory);

TEST_SUITE("multi-GPU" * doctest::skip(gpipe::test::fewer_than_two_gpus())) {
  TEST_CASE("with several GPUs, virtual devices that share GPU 0 still equal the reference") {
    using gpipe::test::CudaOneGpuFactory;
    using namespace gpipe::test;
    conformance::check_against_reference<CudaOneGpuFactory, Model4, gpipe::SoftmaxCrossEntropy>();
    conformance::check_against_reference<CudaOneGpuFactory, Model3, gpipe::MSELoss>();
  }

#if GPIPE_CUDA_NCCL
  TEST_CASE("stages on different GPUs that hand over through NCCL equal the reference") {
    using gpipe::test::CudaNcclFactory;
    using namespace gpipe::test;
    conformance::check_against_reference<CudaNcclFactory, Model2, gpipe::SoftmaxCrossEntropy>();
    conformance::check_against_reference<CudaNcclFactory, Model4, gpipe::MSELoss>();
  }
#endif
}
