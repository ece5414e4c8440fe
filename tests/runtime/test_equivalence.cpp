// A pipelined step equals the unpipelined model on the host backend: the backend-conformance
// suite of tests/support/conformance_equivalence.hpp (K = 1..4 stages, M in {1, 2, 3, 8}, every
// remat policy, both losses; gradient accumulation; memory after a step; remat's peak).

#include <doctest/doctest.h>

#include <cstddef>

#include "gpipe/backend/host/backend.hpp"
#include "support/conformance_equivalence.hpp"
#include "support/host_factory.hpp"

using gpipe::test::HostFactory;

TEST_CASE_TEMPLATE_APPLY(conformance_cross_entropy_equivalence,
                         gpipe::test::conformance::ModelCases<HostFactory>);
TEST_CASE_TEMPLATE_APPLY(conformance_mse_equivalence,
                         gpipe::test::conformance::ModelCases<HostFactory>);
TEST_CASE_TEMPLATE_INVOKE(conformance_gradient_accumulation, HostFactory);
TEST_CASE_TEMPLATE_INVOKE(conformance_memory_after_step, HostFactory);
TEST_CASE_TEMPLATE_INVOKE(conformance_remat_peak, HostFactory);
