#pragma once
// The emulated cuBLASLt: handles, matmul descriptors, matrix layouts and heuristic preferences
// with the attributes the backend sets, cublasLtMatmulAlgoGetHeuristic, and cublasLtMatmul as a
// column-major reference run in stream order: D = alpha op(A) op(B) + beta C summed in float
// (bf16 operands widened exactly, FAST_TF32 rounding them to TF32 first), then the epilogue:
// BIAS adds a vector over D's rows (float, or D's type) before D is stored (bf16 rounded to nearest
// even); BGRADB writes the sums of op(B) over k (D's type); DGELU multiplies the sum by the
// derivative of GELU's tanh approximation at the auxiliary matrix's element (D's type, widened;
// its leading dimension a multiple of 8). Anything else
// (another attribute, epilogue, pointer mode, type combination, ordering) is rejected with
// CUBLAS_STATUS_NOT_SUPPORTED or CUBLAS_STATUS_INVALID_VALUE, so that a pass means the backend
// used only what is modelled; so is a bias vector less than 16-byte aligned, on which a GPU's
// bias epilogue is reported to fail, and an auxiliary matrix less than 16-byte aligned. The
// heuristic's algorithm asks for 4 KiB of workspace where the preference allows it and remembers
// the preference's alignments; cublasLtMatmul checks the workspace and the pointers against them,
// as an algorithm chosen for aligned operands would fault on misaligned ones.

#include <cublasLt.h>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>

#include "support/cuda_emulation/cublas.hpp"
#include "support/cuda_emulation/runtime.hpp"

struct cublasLtContext {
  int gpu;
};

namespace gpipe::test::cuda_emulation {

inline constexpr std::uint64_t lt_magic = 0x6c74656d756c6174;  // "ltemulat"

// What an emulated matmul descriptor holds (inside cublasLtMatmulDescOpaque_t).
struct LtDesc {
  std::uint64_t magic = lt_magic;
  cublasComputeType_t compute;
  cudaDataType_t scale;
  std::int32_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  std::uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  std::int32_t bias_type = -1;  // -1: D's type
  const void* aux = nullptr;    // DGELU reads it (D's type)
  std::int64_t aux_ld = 0;
};
// A column-major matrix layout (inside cublasLtMatrixLayoutOpaque_t).
struct LtLayout {
  std::uint64_t magic = lt_magic;
  cudaDataType_t type;
  std::uint64_t rows, cols;
  std::int64_t ld;
};
// Heuristic preferences (inside cublasLtMatmulPreferenceOpaque_t).
struct LtPreference {
  std::uint64_t magic = lt_magic;
  std::uint64_t max_workspace = 0;
  std::uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D
};
// The heuristic's algorithm (inside cublasLtMatmulAlgo_t).
struct LtAlgo {
  std::uint64_t magic = lt_magic;
  std::uint64_t workspace = 0;
  std::uint32_t align[4] = {};
};
static_assert(sizeof(LtDesc) <= sizeof(cublasLtMatmulDescOpaque_t));
static_assert(sizeof(LtLayout) <= sizeof(cublasLtMatrixLayoutOpaque_t));
static_assert(sizeof(LtPreference) <= sizeof(cublasLtMatmulPreferenceOpaque_t));
static_assert(sizeof(LtAlgo) <= sizeof(cublasLtMatmulAlgo_t));

// The emulator's view of an opaque descriptor; null unless it made it.
template <class T, class Opaque>
T* lt_view(Opaque* p) {
  if (p == nullptr) return nullptr;
  T* t = std::launder(reinterpret_cast<T*>(p->data));
  return t->magic == lt_magic ? t : nullptr;
}
template <class T, class Opaque>
Opaque* lt_make(T value) {
  auto* p = new Opaque{};
  new (p->data) T(value);
  return p;
}

// Copies an attribute's value of type V from buf, or says why not.
template <class V>
cublasStatus_t lt_read(const void* buf, std::size_t size, V& out) {
  if (buf == nullptr || size != sizeof(V)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&out, buf, sizeof(V));
  return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t lt_set(LtDesc& d, cublasLtMatmulDescAttributes_t attr, const void* buf,
                             std::size_t size) {
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return lt_read(buf, size, d.trans_a);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return lt_read(buf, size, d.trans_b);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      return lt_read(buf, size, d.epilogue);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      return lt_read(buf, size, d.bias);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      return lt_read(buf, size, d.bias_type);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
      return lt_read(buf, size, d.aux);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
      return lt_read(buf, size, d.aux_ld);
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;  // not modelled
  }
}

inline cublasStatus_t lt_set(LtPreference& p, cublasLtMatmulPreferenceAttributes_t attr,
                             const void* buf, std::size_t size) {
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return lt_read(buf, size, p.max_workspace);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return lt_read(buf, size, p.align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES]);
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

inline std::size_t lt_size(cudaDataType_t type) { return type == CUDA_R_32F ? 4 : 2; }

// The problem a descriptor and four layouts describe: m, n, k of D (m, n) = op(A) op(B), or
// why it is not one the emulator models.
struct LtShape {
  std::uint64_t m = 0, n = 0, k = 0;
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
};

inline bool lt_types_modelled(const LtDesc& d, const LtLayout& a, const LtLayout& b,
                              const LtLayout& c, const LtLayout& dd) {
  if (d.scale != CUDA_R_32F || a.type != b.type || c.type != dd.type) return false;
  if (d.compute == CUBLAS_COMPUTE_32F_FAST_TF32)
    return a.type == CUDA_R_32F && c.type == CUDA_R_32F;
  if (d.compute != CUBLAS_COMPUTE_32F) return false;
  if (a.type == CUDA_R_32F) return c.type == CUDA_R_32F;
  return a.type == CUDA_R_16BF && (c.type == CUDA_R_32F || c.type == CUDA_R_16BF);
}

inline bool lt_epilogue_modelled(const LtDesc& d, const LtLayout& dd) {
  const bool aux = d.aux != nullptr && d.aux_ld % 8 == 0 && d.aux_ld >= std::int64_t(dd.rows);
  switch (d.epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT:
      return true;
    case CUBLASLT_EPILOGUE_BIAS:
      return d.bias != nullptr &&
             (d.bias_type == -1 || d.bias_type == CUDA_R_32F || d.bias_type == dd.type);
    case CUBLASLT_EPILOGUE_BGRADB:
      return d.bias != nullptr && (d.bias_type == -1 || d.bias_type == dd.type);
    case CUBLASLT_EPILOGUE_DGELU:
      return aux;
    default:
      return false;
  }
}

inline LtShape lt_shape(const LtDesc* d, const LtLayout* a, const LtLayout* b, const LtLayout* c,
                        const LtLayout* dd) {
  LtShape s;
  if (d == nullptr || a == nullptr || b == nullptr || c == nullptr || dd == nullptr ||
      (d->trans_a != CUBLAS_OP_N && d->trans_a != CUBLAS_OP_T) ||
      (d->trans_b != CUBLAS_OP_N && d->trans_b != CUBLAS_OP_T)) {
    s.status = CUBLAS_STATUS_INVALID_VALUE;
    return s;
  }
  if (!lt_types_modelled(*d, *a, *b, *c, *dd) || !lt_epilogue_modelled(*d, *dd)) {
    s.status = CUBLAS_STATUS_NOT_SUPPORTED;
    return s;
  }
  const bool ta = d->trans_a == CUBLAS_OP_T, tb = d->trans_b == CUBLAS_OP_T;
  s.m = ta ? a->cols : a->rows;
  s.k = ta ? a->rows : a->cols;
  s.n = tb ? b->rows : b->cols;
  const std::uint64_t kb = tb ? b->cols : b->rows;
  const bool same_cd = c->rows == dd->rows && c->cols == dd->cols && c->ld == dd->ld;
  if (kb != s.k || dd->rows != s.m || dd->cols != s.n || !same_cd ||
      std::uint64_t(a->ld) < a->rows || std::uint64_t(b->ld) < b->rows ||
      std::uint64_t(dd->ld) < dd->rows || a->ld < 1 || b->ld < 1 || dd->ld < 1)
    s.status = CUBLAS_STATUS_INVALID_VALUE;
  return s;
}

// An operand's element (r, c) of a column-major layout, widened (TF32-rounded when `tf32`).
inline float lt_at(const void* p, const LtLayout& l, std::uint64_t r, std::uint64_t c, bool tf32) {
  const float v = element(p, l.type, r + c * static_cast<std::uint64_t>(l.ld));
  return tf32 ? to_tf32(v) : v;
}

// The derivative of GELU's tanh approximation, as cuBLASLt's DGELU epilogue applies it.
inline float lt_gelu_derivative(float v) {
  constexpr float a = 0.044715f, c = 0.79788456080286535588f;
  const float th = std::tanh(c * (v + a * v * v * v));
  return 0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * c * (1.0f + 3.0f * a * v * v);
}

// What cublasLtMatmul computes, once its stream reaches it.
struct LtRun {
  LtDesc d;
  LtLayout a, b, c, dd;
  LtShape s;
  float alpha, beta;
  const void *pa, *pb, *pc;
  void* pd;

  void operator()() const {
    const bool ta = d.trans_a == CUBLAS_OP_T, tb = d.trans_b == CUBLAS_OP_T;
    const bool tf32 = d.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    auto op_a = [&](std::uint64_t i, std::uint64_t p, bool round) {
      return ta ? lt_at(pa, a, p, i, round) : lt_at(pa, a, i, p, round);
    };
    auto op_b = [&](std::uint64_t p, std::uint64_t j, bool round) {
      return tb ? lt_at(pb, b, j, p, round) : lt_at(pb, b, p, j, round);
    };
    if (d.epilogue == CUBLASLT_EPILOGUE_BGRADB) {
      for (std::uint64_t j = 0; j < s.n; ++j) {
        float sum = 0;
        for (std::uint64_t p = 0; p < s.k; ++p) sum += op_b(p, j, false);
        store(const_cast<void*>(d.bias), dd.type, j, sum);
      }
    }
    const cudaDataType_t bias_type = d.bias_type == -1 ? dd.type : cudaDataType_t(d.bias_type);
    for (std::uint64_t j = 0; j < s.n; ++j)
      for (std::uint64_t i = 0; i < s.m; ++i) {
        float sum = 0;
        for (std::uint64_t p = 0; p < s.k; ++p) sum += op_a(i, p, tf32) * op_b(p, j, tf32);
        float v = alpha * sum;
        if (beta != 0.0f) v += beta * element(pc, c.type, i + j * std::uint64_t(c.ld));
        const std::uint64_t at_aux = i + j * std::uint64_t(d.aux_ld);
        switch (d.epilogue) {
          case CUBLASLT_EPILOGUE_BIAS:
            v += element(d.bias, bias_type, i);
            break;
          case CUBLASLT_EPILOGUE_DGELU:
            v *= lt_gelu_derivative(element(d.aux, dd.type, at_aux));
            break;
          default:
            break;
        }
        store(pd, dd.type, i + j * std::uint64_t(dd.ld), v);
      }
  }
};

// cublasLtMatmul calls that passed their checks and were enqueued, for tests that a path uses it.
inline std::atomic<std::size_t>& lt_matmuls() {
  static std::atomic<std::size_t> count{0};
  return count;
}

// cublasLtMatmul's checks when it is called; the run's own, of memory, when the stream gets there.
inline cublasStatus_t lt_matmul(cublasLtHandle_t handle, const LtRun& run, const LtAlgo* algo,
                                void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (run.s.status != CUBLAS_STATUS_SUCCESS) return run.s.status;
  if (algo == nullptr || workspace_bytes < algo->workspace ||
      (algo->workspace > 0 && workspace == nullptr))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (run.d.epilogue == CUBLASLT_EPILOGUE_BIAS && reinterpret_cast<std::uintptr_t>(run.d.bias) % 16)
    return CUBLAS_STATUS_INVALID_VALUE;  // not modelled: a GPU's bias epilogue may fault
  if (run.d.epilogue == CUBLASLT_EPILOGUE_DGELU && reinterpret_cast<std::uintptr_t>(run.d.aux) % 16)
    return CUBLAS_STATUS_INVALID_VALUE;  // not modelled
  const void* operands[4] = {run.pa, run.pb, run.pc, run.pd};
  for (int i = 0; i < 4; ++i)
    if (reinterpret_cast<std::uintptr_t>(operands[i]) % algo->align[i] != 0)
      return CUBLAS_STATUS_INVALID_VALUE;  // the algorithm was chosen for aligned operands
  if (handle->gpu != current_gpu() || (stream != nullptr && stream->gpu != handle->gpu)) {
    std::fprintf(stderr, "cublasLt emulator: handle of GPU %d used with GPU %d current\n",
                 handle->gpu, current_gpu());
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  ++lt_matmuls();
  if (run.s.m == 0 || run.s.n == 0) return CUBLAS_STATUS_SUCCESS;
  counts().add_gemm();
  if (dry_run()) return CUBLAS_STATUS_SUCCESS;
  run_on(stream, [run, workspace, gpu = handle->gpu, ws = algo->workspace] {
    for (const void* p : {run.pa, run.pb, run.pc, static_cast<const void*>(run.pd)})
      require_accessible("cublasLtMatmul", gpu, p);
    if (run.d.epilogue != CUBLASLT_EPILOGUE_DEFAULT && run.d.epilogue != CUBLASLT_EPILOGUE_DGELU)
      require_accessible("cublasLtMatmul's bias", gpu, run.d.bias);
    if (run.d.epilogue == CUBLASLT_EPILOGUE_DGELU)
      require_accessible("cublasLtMatmul's auxiliary matrix", gpu, run.d.aux);
    if (ws > 0) require_accessible("cublasLtMatmul's workspace", gpu, workspace);
    run();
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace gpipe::test::cuda_emulation

#ifndef GPIPE_CUDA_EMULATION_LINKED  // else defined in the emulation library
extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  *handle = new cublasLtContext{gpipe::test::cuda_emulation::current_gpu()};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  using namespace gpipe::test::cuda_emulation;
  LtDesc d;
  d.compute = compute;
  d.scale = scale;
  *desc = lt_make<LtDesc, cublasLtMatmulDescOpaque_t>(d);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
  using namespace gpipe::test::cuda_emulation;
  LtDesc* d = lt_view<LtDesc>(desc);
  return d == nullptr ? CUBLAS_STATUS_INVALID_VALUE : lt_set(*d, attr, buf, size);
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  using namespace gpipe::test::cuda_emulation;
  if (type != CUDA_R_32F && type != CUDA_R_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
  LtLayout l;
  l.type = type;
  l.rows = rows;
  l.cols = cols;
  l.ld = ld;
  *layout = lt_make<LtLayout, cublasLtMatrixLayoutOpaque_t>(l);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  using namespace gpipe::test::cuda_emulation;
  *pref = lt_make<LtPreference, cublasLtMatmulPreferenceOpaque_t>(LtPreference{});
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  using namespace gpipe::test::cuda_emulation;
  LtPreference* p = lt_view<LtPreference>(pref);
  return p == nullptr ? CUBLAS_STATUS_INVALID_VALUE : lt_set(*p, attr, buf, size);
}

// One algorithm for any modelled problem: 4 KiB of workspace where the preference allows it.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* returned) {
  using namespace gpipe::test::cuda_emulation;
  const LtPreference* p = lt_view<LtPreference>(pref);
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (p == nullptr || requested <= 0 || results == nullptr || returned == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  const LtShape s = lt_shape(lt_view<LtDesc>(desc), lt_view<LtLayout>(a), lt_view<LtLayout>(b),
                             lt_view<LtLayout>(c), lt_view<LtLayout>(d));
  if (s.status != CUBLAS_STATUS_SUCCESS) return s.status;
  LtAlgo algo;
  algo.workspace = p->max_workspace >= 4096 ? 4096 : 0;
  std::memcpy(algo.align, p->align, sizeof algo.align);
  results[0] = cublasLtMatmulHeuristicResult_t{};
  new (results[0].algo.data) LtAlgo(algo);
  results[0].workspaceSize = algo.workspace;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

// D = alpha op(A) op(B) + beta C, then the epilogue, column-major (see the top of this file).
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* a, cublasLtMatrixLayout_t a_layout, const void* b,
                              cublasLtMatrixLayout_t b_layout, const void* beta, const void* c,
                              cublasLtMatrixLayout_t c_layout, void* d,
                              cublasLtMatrixLayout_t d_layout, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  using namespace gpipe::test::cuda_emulation;
  const LtDesc* dv = lt_view<LtDesc>(desc);
  const LtLayout *av = lt_view<LtLayout>(a_layout), *bv = lt_view<LtLayout>(b_layout),
                 *cv = lt_view<LtLayout>(c_layout), *dl = lt_view<LtLayout>(d_layout);
  const LtShape s = lt_shape(dv, av, bv, cv, dl);
  if (s.status != CUBLAS_STATUS_SUCCESS) return s.status;
  if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  const LtAlgo* chosen =
      algo == nullptr ? nullptr : lt_view<LtAlgo>(const_cast<cublasLtMatmulAlgo_t*>(algo));
  const LtRun run{*dv,
                  *av,
                  *bv,
                  *cv,
                  *dl,
                  s,
                  *static_cast<const float*>(alpha),
                  *static_cast<const float*>(beta),
                  a,
                  b,
                  c,
                  d};
  return lt_matmul(handle, run, chosen, workspace, workspace_bytes, stream);
}

}  // extern "C"
#endif  // GPIPE_CUDA_EMULATION_LINKED
