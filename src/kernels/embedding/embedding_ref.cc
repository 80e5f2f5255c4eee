// kernels/embedding/embedding_ref.cc: reference embedding lookup.
#include "kernels/embedding/embedding.h"

namespace polylora::kernels::ref {

void embedding(const EmbeddingArgs& a) {
  for (int64_t t = 0; t < a.m; ++t) {
    const int64_t row = embedding_row(a, a.ids[t]);
    float* o = a.out + t * a.ld_out;
    if (row < 0) {
      for (int64_t c = 0; c < a.table.cols; ++c) o[c] = 0.0f;
    } else {
      a.table.row_to_f32(row, o);
    }
  }
}

}  // namespace polylora::kernels::ref
