// model/decoder.cc: loading, and everything around the one forward pass (forward.cc, Model::run_layers):
// a step's inputs (ids, positions, block tables, slots, adapter rows and expert-LoRA tables) packed on the
// host and copied to the backend once per forward (nothing is read back until the logits), eager and
// CUDA-graph launches (capture per batch-size bucket, replay), the warm-up, the output read-back, and the
// adapter slots' uploads.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <limits>
#include <map>

#include "common/error.h"
#include "common/log.h"
#include "lora/adapter_batch.h"
#include "model/arch/arch.h"
#include "model/model.h"
#include "model/model_step.h"
#include "model/quantize.h"
#include "runtime/rank_threads.h"

namespace polylora {

namespace k = kernels;

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

struct Model::Graph {
  void* exec = nullptr;
  uint64_t ws_epoch = 0, backend_epoch = 0;
  const void* kv_key = nullptr;   // the KV cache it was captured with
};

namespace {

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
  const bool gpu_ranks = tp > 1 && m->backend_->kind() != DeviceKind::kCpu;
  const TpLayout layout{.size = tp,
                        .expert_parallel = options.enable_expert_parallel,
                        .fully_sharded_loras = options.fully_sharded_loras};
  check_tensor_parallel(config, layout);
  // Tensor parallelism on GPUs: the whole model is loaded into host memory first (zero-copy views of the
  // checkpoint where it can be, as on the CPU), and each rank's shard is then copied to its GPU; dummy
  // weights are made on each rank's GPU directly, in its shard's shapes.
  const bool dummy_ranks = gpu_ranks && checkpoint == nullptr;
  std::shared_ptr<Backend> host =
      gpu_ranks && !dummy_ranks ? std::shared_ptr<Backend>(make_cpu_backend()) : nullptr;
  if (!dummy_ranks) {
    Backend& load_be = host ? *host : *m->backend_;
    WeightUploadOptions upload = host ? WeightUploadOptions{} : options.upload;
    // In the background only where the weights stay where they are loaded (not int8: quantized right away).
    upload.background = upload.background && options.quantization != WeightQuantization::kInt8;
    WeightLoader loader(checkpoint, load_be, m->weights_, options.seed, upload);
    arch::bind(config, loader, m->weights_);
    loader.finish();  // the staged path reads and uploads everything here (or starts to, in the background)
    m->weights_in_flight_ = loader.take_in_flight();
    if (options.quantization == WeightQuantization::kInt8)
      quantize_weights_int8(m->weights_, loader, load_be);
  }
  m->rope_ = RopeTable::from_config(config);
  m->inv_freq_ = m->backend_->vector_from_host(m->rope_.inv_freq.data(), m->rope_.inv_freq.size());
  m->init_workspace();
  if (tp > 1) m->split_tensor_parallel(layout, options, std::move(host), dummy_ranks);
  m->backend_->synchronize();
  return m;
}

Model::Model() = default;

void Model::init_workspace() { ws_ = std::make_unique<Workspace>(); }

void Model::wait_for_weights() {
  if (weights_error_) std::rethrow_exception(weights_error_);  // no step runs on half-loaded weights
  if (!weights_in_flight_) return;
  std::unique_ptr<WeightsInFlight> w = std::move(weights_in_flight_);
  try {
    w->wait();
  } catch (...) {
    weights_error_ = std::current_exception();
    throw;
  }
}

Model::~Model() {
  weights_in_flight_.reset();  // no copy may still write into memory freed below
  tp_threads_.reset();  // the other ranks' threads, then the ranks (their views point into full_weights_)
  if (tp_devices_) {    // the GPU ranks' queues drained, then their communicators, before their backends go
    for_each_rank([](Model& m) {
      try {
        m.backend_->synchronize();
      } catch (...) {  // a failed group: nothing more to wait for
      }
    });
    tp_devices_.reset();
  }
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
  lora_ext_.reset();
  lora_->reserve(slots, max_rank);
  ++ws_->epoch;  // graphs hold the stacks' pointers
  // The dense LoRA as extra K columns of the prefill products, where the backend would take it.
  const int64_t tails = comm_ ? 0 : LoraDenseExt::tail_cols(weights_, *lora_);
  if (tails > 0 && backend_->dense_lora_ext(std::numeric_limits<int64_t>::max(), tails))
    lora_ext_ = std::make_unique<LoraDenseExt>(*backend_, weights_, *lora_);
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
  return {.count = t.count, .seconds = t.seconds, .bytes = t.bytes, .from_image = t.from_image};
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
  auto* d_ids = ensure_buffer<int32_t>(be, ws.ids, static_cast<size_t>(rows), unused_epoch);
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
  if (!be.dry_run()) wait_for_weights();
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
  if (tp_threads_) return launch_tensor_parallel(b, kv, adapters, feed);
  if (graphs_enabled_ && graph_eligible(b, adapters)) return launch_graph(b, kv, adapters, feed);
  run_eager(b, kv, adapters, feed);
}

void Model::run_eager(const ForwardBatch& b, std::span<const k::KvCacheView> kv,
                      std::span<const LoraAdapter* const> adapters, const TokenFeed& feed) {
  Workspace& ws = *ws_;
  StepInputs si = stage(b, adapters, feed.pairs);
  auto* inputs = ensure_buffer<std::byte>(*backend_, ws.inputs, ws.staging.size(), ws.epoch);
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
  si.o_ids = st.add(b.token_ids);  // whole-vocabulary ids (a rank's embedding reads zeros outside its rows)
  si.o_pos = st.add(b.positions);
  si.o_qs = st.add(b.query_start);
  si.o_ctx = st.add(b.context_lens);
  si.o_bt = st.add(b.block_tables);
  si.o_slot = st.add(b.slot_mapping);
  si.o_rows = st.add(b.logits_rows);
  si.o_tslots = st.add(si.adapters.token_slots);
  if (comm_ && tp_.fully_sharded_loras && !si.adapters.empty()) {
    // Fully sharded LoRA: the tokens of each slot, one list after the other.
    std::vector<int32_t> rows;
    int32_t max_slot = -1;
    for (int32_t slot : si.adapters.slots) max_slot = std::max(max_slot, slot);
    si.fs_rows.assign(static_cast<size_t>(max_slot + 1), {0, 0});
    for (int32_t slot : si.adapters.slots) {
      const auto first = static_cast<int64_t>(rows.size());
      for (size_t t = 0; t < si.adapters.token_slots.size(); ++t)
        if (si.adapters.token_slots[t] == slot) rows.push_back(static_cast<int32_t>(t));
      si.fs_rows[static_cast<size_t>(slot)] = {first, static_cast<int64_t>(rows.size()) - first};
    }
    si.o_fs_rows = st.add(rows);
  }
  si.o_feed = st.add(feed_pairs.data(), feed_pairs.size());
  return si;
}

// The LM head over the vocabulary shards (tensor parallelism): this rank's logits columns
// [rows, vocab_stride] from its rows of the head, gathered from every rank; rank 0 lays them out as
// logits [rows, vocab] (in backend memory, queued: one strided copy per rank).
void Model::lm_head_parallel(const float* in, int64_t rows, float* logits) {
  Backend& be = *backend_;
  Workspace& ws = *ws_;
  const int64_t V = config_.vocab_size, W = tp_.vocab_stride, N = tp_.size;
  float* mine = ensure_buffer<float>(be, ws.logits_shard, rows * W, ws.epoch);
  float* all = ensure_buffer<float>(be, ws.logits_all, N * rows * W, ws.epoch);
  be.linear({.x = in, .m = rows, .ldx = config_.hidden_size, .w = weights_.lm_head, .bias = nullptr, .y = mine, .ldy = W});
  if (!be.dry_run()) comm_->all_gather(mine, all, static_cast<size_t>(rows * W), DType::kF32);
  if (tp_.rank != 0) return;
  for (int64_t r = 0; r < N; ++r) {
    const int64_t begin = std::min(V, r * W), n = std::min(W, V - begin);
    if (n > 0)
      be.copy_2d(logits + begin, static_cast<size_t>(V) * sizeof(float), all + r * rows * W,
                 static_cast<size_t>(W) * sizeof(float), static_cast<size_t>(n) * sizeof(float),
                 static_cast<size_t>(rows));
  }
}

bool Model::graph_eligible(const ForwardBatch& b, std::span<const LoraAdapter* const> adapters) const {
  const int64_t S = b.num_seqs();
  if (graph_sizes_.empty() || S > graph_sizes_.back() || b.num_tokens() != S) return false;
  if (b.max_blocks_per_seq > graph_max_blocks_) return false;
  if (static_cast<int64_t>(b.logits_rows.size()) != S) return false;
  for (int64_t i = 0; i < S; ++i)
    if (b.logits_rows[i] != i) return false;
  if (tp_.fully_sharded_loras)  // its LoRA calls follow each step's slots and their tokens: eager
    for (int32_t slot : b.adapter_slots)
      if (slot >= 0) return false;
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
                         std::span<const LoraAdapter* const> adapters, const TokenFeed& feed, bool with_lora,
                         bool run) {
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
  // The graph is recorded after a dry run of the step has sized every buffer for this shape (ops reserve
  // their workspace, no kernel runs), then replayed for this step's results (at start-up, `run` false:
  // dummy steps, not replayed, but under tensor parallelism they are, so every rank runs the same
  // collectives). Where that recording fails (GraphOptions::dry_run_sizing off: always), the step runs
  // eagerly instead and is recorded after it, as before dry runs existed.
  if (g.exec) be.destroy_graph(g.exec);
  g = Graph{};
  if (graph_dry_sizing_) {
    {
      struct DryRun {  // the backend's dry run, ended however run_layers leaves
        Backend& be;
        explicit DryRun(Backend& b) : be(b) { be.set_dry_run(true); }
        ~DryRun() { be.set_dry_run(false); }
      } dry(be);
      run_layers(p, kv, si, inputs);
    }
    if (void* exec = record(p, kv, si, inputs)) {
      g = {exec, ws.epoch, be.workspace_epoch(), kv_key};
      ++graph_recordings_.after_dry_run;
      if (run || comm_) {
        wait_for_weights();
        be.run_graph(exec);
      }
      return;
    }
  }
  wait_for_weights();  // the step runs
  run_layers(p, kv, si, inputs);
  if (void* exec = record(p, kv, si, inputs)) {
    g = {exec, ws.epoch, be.workspace_epoch(), kv_key};
    ++graph_recordings_.after_eager_run;
    return;
  }
  spdlog::warn("CUDA graph capture of a {}-sequence decode step{} failed; running decode steps eagerly", size,
               with_lora ? " with LoRA" : "");
  graphs_enabled_ = false;
}

// Records the step's ops as a graph; nullptr when the capture failed (an op that threw included) or a
// buffer moved while it ran (the graph would hold a freed pointer).
void* Model::record(const ForwardBatch& p, std::span<const k::KvCacheView> kv, const StepInputs& si,
                    std::byte* inputs) {
  Backend& be = *backend_;
  Workspace& ws = *ws_;
  const uint64_t ws_epoch = ws.epoch, backend_epoch = be.workspace_epoch();
  be.begin_capture();
  try {
    run_layers(p, kv, si, inputs);
  } catch (const std::exception& e) {
    spdlog::debug("CUDA graph capture: {}", e.what());
    if (void* partial = be.end_capture()) be.destroy_graph(partial);
    return nullptr;
  }
  void* exec = be.end_capture();
  if (exec && (ws.epoch != ws_epoch || be.workspace_epoch() != backend_epoch)) {
    be.destroy_graph(exec);
    return nullptr;
  }
  return exec;
}

void Model::warm_up(std::span<const k::KvCacheView> kv, int64_t tokens, int64_t logits_rows, bool dry) {
  if (tokens <= 0 || kv.empty()) return;
  std::vector<float> logits;
  struct DryRun {  // every rank's backend in a dry run while `on`, ended however forward leaves
    Model& m;
    bool on;
    DryRun(Model& model, bool d) : m(model), on(d) {
      if (on) m.for_each_rank([](Model& r) { r.backend_->set_dry_run(true); });
    }
    ~DryRun() {
      if (on) m.for_each_rank([](Model& r) { r.backend_->set_dry_run(false); });
    }
  } dry_run(*this, dry);
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
  for_each_rank([](Model& m) {
    for (auto& [size, g] : m.graphs_) m.backend_->destroy_graph(g.exec);
    m.graphs_.clear();
    m.graph_sizes_.clear();
    m.graphs_enabled_ = false;
  });
  bool enabled = options.enabled && backend_->supports_graphs() && !options.sizes.empty();
  if (enabled && tp_devices_ && !tp_collectives_capturable()) {
    spdlog::info(
        "CUDA graphs: off (tensor-parallel collectives through host memory cannot be recorded); every step "
        "runs eagerly");
    enabled = false;
  }
  if (!enabled) return;
  auto t0 = std::chrono::steady_clock::now();
  // Warm-up: the largest prefill the engine will run, so that its buffers are in place before any capture
  // (a later growth would invalidate the graphs, which are then recorded again at their next use). Under
  // tensor parallelism it runs on every rank (rank 0 drives the step).
  if (options.warmup_tokens > 0 && !kv.empty())
    warm_up(kv, options.warmup_tokens, options.warmup_logits_rows);
  if (!tp_threads_) {
    prepare_graphs_local(kv, options);
  } else {  // every rank records its graphs at once: the eager runs before each capture hold collectives
    tp_threads_->run([&](int rank) {
      Model& m = rank == 0 ? *this : *tp_ranks_[static_cast<size_t>(rank - 1)];
      m.prepare_graphs_local(rank == 0 ? kv : m.mirror_kv(kv), options);
    });
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (graphs_enabled_)
    spdlog::info(
        "CUDA graphs: captured {} decode shapes ({} to {} sequences{}) in {:.2f} s{}{}; {} recorded after a "
        "dry "
        "run, {} after an eager run (so far)",
        graph_sizes_.size(), graph_sizes_.front(), graph_sizes_.back(),
        lora_ && lora_->reserved() ? ", each without and with LoRA" : "", seconds,
        options.warmup_tokens > 0 ? " (warm-up included)" : "",
        tp_threads_ ? fmt::format(", on each of {} ranks", tp_.size) : "", graph_recordings_.after_dry_run,
        graph_recordings_.after_eager_run);
}

void Model::prepare_graphs_local(std::span<const k::KvCacheView> kv, const GraphOptions& options) {
  graphs_enabled_ = true;
  const char* env = std::getenv("POLYLORA_GRAPH_DRY_SIZING");
  graph_dry_sizing_ = options.dry_run_sizing && !(env && std::string(env) == "0");
  graph_sizes_ = options.sizes;
  std::sort(graph_sizes_.begin(), graph_sizes_.end());
  graph_sizes_.erase(std::unique(graph_sizes_.begin(), graph_sizes_.end()), graph_sizes_.end());
  graph_max_blocks_ = std::max<int64_t>(1, options.max_blocks_per_seq);
  Workspace& ws = *ws_;
  // The inputs every graph reads: sized for the largest one, never moved.
  // (An empty batch padded to a size is that size's dummy decode step: no KV written.)
  // (The feed pairs, staged last, take at most two ids per sequence.)
  const std::vector<int32_t> max_feed(static_cast<size_t>(2 * graph_sizes_.back()), 0);
  stage(pad_for_graph(ForwardBatch{}, graph_sizes_.back()), {}, max_feed);
  ensure_buffer<std::byte>(*backend_, ws.graph_inputs, ws.staging.size(), ws.epoch);
  // Largest first: smaller shapes then fit the buffers the larger ones sized. Without a KV cache the
  // graphs are recorded at their first use instead.
  // With reserved adapter stacks, each size is also recorded with the LoRA kernels. Under tensor
  // parallelism a rank whose capture failed goes on with the others (each recording runs the step, with
  // its collectives, first), so every rank runs the same steps.
  const bool lora = lora_ && lora_->reserved();
  for (const bool with_lora : {false, true}) {
    if (with_lora && !lora) break;
    for (auto it = graph_sizes_.rbegin();
         it != graph_sizes_.rend() && (graphs_enabled_ || comm_ != nullptr) && !kv.empty(); ++it)
      launch_graph(pad_for_graph(ForwardBatch{}, *it), kv, {}, {}, with_lora, /*run=*/false);
  }
  backend_->synchronize();
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
