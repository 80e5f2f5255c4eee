// kernels/embedding/embedding.h: token embedding lookup, out[t] = table[ids[t]] as f32.
// Ids must be in range (the caller validates them against the vocabulary). With id_rows > 0 the table is
// a block of a larger vocabulary (tensor parallelism: one rank's rows): id maps to table row
// id - id_begin, and an id outside [id_begin, id_begin + id_rows) gives a row of zeros.
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
  int64_t id_begin = 0;  // the vocabulary id of table row 0
  int64_t id_rows = 0;   // > 0: ids outside [id_begin, id_begin + id_rows) read zeros
};

// The table row of id (or -1: a row of zeros).
inline int64_t embedding_row(const EmbeddingArgs& a, int64_t id) {
  const int64_t r = id - a.id_begin;
  return a.id_rows > 0 && (r < 0 || r >= a.id_rows) ? -1 : r;
}

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
