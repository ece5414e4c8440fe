// Every way a Trainer can fail ends in a gpipe::Error that says what was expected, nothing
// hangs, and device memory and the numbers recover, on the host backend: the backend-conformance
// suite of tests/support/conformance_errors.hpp.

#include <doctest/doctest.h>

#include "gpipe/backend/host/backend.hpp"
#include "support/conformance_errors.hpp"
#include "support/faulty_layer.hpp"
#include "support/host_factory.hpp"

static_assert(gpipe::layer_for<gpipe::test::FaultyIdentity<8>, gpipe::host::Kernels<float>>);

TEST_SUITE_BEGIN("runtime errors");
GPIPE_CONFORMANCE_ERRORS(::gpipe::test::HostFactory);
TEST_SUITE_END();
