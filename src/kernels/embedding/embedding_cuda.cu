// kernels/embedding/embedding_cuda.cu: CUDA embedding lookup: one block per token, the row converted to f32.
#include "kernels/cuda_util.cuh"
#include "kernels/embedding/embedding.h"

namespace polylora::kernels::cuda {
namespace {

// id_rows > 0: ids outside [id_begin, id_begin + id_rows) give zeros (a vocabulary shard).
__global__ void embedding_kernel(const int32_t* ids, const void* table, DType dtype, int64_t cols, float* out,
                                 int64_t ld_out, int64_t id_begin, int64_t id_rows) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  int64_t t = blockIdx.x;
  const int64_t row = static_cast<int64_t>(ids[t]) - id_begin;
  float* o = out + t * ld_out;
  if (id_rows > 0 && (row < 0 || row >= id_rows)) {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) o[c] = 0.0f;
    return;
  }
  int64_t base = row * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    o[c] = cuda_util::load_as_f32(table, dtype, base + c);
}

}  // namespace

void embedding(const EmbeddingArgs& a, const CudaContext& ctx) {
  if (a.m == 0) return;
  cuda_util::launch_pdl(embedding_kernel, static_cast<unsigned>(a.m), 256, 0, cuda_util::stream(ctx), a.ids,
                        a.table.data, a.table.dtype, a.table.cols, a.out, a.ld_out, a.id_begin, a.id_rows);
  CUDA_CHECK_LAUNCH();
}

}  // namespace polylora::kernels::cuda
