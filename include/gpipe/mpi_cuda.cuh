#pragma once
// gpipe across processes on GPUs: everything <gpipe/cuda.cuh> has, plus
// gpipe::mpi::CudaBackend (a rank per pipeline device, each on its own GPU, NCCL between them,
// bootstrapped over MPI). Compile with nvcc, link the CMake targets gpipe::cuda (with NCCL) and
// gpipe::mpi, and launch one rank per GPU:
//
//   int main(int argc, char** argv) {
//     gpipe::mpi::CudaBackend backend(argc, argv);   // MPI_COMM_WORLD: rank r is device r
//     gpipe::Trainer<Model, gpipe::SoftmaxCrossEntropy, gpipe::mpi::CudaBackend,
//                    gpipe::OneFOneB> trainer(backend, {.micro_batches = 8});
//     float loss = trainer.forward_backward(x, y);   // the same on every rank
//   }
//   mpirun -n 4 ./train            (on one machine with 4 GPUs)

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/mpi_cuda.cuh is CUDA code: compile it with nvcc (a .cu file)"
#endif

#include "gpipe/backend/mpi/cuda_backend.cuh"
#include "gpipe/cuda.cuh"
