#pragma once
// The emulated CUDA Graphs: stream capture (cudaStreamBeginCapture .. cudaStreamEndCapture over
// every stream that joins it), instantiation and launch. The model is runtime.hpp's Capture: the
// captured operations in the host's issue order, run one after another on the launching stream.
// What it checks, as CUDA does: a capture ends on its origin stream after every stream that joined
// it has been joined back (cudaErrorStreamCaptureUnjoined); a wait inside a capture for work
// outside it, a synchronization with a capturing stream, a copy between pageable host memory and
// the device, and freeing memory the graph does not own invalidate the capture; a graph whose
// memory is not freed inside it cannot be launched twice.

#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "support/cuda_emulation/runtime.hpp"

struct CUgraph_st {
  std::shared_ptr<gpipe::test::cuda_emulation::Capture> capture;
};
struct CUgraphExec_st {
  std::shared_ptr<gpipe::test::cuda_emulation::Capture> graph;
  std::size_t launches = 0;
};

namespace gpipe::test::cuda_emulation {

inline Capture::~Capture() {
  Machine& m = machine();
  std::lock_guard lock(m.mutex);
  for (void* p : allocations) {
    graph_memory().erase(p);
    auto it = m.device.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == m.device.end()) continue;
    m.used[static_cast<std::size_t>(it->second.gpu)] -= it->second.rounded;
    m.device.erase(it);
    std::free(p);
  }
}

// The requested and rounded bytes of the graph's allocation p.
inline Machine::Allocation graph_allocation(void* p) {
  std::lock_guard lock(machine().mutex);
  return machine().device.at(reinterpret_cast<std::uintptr_t>(p));
}

}  // namespace gpipe::test::cuda_emulation

#ifndef GPIPE_CUDA_EMULATION_LINKED  // else defined in the emulation library
extern "C" {

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode) {
  using namespace gpipe::test::cuda_emulation;
  if (stream == nullptr) return fail(cudaErrorStreamCaptureUnsupported);
  if (stream->capture != nullptr) return fail(cudaErrorIllegalState);
  stream->capture = std::make_shared<Capture>();
  stream->capture->origin = stream;
  stream->capture->members[stream];
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus* status) {
  *status = stream != nullptr && stream->capture != nullptr ? cudaStreamCaptureStatusActive
                                                            : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

// Ends the capture for every stream in it; the graph, unless the capture was invalidated or a
// stream that joined it was not joined back.
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  using namespace gpipe::test::cuda_emulation;
  *graph = nullptr;
  if (stream == nullptr || stream->capture == nullptr) return fail(cudaErrorIllegalState);
  std::shared_ptr<Capture> c = stream->capture;
  if (c->origin != stream) {
    c->invalidate(cudaErrorStreamCaptureUnmatched);
    return fail(cudaErrorStreamCaptureUnmatched);
  }
  for (auto& [member, m] : c->members) {
    if (member != stream && m.joined < m.actions) c->invalidate(cudaErrorStreamCaptureUnjoined);
    member->capture.reset();
  }
  c->open = false;
  if (c->error != cudaSuccess) return fail(c->error);
  *graph = new CUgraph_st{c};
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  using namespace gpipe::test::cuda_emulation;
  if (graph == nullptr || exec == nullptr) return fail(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->capture, 0};
  return cudaSuccess;
}

// The graph's operations on `stream`, in capture order: its memory filled with 0xff first, its
// external event records issued now (so that queries see them pending), and after the last
// node a check that nothing wrote past the end of the graph's allocations.
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  using namespace gpipe::test::cuda_emulation;
  if (exec == nullptr || stream == nullptr) return fail(cudaErrorInvalidValue);
  if (stream->capture != nullptr) return fail(cudaErrorStreamCaptureUnsupported);
  std::shared_ptr<Capture> c = exec->graph;
  if (exec->launches++ > 0)
    for (void* p : c->allocations)
      if (c->freed.count(p) == 0) return fail(cudaErrorInvalidValue);
  if (!dry_run())
    stream->submit([c] {
      for (void* p : c->allocations) {
        const Machine::Allocation a = graph_allocation(p);
        std::memset(p, 0xff, a.rounded + Machine::redzone);
      }
    });
  for (const Capture::Node& node : c->nodes) {
    if (node.external != nullptr) {
      stream->submit(
          [e = node.external, generation = node.external->record(), c] { e->complete(generation); },
          /*bookkeeping=*/true);
    } else {
      stream->submit([run = node.run, c] { run(); }, node.bookkeeping);
    }
  }
  if (!dry_run())
    stream->submit([c] {
      for (void* p : c->allocations) {
        const Machine::Allocation a = graph_allocation(p);
        const auto* bytes = static_cast<const unsigned char*>(p);
        for (std::size_t i = a.bytes; i < a.rounded + Machine::redzone; ++i)
          if (bytes[i] != 0xff)
            throw std::runtime_error("graph memory written past the end of an allocation of " +
                                     std::to_string(a.bytes) + " bytes");
      }
    });
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

// cudaEventRecordExternal inside a capture: a node that records the event at each launch.
cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags) {
  using namespace gpipe::test::cuda_emulation;
  if ((flags & cudaEventRecordExternal) == 0 || stream == nullptr || stream->capture == nullptr)
    return cudaEventRecord(event, stream);
  std::shared_ptr<CUevent_st> e = event_of(event);
  if (e == nullptr || e->gpu != stream->gpu) return fail(cudaErrorInvalidResourceHandle);
  stream->capture->nodes.push_back({nullptr, e, true});
  ++stream->capture->members[stream].actions;
  return cudaSuccess;
}

}  // extern "C"
#endif  // GPIPE_CUDA_EMULATION_LINKED
