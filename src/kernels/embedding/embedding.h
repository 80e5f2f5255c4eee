// kernels/embedding/embedding.h: token embedding lookup, out[t] = table[ids[t]] as f32.
// Ids must be in range (the caller validates them against the vocabulary).
// Must not: depend on anything above common/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda_context.h"
#include "kernels/tensor_view.h"

namespace polylora::kernels {

struct EmbeddingArgs {
  const int32_t* ids = nullptr;  // [m]
  int64_t m = 0;
  WeightView table;      // [vocab, hidden]
  float* out = nullptr;  // [m, hidden], row stride ld_out
  int64_t ld_out = 0;
};

namespace ref {
void embedding(const EmbeddingArgs& args);
}
namespace cpu {
void embedding(const EmbeddingArgs& args);
}
namespace cuda {
void embedding(const EmbeddingArgs& args, const CudaContext& ctx);
}

}  // namespace polylora::kernels
