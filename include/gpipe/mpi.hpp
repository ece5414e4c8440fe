#pragma once
// gpipe across processes: everything <gpipe/gpipe.hpp> has, plus gpipe::mpi::Backend (a rank per
// device over MPI point-to-point). Link the CMake target gpipe::mpi and launch with mpirun, one
// rank per pipeline device:
//
//   int main(int argc, char** argv) {
//     gpipe::mpi::Backend backend(argc, argv);          // MPI_COMM_WORLD: rank r is device r
//     gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, gpipe::mpi::Backend, gpipe::OneFOneB>
//         trainer(backend, {.micro_batches = 8});
//     float loss = trainer.forward_backward(x, y);      // the same on every rank
//   }
//   mpirun -n 4 ./train

#include "gpipe/backend/mpi/backend.hpp"
#include "gpipe/gpipe.hpp"
