#pragma once
// The host backend's runtime instantiations that the optional library (CMake target
// gpipe::compiled, src/host.cpp) compiles once: in a program compiled with GPIPE_COMPILED_HOST
// they are explicit instantiation declarations (extern template), so that the program compiles
// only what depends on its model's types; in the library's source, the definitions. Without
// GPIPE_COMPILED_HOST this header declares nothing (see backend/host/linkage.hpp). The kernel
// context's and the layers' kernels' instantiations are beside their code (kernels_bf16.hpp,
// layers/).

#include <cstdint>

#include "gpipe/backend/host.hpp"
#include "gpipe/backend/host/linkage.hpp"
#include "gpipe/core.hpp"

// The Trainer's parts for host::Backend (runtime/trainer.hpp): step runners for both target types
// (class ids, floats), the parameter store and the optimizer state's update for both optimizers.
GPIPE_HOST_INSTANTIATION(class gpipe::detail::StepRunner<gpipe::host::Backend, std::int32_t>);
GPIPE_HOST_INSTANTIATION(class gpipe::detail::StepRunner<gpipe::host::Backend, float>);
GPIPE_HOST_INSTANTIATION(class gpipe::detail::ParameterStore<gpipe::host::Backend>);
GPIPE_HOST_INSTANTIATION(void gpipe::detail::OptimizerState<gpipe::host::Backend>::step(
    const gpipe::optim::SGD&, gpipe::detail::ParameterStore<gpipe::host::Backend>&,
    gpipe::host::Backend&));
GPIPE_HOST_INSTANTIATION(void gpipe::detail::OptimizerState<gpipe::host::Backend>::step(
    const gpipe::optim::AdamW&, gpipe::detail::ParameterStore<gpipe::host::Backend>&,
    gpipe::host::Backend&));
