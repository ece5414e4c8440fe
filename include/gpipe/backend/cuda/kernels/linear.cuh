#pragma once
// Linear's GEMMs through cuBLASLt with the bias in the epilogue: the forward adds b as the GEMM
// stores y, and the weight gradient's GEMM sums dy's columns as it reads dy, so that neither runs
// a pass of its own over the activation. Host reference: gpipe/backend/host/kernels.hpp
// (linear_forward; gemm and bias_grad).
//
// Row-major to column-major as in gemm.cuh (a row-major (r, c) matrix is the column-major (c, r)
// one), D (m, n) = op(A) (m, k) op(B) (k, n) + beta D:
//   forward   y (rows, out) = x W^T + b   is  D (out, rows) = A^T B + b 1^T,  A = W as (in, out),
//             B = x as (in, rows), D = y; CUBLASLT_EPILOGUE_BIAS adds b (D's rows) to each column.
//   backward  dW (out, in) += dy^T x      is  D (in, out) = A B^T + D,  A = x as (in, rows),
//             B = dy as (out, rows), D = dW, k = rows; CUBLASLT_EPILOGUE_BGRADB sums op(B) over
//             k: db = the column sums of dy.
// The bias-gradient epilogue overwrites its vector while db accumulates over micro-batches, so
// the GEMM writes the sums into scratch and accumulate() adds them to db: `out` floats read twice
// and written once, against a separate column-sum pass that reads all of dy (rows x out).
//
// The input gradient through a GELUTanh and the Linear after it (GPT-2's c_proj):
//   dx (rows, in) = (dy W) * GELU'(pre)  is  D (in, rows) = A B,  A = W as (in, out), B = dy as
//             (out, rows), with CUBLASLT_EPILOGUE_DGELU reading GELU's input pre (in, rows) as its
//             auxiliary matrix: D is the gradient of GELU's input, and the gradient of its output
//             is never stored. cuBLASLt's GELU is the tanh approximation, GELUTanh's; the epilogue
//             needs the auxiliary matrix's leading dimension (in) a multiple of 8 and, here, pre
//             16-byte aligned, else the function enqueues nothing and returns false.
// The forward keeps GELU as a kernel of its own: cuBLASLt's GELU_AUX_BIAS epilogue would compute
// GELU from the unrounded sum with its own tanh, and Remat::selective, which recomputes GELU's
// output from the stored pre with gpipe's kernel, would then not give the same bits as
// Remat::never.
//
// The algorithm is cublasLtMatmulAlgoGetHeuristic's first, under the operands' actual alignments
// and at most lt_workspace_limit bytes of workspace (the device's block grows to what it asks),
// asked once per problem and alignments and then kept by the device (DeviceState::lt_algos).
// Where cuBLASLt has none (an epilogue it lacks for these types), the functions enqueue nothing
// and return false, and the caller runs the GEMM and the separate bias pass. cuBLASLt gives the
// same bits on every run for the same problem on one GPU model and toolkit (no atomics), and the
// heuristic picks the same algorithm for the same problem, so db stays deterministic.

#if !defined(__CUDACC__) && !defined(GPIPE_CUDA_EMULATION)
#error "gpipe/backend/cuda/kernels/linear.cuh is CUDA code: compile it with nvcc"
#endif

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "gpipe/backend/cuda/device.cuh"
#include "gpipe/backend/cuda/error.cuh"
#include "gpipe/backend/cuda/kernels/elementwise.cuh"
#include "gpipe/backend/cuda/launch_log.cuh"
#include "gpipe/model/precision.hpp"

namespace gpipe::cuda {

/// Most bytes of workspace that a cuBLASLt algorithm of a fused Linear may ask for.
inline constexpr std::size_t lt_workspace_limit = std::size_t{32} << 20;

namespace detail {

// One column-major cublasLtMatmul, D (m, n) = op(A) (m, k) op(B) (k, n) + beta D, then
// `epilogue` on `bias`: read (float) by BIAS, written (as D's type) by BGRADB.
struct LtProblem {
  bool trans_a = false, trans_b = false;
  std::uint64_t m = 0, n = 0, k = 0;
  cudaDataType_t ab_type = CUDA_R_32F;  // A and B
  cudaDataType_t d_type = CUDA_R_32F;   // C and D (C is D)
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  // DGELU reads GELU's input there (D's type, leading dimension m)
  const void* aux = nullptr;
  float beta = 0;
};

// Owns a cuBLASLt descriptor (H, destroyed by Destroy).
template <class H, cublasStatus_t (*Destroy)(H)>
class LtOwned {
 public:
  LtOwned() = default;
  LtOwned(const LtOwned&) = delete;
  LtOwned& operator=(const LtOwned&) = delete;
  ~LtOwned() {
    if (h_ != nullptr) (void)Destroy(h_);
  }
  H* out() { return &h_; }
  H get() const { return h_; }

 private:
  H h_ = nullptr;
};
using LtDesc = LtOwned<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using LtLayout = LtOwned<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using LtPreference = LtOwned<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

template <class V>
void lt_set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, V value) {
  GPIPE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof value));
}
template <class V>
void lt_set(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attribute,
            V value) {
  GPIPE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &value, sizeof value));
}

// The largest power of two up to 256 (cuBLASLt's default) that divides p's address.
inline std::uint32_t lt_alignment(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 256;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

// The descriptor of p: compute type (scale type float), transposes, epilogue, bias pointer; a
// float bias of a bf16 D says so (cuBLASLt's default is D's type).
inline void lt_describe(const LtProblem& p, LtDesc& desc) {
  GPIPE_CUBLAS_CHECK(cublasLtMatmulDescCreate(desc.out(), p.compute, CUDA_R_32F));
  lt_set(desc.get(), CUBLASLT_MATMUL_DESC_TRANSA,
         static_cast<std::int32_t>(p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N));
  lt_set(desc.get(), CUBLASLT_MATMUL_DESC_TRANSB,
         static_cast<std::int32_t>(p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N));
  lt_set(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<std::uint32_t>(p.epilogue));
  if (p.epilogue == CUBLASLT_EPILOGUE_DEFAULT) return;
  if (p.epilogue == CUBLASLT_EPILOGUE_DGELU) {  // no vector
    lt_set(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.aux);
    lt_set(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<std::int64_t>(p.m));
    return;
  }
  lt_set(desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias);
  if (p.epilogue == CUBLASLT_EPILOGUE_BIAS && p.d_type != CUDA_R_32F)
    lt_set(desc.get(), CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<std::int32_t>(CUDA_R_32F));
}

// The matrix layouts of p: A is op(A) (m, k), or (k, m) when transposed; B likewise (k, n) or
// (n, k); D (m, n). Column-major, dense.
inline void lt_layouts(const LtProblem& p, LtLayout& a, LtLayout& b, LtLayout& d) {
  const std::uint64_t a_rows = p.trans_a ? p.k : p.m, b_rows = p.trans_b ? p.n : p.k;
  GPIPE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(a.out(), p.ab_type, a_rows, p.trans_a ? p.m : p.k,
                                                static_cast<std::int64_t>(a_rows)));
  GPIPE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(b.out(), p.ab_type, b_rows, p.trans_b ? p.k : p.n,
                                                static_cast<std::int64_t>(b_rows)));
  GPIPE_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(d.out(), p.d_type, p.m, p.n, static_cast<std::int64_t>(p.m)));
}

// The heuristic's first algorithm for p with A, B and D (C is D) at alignments `align`, at most
// lt_workspace_limit bytes of workspace: asked once per problem, then taken from s.lt_algos.
inline LtAlgoChoice lt_choose(DeviceState& s, const LtProblem& p, const LtDesc& desc,
                              const LtLayout& a, const LtLayout& b, const LtLayout& d,
                              const std::array<std::uint32_t, 3>& align) {
  const std::array<std::uint64_t, 6> key = {
      (p.trans_a ? 1u : 0u) | (p.trans_b ? 2u : 0u) | static_cast<std::uint64_t>(p.epilogue) << 8 |
          std::uint64_t{lt_alignment(p.aux)} << 32,
      p.m,
      p.n,
      p.k,
      std::uint64_t{static_cast<std::uint32_t>(p.ab_type)} |
          std::uint64_t{static_cast<std::uint32_t>(p.d_type)} << 16 |
          std::uint64_t{static_cast<std::uint32_t>(p.compute)} << 32,
      std::uint64_t{align[0]} | std::uint64_t{align[1]} << 16 | std::uint64_t{align[2]} << 32 |
          std::uint64_t{lt_alignment(p.bias)} << 48};
  for (const LtAlgoChoice& c : s.lt_algos)
    if (c.key == key) return c;
  LtPreference pref;
  GPIPE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(pref.out()));
  lt_set(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, std::uint64_t{lt_workspace_limit});
  lt_set(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align[0]);
  lt_set(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align[1]);
  lt_set(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align[2]);
  lt_set(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align[2]);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      s.blas_lt, desc.get(), a.get(), b.get(), d.get(), d.get(), pref.get(), 1, &result, &found);
  if (status != CUBLAS_STATUS_NOT_SUPPORTED) GPIPE_CUBLAS_CHECK(status);
  LtAlgoChoice choice{key, status == CUBLAS_STATUS_SUCCESS && found > 0, result.algo,
                      result.workspaceSize};
  s.lt_algos.push_back(choice);
  return choice;
}

// The launch record of p: A, B (and D when beta != 0) read, D written, the bias vector read
// (BIAS: m floats) or written (BGRADB: n, D's type), the auxiliary matrix read (DGELU). FLOPs:
// the product's 2 m n k (GELU's derivative, a few per element, rides on the epilogue and is not
// counted, as the bias is not).
inline void record_lt(const LtProblem& p, cudaStream_t stream) {
  const double ab = p.ab_type == CUDA_R_32F ? 4 : 2, dsize = p.d_type == CUDA_R_32F ? 4 : 2;
  const auto m = static_cast<double>(p.m), n = static_cast<double>(p.n),
             k = static_cast<double>(p.k);
  const double bias_read = p.epilogue == CUBLASLT_EPILOGUE_BIAS ? 4 * m : 0;
  const double bias_written = p.epilogue == CUBLASLT_EPILOGUE_BGRADB ? dsize * n : 0;
  const double aux_read = p.epilogue == CUBLASLT_EPILOGUE_DGELU ? dsize * m * n : 0;
  record_launch({.kernel = "cublasLtMatmul",
                 .shape = {static_cast<std::size_t>(p.m), static_cast<std::size_t>(p.n),
                           static_cast<std::size_t>(p.k)},
                 .flops = 2 * m * n * k,
                 .bytes_read = ab * (m * k + k * n) + (p.beta != 0 ? dsize * m * n : 0) +
                               bias_read + aux_read,
                 .bytes_written = dsize * m * n + bias_written,
                 .kind = LaunchKind::gemm,
                 .tensor_cores = p.ab_type == CUDA_R_16BF,
                 .stream = stream});
}

// Enqueues p on a, b and d on s's compute stream with the heuristic's first algorithm; false,
// with nothing enqueued, where the heuristic has none.
inline bool lt_matmul(DeviceState& s, const LtProblem& p, const void* a, const void* b, void* d) {
  LtDesc desc;
  lt_describe(p, desc);
  LtLayout la, lb, ld;
  lt_layouts(p, la, lb, ld);
  const LtAlgoChoice choice =
      lt_choose(s, p, desc, la, lb, ld, {lt_alignment(a), lt_alignment(b), lt_alignment(d)});
  if (!choice.found) return false;
  record_lt(p, s.compute);
  void* workspace = grow_scratch(s, s.lt_workspace, s.lt_workspace_floats,
                                 (choice.workspace + sizeof(float) - 1) / sizeof(float));
  const float alpha = 1;
  GPIPE_CUBLAS_CHECK(cublasLtMatmul(s.blas_lt, desc.get(), &alpha, a, la.get(), b, lb.get(),
                                    &p.beta, d, ld.get(), d, ld.get(), &choice.algo, workspace,
                                    choice.workspace, s.compute));
  return true;
}

// cuBLASLt's operand type and compute type for a Linear of T: FP32 (TF32 where the backend
// allows it) for float, float accumulation for bf16.
template <class T>
void lt_types(const DeviceState& s, LtProblem& p) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16>,
                "gpipe: a fused Linear takes float or bf16 activations");
  p.ab_type = std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_16BF;
  p.compute =
      std::is_same_v<T, float> && s.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

}  // namespace detail

/// y (rows, out) = x (rows, in) W^T + b (out), W (out, in) row-major, y overwritten, on s's
/// compute stream: one cublasLtMatmul with CUBLASLT_EPILOGUE_BIAS. T float (FP32, TF32 where
/// BackendOptions::tf32 allows) or bf16 (x, W, y bf16; float accumulation; b float, added in float
/// before y is rounded once). False, with nothing enqueued, where cuBLASLt has no algorithm or b
/// is not 16-byte aligned.
template <class T>
bool linear_forward_lt(detail::DeviceState& s, std::size_t rows, std::size_t in, std::size_t out,
                       const T* x, const T* w, const float* b, T* y) {
  if (rows == 0) return true;
  // cuBLASLt's bias epilogue is reported to fail on bias vectors less than 16-byte aligned (a
  // bias at W's end when out x in is not a multiple of 4)
  if (detail::lt_alignment(b) < 16) return false;
  detail::LtProblem p;
  detail::lt_types<T>(s, p);
  p.d_type = p.ab_type;
  p.trans_a = true;
  p.m = out, p.n = rows, p.k = in;
  p.epilogue = CUBLASLT_EPILOGUE_BIAS;
  p.bias = b;
  return detail::lt_matmul(s, p, w, x, y);
}

/// dW (out, in) += dy^T x and db (out) += the column sums of dy, for dy (rows, out) and x (rows,
/// in), on s's compute stream: one cublasLtMatmul with CUBLASLT_EPILOGUE_BGRADB, which writes the
/// column sums into `sums` (out floats of scratch), then accumulate(out, sums, db). dW and db
/// float; T float or bf16 as for linear_forward_lt. False, with nothing enqueued, where cuBLASLt
/// has no algorithm.
template <class T>
bool linear_backward_weight_lt(detail::DeviceState& s, std::size_t rows, std::size_t in,
                               std::size_t out, const T* dy, const T* x, float* dw, float* db,
                               float* sums) {
  if (rows == 0) return true;
  detail::LtProblem p;
  detail::lt_types<T>(s, p);
  p.d_type = CUDA_R_32F;
  p.trans_b = true;
  p.m = in, p.n = out, p.k = rows;
  p.epilogue = CUBLASLT_EPILOGUE_BGRADB;
  p.bias = sums;
  p.beta = 1;
  if (!detail::lt_matmul(s, p, x, dy, dw)) return false;
  accumulate(out, static_cast<const float*>(sums), db, s.compute);
  return true;
}

/// dx (rows, in) = (dy (rows, out) W) * GELUTanh'(pre (rows, in)), W (out, in) row-major, dx
/// overwritten, on s's compute stream: the input gradient of GELUTanh followed by a Linear, as one
/// cublasLtMatmul with CUBLASLT_EPILOGUE_DGELU (the product in float, rounded once). Types as
/// linear_forward_lt's. False, with nothing enqueued, where cuBLASLt has no algorithm, in is not
/// a multiple of 8, or pre is not 16-byte aligned.
template <class T>
bool linear_backward_input_gelu_tanh_lt(detail::DeviceState& s, std::size_t rows, std::size_t in,
                                        std::size_t out, const T* dy, const T* w, const T* pre,
                                        T* dx) {
  if (rows == 0) return true;
  if (in % 8 != 0 || detail::lt_alignment(pre) < 16) return false;
  detail::LtProblem p;
  detail::lt_types<T>(s, p);
  p.d_type = p.ab_type;
  p.m = in, p.n = rows, p.k = out;
  p.epilogue = CUBLASLT_EPILOGUE_DGELU;
  p.aux = pre;
  return detail::lt_matmul(s, p, w, dy, dx);
}

}  // namespace gpipe::cuda
