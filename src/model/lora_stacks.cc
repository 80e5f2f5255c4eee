// model/lora_stacks.cc: allocation of the slot-stacked LoRA tensors and the upload of one adapter into
// one slot (lora_stacks.h); the asynchronous uploads and the host images are in lora_stacks_async.cc.
#include "model/lora_stacks.h"

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>

#include <spdlog/spdlog.h>

#include "common/dtype.h"
#include "common/error.h"

namespace polylora {
namespace {

constexpr size_t kStagingBytes = size_t{8} << 20;
constexpr size_t kUploadThreads = 8;  // fill threads of an asynchronous upload (each with its staging)

bool has_module(const ModelConfig& c, int64_t layer, LoraModule m) {
  switch (m) {
    case LoraModule::kQ:
    case LoraModule::kK:
    case LoraModule::kV:
    case LoraModule::kO:
      return true;
    case LoraModule::kGate:
    case LoraModule::kUp:
    case LoraModule::kDown:
      return !c.moe_layers[static_cast<size_t>(layer)];
  }
  return false;
}

std::pair<int64_t, int64_t> module_shape(const ModelConfig& c, LoraModule m) {  // in, out
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  switch (m) {
    case LoraModule::kQ:
      return {H, c.q_size()};
    case LoraModule::kK:
    case LoraModule::kV:
      return {H, c.kv_size()};
    case LoraModule::kO:
      return {c.q_size(), H};
    case LoraModule::kGate:
    case LoraModule::kUp:
      return {H, I};
    case LoraModule::kDown:
      return {I, H};
  }
  return {0, 0};
}

// Row `r` of A (rank rows) or B (out rows) of an optional matrix into dst[cols], zero-padded: A rows past
// the matrix's rank are zero, B rows take the matrix's rank columns and zeros after.
void a_row(const std::optional<LoraMatrix>& m, int64_t r, int64_t cols, float* dst) {
  if (!m || r >= m->rank) {
    std::fill(dst, dst + cols, 0.0f);
    return;
  }
  std::copy_n(m->a.data() + r * m->in, cols, dst);
}
void b_row(const std::optional<LoraMatrix>& m, int64_t row, int64_t cols, float* dst) {
  std::fill(dst, dst + cols, 0.0f);
  if (!m) return;
  std::copy_n(m->b.data() + row * m->rank, std::min(m->rank, cols), dst);
}

// Host images' budget (lora_stacks.h): POLYLORA_LORA_HOST_IMAGE_GB, else a quarter of the host's memory
// on CUDA and none on the CPU.
size_t default_image_budget(DeviceKind kind) {
  if (const char* v = std::getenv("POLYLORA_LORA_HOST_IMAGE_GB"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    const double gb = std::strtod(v, &end);
    CHECK_MSG(end != v && *end == '\0' && gb >= 0, "POLYLORA_LORA_HOST_IMAGE_GB={} is not a number of GB", v);
    return static_cast<size_t>(gb * 1e9);
  }
  if (kind != DeviceKind::kCuda) return 0;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<size_t>(pages) * static_cast<size_t>(page) / 4;
}

// Fill threads of the asynchronous uploads (lora_stacks.h): POLYLORA_LORA_UPLOAD_THREADS, else
// kUploadThreads (at most the cores).
size_t default_upload_threads() {
  if (const char* v = std::getenv("POLYLORA_LORA_UPLOAD_THREADS"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    CHECK_MSG(end != v && *end == '\0' && n >= 1 && n <= 64, "POLYLORA_LORA_UPLOAD_THREADS={} is not 1..64",
              v);
    return static_cast<size_t>(n);
  }
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  return std::min<size_t>(kUploadThreads, hw);
}

}  // namespace

// fn(k) for k in [0, n): k = 0 on the calling thread, the others on threads of their own; the first
// error (in k order) is thrown once all are done.
void LoraStacks::on_threads(size_t n, const std::function<void(size_t)>& fn) {
  std::vector<std::string> errors(n);
  auto run = [&](size_t k) {
    try {
      fn(k);
    } catch (const std::exception& e) {
      errors[k] = e.what();
    }
  };
  std::vector<std::thread> threads;
  for (size_t k = 1; k < n; ++k) threads.emplace_back(run, k);
  run(0);
  for (std::thread& t : threads) t.join();
  for (const std::string& e : errors)
    if (!e.empty()) fail("{}", e);
}

LoraStacks::LoraStacks(Backend& backend, const ModelConfig& config) : be_(backend), config_(config) {
  dtype_ = backend.lora_stack_dtype();
  gu_slices_ = config.expert_activation == ExpertActivation::kGptOssClampedSwiglu ? 1 : 2;
  image_budget_.store(default_image_budget(backend.kind()));
  upload_threads_ = default_upload_threads();
}

LoraStacks::~LoraStacks() {
  wait_uploads();
  stop_upload_thread();
  release();
}

void LoraStacks::stop_upload_thread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void LoraStacks::release() {
  wait_uploads();  // the upload thread writes into the allocations below
  {
    // Images asked for by the copies just done are of the stacks about to go: dropped, and the one under
    // way finished before images_ is touched here (no copy starts meanwhile: the caller's contract).
    std::unique_lock<std::mutex> lock(mu_);
    image_jobs_.clear();
    cv_.wait(lock, [&] { return !image_building_; });
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.clear();
  }
  main_ = {};
  async_.clear();
  free_images();  // their regions are those of the stacks freed below
  for (void* p : allocations_) be_.free(p);
  allocations_.clear();
  dense_.clear();
  experts_.clear();
  d_scales_ = nullptr;
  slots_ = rank_ = 0;
  bytes_ = 0;
  held_.clear();
}

size_t LoraStacks::bytes_for(int64_t slots, int64_t rank) const {
  const ModelConfig& c = config_;
  const int64_t R = (rank + 7) / 8 * 8, E = c.num_experts, H = c.hidden_size, I = c.moe_intermediate_size;
  const size_t es = dtype_size(dtype_);
  size_t n = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (size_t m = 0; m < kNumLoraModules; ++m) {
      const auto mod = static_cast<LoraModule>(m);
      if (!has_module(c, l, mod)) continue;
      auto [in, out] = module_shape(c, mod);
      n += static_cast<size_t>(slots * R * (in + out)) * es;
    }
    if (c.moe_layers[static_cast<size_t>(l)])
      n += static_cast<size_t>(slots * E * R * (gu_slices_ * H + 2 * I + I + H)) * es;
  }
  return n;
}

void LoraStacks::reserve(int64_t slots, int64_t rank) {
  CHECK(slots > 0 && rank > 0);
  release();
  ++epoch_;
  const ModelConfig& c = config_;
  const int64_t R = (rank + 7) / 8 * 8, E = c.num_experts, H = c.hidden_size, I = c.moe_intermediate_size;
  const size_t es = dtype_size(dtype_);
  auto alloc = [&](size_t bytes) {
    void* p = be_.alloc(bytes);
    allocations_.push_back(p);
    bytes_ += bytes;
    return p;
  };
  slots_ = slots;
  rank_ = R;
  dense_.assign(static_cast<size_t>(c.num_layers), {});
  experts_.assign(static_cast<size_t>(c.num_layers), {});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (size_t m = 0; m < kNumLoraModules; ++m) {
      const auto mod = static_cast<LoraModule>(m);
      if (!has_module(c, l, mod)) continue;
      auto [in, out] = module_shape(c, mod);
      Dense& d = dense_[static_cast<size_t>(l)][m];
      d.in = in;
      d.out = out;
      d.a = alloc(static_cast<size_t>(slots * R * in) * es);
      d.b = alloc(static_cast<size_t>(slots * out * R) * es);
    }
    if (!c.moe_layers[static_cast<size_t>(l)]) continue;
    Experts& x = experts_[static_cast<size_t>(l)];
    x.a_gu = alloc(static_cast<size_t>(slots * E * gu_slices_ * R * H) * es);
    x.b_gu = alloc(static_cast<size_t>(slots * E * 2 * I * R) * es);
    x.a_down = alloc(static_cast<size_t>(slots * E * R * I) * es);
    x.b_down = alloc(static_cast<size_t>(slots * E * H * R) * es);
  }
  experts_scale_offset_ = static_cast<size_t>(c.num_layers) * kNumLoraModules * static_cast<size_t>(slots);
  scales_.assign(experts_scale_offset_ + static_cast<size_t>(c.num_layers * slots * E * 3), 0.0f);
  d_scales_ = static_cast<float*>(alloc(scales_.size() * sizeof(float)));
  held_.assign(static_cast<size_t>(slots), {});
  versions_.assign(static_cast<size_t>(slots), 0);
  // Made after the allocations (and their zeroing), so the uploads are ordered after them.
  main_.staging = be_.make_upload_staging(kStagingBuffers, kStagingBytes);
}

std::byte* LoraStacks::take_buffer(Stager& st, int* index) {
  const int i = st.next;
  st.next = (st.next + 1) % st.staging->num_buffers();
  st.staging->wait(i);
  *index = i;
  return st.staging->buffer(i);
}

void LoraStacks::store_values(const float* src, int64_t n, std::byte* dst) const {
  if (dtype_ != DType::kBF16) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  auto* out = reinterpret_cast<uint16_t*>(dst);
  for (int64_t j = 0; j < n; ++j) out[j] = f32_to_bf16(src[j]);
}

void LoraStacks::submit(Stager& st, int i, void* dst, int64_t rows, int64_t cols, DType dtype) {
  st.staging->upload(i, {.rows = rows,
                         .cols = cols,
                         .src_dtype = dtype,
                         .dst = dst,
                         .dst_dtype = dtype,
                         .dst_ld = cols,
                         .transpose = false});
}

template <typename Fill>
size_t LoraStacks::put(Stager& st, Dst dst, int64_t rows, int64_t cols, const Fill& fill) {
  // BF16 stacks get BF16 rows from the host (rounded here: half the bytes over the bus, copied as they
  // are); F32 stacks get F32 rows.
  const size_t es = dtype_size(dtype_);
  const size_t total = static_cast<size_t>(rows * cols) * es;
  if (st.sink != Sink::kStaging) {
    if (st.sink == Sink::kImage) {
      std::vector<float> row(static_cast<size_t>(cols));
      std::byte* out = st.image + st.image_off;
      for (int64_t r = 0; r < rows; ++r) {
        fill(r, row.data());
        store_values(row.data(), cols, out + static_cast<size_t>(r * cols) * es);
      }
      st.segments.push_back({dst.base, dst.slot_bytes, st.image_off, total});
    }
    st.image_off += total;
    return total;
  }
  const size_t cap = st.staging->buffer_bytes();
  CHECK_MSG(static_cast<size_t>(cols) * es <= cap, "LoRA row of {} values is too long", cols);
  const int64_t per = std::max<int64_t>(1, static_cast<int64_t>(cap / (es * static_cast<size_t>(cols))));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r0 = 0; r0 < rows; r0 += per) {
    const int64_t n = std::min(per, rows - r0);
    int i = 0;
    std::byte* buf = take_buffer(st, &i);
    for (int64_t r = 0; r < n; ++r) {
      fill(r0 + r, row.data());
      store_values(row.data(), cols, buf + static_cast<size_t>(r * cols) * es);
    }
    submit(st, i, dst.ptr() + static_cast<size_t>(r0 * cols) * es, n, cols, dtype_);
  }
  return total;
}

template <typename Src>
size_t LoraStacks::put_runs(Stager& st, Dst dst, int64_t total, const Src& src) {
  const size_t es = dtype_size(dtype_);
  if (st.sink != Sink::kStaging) {
    const size_t bytes = static_cast<size_t>(total) * es;
    if (st.sink == Sink::kImage) {
      std::byte* out = st.image + st.image_off;
      for (int64_t k = 0; k < total;) {
        auto [p, run] = src(k);
        run = std::min(run, total - k);
        store_values(p, run, out + static_cast<size_t>(k) * es);
        k += run;
      }
      st.segments.push_back({dst.base, dst.slot_bytes, st.image_off, bytes});
    }
    st.image_off += bytes;
    return bytes;
  }
  const auto cap = static_cast<int64_t>(st.staging->buffer_bytes() / es);
  for (int64_t o = 0; o < total; o += cap) {
    const int64_t n = std::min(cap, total - o);
    int i = 0;
    std::byte* buf = take_buffer(st, &i);
    for (int64_t k = 0; k < n;) {
      auto [p, run] = src(o + k);
      run = std::min(run, n - k);
      store_values(p, run, buf + static_cast<size_t>(k) * es);
      k += run;
    }
    submit(st, i, dst.ptr() + static_cast<size_t>(o) * es, 1, n, dtype_);
  }
  return static_cast<size_t>(total) * es;
}

void LoraStacks::upload_scales() {
  Stager& st = main_;
  const int64_t n = static_cast<int64_t>(scales_.size());
  const int64_t per = static_cast<int64_t>(st.staging->buffer_bytes() / sizeof(float));
  for (int64_t o = 0; o < n; o += per) {
    const int64_t len = std::min(per, n - o);
    int i = 0;
    std::byte* buf = take_buffer(st, &i);
    std::memcpy(buf, scales_.data() + o, static_cast<size_t>(len) * sizeof(float));
    submit(st, i, d_scales_ + o, 1, len, DType::kF32);
  }
  st.staging->finish();
}

void LoraStacks::upload(int32_t slot, const LoraAdapter& ad) {
  CHECK_MSG(!upload_pending(slot), "LoRA slot {} is uploaded while an upload into it is pending", slot);
  held_.at(static_cast<size_t>(slot)) = {};
  write_weights(main_, slot, ad);
  activate(slot, ad);
}

size_t LoraStacks::write_weights_parallel(int32_t slot, const LoraAdapter& ad) {
  const size_t n = async_.size();
  CHECK(n > 0);
  std::vector<size_t> bytes(n, 0);
  on_threads(n, [&](size_t k) {
    bytes[k] = write_weights(async_[k], slot, ad, static_cast<int64_t>(k), static_cast<int64_t>(n));
  });
  size_t total = 0;
  for (size_t b : bytes) total += b;
  return total;
}

size_t LoraStacks::write_weights(Stager& st, int32_t slot, const LoraAdapter& ad, int64_t first,
                                 int64_t stride) {
  const ModelConfig& c = config_;
  CHECK_MSG(slot >= 0 && slot < slots_, "LoRA slot {} outside the {} reserved", slot, slots_);
  CHECK_MSG(ad.max_rank <= rank_, "adapter '{}' has rank {}, above the reserved {}", ad.name, ad.max_rank,
            rank_);
  CHECK(static_cast<int64_t>(ad.layers.size()) == c.num_layers);
  const int64_t R = rank_, E = c.num_experts, H = c.hidden_size, I = c.moe_intermediate_size;
  const size_t es = dtype_size(dtype_);
  auto at = [&](void* base, int64_t per_slot) {
    return Dst{static_cast<std::byte*>(base), static_cast<size_t>(per_slot) * es, slot};
  };
  size_t bytes = 0;
  for (int64_t l = first; l < c.num_layers; l += stride) {
    const LoraLayer& src = ad.layers[static_cast<size_t>(l)];
    for (size_t m = 0; m < kNumLoraModules; ++m) {
      const Dense& d = dense_[static_cast<size_t>(l)][m];
      const std::optional<LoraMatrix>& mat = src.modules[m];
      if (!d.a) continue;  // ignored by the loader's checks already: the model has no such module here
      if (!mat) continue;  // the scale 0 keeps the stale rows unread
      const Dst da = at(d.a, R * d.in), db = at(d.b, d.out * R);
      if (mat->rank == R && mat->in == d.in &&
          mat->out == d.out) {  // the stacks' [R, in], [out, R] as they are
        bytes += put_runs(st, da, R * d.in, [&](int64_t o) {
          return std::pair{mat->a.data() + o, R * d.in - o};
        });
        bytes += put_runs(st, db, d.out * R, [&](int64_t o) {
          return std::pair{mat->b.data() + o, d.out * R - o};
        });
        continue;
      }
      bytes += put(st, da, R, d.in, [&](int64_t r, float* dst) { a_row(mat, r, d.in, dst); });
      bytes += put(st, db, d.out, R, [&](int64_t r, float* dst) { b_row(mat, r, R, dst); });
    }
    const Experts& x = experts_[static_cast<size_t>(l)];
    if (!x.a_gu || src.experts.empty()) continue;
    CHECK(static_cast<int64_t>(src.experts.size()) == E);
    const int64_t G = gu_slices_;
    // The matrix feeding slice `sl` of gate/up: the fused gate_up LoRA, or gate (slice 0) / up (slice 1).
    auto gu_src = [&](int64_t e, int64_t sl) -> const std::optional<LoraMatrix>& {
      const LoraExpert& le = src.experts[static_cast<size_t>(e)];
      if (G == 1 || le.gate_up) return le.gate_up;
      return sl == 0 ? le.gate : le.up;
    };
    const Dst dagu = at(x.a_gu, E * G * R * H), dbgu = at(x.b_gu, E * 2 * I * R),
              dad = at(x.a_down, E * R * I), dbd = at(x.b_down, E * H * R);
    // Every expert with all its matrices at the full rank: the stacks' blocks are the matrices as they are
    // (per expert: A [G, R, H] and B [2I, R] of gate/up, A [R, I] and B [H, R] of down), copied in runs.
    bool whole = true;
    for (int64_t e = 0; e < E && whole; ++e) {
      const LoraExpert& le = src.experts[static_cast<size_t>(e)];
      whole = le.down && le.down->rank == R;
      for (int64_t sl = 0; sl < G && whole; ++sl) whole = gu_src(e, sl) && gu_src(e, sl)->rank == R;
      if (G == 2 && le.gate_up) whole = false;  // a fused gate_up where the stack wants slices
    }
    if (whole) {
      const int64_t agu = G * R * H, bgu = 2 * I * R, ad_ = R * I, bd = H * R;
      bytes += put_runs(st, dagu, E * agu, [&](int64_t o) {
        const int64_t e = o / agu, w = o % agu, sl = w / (R * H), k = w % (R * H);
        return std::pair{gu_src(e, sl)->a.data() + k, R * H - k};
      });
      bytes += put_runs(st, dbgu, E * bgu, [&](int64_t o) {
        const int64_t e = o / bgu, w = o % bgu;
        if (G == 1) return std::pair{gu_src(e, 0)->b.data() + w, bgu - w};
        const int64_t sl = w / (I * R), k = w % (I * R);
        return std::pair{gu_src(e, sl)->b.data() + k, I * R - k};
      });
      bytes += put_runs(st, dad, E * ad_, [&](int64_t o) {
        const int64_t e = o / ad_, w = o % ad_;
        return std::pair{src.experts[static_cast<size_t>(e)].down->a.data() + w, ad_ - w};
      });
      bytes += put_runs(st, dbd, E * bd, [&](int64_t o) {
        const int64_t e = o / bd, w = o % bd;
        return std::pair{src.experts[static_cast<size_t>(e)].down->b.data() + w, bd - w};
      });
      continue;
    }
    bytes += put(st, dagu, E * G * R, H, [&](int64_t q, float* dst) {
      a_row(gu_src(q / (G * R), (q % (G * R)) / R), q % R, H, dst);
    });
    bytes += put(st, dbgu, E * 2 * I, R, [&](int64_t q, float* dst) {
      const int64_t e = q / (2 * I), n = q % (2 * I);
      const LoraExpert& le = src.experts[static_cast<size_t>(e)];
      if (G == 1 || le.gate_up) return b_row(le.gate_up, n, R, dst);
      return n < I ? b_row(le.gate, n, R, dst) : b_row(le.up, n - I, R, dst);
    });
    bytes += put(st, dad, E * R, I, [&](int64_t q, float* dst) {
      a_row(src.experts[static_cast<size_t>(q / R)].down, q % R, I, dst);
    });
    bytes += put(st, dbd, E * H, R, [&](int64_t q, float* dst) {
      b_row(src.experts[static_cast<size_t>(q / H)].down, q % H, R, dst);
    });
  }
  if (st.sink == Sink::kStaging) st.staging->finish();
  return bytes;
}

void LoraStacks::activate(int32_t slot, const LoraAdapter& ad) {
  const ModelConfig& c = config_;
  const int64_t E = c.num_experts, S = slots_;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LoraLayer& src = ad.layers[static_cast<size_t>(l)];
    for (size_t m = 0; m < kNumLoraModules; ++m) {
      const std::optional<LoraMatrix>& mat = src.modules[m];
      scales_[(static_cast<size_t>(l) * kNumLoraModules + m) * static_cast<size_t>(S) +
              static_cast<size_t>(slot)] = dense_[static_cast<size_t>(l)][m].a && mat ? mat->scale : 0.0f;
    }
    float* esc = scales_.data() + experts_scale_offset_ + static_cast<size_t>((l * S + slot) * E * 3);
    std::fill(esc, esc + E * 3, 0.0f);
    if (!experts_[static_cast<size_t>(l)].a_gu || src.experts.empty()) continue;
    const int64_t G = gu_slices_;
    for (int64_t e = 0; e < E; ++e) {
      const LoraExpert& le = src.experts[static_cast<size_t>(e)];
      for (int64_t sl = 0; sl < G; ++sl) {
        const std::optional<LoraMatrix>& m = G == 1 || le.gate_up ? le.gate_up : sl == 0 ? le.gate : le.up;
        esc[e * 3 + sl] = m ? m->scale : 0.0f;
      }
      esc[e * 3 + 2] = le.down ? le.down->scale : 0.0f;
    }
  }
  upload_scales();
  held_[static_cast<size_t>(slot)] = {.adapter = &ad, .generation = ad.generation, .owner = {}};
  ++versions_[static_cast<size_t>(slot)];
}

void LoraStacks::zero_scales(int32_t slot) {
  const ModelConfig& c = config_;
  const size_t S = static_cast<size_t>(slots_), E = static_cast<size_t>(c.num_experts);
  for (size_t l = 0; l < static_cast<size_t>(c.num_layers); ++l) {
    for (size_t m = 0; m < kNumLoraModules; ++m)
      scales_[(l * kNumLoraModules + m) * S + static_cast<size_t>(slot)] = 0.0f;
    float* esc = scales_.data() + experts_scale_offset_ + (l * S + static_cast<size_t>(slot)) * E * 3;
    std::fill(esc, esc + E * 3, 0.0f);
  }
  upload_scales();
}

void LoraStacks::clear(int32_t slot) {
  if (slot < 0 || slot >= slots_) return;
  CHECK_MSG(!upload_pending(slot), "LoRA slot {} is cleared while an upload into it is pending", slot);
  zero_scales(slot);
  ++versions_[static_cast<size_t>(slot)];
  std::shared_ptr<const LoraAdapter> leaving = leave(slot, nullptr);
  if (!leaving) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    image_jobs_.push_back(leaving);
    start_upload_thread_locked();
  }
  cv_.notify_all();
}

bool LoraStacks::holds(int32_t slot, const LoraAdapter& adapter) const {
  if (slot < 0 || slot >= slots_) return false;
  const Held& h = held_[static_cast<size_t>(slot)];
  return h.adapter == &adapter && h.generation != 0 && h.generation == adapter.generation;
}

kernels::LoraStack LoraStacks::dense(int64_t layer, LoraModule module) const {
  if (!reserved()) return {};
  const Dense& d = dense_[static_cast<size_t>(layer)][static_cast<size_t>(module)];
  if (!d.a) return {};
  return {.a = d.a,
          .b = d.b,
          .dtype = dtype_,
          .scale = d_scales_ + (static_cast<size_t>(layer) * kNumLoraModules + static_cast<size_t>(module)) *
                                   static_cast<size_t>(slots_),
          .slots = slots_,
          .rank = rank_,
          .in = d.in,
          .out = d.out};
}

kernels::MoeLoraStack LoraStacks::experts(int64_t layer) const {
  if (!reserved()) return {};
  const Experts& x = experts_[static_cast<size_t>(layer)];
  if (!x.a_gu) return {};
  return {.a_gu = x.a_gu,
          .b_gu = x.b_gu,
          .a_down = x.a_down,
          .b_down = x.b_down,
          .dtype = dtype_,
          .scale = d_scales_ + experts_scale_offset_ +
                   static_cast<size_t>(layer * slots_ * config_.num_experts * 3),
          .slots = slots_,
          .rank = rank_,
          .gu_slices = gu_slices_};
}

}  // namespace polylora
