// model/fully_sharded_lora.cc: fully sharded LoRA (--fully-sharded-loras; fully_sharded_lora.h): a rank's
// share of the dense modules, and Model::fully_sharded_lora, which applies them with their collectives.
#include "model/fully_sharded_lora.h"

#include <algorithm>

#include "common/error.h"
#include "model/model.h"
#include "model/model_step.h"
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

// The host values of a fully sharded matrix before upload.
struct HostMatrix {
  FullyShardedMatrix f;  // its counts (pointers set at upload)
  std::vector<float> a;
  std::vector<std::vector<float>> b_parts;
};

// m: the rank's default share of the module (column: A whole, B's output rows; row: A's input columns, B
// whole).
HostMatrix fully_shard(LoraModule module, const LoraMatrix& m, const ModelConfig& cfg, const TpShard& s) {
  const int64_t N = s.size, r = m.rank;
  HostMatrix h;
  FullyShardedMatrix& f = h.f;
  f.column = column_parallel(module);
  f.rank = r;
  f.in = m.in;
  f.scale = m.scale;
  if (f.column) {
    const int64_t p = (r + N - 1) / N, first = s.rank * p;
    f.width = p;
    f.out = m.out;
    h.a.assign(static_cast<size_t>(p * m.in), 0.0f);
    for (int64_t i = 0; i < p && first + i < r; ++i)
      std::copy_n(m.a.begin() + (first + i) * m.in, m.in, h.a.begin() + i * m.in);
    h.b_parts.assign(static_cast<size_t>(N), std::vector<float>(static_cast<size_t>(m.out * p), 0.0f));
    for (int64_t j = 0; j < N; ++j)
      for (int64_t o = 0; o < m.out; ++o)
        for (int64_t c = 0; c < p && j * p + c < r; ++c)
          h.b_parts[static_cast<size_t>(j)][static_cast<size_t>(o * p + c)] =
              m.b[static_cast<size_t>(o * r + j * p + c)];
  } else {
    CHECK(m.out % N == 0 && m.out == cfg.hidden_size);
    f.width = r;
    f.out = m.out / N;
    h.a = m.a;
    h.b_parts.emplace_back(m.b.begin() + s.rank * f.out * r, m.b.begin() + (s.rank + 1) * f.out * r);
  }
  return h;
}

}  // namespace

FullyShardedLora::~FullyShardedLora() {
  if (!backend) return;
  for (const void* p : owned) {
    try {
      backend->free(const_cast<void*>(p));
    } catch (...) {  // a failed device: nothing to give back
    }
  }
}

std::pair<std::shared_ptr<const LoraAdapter>, std::shared_ptr<const FullyShardedLora>> split_fully_sharded(
    const LoraAdapter& rank_share, const ModelConfig& cfg, const TpShard& shard, Backend& be) {
  auto stacks = std::make_shared<LoraAdapter>(rank_share);
  auto fs = std::make_shared<FullyShardedLora>();
  fs->backend = &be;
  auto upload = [&](const std::vector<float>& v) {
    const float* d = be.vector_from_host(v.data(), v.size());
    fs->owned.push_back(d);
    return d;
  };
  fs->layers.resize(rank_share.layers.size());
  for (size_t l = 0; l < rank_share.layers.size(); ++l)
    for (size_t m = 0; m < kNumLoraModules; ++m) {
      std::optional<LoraMatrix>& mat = stacks->layers[l].modules[m];
      if (!mat) continue;
      HostMatrix h = fully_shard(static_cast<LoraModule>(m), *mat, cfg, shard);
      h.f.a = upload(h.a);
      for (const std::vector<float>& part : h.b_parts) h.f.b_parts.push_back(upload(part));
      h.f.eye = upload(identity(h.f.width));
      fs->layers[l][m] = std::move(h.f);
      mat.reset();  // applied by Model::fully_sharded_lora, not by the stacks
    }
  return {std::move(stacks), std::move(fs)};
}

void Model::fully_sharded_lora(int64_t layer, LoraModule module, const float* x, int64_t ldx, int64_t T,
                               float* y, int64_t ldy, const StepInputs& si, const int32_t* rows) {
  CHECK(comm_ && tp_.fully_sharded_loras);
  Backend& be = *backend_;
  Workspace& ws = *ws_;
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
  for (int32_t slot : si.adapters.slots)
    if (const FullyShardedMatrix* f = matrix(slot)) width = std::max(width, f->width);
  if (width == 0) return;
  // Each slot's tokens: rows[offset, offset + count) of the staged row lists (Model::stage).
  auto slot_rows = [&](int32_t slot) { return si.fs_rows.at(slot); };
  const bool dry = be.dry_run();

  // Shrink: this rank's rows of A (column) or its input columns (row), scaled, into [T, width].
  float* shrink = ensure_buffer<float>(be, ws.fs_shrink, static_cast<size_t>(T * width), ws.epoch);
  be.fill_zero(shrink, static_cast<size_t>(T * width) * sizeof(float));
  for (int32_t slot : si.adapters.slots) {
    const FullyShardedMatrix* f = matrix(slot);
    const auto [offset, count] = slot_rows(slot);
    if (!f || count == 0) continue;
    be.lora_apply({.x = x,
                   .ldx = ldx,
                   .y = shrink,
                   .ldy = width,
                   .rows = rows + offset,
                   .num_rows = count,
                   .lora = {f->a, f->eye, f->width, f->in, f->width, f->scale}});
  }
  if (!column) {
    // Row-parallel: the ranks' partial shrinks summed; each rank expands its rows of B into its slice of y.
    if (!dry) comm_->all_reduce(shrink, shrink, static_cast<size_t>(T * width), DType::kF32, ReduceOp::kSum);
    for (int32_t slot : si.adapters.slots) {
      const FullyShardedMatrix* f = matrix(slot);
      const auto [offset, count] = slot_rows(slot);
      if (!f || count == 0) continue;
      be.lora_apply({.x = shrink,
                     .ldx = width,
                     .y = y + tp_.rank * f->out,
                     .ldy = ldy,
                     .rows = rows + offset,
                     .num_rows = count,
                     .lora = {f->eye, f->b_parts[0], f->rank, f->rank, f->out, 1.0f}});
    }
    return;
  }
  // Column-parallel: every rank's shrinks gathered ([N, T, width]); rank j's p values of a token's A·x are
  // expanded through part j of this rank's output rows of B, one part after the other.
  float* gathered = ensure_buffer<float>(be, ws.fs_gathered, static_cast<size_t>(N * T * width), ws.epoch);
  if (!dry) comm_->all_gather(shrink, gathered, static_cast<size_t>(T * width), DType::kF32);
  for (int32_t slot : si.adapters.slots) {
    const FullyShardedMatrix* f = matrix(slot);
    const auto [offset, count] = slot_rows(slot);
    if (!f || count == 0) continue;
    for (int64_t j = 0; j < N; ++j)
      be.lora_apply({.x = gathered + j * T * width,
                     .ldx = width,
                     .y = y,
                     .ldy = ldy,
                     .rows = rows + offset,
                     .num_rows = count,
                     .lora = {f->eye, f->b_parts[static_cast<size_t>(j)], f->width, f->width, f->out, 1.0f}});
  }
}

}  // namespace polylora
