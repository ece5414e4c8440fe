#pragma once
// Which library runs the host backend's float GEMMs: oneDNN (linked, the default) or OpenBLAS
// (opened at run time from libopenblas.so.0, so that nothing links it and a machine without it
// loses nothing). Chosen once per process by gemm_library():
//
//   GPIPE_HOST_GEMM=onednn     oneDNN's dnnl_sgemm (and a oneDNN matmul with the bias fused for
//                              a Linear's forward)
//   GPIPE_HOST_GEMM=openblas   OpenBLAS's cblas_sgemm, then a bias pass; gpipe::Error if
//                              libopenblas.so.0 cannot be loaded
//   unset, or =auto            OpenBLAS where the CPU is an AMD one for which OpenBLAS has its
//                              Zen kernels (openblas_get_corename() says "Zen"), oneDNN elsewhere
//                              and in sanitizer builds
//
// Why the AMD rule: on AMD Zen, oneDNN 2.6's sgemm ran the model's GEMMs, and bench_mlp_step's
// whole step, slower than OpenBLAS 0.3.21's Zen kernels; on Intel CPUs with AVX-512 oneDNN is the
// faster one (and OpenBLAS 0.3.21 may not know the CPU at all). BENCHMARKS.md has the numbers
// ("Host step on AMD Zen 3").
// Either way each call runs on its caller's thread alone: OpenBLAS's thread count is set to one
// when gpipe loads it (a process-wide setting in OpenBLAS 0.3.21, so a program that also calls
// OpenBLAS itself gets one thread there too), and the OpenMP count per call as for oneDNN.

#ifndef GPIPE_HOST_GEMM_REFERENCE

#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>

#include <cstddef>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "gpipe/error.hpp"

namespace gpipe::host {

/// The library that runs the host backend's float GEMMs (see gemm_library()).
enum class GemmLibrary {
  onednn,   ///< oneDNN's dnnl_sgemm; a Linear's forward as one matmul with the bias fused
  openblas  ///< OpenBLAS's cblas_sgemm from libopenblas.so.0, loaded at run time
};

}  // namespace gpipe::host

namespace gpipe::detail {

// The process's OpenBLAS, opened once with dlopen and never closed (its thread pool and code
// live as long as the process).
struct OpenBlas {
  // cblas_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); the CBLAS
  // enums are C ints.
  using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int,
                         float, float*, int);
  static constexpr int row_major = 101, no_trans = 111, trans = 112;

  Sgemm sgemm = nullptr;
  std::string core;    // openblas_get_corename(): the kernels it picked for this CPU
  std::string config;  // openblas_get_config(): version and build options

  // nullptr where libopenblas.so.0 cannot be loaded or lacks a function gpipe calls.
  static const OpenBlas* get() {
    static const std::optional<OpenBlas> loaded = load();
    return loaded ? &*loaded : nullptr;
  }

 private:
  static std::optional<OpenBlas> load() {
    void* lib = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return std::nullopt;
    OpenBlas blas;
    blas.sgemm = reinterpret_cast<Sgemm>(dlsym(lib, "cblas_sgemm"));
    const auto set_threads =
        reinterpret_cast<void (*)(int)>(dlsym(lib, "openblas_set_num_threads"));
    const auto corename = reinterpret_cast<char* (*)()>(dlsym(lib, "openblas_get_corename"));
    const auto config = reinterpret_cast<char* (*)()>(dlsym(lib, "openblas_get_config"));
    if (blas.sgemm == nullptr || set_threads == nullptr || corename == nullptr) {
      dlclose(lib);  // not an OpenBLAS gpipe can use
      return std::nullopt;
    }
    set_threads(1);
    const char* core = corename();
    blas.core = core != nullptr ? core : "";
    const char* built = config != nullptr ? config() : nullptr;
    blas.config = built != nullptr ? built : "OpenBLAS";
    return blas;
  }
};

// True on an x86 CPU whose vendor string is AMD's.
inline bool amd_cpu() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) == 0) return false;
  return ebx == 0x68747541u && edx == 0x69746e65u && ecx == 0x444d4163u;  // "AuthenticAMD"
#else
  return false;
#endif
}

// The choice gemm_library() makes for a GPIPE_HOST_GEMM value (nullptr: unset).
inline host::GemmLibrary choose_gemm_library(const char* setting) {
  const std::string_view value = setting != nullptr ? setting : "auto";
  if (value == "onednn") return host::GemmLibrary::onednn;
  if (value == "openblas") {
    if (OpenBlas::get() == nullptr)
      throw Error(
          "gpipe: GPIPE_HOST_GEMM=openblas, but libopenblas.so.0 (with cblas_sgemm) cannot be "
          "loaded; install OpenBLAS (Debian/Ubuntu: libopenblas0-pthread) or unset it");
    return host::GemmLibrary::openblas;
  }
  if (value != "auto" && !value.empty())
    throw Error("gpipe: GPIPE_HOST_GEMM is \"" + std::string(value) +
                "\"; use onednn, openblas or auto");
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return host::GemmLibrary::onednn;  // sanitizer builds stay on one library's code
#else
  if (amd_cpu()) {  // first: other CPUs never load OpenBLAS (and start its threads)
    const OpenBlas* blas = OpenBlas::get();
    if (blas != nullptr && blas->core.starts_with("Zen")) return host::GemmLibrary::openblas;
  }
  return host::GemmLibrary::onednn;
#endif
}

}  // namespace gpipe::detail

namespace gpipe::host {

/// The library that runs this process's float GEMMs, chosen on the first call from the
/// environment variable GPIPE_HOST_GEMM (onednn, openblas, or auto when unset; see the top of
/// gemm_library.hpp) and kept. Throws `gpipe::Error` for another value, or for openblas where
/// libopenblas.so.0 cannot be loaded (and again on the next call).
inline GemmLibrary gemm_library() {
  static const GemmLibrary chosen = detail::choose_gemm_library(std::getenv("GPIPE_HOST_GEMM"));
  return chosen;
}

/// What runs this process's float GEMMs, in words: "oneDNN 2.6.3" or OpenBLAS's build string
/// with the kernels it picked (say "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Zen MAX_THREADS=64,
/// core Zen").
inline std::string gemm_library_description() {
  if (gemm_library() == GemmLibrary::openblas) {
    const detail::OpenBlas& blas = *detail::OpenBlas::get();
    return blas.config + ", core " + blas.core;
  }
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch);
}

}  // namespace gpipe::host

#endif  // GPIPE_HOST_GEMM_REFERENCE
