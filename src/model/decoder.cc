// model/decoder.cc: loading and the one forward pass shared by all architectures and backends:
// embedding -> per layer [RMSNorm -> q/k/v (+LoRA) -> (q/k norm) -> RoPE -> KV-cache write -> paged
// attention -> o (+LoRA) -> residual -> RMSNorm -> dense SwiGLU MLP (+LoRA) or MoE (router, experts, expert
// LoRA) -> residual] -> final RMSNorm -> LM head on the rows whose logits are wanted. Each residual add runs
// fused with the norm after it (add_rms_norm) and q/k norm, RoPE and the cache write are one op
// (rope_kv_write).
// A step's inputs (ids, positions, block tables, slots, adapter rows and expert-LoRA tables) are packed
// on the host and copied to the backend once per forward; nothing is read back until the logits.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <tuple>

#include "common/error.h"
#include "common/log.h"
#include "lora/adapter_batch.h"
#include "model/arch/arch.h"
#include "model/model.h"
#include "model/quantize.h"
#include "runtime/rank_threads.h"

namespace polylora {

namespace k = kernels;

namespace {
struct Buffer {
  void* ptr = nullptr;
  size_t cap = 0;
};
}  // namespace

struct Model::Workspace {
  Buffer x, h, q, kk, v, attn, tmp, gate, up, act, router, route_w, route_ids, logits_in, logits, inputs;
  Buffer lora_tmp;      // dense LoRA split over other ops: the q/k/v and o shrinks' sums [rows, ranks]
  Buffer graph_inputs;  // fixed once graphs are prepared: every graph reads its inputs here
  Buffer ids;           // argmax ids of the output rows (forward_argmax)
  std::vector<std::byte> staging;  // where a step's inputs are packed
  std::vector<int32_t> shard_ids;  // tensor parallelism: the step's token ids as rows of this rank's table
  Buffer logits_shard, logits_all;  // tensor parallelism: this rank's logits columns, every rank's
  // Two page-locked buffers the packed inputs are copied from, alternately: a step is staged while the
  // copy of the previous one may still be queued. `consumed` marks when the copy out of it has run.
  struct Pinned {
    void* ptr = nullptr;
    size_t cap = 0;
    void* consumed = nullptr;
    bool in_use = false;
  };
  std::array<Pinned, 2> pinned;
  int next_pinned = 0;
  int64_t output_rows = 0;  // logits rows of the last launch
  uint64_t epoch = 0;       // moves when any buffer above is reallocated
};

// Events around each step (when timing is on): a ring, since a step is launched before the previous
// one has completed.
struct Model::StepTimer {
  struct Slot {
    void* start = nullptr;
    void* end = nullptr;
  };
  std::array<Slot, 4> slots;
  int next = 0;
  std::deque<int> open;   // launched, not yet completed (oldest first)
  int last_done = -1;     // slot of the last completed step
  bool ended_last = true;  // end_step() was called for the most recent launch
};

// A step's inputs packed in host staging: offsets of each array, and the step's adapter batch.
struct Model::StepInputs {
  size_t o_ids = 0, o_pos = 0, o_qs = 0, o_ctx = 0, o_bt = 0, o_slot = 0, o_rows = 0, o_tslots = 0, o_feed = 0;
  AdapterBatch adapters;
  // Launch the LoRA kernels of every module the stacks hold, whatever the step's adapters (graphs with
  // LoRA: any mix of slots replays them; the kernels skip tokens and slots without LoRA).
  bool all_lora = false;
};

struct Model::Graph {
  void* exec = nullptr;
  uint64_t ws_epoch = 0, backend_epoch = 0;
  const void* kv_key = nullptr;   // the KV cache it was captured with
};

namespace {

// Grows `b` to at least `bytes` (contents are not kept) and returns it. Every reallocation moves
// `epoch` (captured graphs hold the old pointers).
template <typename T>
T* ensure(Backend& be, Buffer& b, size_t count, uint64_t& epoch) {
  size_t bytes = count * sizeof(T);
  if (b.cap < bytes) {
    ++epoch;
    if (b.ptr) be.free(b.ptr);
    b.cap = std::max(bytes, b.cap + b.cap / 2);
    b.ptr = be.alloc(b.cap);
  }
  return static_cast<T*>(b.ptr);
}

// Host staging of the step's inputs: append arrays at 256-byte aligned offsets, then one copy.
class Staging {
 public:
  explicit Staging(std::vector<std::byte>& buf) : buf_(buf) { buf_.clear(); }
  template <typename T>
  size_t add(const T* data, size_t n) {
    size_t off = (buf_.size() + 255) / 256 * 256;
    buf_.resize(off + n * sizeof(T));
    if (n) std::memcpy(buf_.data() + off, data, n * sizeof(T));
    return off;
  }
  template <typename T>
  size_t add(const std::vector<T>& v) {
    return add(v.data(), v.size());
  }
  size_t size() const { return buf_.size(); }
  const std::byte* data() const { return buf_.data(); }

 private:
  std::vector<std::byte>& buf_;
};

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& dir, const ModelLoadOptions& options,
                                   std::shared_ptr<Backend> backend) {
  namespace fs = std::filesystem;
  fs::path root(dir);
  if (!fs::is_directory(root)) fail("model directory {} does not exist", dir);
  ModelConfig cfg = ModelConfig::from_file((root / "config.json").string());
  if (options.load_format == LoadFormat::kDummy) {
    auto m = from_config(cfg, nullptr, options, std::move(backend));
    m->source_ = dir + " (dummy weights)";
    return m;
  }
  auto checkpoint = std::make_unique<Checkpoint>(Checkpoint::open_dir(dir, kModelCheckpointDTypes));
  auto m = from_config(cfg, checkpoint.get(), options, std::move(backend));
  if (m->backend_->kind() == DeviceKind::kCpu)  // views point into it
    (m->full_weights_ ? *m->full_weights_ : m->weights_).checkpoint = std::move(checkpoint);
  m->source_ = dir;
  return m;
}

std::unique_ptr<Model> Model::from_config(const ModelConfig& config, const Checkpoint* checkpoint,
                                          const ModelLoadOptions& options, std::shared_ptr<Backend> backend) {
  check_quantization(options.quantization, config, checkpoint ? checkpoint->location() : "the dummy model");
  std::unique_ptr<Model> m(new Model());
  m->config_ = config;
  m->shard_cfg_ = config;
  m->backend_ = backend ? std::move(backend) : std::shared_ptr<Backend>(make_cpu_backend());
  const int tp = options.tensor_parallel_size;
  if (tp != 1 && m->backend_->kind() != DeviceKind::kCpu)
    fail(
        "--tensor-parallel-size {}: multi-GPU tensor parallelism is not implemented yet (the NCCL "
        "communicator exists, but the model does not run its ranks on GPUs); use --tensor-parallel-size 1 "
        "on --device cuda (--device cpu runs any size the model's heads allow)",
        tp);
  const TpLayout layout{.size = tp,
                        .expert_parallel = options.enable_expert_parallel,
                        .fully_sharded_loras = options.fully_sharded_loras};
  check_tensor_parallel(config, layout);
  WeightLoader loader(checkpoint, *m->backend_, m->weights_, options.seed, options.upload);
  arch::bind(config, loader, m->weights_);
  loader.finish();  // the staged path reads and uploads everything here
  if (options.quantization == WeightQuantization::kInt8)
    quantize_weights_int8(m->weights_, loader, *m->backend_);
  m->rope_ = RopeTable::from_config(config);
  m->inv_freq_ = m->backend_->vector_from_host(m->rope_.inv_freq.data(), m->rope_.inv_freq.size());
  m->init_workspace();
  if (tp > 1) m->split_tensor_parallel(layout);
  m->backend_->synchronize();
  return m;
}

Model::Model() = default;

void Model::init_workspace() { ws_ = std::make_unique<Workspace>(); }

Model::~Model() {
  tp_threads_.reset();  // the other ranks' threads, then the ranks (their views point into full_weights_)
  tp_ranks_.clear();
  if (!backend_) return;
  backend_->synchronize();
  for (auto& [size, g] : graphs_) backend_->destroy_graph(g.exec);
  if (ws_)
    for (auto& p : ws_->pinned) {
      backend_->free_host(p.ptr);
      backend_->destroy_event(p.consumed);
    }
  if (timer_)
    for (auto& s : timer_->slots) {
      backend_->destroy_event(s.start);
      backend_->destroy_event(s.end);
    }
}

void Model::reserve_adapters(int64_t slots, int64_t max_rank) {
  for_each_rank([&](Model& m) { m.reserve_local(slots, max_rank); });
}

void Model::set_adapter_slots(int64_t slots) {
  for_each_rank([&](Model& m) { m.adapter_slots_hint_ = slots; });
}

void Model::set_async_uploads(bool on) {
  for_each_rank([&](Model& m) { m.async_uploads_ = on; });
}

void Model::set_upload_delay_for_tests(int ms) {
  for_each_rank([&](Model& m) { m.upload_delay_ms_ = ms; });
}

void Model::reserve_local(int64_t slots, int64_t max_rank) {
  if (!lora_) lora_ = std::make_unique<LoraStacks>(*backend_, shard_cfg_);
  backend_->synchronize();  // no queued step reads the old stacks
  lora_->reserve(slots, max_rank);
  ++ws_->epoch;  // graphs hold the stacks' pointers
}

void Model::free_adapter_slot(int32_t slot) {
  for_each_rank([&](Model& m) {
    if (m.lora_) m.lora_->clear(slot);
  });
}

void Model::upload_adapter(int32_t slot, const LoraAdapter& adapter) {
  for_each_rank([&](Model& m) { m.ensure_uploaded(slot, adapter); });
}

void Model::begin_upload(int32_t slot, std::shared_ptr<const LoraAdapter> adapter) {
  CHECK(adapter != nullptr);
  for_each_rank([&](Model& m) { m.begin_upload_local(slot, adapter); });
}

void Model::begin_upload_local(int32_t slot, std::shared_ptr<const LoraAdapter> adapter) {
  if (!async_uploads_) return ensure_uploaded(slot, *adapter);
  if (&rank_adapter(slot, *adapter) != adapter.get()) adapter = adapter_shards_[static_cast<size_t>(slot)].shard;
  if (lora_ && lora_->holds(slot, *adapter)) return;
  fit_stacks(slot, *adapter);
  lora_->begin_upload(slot, std::move(adapter), upload_delay_ms_);
}

bool Model::upload_done(int32_t slot) {
  bool done = true;
  for_each_rank([&](Model& m) { done = done && (!m.lora_ || m.lora_->upload_done(slot)); });
  return done;
}

void Model::finish_upload(int32_t slot) {
  for_each_rank([&](Model& m) {
    if (m.lora_) m.lora_->finish_upload(slot);
  });
}

AdapterDevice::UploadTiming Model::upload_timing() const {
  if (!lora_) return {};
  const LoraStacks::UploadTiming t = lora_->upload_timing();
  return {.count = t.count, .seconds = t.seconds, .bytes = t.bytes};
}

void Model::fit_stacks(int32_t slot, const LoraAdapter& adapter) {
  if (!lora_ || slot >= lora_->slots() || adapter.max_rank > lora_->rank())
    reserve_local(std::max<int64_t>({slot + 1, lora_ ? lora_->slots() : 0, adapter_slots_hint_}),
                  std::max<int64_t>({adapter.max_rank, lora_ ? lora_->rank() : 0, 1}));
}

void Model::ensure_uploaded(int32_t slot, const LoraAdapter& full) {
  if (lora_ && lora_->upload_pending(slot)) lora_->finish_upload(slot);  // begun, not yet finished
  const LoraAdapter& adapter = rank_adapter(slot, full);
  if (lora_ && lora_->holds(slot, adapter)) return;
  fit_stacks(slot, adapter);
  lora_->upload(slot, adapter);
}

void Model::forward(const ForwardBatch& b, std::span<const k::KvCacheView> kv,
                    std::span<const LoraAdapter* const> adapters, float* logits) {
  forward_impl(b, kv, adapters, logits, nullptr);
}

void Model::forward_argmax(const ForwardBatch& b, std::span<const k::KvCacheView> kv,
                           std::span<const LoraAdapter* const> adapters, int32_t* ids) {
  forward_impl(b, kv, adapters, nullptr, ids);
}

void Model::read_output(int64_t rows, float* logits, int32_t* ids) {
  Backend& be = *backend_;
  Workspace& ws = *ws_;
  const int64_t V = config_.vocab_size;
  if (rows <= 0) return;
  if (logits) {
    be.copy_to_host(logits, ws.logits.ptr, static_cast<size_t>(rows * V) * sizeof(float));
    return;
  }
  uint64_t unused_epoch = 0;  // no graph reads this buffer
  auto* d_ids = ensure<int32_t>(be, ws.ids, static_cast<size_t>(rows), unused_epoch);
  be.argmax_rows(static_cast<const float*>(ws.logits.ptr), rows, V, d_ids);
  be.copy_to_host(ids, d_ids, static_cast<size_t>(rows) * sizeof(int32_t));
}

void Model::forward_impl(const ForwardBatch& b, std::span<const k::KvCacheView> kv,
                         std::span<const LoraAdapter* const> adapters, float* logits, int32_t* ids) {
  launch(b, kv, adapters);
  read_output(ws_->output_rows, logits, ids);
  end_step();
  step_completed();
}

void Model::launch(const ForwardBatch& b, std::span<const k::KvCacheView> kv,
                   std::span<const LoraAdapter* const> adapters, const TokenFeed& feed) {
  const ModelConfig& c = config_;
  Backend& be = *backend_;
  Workspace& ws = *ws_;
  const int64_t T = b.num_tokens(), S = b.num_seqs();
  CHECK(static_cast<int64_t>(kv.size()) == c.num_layers);
  CHECK(static_cast<int64_t>(b.query_start.size()) == S + 1 && b.query_start[S] == T);
  CHECK(static_cast<int64_t>(b.positions.size()) == T && static_cast<int64_t>(b.slot_mapping.size()) == T);
  CHECK(static_cast<int64_t>(b.block_tables.size()) == S * b.max_blocks_per_seq);
  for (int32_t id : b.token_ids)
    if (id < 0 || id >= c.vocab_size)
      fail("token id {} is outside the vocabulary (size {})", id, c.vocab_size);
  for (int32_t row : b.logits_rows) CHECK(row >= 0 && row < T);
  CHECK(feed.pairs.size() % 2 == 0 && (feed.empty() || feed.src));
  for (size_t i = 0; i < feed.pairs.size(); i += 2) CHECK(feed.pairs[i] >= 0 && feed.pairs[i] < T);
  ws.output_rows = 0;
  if (T == 0) return;
  if (gpu_timing_) {
    if (!timer_) timer_ = std::make_unique<StepTimer>();
    StepTimer& t = *timer_;
    CHECK_MSG(t.open.size() < 2, "more than two steps launched without step_completed()");
    int slot = t.next;
    t.next = (t.next + 1) % static_cast<int>(t.slots.size());
    if (!t.slots[slot].start) {
      t.slots[slot].start = be.create_event();
      t.slots[slot].end = be.create_event();
    }
    if (t.slots[slot].start) be.record_event(t.slots[slot].start);
    t.open.push_back(slot);
    t.ended_last = false;
  }
  ws.output_rows = static_cast<int64_t>(b.logits_rows.size());
  if (graphs_enabled_ && graph_eligible(b, adapters)) return launch_graph(b, kv, adapters, feed);
  if (tp_threads_) return launch_tensor_parallel(b, kv, adapters, feed);
  run_eager(b, kv, adapters, feed);
}

void Model::run_eager(const ForwardBatch& b, std::span<const k::KvCacheView> kv,
                      std::span<const LoraAdapter* const> adapters, const TokenFeed& feed) {
  Workspace& ws = *ws_;
  StepInputs si = stage(b, adapters, feed.pairs);
  auto* inputs = ensure<std::byte>(*backend_, ws.inputs, ws.staging.size(), ws.epoch);
  upload_inputs(inputs, si, feed);
  run_layers(b, kv, si, inputs);
}

const float* Model::device_logits() const {
  return ws_->output_rows > 0 ? static_cast<const float*>(ws_->logits.ptr) : nullptr;
}

void Model::end_step() {
  if (!timer_ || timer_->ended_last || timer_->open.empty()) return;
  const StepTimer::Slot& s = timer_->slots[static_cast<size_t>(timer_->open.back())];
  if (s.end) backend_->record_event(s.end);
  timer_->ended_last = true;
}

void Model::step_completed() {
  if (!timer_ || timer_->open.empty()) return;
  StepTimer& t = *timer_;
  if (t.open.size() == 1 && !t.ended_last) end_step();
  const int slot = t.open.front();
  t.open.pop_front();
  const StepTimer::Slot& s = t.slots[static_cast<size_t>(slot)];
  if (!s.end) return;
  Backend& be = *backend_;
  be.wait_event(s.end);
  last_gpu_seconds_ = be.event_elapsed(s.start, s.end);
  last_gap_seconds_ = t.last_done >= 0 ? be.event_elapsed(t.slots[static_cast<size_t>(t.last_done)].end, s.start) : 0;
  t.last_done = slot;
}

void Model::upload_inputs(std::byte* dst, const StepInputs& si, const TokenFeed& feed) {
  Backend& be = *backend_;
  Workspace& ws = *ws_;
  Workspace::Pinned& p = ws.pinned[static_cast<size_t>(ws.next_pinned)];
  ws.next_pinned ^= 1;
  if (p.in_use) be.wait_event(p.consumed);  // its copy (two launches ago) has run: normally long since
  const size_t n = ws.staging.size();
  if (p.cap < n) {
    be.free_host(p.ptr);
    p.cap = std::max<size_t>({n, size_t{64} << 10, p.cap + p.cap / 2});
    p.ptr = be.alloc_host(p.cap);
    if (!p.consumed) p.consumed = be.create_event();
  }
  std::memcpy(p.ptr, ws.staging.data(), n);
  be.copy_to_device_async(dst, p.ptr, n);
  if (p.consumed) {
    be.record_event(p.consumed);
    p.in_use = true;
  }
  if (!feed.empty())
    be.feed_tokens(reinterpret_cast<int32_t*>(dst + si.o_ids), reinterpret_cast<const int32_t*>(dst + si.o_feed),
                   static_cast<int64_t>(feed.pairs.size() / 2), feed.src);
}

Model::StepInputs Model::stage(const ForwardBatch& b, std::span<const LoraAdapter* const> adapters,
                               std::span<const int32_t> feed_pairs) {
  const ModelConfig& c = config_;
  Workspace& ws = *ws_;
  // Adapters of this step: each token's slot, and where they have LoRA (lora/adapter_batch.h). Every
  // slot the step uses must hold its adapter in the stacks (copied now when it does not: direct callers).
  StepInputs si;
  si.adapters = build_adapter_batch(b.adapter_slots, b.query_start, adapters, c.num_layers);
  if (!si.adapters.empty()) {
    int64_t need_slots = 0, need_rank = 1;
    for (int32_t slot : si.adapters.slots) {
      need_slots = std::max<int64_t>(need_slots, slot + 1);
      need_rank = std::max(need_rank, adapters[static_cast<size_t>(slot)]->max_rank);
    }
    if (!lora_ || need_slots > lora_->slots() || need_rank > lora_->rank())
      reserve_local(std::max({need_slots, lora_ ? lora_->slots() : 0, adapter_slots_hint_}),
                    std::max(need_rank, lora_ ? lora_->rank() : 0));
    for (int32_t slot : si.adapters.slots) ensure_uploaded(slot, *adapters[static_cast<size_t>(slot)]);
  }

  // Pack every step input into one host buffer and copy it once.
  Staging st(ws.staging);
  if (comm_) shard_token_ids(b.token_ids, tp_, ws.shard_ids);
  si.o_ids = st.add(comm_ ? ws.shard_ids : b.token_ids);
  si.o_pos = st.add(b.positions);
  si.o_qs = st.add(b.query_start);
  si.o_ctx = st.add(b.context_lens);
  si.o_bt = st.add(b.block_tables);
  si.o_slot = st.add(b.slot_mapping);
  si.o_rows = st.add(b.logits_rows);
  si.o_tslots = st.add(si.adapters.token_slots);
  si.o_feed = st.add(feed_pairs.data(), feed_pairs.size());
  return si;
}

void Model::run_layers(const ForwardBatch& b, std::span<const k::KvCacheView> kv, const StepInputs& si,
                       std::byte* inputs) {
  const ModelConfig& c = shard_cfg_;
  Backend& be = *backend_;
  Workspace& ws = *ws_;
  const int64_t T = b.num_tokens(), H = c.hidden_size, S = b.num_seqs();
  const int64_t qs = c.q_size(), kvs = c.kv_size(), D = c.head_dim;
  // E: the router's experts (all of them); shard_cfg_ counts this rank's (expert parallelism: E / N).
  const int64_t E = config_.num_experts, K = c.num_experts_per_tok;
  const int64_t R = static_cast<int64_t>(b.logits_rows.size());
  auto at = [&](size_t off) { return inputs + off; };
  const auto* d_ids = reinterpret_cast<const int32_t*>(at(si.o_ids));
  const auto* d_pos = reinterpret_cast<const int32_t*>(at(si.o_pos));
  const auto* d_qs = reinterpret_cast<const int32_t*>(at(si.o_qs));
  const auto* d_ctx = reinterpret_cast<const int32_t*>(at(si.o_ctx));
  const auto* d_bt = reinterpret_cast<const int32_t*>(at(si.o_bt));
  const auto* d_slot = reinterpret_cast<const int64_t*>(at(si.o_slot));
  const auto* d_rows = reinterpret_cast<const int32_t*>(at(si.o_rows));
  const auto* d_tslots = reinterpret_cast<const int32_t*>(at(si.o_tslots));

  // Whether this step queues LoRA kernels (the backend may launch them differently: Backend::set_lora_step).
  struct LoraStepScope {
    Backend& be;
    LoraStepScope(Backend& b, bool lora, int64_t tokens) : be(b) { be.set_lora_step(lora, tokens); }
    ~LoraStepScope() { be.set_lora_step(false, 0); }
  } lora_scope(be, lora_ && lora_->reserved() && (si.all_lora || !si.adapters.empty()), T);
  float* x = ensure<float>(be, ws.x, T * H, ws.epoch);
  float* h = ensure<float>(be, ws.h, T * H, ws.epoch);
  float* q = ensure<float>(be, ws.q, T * qs, ws.epoch);
  float* kk = ensure<float>(be, ws.kk, T * kvs, ws.epoch);
  float* v = ensure<float>(be, ws.v, T * kvs, ws.epoch);
  float* attn = ensure<float>(be, ws.attn, T * qs, ws.epoch);
  float* tmp = ensure<float>(be, ws.tmp, T * H, ws.epoch);
  const float eps = static_cast<float>(c.rms_norm_eps);

  // LoRA of a group of modules sharing one input (q/k/v, dense gate/up) or of one module: the batched
  // kernels over every token's slot, where some adapter of the step has the module (or, for graphs with
  // LoRA, wherever the stacks hold it).
  auto lora_active = [&](int64_t layer, LoraModule m) {
    if (!lora_ || !lora_->reserved() || lora_->dense(layer, m).empty()) return false;
    return si.all_lora || (!si.adapters.empty() && si.adapters.dense[static_cast<size_t>(layer)][static_cast<size_t>(m)]);
  };
  auto lora_group = [&](int64_t layer, const float* in, int64_t ldx,
                        std::initializer_list<std::tuple<LoraModule, float*, int64_t>> modules) {
    k::LoraBatchArgs a{.x = in, .ldx = ldx, .m = T, .token_slots = d_tslots, .num = 0};
    for (const auto& [m, y, ldy] : modules) {
      if (!lora_active(layer, m)) continue;
      a.w[a.num] = lora_->dense(layer, m);
      a.y[a.num] = y;
      a.ldy[a.num] = ldy;
      ++a.num;
    }
    if (a.num > 0) be.lora_batch(a);
    if (tp_.fully_sharded_loras && !si.adapters.empty())  // --fully-sharded-loras: not in the stacks
      for (const auto& [m, y, ldy] : modules)
        if (si.adapters.dense[static_cast<size_t>(layer)][static_cast<size_t>(m)])
          fully_sharded_lora(layer, m, in, ldx, T, y, ldy, si.adapters);
  };
  auto linear = [&](const LinearWeights& lw, const float* in, int64_t ldx, float* y, int64_t ldy,
                    const k::LoraBatchArgs* shrink = nullptr, float* shrink_tmp = nullptr,
                    int64_t ld_tmp = 0) {
    be.linear({.x = in,
               .m = T,
               .ldx = ldx,
               .w = lw.w,
               .bias = lw.bias,
               .y = y,
               .ldy = ldy,
               .lora_shrink = shrink,
               .lora_tmp = shrink_tmp,
               .lora_ld_tmp = ld_tmp});
  };
  // Decode-sized steps (Backend::split_dense_lora_max_rows) split the q/k/v and o LoRA over other ops: the
  // shrinks run with the q and o projections, the expands inside rope_kv_write and add_rms_norm. Not with
  // tensor parallelism (o's partial LoRA sums belong before the all_reduce). The shrinks' sums live in
  // lora_tmp, sized for the largest such step whenever the stacks exist (no allocation inside a capture).
  const bool split_lora = lora_ && lora_->reserved() && !comm_ && T <= be.split_dense_lora_max_rows();
  float* lora_tmp = nullptr;
  if (lora_ && lora_->reserved() && be.split_dense_lora_max_rows() > 0)
    lora_tmp = ensure<float>(
        be, ws.lora_tmp, static_cast<size_t>(be.split_dense_lora_max_rows() * 4 * lora_->rank()), ws.epoch);
  // The split shrink of the active modules among `modules` (their sums side by side in lora_tmp, then
  // `expand` gets each module's LoraExpandIn, empty where the module has no LoRA this step).
  auto split_group = [&](int64_t layer, const float* in, int64_t ldx,
                         std::initializer_list<LoraModule> modules, k::LoraBatchArgs& a,
                         k::LoraExpandIn* expand) {
    a = {.x = in, .ldx = ldx, .m = T, .token_slots = d_tslots, .num = 0};
    int64_t first = 0, i = 0;
    for (LoraModule m : modules) {
      expand[i] = {};
      if (lora_active(layer, m)) {
        a.w[a.num++] = lora_->dense(layer, m);
        expand[i] = {.token_slots = d_tslots, .tmp = lora_tmp, .first = first, .w = lora_->dense(layer, m)};
        first += lora_->dense(layer, m).rank;
      }
      ++i;
    }
    for (int64_t j = 0; j < i; ++j) expand[j].ld_tmp = first;
    return first;
  };

  be.embedding({.ids = d_ids, .m = T, .table = weights_.embed, .out = x, .ld_out = H});
  all_reduce_sum(x, T * H);  // tensor parallelism: each rank has its vocabulary rows, zeros elsewhere
  // The first layer's input norm; every later norm (post-attention, the next layer's input, the final one)
  // is fused with the residual add before it (add_rms_norm).
  be.rms_norm({.x = x,
               .ldx = H,
               .y = h,
               .ldy = H,
               .m = T,
               .n = H,
               .w = c.num_layers > 0 ? weights_.layers[0].input_norm : weights_.final_norm,
               .eps = eps});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = weights_.layers[l];
    const AttentionWeights& aw = lw.attn;
    k::LoraBatchArgs qkv_shrink;
    k::LoraExpandIn qkv_lora[3];
    const int64_t qkv_ranks =
        split_lora
            ? split_group(l, h, H, {LoraModule::kQ, LoraModule::kK, LoraModule::kV}, qkv_shrink, qkv_lora)
            : 0;
    // q, k and v read the same h: one launch where the backend can (CUDA at decode sizes).
    const k::LinearArgs qkv[3] = {
        {.x = h,
         .m = T,
         .ldx = H,
         .w = aw.q.w,
         .bias = aw.q.bias,
         .y = q,
         .ldy = qs,
         .lora_shrink = qkv_ranks > 0 ? &qkv_shrink : nullptr,
         .lora_tmp = lora_tmp,
         .lora_ld_tmp = qkv_ranks},
        {.x = h, .m = T, .ldx = H, .w = aw.k.w, .bias = aw.k.bias, .y = kk, .ldy = kvs},
        {.x = h, .m = T, .ldx = H, .w = aw.v.w, .bias = aw.v.bias, .y = v, .ldy = kvs}};
    be.linear_group(qkv);
    if (!split_lora)
      lora_group(l, h, H, {{LoraModule::kQ, q, qs}, {LoraModule::kK, kk, kvs}, {LoraModule::kV, v, kvs}});
    // Qwen3's per-head q/k norms, RoPE on q and k, k and v into the paged cache: one op (with the q/k/v
    // LoRA expands when split).
    be.rope_kv_write({.q = q,
                      .ldq = qs,
                      .k = kk,
                      .ldk = kvs,
                      .v = v,
                      .ldv = kvs,
                      .m = T,
                      .num_heads = c.num_heads,
                      .num_kv_heads = c.num_kv_heads,
                      .head_dim = D,
                      .positions = d_pos,
                      .inv_freq = inv_freq_,
                      .attention_scaling = rope_.attention_scaling,
                      .q_norm = c.qk_norm ? aw.q_norm : nullptr,
                      .k_norm = c.qk_norm ? aw.k_norm : nullptr,
                      .eps = eps,
                      .slot_mapping = d_slot,
                      .cache = kv[l],
                      .lora_q = qkv_lora[0],
                      .lora_k = qkv_lora[1],
                      .lora_v = qkv_lora[2]});
    be.attention({.q = q,
                  .ldq = qs,
                  .out = attn,
                  .ldo = qs,
                  .num_seqs = S,
                  .num_tokens = T,
                  .query_start = d_qs,
                  .context_lens = d_ctx,
                  .block_tables = d_bt,
                  .max_blocks_per_seq = b.max_blocks_per_seq,
                  .num_heads = c.num_heads,
                  .scale = 1.0f / std::sqrt(static_cast<float>(D)),
                  .window = c.layer_window(l),
                  .sinks = aw.sinks,
                  .cache = kv[l]});
    k::LoraBatchArgs o_shrink;
    k::LoraExpandIn o_lora[1];
    const int64_t o_ranks = split_lora ? split_group(l, attn, qs, {LoraModule::kO}, o_shrink, o_lora) : 0;
    // Its sums after q/k/v's in lora_tmp (rope_kv_write has read those).
    for (k::LoraExpandIn& e : o_lora) e.tmp = lora_tmp + T * qkv_ranks;
    linear(aw.o, attn, qs, tmp, H, o_ranks > 0 ? &o_shrink : nullptr, lora_tmp + T * qkv_ranks, o_ranks);
    if (!split_lora) lora_group(l, attn, qs, {{LoraModule::kO, tmp, H}});
    all_reduce_sum(tmp, T * H);  // row-parallel o_proj: the ranks' heads
    be.add_rms_norm({.x = x,
                     .ldx = H,
                     .delta = tmp,
                     .ld_delta = H,
                     .y = h,
                     .ldy = H,
                     .m = T,
                     .n = H,
                     .w = lw.post_attention_norm,
                     .eps = eps,
                     .lora_delta = o_lora[0]});
    if (!lw.is_moe) {
      int64_t I = c.intermediate_size;
      float* gate = ensure<float>(be, ws.gate, T * I, ws.epoch);
      float* up = ensure<float>(be, ws.up, T * I, ws.epoch);
      float* act = ensure<float>(be, ws.act, T * I, ws.epoch);
      linear(lw.mlp.gate, h, H, gate, I);
      linear(lw.mlp.up, h, H, up, I);
      lora_group(l, h, H, {{LoraModule::kGate, gate, I}, {LoraModule::kUp, up, I}});
      be.silu_and_mul(
          {.gate = gate, .ld_gate = I, .up = up, .ld_up = I, .out = act, .ld_out = I, .m = T, .n = I});
      linear(lw.mlp.down, act, I, tmp, H);
      lora_group(l, act, I, {{LoraModule::kDown, tmp, H}});
    } else {
      float* router = ensure<float>(be, ws.router, T * E, ws.epoch);
      float* route_w = ensure<float>(be, ws.route_w, T * K, ws.epoch);
      int32_t* route_ids = ensure<int32_t>(be, ws.route_ids, T * K, ws.epoch);
      be.linear({.x = h,
                 .m = T,
                 .ldx = H,
                 .w = lw.moe.router.w,
                 .bias = lw.moe.router.bias,
                 .y = router,
                 .ldy = E});
      be.route({.logits = router,
                .m = T,
                .num_experts = E,
                .top_k = K,
                .scoring = c.router == RouterKind::kTopKSoftmax ? k::RouterScoring::kTopKSoftmax
                                                                : k::RouterScoring::kSoftmaxTopK,
                .renormalize = c.norm_topk_prob,
                .ids = route_ids,
                .weights = route_w});
      // The stacks are passed whenever they exist (the workspace is sized with them), the token slots
      // only where LoRA runs in this layer.
      const k::MoeLoraStack expert_lora = lora_ ? lora_->experts(l) : k::MoeLoraStack{};
      const bool layer_lora =
          !expert_lora.empty() && (si.all_lora || (!si.adapters.empty() && si.adapters.experts[static_cast<size_t>(l)]));
      const k::MoeExpertsArgs moe{.x = h,
                                  .ldx = H,
                                  .m = T,
                                  .hidden = H,
                                  .inter = c.moe_intermediate_size,
                                  .num_experts = c.num_experts,
                                  .top_k = K,
                                  .ids = route_ids,
                                  .weights = route_w,
                                  .experts = lw.moe.experts_on_device,
                                  .experts_mxfp4 = lw.moe.experts.front().gate_up.mxfp4(),
                                  .experts_int8 = lw.moe.experts.front().down.int8(),
                                  .act = c.expert_activation == ExpertActivation::kGptOssClampedSwiglu
                                             ? k::ExpertAct::kGptOssSwiglu
                                             : k::ExpertAct::kSiluGate,
                                  .swiglu_alpha = static_cast<float>(c.swiglu_alpha),
                                  .swiglu_limit = static_cast<float>(c.swiglu_limit),
                                  .token_slots = layer_lora ? d_tslots : nullptr,
                                  .lora_stack = expert_lora,
                                  .out = tmp,
                                  .ldo = H};
      if (tp_.expert_parallel)
        moe_expert_parallel(moe, si.adapters.token_slots);  // dispatch, local experts, combine
      else
        be.moe_experts(moe);
    }
    all_reduce_sum(tmp, T * H);  // row-parallel down / experts' down: the ranks' intermediate columns
    // The residual add with the next norm: the next layer's input norm or, after the last layer, the final
    // norm (of every row: the LM head's rows are gathered from h); the add alone when no logits are wanted.
    const float* next_norm =
        l + 1 < c.num_layers ? weights_.layers[l + 1].input_norm : (R > 0 ? weights_.final_norm : nullptr);
    if (next_norm)
      be.add_rms_norm({.x = x,
                       .ldx = H,
                       .delta = tmp,
                       .ld_delta = H,
                       .y = h,
                       .ldy = H,
                       .m = T,
                       .n = H,
                       .w = next_norm,
                       .eps = eps});
    else
      be.add_inplace(x, tmp, T * H);
  }

  // LM head on the wanted rows only (h holds every row after the final norm).
  if (R == 0) return;
  float* logits_in = ensure<float>(be, ws.logits_in, R * H, ws.epoch);
  float* d_logits = ensure<float>(be, ws.logits, R * c.vocab_size, ws.epoch);
  be.gather_rows(h, d_rows, R, H, logits_in);
  if (comm_) return lm_head_parallel(logits_in, R, d_logits);
  be.linear({.x = logits_in,
             .m = R,
             .ldx = H,
             .w = weights_.lm_head,
             .bias = nullptr,
             .y = d_logits,
             .ldy = c.vocab_size});
  (void)S;
}

// The LM head over the vocabulary shards (tensor parallelism, CPU): this rank's logits columns
// [rows, vocab_stride] from its rows of the head, gathered from every rank; rank 0 lays them out as
// logits [rows, vocab].
void Model::lm_head_parallel(const float* in, int64_t rows, float* logits) {
  Backend& be = *backend_;
  Workspace& ws = *ws_;
  const int64_t V = config_.vocab_size, W = tp_.vocab_stride, N = tp_.size;
  float* mine = ensure<float>(be, ws.logits_shard, rows * W, ws.epoch);
  float* all = ensure<float>(be, ws.logits_all, N * rows * W, ws.epoch);
  be.linear({.x = in, .m = rows, .ldx = config_.hidden_size, .w = weights_.lm_head, .bias = nullptr, .y = mine, .ldy = W});
  comm_->all_gather(mine, all, static_cast<size_t>(rows * W), DType::kF32);
  if (tp_.rank != 0) return;
  for (int64_t r = 0; r < N; ++r) {
    const int64_t begin = std::min(V, r * W), n = std::min(W, V - begin);
    for (int64_t i = 0; i < rows; ++i)
      std::memcpy(logits + i * V + begin, all + (r * rows + i) * W, static_cast<size_t>(n) * sizeof(float));
  }
}

bool Model::graph_eligible(const ForwardBatch& b, std::span<const LoraAdapter* const> adapters) const {
  const int64_t S = b.num_seqs();
  if (graph_sizes_.empty() || S > graph_sizes_.back() || b.num_tokens() != S) return false;
  if (b.max_blocks_per_seq > graph_max_blocks_) return false;
  if (static_cast<int64_t>(b.logits_rows.size()) != S) return false;
  for (int64_t i = 0; i < S; ++i)
    if (b.logits_rows[i] != i) return false;
  (void)adapters;  // steps with adapters replay the graphs captured with the LoRA kernels
  return true;
}

// The batch padded to `size` sequences of one token: padding tokens write no KV (slot -1), see one key of
// block 0, and their logits rows are ignored. Block tables take the graphs' fixed width.
ForwardBatch Model::pad_for_graph(const ForwardBatch& b, int64_t size) const {
  const int64_t S = b.num_seqs(), MB = graph_max_blocks_;
  ForwardBatch p;
  p.token_ids = b.token_ids;
  p.token_ids.resize(static_cast<size_t>(size), 0);
  p.positions = b.positions;
  p.positions.resize(static_cast<size_t>(size), 0);
  p.context_lens = b.context_lens;
  p.context_lens.resize(static_cast<size_t>(size), 1);
  p.slot_mapping = b.slot_mapping;
  p.slot_mapping.resize(static_cast<size_t>(size), -1);
  p.query_start.resize(static_cast<size_t>(size + 1));
  for (int64_t i = 0; i <= size; ++i) p.query_start[i] = static_cast<int32_t>(i);
  p.logits_rows.resize(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) p.logits_rows[i] = static_cast<int32_t>(i);
  p.adapter_slots = b.adapter_slots;
  p.adapter_slots.resize(static_cast<size_t>(size), -1);
  p.max_blocks_per_seq = MB;
  p.block_tables.assign(static_cast<size_t>(size * MB), 0);
  for (int64_t s = 0; s < S; ++s)
    std::copy_n(b.block_tables.begin() + s * b.max_blocks_per_seq, b.max_blocks_per_seq,
                p.block_tables.begin() + s * MB);
  return p;
}

void Model::launch_graph(const ForwardBatch& b, std::span<const k::KvCacheView> kv,
                         std::span<const LoraAdapter* const> adapters, const TokenFeed& feed, bool with_lora) {
  Backend& be = *backend_;
  Workspace& ws = *ws_;
  const int64_t S = b.num_seqs();
  const int64_t size = *std::lower_bound(graph_sizes_.begin(), graph_sizes_.end(), S);
  ForwardBatch p = pad_for_graph(b, size);
  StepInputs si = stage(p, adapters, feed.pairs);
  // Steps with adapters replay the graph recorded with every LoRA kernel the stacks hold (which skip the
  // tokens and slots without LoRA), the others the one without.
  with_lora = (with_lora || !si.adapters.empty()) && lora_ && lora_->reserved();
  si.all_lora = with_lora;
  CHECK_MSG(ws.staging.size() <= ws.graph_inputs.cap, "graph inputs ({} bytes) exceed the reserved {}",
            ws.staging.size(), ws.graph_inputs.cap);
  auto* inputs = static_cast<std::byte*>(ws.graph_inputs.ptr);
  Graph& g = graphs_[{size, with_lora}];
  const void* kv_key = kv.empty() ? nullptr : kv[0].k;
  bool valid =
      g.exec && g.ws_epoch == ws.epoch && g.backend_epoch == be.workspace_epoch() && g.kv_key == kv_key;
  upload_inputs(inputs, si, feed);
  if (valid) {
    be.run_graph(g.exec);
    return;
  }
  // This step runs eagerly (sizing every buffer for this shape), then its shape is recorded.
  if (g.exec) be.destroy_graph(g.exec);
  g = Graph{};
  run_layers(p, kv, si, inputs);
  const uint64_t ws_epoch = ws.epoch, backend_epoch = be.workspace_epoch();
  be.begin_capture();
  run_layers(p, kv, si, inputs);
  void* exec = be.end_capture();
  if (!exec || ws.epoch != ws_epoch || be.workspace_epoch() != backend_epoch) {
    if (exec) be.destroy_graph(exec);
    spdlog::warn("CUDA graph capture of a {}-sequence decode step{} failed; running decode steps eagerly", size,
                 with_lora ? " with LoRA" : "");
    graphs_enabled_ = false;
    return;
  }
  g = {exec, ws_epoch, backend_epoch, kv_key};
}

void Model::warm_up(std::span<const k::KvCacheView> kv, int64_t tokens, int64_t logits_rows) {
  if (tokens <= 0 || kv.empty()) return;
  std::vector<float> logits;
  {
    const int64_t T = tokens, bs = kv.empty() ? 16 : kv[0].block_size;
    ForwardBatch w;
    w.token_ids.assign(static_cast<size_t>(T), 0);
    w.positions.resize(static_cast<size_t>(T));
    for (int64_t i = 0; i < T; ++i) w.positions[i] = static_cast<int32_t>(i);
    w.query_start = {0, static_cast<int32_t>(T)};
    w.context_lens = {static_cast<int32_t>(T)};
    w.max_blocks_per_seq = (T + bs - 1) / bs;
    w.block_tables.assign(static_cast<size_t>(w.max_blocks_per_seq), 0);
    w.slot_mapping.assign(static_cast<size_t>(T), -1);
    w.adapter_slots = {-1};
    const int64_t rows = std::min<int64_t>(T, std::max<int64_t>(1, logits_rows));
    for (int64_t i = 0; i < rows; ++i) w.logits_rows.push_back(static_cast<int32_t>(T - rows + i));
    logits.resize(static_cast<size_t>(rows * config_.vocab_size));
    bool enabled = graphs_enabled_;
    graphs_enabled_ = false;
    forward(w, kv, {}, logits.data());
    graphs_enabled_ = enabled;
    backend_->synchronize();
  }
}

void Model::prepare_graphs(std::span<const k::KvCacheView> kv, const GraphOptions& options) {
  for (auto& [size, g] : graphs_) backend_->destroy_graph(g.exec);
  graphs_.clear();
  graph_sizes_.clear();
  graphs_enabled_ = options.enabled && backend_->supports_graphs() && !options.sizes.empty();
  if (!graphs_enabled_) return;
  graph_sizes_ = options.sizes;
  std::sort(graph_sizes_.begin(), graph_sizes_.end());
  graph_sizes_.erase(std::unique(graph_sizes_.begin(), graph_sizes_.end()), graph_sizes_.end());
  graph_max_blocks_ = std::max<int64_t>(1, options.max_blocks_per_seq);
  auto t0 = std::chrono::steady_clock::now();
  Workspace& ws = *ws_;
  // Warm-up: the largest prefill the engine will run, so that its buffers are in place before any capture
  // (a later growth would invalidate the graphs, which are then recorded again at their next use).
  if (options.warmup_tokens > 0 && !kv.empty())
    warm_up(kv, options.warmup_tokens, options.warmup_logits_rows);
  // The inputs every graph reads: sized for the largest one, never moved.
  // (An empty batch padded to a size is that size's dummy decode step: no KV written.)
  // (The feed pairs, staged last, take at most two ids per sequence.)
  const std::vector<int32_t> max_feed(static_cast<size_t>(2 * graph_sizes_.back()), 0);
  stage(pad_for_graph(ForwardBatch{}, graph_sizes_.back()), {}, max_feed);
  ensure<std::byte>(*backend_, ws.graph_inputs, ws.staging.size(), ws.epoch);
  // Largest first: smaller shapes then fit the buffers the larger ones sized. Without a KV cache the
  // graphs are recorded at their first use instead.
  // With reserved adapter stacks, each size is also recorded with the LoRA kernels.
  const bool lora = lora_ && lora_->reserved();
  for (const bool with_lora : {false, true}) {
    if (with_lora && !lora) break;
    for (auto it = graph_sizes_.rbegin(); it != graph_sizes_.rend() && graphs_enabled_ && !kv.empty(); ++it)
      launch_graph(pad_for_graph(ForwardBatch{}, *it), kv, {}, {}, with_lora);
  }
  backend_->synchronize();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (graphs_enabled_)
    spdlog::info("CUDA graphs: captured {} decode shapes ({} to {} sequences{}) in {:.2f} s{}",
                 graph_sizes_.size(), graph_sizes_.front(), graph_sizes_.back(),
                 lora ? ", each without and with LoRA" : "", seconds,
                 options.warmup_tokens > 0 ? " (warm-up included)" : "");
}

std::vector<int64_t> default_graph_sizes(int64_t max_num_seqs) {
  std::vector<int64_t> sizes;
  for (int64_t s : {1, 2, 4})
    if (s <= max_num_seqs) sizes.push_back(s);
  for (int64_t s = 8; s <= max_num_seqs; s += 8) sizes.push_back(s);
  if (sizes.empty() || sizes.back() < max_num_seqs) sizes.push_back(max_num_seqs);
  return sizes;
}
}  // namespace polylora
