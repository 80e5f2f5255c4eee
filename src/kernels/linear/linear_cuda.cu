// kernels/linear/linear_cuda.cu: CUDA dense products through cuBLAS. Row-major y[m, n] = x[m, k]·W[n, k]ᵀ is
// the column-major product yᵀ = W·xᵀ with W transposed (cuBLAS sees W as a k×n column-major matrix).
// BF16 weights: x is cast to bf16 into the workspace and cublasGemmEx multiplies bf16 × bf16 with f32
// accumulation and f32 output; F32 weights: exact fp32 cublasSgemm (the handle's math mode is
// CUBLAS_DEFAULT_MATH, no TF32). The bias is added by a small kernel afterwards.
#include <cublas_v2.h>

#include "kernels/cuda_util.cuh"
#include "kernels/linear/linear.h"

#define CUBLAS_CHECK(expr)                                                                          \
  do {                                                                                              \
    cublasStatus_t cublas_check_st_ = (expr);                                                       \
    if (cublas_check_st_ != CUBLAS_STATUS_SUCCESS)                                                  \
      ::polylora::check_failed(__FILE__, __LINE__, #expr, cublasGetStatusString(cublas_check_st_)); \
  } while (0)

namespace polylora::kernels::cuda {
namespace {

__global__ void cast_rows_bf16_kernel(const float* x, int64_t ldx, int64_t m, int64_t k, __nv_bfloat16* out) {
  int64_t total = m * k;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t i = idx / k, j = idx % k;
    out[idx] = __float2bfloat16_rn(x[i * ldx + j]);
  }
}

__global__ void add_bias_kernel(float* y, int64_t ldy, int64_t m, int64_t n, const float* bias) {
  int64_t total = m * n;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t i = idx / n, j = idx % n;
    y[i * ldy + j] += bias[j];
  }
}

}  // namespace

size_t linear_workspace_bytes(const LinearArgs& a) {
  return a.w.dtype == DType::kBF16 ? static_cast<size_t>(a.m * a.w.cols) * sizeof(__nv_bfloat16) : 0;
}

void linear(const LinearArgs& a, const CudaContext& ctx) {
  const int64_t m = a.m, n = a.w.rows, k = a.w.cols;
  if (m == 0 || n == 0) return;
  KERNEL_CHECK(m < (1LL << 31) && n < (1LL << 31) && k < (1LL << 31),
               "linear: dimension too large for cuBLAS");
  cudaStream_t st = cuda_util::stream(ctx);
  auto handle = static_cast<cublasHandle_t>(ctx.cublas);
  const float one = 1.0f, zero = 0.0f;
  switch (a.w.dtype) {
    case DType::kBF16: {
      KERNEL_CHECK(linear_workspace_bytes(a) <= ctx.workspace_bytes, "linear: workspace too small");
      auto* xb = static_cast<__nv_bfloat16*>(ctx.workspace);
      cast_rows_bf16_kernel<<<cuda_util::blocks_for(m * k, 256, 8192), 256, 0, st>>>(a.x, a.ldx, m, k, xb);
      CUDA_CHECK_LAUNCH();
      CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                                static_cast<int>(k), &one, a.w.data, CUDA_R_16BF, static_cast<int>(k), xb,
                                CUDA_R_16BF, static_cast<int>(k), &zero, a.y, CUDA_R_32F,
                                static_cast<int>(a.ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      break;
    }
    case DType::kF32:
      CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                               static_cast<int>(k), &one, static_cast<const float*>(a.w.data),
                               static_cast<int>(k), a.x, static_cast<int>(a.ldx), &zero, a.y,
                               static_cast<int>(a.ldy)));
      break;
    case DType::kF16:
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
      KERNEL_CHECK(false, "linear: CUDA weights must be BF16 or F32 (matrix_from_host converts them)");
  }
  if (a.bias) {
    add_bias_kernel<<<cuda_util::blocks_for(m * n, 256, 8192), 256, 0, st>>>(a.y, a.ldy, m, n, a.bias);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace polylora::kernels::cuda
