// kernels/embedding/embedding_cuda.cu: CUDA embedding lookup: one block per token, the row converted to f32.
#include "kernels/cuda_util.cuh"
#include "kernels/embedding/embedding.h"

namespace polylora::kernels::cuda {
namespace {

__global__ void embedding_kernel(const int32_t* ids, const void* table, DType dtype, int64_t cols, float* out,
                                 int64_t ld_out) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  int64_t t = blockIdx.x;
  int64_t base = static_cast<int64_t>(ids[t]) * cols;
  float* o = out + t * ld_out;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    o[c] = cuda_util::load_as_f32(table, dtype, base + c);
}

}  // namespace

void embedding(const EmbeddingArgs& a, const CudaContext& ctx) {
  if (a.m == 0) return;
  cuda_util::launch_pdl(embedding_kernel, static_cast<unsigned>(a.m), 256, 0, cuda_util::stream(ctx), a.ids,
                        a.table.data, a.table.dtype, a.table.cols, a.out, a.ld_out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace polylora::kernels::cuda
