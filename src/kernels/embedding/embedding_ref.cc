// kernels/embedding/embedding_ref.cc: reference embedding lookup.
#include "kernels/embedding/embedding.h"

namespace polylora::kernels::ref {

void embedding(const EmbeddingArgs& a) {
  for (int64_t t = 0; t < a.m; ++t) a.table.row_to_f32(a.ids[t], a.out + t * a.ld_out);
}

}  // namespace polylora::kernels::ref
