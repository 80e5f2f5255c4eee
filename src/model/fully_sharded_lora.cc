// model/fully_sharded_lora.cc: fully sharded LoRA (--fully-sharded-loras; fully_sharded_lora.h): a rank's
// share of the dense modules, and Model::fully_sharded_lora, which applies them with their collectives.
#include "model/fully_sharded_lora.h"

#include <algorithm>

#include "common/error.h"
#include "model/model.h"
#include "runtime/communicator.h"

namespace polylora {

namespace {

bool column_parallel(LoraModule m) {
  switch (m) {
    case LoraModule::kQ:
    case LoraModule::kK:
    case LoraModule::kV:
    case LoraModule::kGate:
    case LoraModule::kUp:
      return true;
    case LoraModule::kO:
    case LoraModule::kDown:
      return false;
  }
  return false;
}

std::vector<float> identity(int64_t n) {
  std::vector<float> e(static_cast<size_t>(n * n), 0.0f);
  for (int64_t i = 0; i < n; ++i) e[static_cast<size_t>(i * n + i)] = 1.0f;
  return e;
}

// m: the rank's default share of the module (column: A whole, B's output rows; row: A's input columns, B
// whole).
FullyShardedMatrix fully_shard(LoraModule module, const LoraMatrix& m, const ModelConfig& cfg,
                               const TpShard& s) {
  const int64_t N = s.size, r = m.rank;
  FullyShardedMatrix f;
  f.column = column_parallel(module);
  f.rank = r;
  f.in = m.in;
  f.scale = m.scale;
  if (f.column) {
    const int64_t p = (r + N - 1) / N, first = s.rank * p;
    f.width = p;
    f.out = m.out;
    f.a.assign(static_cast<size_t>(p * m.in), 0.0f);
    for (int64_t i = 0; i < p && first + i < r; ++i)
      std::copy_n(m.a.begin() + (first + i) * m.in, m.in, f.a.begin() + i * m.in);
    f.b.assign(static_cast<size_t>(m.out * N * p), 0.0f);
    for (int64_t o = 0; o < m.out; ++o) std::copy_n(m.b.begin() + o * r, r, f.b.begin() + o * N * p);
    f.eye_expand = identity(N * p);
  } else {
    CHECK(m.out % N == 0 && m.out == cfg.hidden_size);
    f.width = r;
    f.out = m.out / N;
    f.a = m.a;
    f.b.assign(m.b.begin() + s.rank * f.out * r, m.b.begin() + (s.rank + 1) * f.out * r);
    f.eye_expand = identity(r);
  }
  f.eye_shrink = identity(f.width);
  return f;
}

}  // namespace

std::pair<std::shared_ptr<const LoraAdapter>, std::shared_ptr<const FullyShardedLora>> split_fully_sharded(
    const LoraAdapter& rank_share, const ModelConfig& cfg, const TpShard& shard) {
  auto stacks = std::make_shared<LoraAdapter>(rank_share);
  auto fs = std::make_shared<FullyShardedLora>();
  fs->layers.resize(rank_share.layers.size());
  for (size_t l = 0; l < rank_share.layers.size(); ++l)
    for (size_t m = 0; m < kNumLoraModules; ++m) {
      std::optional<LoraMatrix>& mat = stacks->layers[l].modules[m];
      if (!mat) continue;
      fs->layers[l][m] = fully_shard(static_cast<LoraModule>(m), *mat, cfg, shard);
      mat.reset();  // applied by Model::fully_sharded_lora, not by the stacks
    }
  return {std::move(stacks), std::move(fs)};
}

void Model::fully_sharded_lora(int64_t layer, LoraModule module, const float* x, int64_t ldx, int64_t T,
                               float* y, int64_t ldy, const AdapterBatch& ab) {
  CHECK(comm_ && tp_.fully_sharded_loras && backend_->kind() == DeviceKind::kCpu);
  FullyShardedScratch& s = fs_;
  const int64_t N = tp_.size;
  const bool column = column_parallel(module);
  // The step's slots with this module (the same on every rank: the same adapters), and the widest shrink.
  auto matrix = [&](int32_t slot) -> const FullyShardedMatrix* {
    if (static_cast<size_t>(slot) >= adapter_shards_.size()) return nullptr;
    const auto& fs = adapter_shards_[static_cast<size_t>(slot)].fully_sharded;
    if (!fs || static_cast<size_t>(layer) >= fs->layers.size()) return nullptr;
    const auto& m = fs->layers[static_cast<size_t>(layer)][static_cast<size_t>(module)];
    return m ? &*m : nullptr;
  };
  int64_t width = 0;
  for (int32_t slot : ab.slots)
    if (const FullyShardedMatrix* f = matrix(slot)) width = std::max(width, f->width);
  if (width == 0) return;
  s.rows.resize(std::max<size_t>(s.rows.size(), adapter_shards_.size()));
  for (int32_t slot : ab.slots)
    if (static_cast<size_t>(slot) < s.rows.size()) s.rows[static_cast<size_t>(slot)].clear();
  for (int64_t t = 0; t < T; ++t) {
    const int32_t slot = ab.token_slots[static_cast<size_t>(t)];
    if (slot >= 0 && matrix(slot)) s.rows[static_cast<size_t>(slot)].push_back(static_cast<int32_t>(t));
  }
  auto rows_of = [&](int32_t slot) -> const std::vector<int32_t>& {
    return s.rows[static_cast<size_t>(slot)];
  };

  // Shrink: this rank's rows of A (column) or its input columns (row), scaled, into [T, width].
  s.shrink.assign(static_cast<size_t>(T * width), 0.0f);
  for (int32_t slot : ab.slots) {
    const FullyShardedMatrix* f = matrix(slot);
    if (!f || rows_of(slot).empty()) continue;
    backend_->lora_apply({.x = x,
                          .ldx = ldx,
                          .y = s.shrink.data(),
                          .ldy = width,
                          .rows = rows_of(slot).data(),
                          .num_rows = static_cast<int64_t>(rows_of(slot).size()),
                          .lora = {f->a.data(), f->eye_shrink.data(), f->width, f->in, f->width, f->scale}});
  }
  if (!column) {
    // Row-parallel: the ranks' partial shrinks summed; each rank expands its rows of B into its slice of y.
    comm_->all_reduce(s.shrink.data(), s.shrink.data(), s.shrink.size(), DType::kF32, ReduceOp::kSum);
    for (int32_t slot : ab.slots) {
      const FullyShardedMatrix* f = matrix(slot);
      if (!f || rows_of(slot).empty()) continue;
      backend_->lora_apply({.x = s.shrink.data(),
                            .ldx = width,
                            .y = y + tp_.rank * f->out,
                            .ldy = ldy,
                            .rows = rows_of(slot).data(),
                            .num_rows = static_cast<int64_t>(rows_of(slot).size()),
                            .lora = {f->eye_expand.data(), f->b.data(), f->rank, f->rank, f->out, 1.0f}});
    }
    return;
  }
  // Column-parallel: every rank's shrink rows gathered; each token's A·x laid out in its adapter's rank order
  // (rank j's p values at j·p), then expanded through this rank's output rows of B.
  s.gathered.resize(static_cast<size_t>(N * T * width));
  comm_->all_gather(s.shrink.data(), s.gathered.data(), s.shrink.size(), DType::kF32);
  s.packed.assign(static_cast<size_t>(T * N * width), 0.0f);
  for (int32_t slot : ab.slots) {
    const FullyShardedMatrix* f = matrix(slot);
    if (!f) continue;
    for (int32_t t : rows_of(slot))
      for (int64_t j = 0; j < N; ++j)
        std::copy_n(s.gathered.begin() + (j * T + t) * width, f->width,
                    s.packed.begin() + t * N * width + j * f->width);
  }
  for (int32_t slot : ab.slots) {
    const FullyShardedMatrix* f = matrix(slot);
    if (!f || rows_of(slot).empty()) continue;
    backend_->lora_apply(
        {.x = s.packed.data(),
         .ldx = N * width,
         .y = y,
         .ldy = ldy,
         .rows = rows_of(slot).data(),
         .num_rows = static_cast<int64_t>(rows_of(slot).size()),
         .lora = {f->eye_expand.data(), f->b.data(), N * f->width, N * f->width, f->out, 1.0f}});
  }
}

}  // namespace polylora
