// bench/kernels_bench_device.cc: `polylora_bench kernels --device cuda`: the CUDA kernels' entries
// (slot-stacked dense LoRA, lora_batch, at GPT-OSS-20B's q/k/v and o shapes; the decode path's fused small
// ops add_rms_norm and rope_kv_write, with the time of the op sequence each replaces beside it; paged
// attention at GPT-OSS-20B's heads: decode against the copy bandwidth, prefill on the f32 CUDA-core kernel
// and on the bf16 tensor-core one against the bf16 GEMM rate of the same run; the prefill q/k/v and o
// products with and without 128 more K columns, against that rate), each first checked against
// its reference on the host (a failure is an error: a benchmarked kernel is a validated one; the GPU tests
// cover the awkward shapes), then timed as CUDA-graph replays and judged against the device limits measured
// in the same run.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend_timing.h"
#include "common/dtype.h"
#include "common/error.h"
#include "kernels/attention/attention.h"
#include "kernels/linear/linear.h"
#include "kernels/lora/lora.h"
#include "kernels/moe/moe.h"
#include "kernels/norm/rms_norm.h"
#include "kernels/rope/rope.h"
#include "kernels/tuning.h"
#include "kernels_bench.h"
#include "machine_limits.h"

namespace polylora::bench {
namespace {

using namespace polylora::kernels;

// Slot-stacked dense LoRA (Backend::lora_batch) at GPT-OSS-20B shapes: q/k/v (x 2880 -> 4096, 512, 512, one
// call for the three) or o (4096 -> 2880); 8 slots of BF16 rank-16 stacks (uniform ±0.05), m tokens
// round-robin over 8 adapters (1 at m = 1; from 1,024 tokens, prefill, 8 sequences of m / 8 tokens each in
// one adapter). Validated against ref::lora_batch on every token first (max error
// over rms(ref LoRA term) <= 1e-4: f32 products of the same values), then timed; the throughput counts the
// LoRA weights of the distinct slots used (read once) plus x and y (read + written), against the copy
// bandwidth.
KernelResult bench_lora_batch_device(Backend& be, int64_t m, bool qkv, double copy_gbs) {
  constexpr int64_t kSlots = 8, kRank = 16;
  const int num = qkv ? 3 : 1;
  const int64_t in = qkv ? 2880 : 4096;
  const int64_t outs[3] = {qkv ? 4096 : 2880, 512, 512};
  const int64_t nact = m == 1 ? 1 : kSlots;
  std::vector<float> x = random_floats(static_cast<size_t>(m * in), 21);
  std::vector<int32_t> slots(static_cast<size_t>(m));
  for (int64_t t = 0; t < m; ++t) slots[t] = static_cast<int32_t>(m >= 1024 ? t * nact / m : t % nact);
  std::vector<void*> ptrs;
  auto up = [&](const void* src, size_t bytes) {
    void* p = be.alloc(std::max<size_t>(bytes, 1));
    ptrs.push_back(p);
    be.copy_to_device(p, src, bytes);
    return p;
  };
  std::vector<std::vector<uint16_t>> a(3), b(3);
  std::vector<float> scale(kSlots, 1.0f);
  std::vector<std::vector<float>> y0(3);
  LoraBatchArgs h;
  h.x = x.data();
  h.ldx = in;
  h.m = m;
  h.token_slots = slots.data();
  h.num = num;
  LoraBatchArgs d = h;
  d.x = static_cast<const float*>(up(x.data(), x.size() * sizeof(float)));
  d.token_slots = static_cast<const int32_t*>(up(slots.data(), slots.size() * sizeof(int32_t)));
  const float* d_scale = static_cast<const float*>(up(scale.data(), scale.size() * sizeof(float)));
  double weight_bytes = 0, act_bytes = static_cast<double>(m * in) * 4;
  for (int i = 0; i < num; ++i) {
    a[i] = random_bf16(static_cast<size_t>(kSlots * kRank * in), static_cast<uint32_t>(30 + i));
    b[i] = random_bf16(static_cast<size_t>(kSlots * outs[i] * kRank), static_cast<uint32_t>(40 + i));
    h.w[i] = {.a = a[i].data(),
              .b = b[i].data(),
              .dtype = DType::kBF16,
              .scale = scale.data(),
              .slots = kSlots,
              .rank = kRank,
              .in = in,
              .out = outs[i]};
    d.w[i] = h.w[i];
    d.w[i].a = up(a[i].data(), a[i].size() * 2);
    d.w[i].b = up(b[i].data(), b[i].size() * 2);
    d.w[i].scale = d_scale;
    y0[i] = random_floats(static_cast<size_t>(m * outs[i]), static_cast<uint32_t>(50 + i));
    h.ldy[i] = d.ldy[i] = outs[i];
    d.y[i] = static_cast<float*>(up(y0[i].data(), y0[i].size() * sizeof(float)));
    weight_bytes += static_cast<double>(nact) * kRank * (in + outs[i]) * 2;
    act_bytes += 2.0 * m * outs[i] * 4;
  }
  // Validation: one call on the device against the reference on a copy.
  be.lora_batch(d);
  double worst = 0;
  for (int i = 0; i < num; ++i) {
    std::vector<float> ref = y0[i], got(ref.size());
    h.y[i] = ref.data();
    be.copy_to_host(got.data(), d.y[i], got.size() * sizeof(float));
    LoraBatchArgs one = h;
    one.num = 1;
    one.w[0] = h.w[i];
    one.y[0] = ref.data();
    one.ldy[0] = h.ldy[i];
    ref::lora_batch(one);
    double sq = 0, err = 0;
    for (size_t j = 0; j < ref.size(); ++j) {
      const double delta = double(ref[j]) - y0[i][j];
      sq += delta * delta;
      err = std::max(err, std::fabs(double(got[j]) - ref[j]));
    }
    const double rel = err / std::max(1e-30, std::sqrt(sq / static_cast<double>(ref.size())));
    worst = std::max(worst, rel);
    if (!(rel <= 1e-4))
      fail("lora_batch m={} module {}: max error {:.3g} of the LoRA term's rms (tolerance 1e-4); not timing",
           m, i, rel);
  }
  // y keeps accumulating over the timed calls (as a residual stream would); the time does not depend on it.
  OpTiming t = time_backend_op(
      be, [&] { be.lora_batch(d); }, 200, true);
  be.synchronize();
  for (void* p : ptrs) be.free(p);
  const double gbs = (weight_bytes + act_bytes) / t.seconds / 1e9;
  std::string shape = "m=" + std::to_string(m) + (qkv ? " qkv 2880->4096/512/512" : " o 4096->2880") +
                      " r16 " + std::to_string(nact) + " slots" + (t.graph ? "" : " (no graph)");
  char err_text[32];
  std::snprintf(err_text, sizeof err_text, " err %.0e", worst);
  return {std::string("lora_batch bf16") + (qkv ? " qkv" : " o"),
          shape + err_text,
          t.seconds * 1e3,
          gbs,
          "GB/s",
          100.0 * gbs / copy_gbs,
          -1.0};
}

// What the dense LoRA as extra K columns of its product would cost (docs/gpu-machine.md, session 59's design
// note): the q/k/v product of an 8,192-token prefill step as one BF16 product (Backend::linear, x cast and
// cuBLAS as the model runs it) over k = 2880 and over k = 2880 + extra (8 slots x rank 16 = 128: the
// adapters' B columns beside W, the shrink outputs beside x). The extra time is to be set against the
// `lora_batch bf16 qkv` m=8192 entry's (the expand it would replace, with the shrink). Eight rows of each
// product are checked against a double-precision reference of the bf16 weights and the bf16-rounded x first
// (max |error| over the row's rms, tolerance 1e-2: bf16 inputs, f32 sums).
KernelResult bench_linear_extra_k_device(Backend& be, int64_t m, int64_t n, int64_t k, int64_t extra,
                                         double gemm_tflops) {
  double secs[2] = {0, 0};
  for (int wide = 0; wide < 2; ++wide) {
    const int64_t kk = k + (wide ? extra : 0);
    std::vector<float> x = random_floats(static_cast<size_t>(m * kk), 61);
    std::vector<uint16_t> w = random_bf16(static_cast<size_t>(n * kk), 62);
    void* dw = be.alloc(w.size() * 2);
    auto* dx = static_cast<float*>(be.alloc(x.size() * sizeof(float)));
    auto* dy = static_cast<float*>(be.alloc(static_cast<size_t>(m * n) * sizeof(float)));
    be.copy_to_device(dw, w.data(), w.size() * 2);
    be.copy_to_device(dx, x.data(), x.size() * sizeof(float));
    LinearArgs a;
    a.x = dx;
    a.m = m;
    a.ldx = kk;
    a.w = WeightView{.data = dw, .dtype = DType::kBF16, .rows = n, .cols = kk};
    a.y = dy;
    a.ldy = n;
    be.linear(a);
    std::vector<float> row(static_cast<size_t>(n));
    for (int64_t i = 0; i < 8; ++i) {
      const int64_t r = i * (m - 1) / 7;
      be.copy_to_host(row.data(), dy + r * n, row.size() * sizeof(float));
      double sq = 0, err = 0;
      for (int64_t j = 0; j < n; ++j) {
        double ref = 0;
        for (int64_t c = 0; c < kk; ++c)
          ref += double(bf16_to_f32(w[j * kk + c])) * bf16_to_f32(f32_to_bf16(x[r * kk + c]));
        sq += ref * ref;
        err = std::max(err, std::fabs(ref - row[j]));
      }
      const double rel = err / std::max(1e-30, std::sqrt(sq / static_cast<double>(n)));
      if (!(rel <= 1e-2))
        fail("linear m={} n={} k={}: row {} max error {:.3g} of its rms (tolerance 1e-2); not timing", m, n,
             kk, r, rel);
    }
    OpTiming t = time_backend_op(
        be, [&] { be.linear(a); }, 20, true);
    secs[wide] = t.seconds;
    be.synchronize();
    be.free(dw);
    be.free(dx);
    be.free(dy);
  }
  const double tflops = 2.0 * m * n * (k + extra) / secs[1] / 1e12;
  char shape[160];
  std::snprintf(shape, sizeof shape, "m=%ld %ldx%ld: %.3f ms; +%ld K: +%.3f ms", static_cast<long>(m),
                static_cast<long>(n), static_cast<long>(k), secs[0] * 1e3, static_cast<long>(extra),
                (secs[1] - secs[0]) * 1e3);
  return {"linear bf16 extra K", shape, secs[1] * 1e3, tflops, "TFLOP/s", 100.0 * tflops / gemm_tflops, -1.0};
}

// Device buffers of one bench entry, freed when it ends.
class DeviceBuffers {
 public:
  explicit DeviceBuffers(Backend& be) : be_(be) {}
  ~DeviceBuffers() {
    be_.synchronize();
    for (void* p : ptrs_) be_.free(p);
  }
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;
  template <typename T>
  T* up(const std::vector<T>& v) {
    void* p = be_.alloc(std::max<size_t>(v.size(), 1) * sizeof(T));
    ptrs_.push_back(p);
    be_.copy_to_device(p, v.data(), v.size() * sizeof(T));
    return static_cast<T*>(p);
  }
  template <typename T>
  std::vector<T> down(const T* p, size_t n) {
    std::vector<T> v(n);
    be_.copy_to_host(v.data(), p, n * sizeof(T));
    return v;
  }

 private:
  Backend& be_;
  std::vector<void*> ptrs_;
};

// Largest |got − ref| / (1e-5 + 1e-5·|ref|) over the elements (≤ 1: within the GPU tests' tolerance).
double worst_tolerance_ratio(const std::vector<float>& got, const std::vector<float>& ref) {
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double r = std::fabs(double(got[i]) - ref[i]) / (1e-5 + 1e-5 * std::fabs(double(ref[i])));
    worst = std::max(worst, std::isnan(r) ? 1e30 : r);
  }
  return worst;
}

// The dense LoRA as extra K columns of its product (Backend::linear_lora_ext, model/lora_dense_ext.h) at
// GPT-OSS-20B's prefill shapes, 16 sequences of m / 16 tokens over 8 adapters (BF16 r16 stacks, scales 2),
// with biases: q/k/v stacked (2880 -> 4096 + 512 + 512, three modules' tails) or o (4096 -> 2880). Eight
// rows are checked against ref::linear_lora_ext first (max error over the row's rms <= 1e-2: the shrink
// sums round to bf16 after sums in another order), then the op is timed beside what it replaces: the
// BF16 product with its bias (one product of the stacked rows) and Backend::lora_batch's shrink and expand
// (speedup = their time / the op's). TFLOP/s of the extended GEMM against the GEMM rate of the run.
KernelResult bench_linear_lora_ext_device(Backend& be, int64_t m, bool qkv, double gemm_tflops) {
  constexpr int64_t kSlots = 8, kRank = 16;
  const int num = qkv ? 3 : 1;
  const int64_t k = qkv ? 2880 : 4096;
  const int64_t outs[3] = {qkv ? 4096 : 2880, 512, 512};
  int64_t n = 0, row0[3] = {}, tail[3] = {}, col = k;
  for (int i = 0; i < num; ++i) {
    row0[i] = n;
    n += outs[i];
    tail[i] = col;
    col += kSlots * kRank;
  }
  const int64_t bias_col = col, cols = (col + 2 + 7) / 8 * 8;
  std::vector<void*> ptrs;
  auto up = [&](const void* src, size_t bytes) {
    void* p = be.alloc(std::max<size_t>(bytes, 1));
    ptrs.push_back(p);
    be.copy_to_device(p, src, bytes);
    return p;
  };
  std::vector<float> x = random_floats(static_cast<size_t>(m * k), 71);
  std::vector<float> bias = random_floats(static_cast<size_t>(n), 72);
  std::vector<uint16_t> w = random_bf16(static_cast<size_t>(n * k), 73);
  std::vector<int32_t> slots(static_cast<size_t>(m));
  for (int64_t t = 0; t < m; ++t) slots[t] = static_cast<int32_t>((t * 16 / m) % kSlots);
  std::vector<float> scale(kSlots, 2.0f);
  std::vector<std::vector<uint16_t>> a(3), b(3);
  std::vector<uint16_t> wext(static_cast<size_t>(n * cols), 0);
  for (int64_t r = 0; r < n; ++r) {
    std::memcpy(wext.data() + r * cols, w.data() + r * k, static_cast<size_t>(k) * 2);
    wext[r * cols + bias_col] = f32_to_bf16(bias[r]);
    wext[r * cols + bias_col + 1] = f32_to_bf16(bias[r] - bf16_to_f32(wext[r * cols + bias_col]));
  }
  const auto* dx = static_cast<const float*>(up(x.data(), x.size() * sizeof(float)));
  const auto* dslots = static_cast<const int32_t*>(up(slots.data(), slots.size() * sizeof(int32_t)));
  const auto* dscale = static_cast<const float*>(up(scale.data(), scale.size() * sizeof(float)));
  LinearLoraExtArgs h{.x = x.data(), .m = m, .ldx = k, .k = k, .ldy = n};
  h.shrink = {.x = x.data(), .ldx = k, .m = m, .token_slots = slots.data(), .num = num};
  LoraBatchArgs dl{.x = dx, .ldx = k, .m = m, .token_slots = dslots, .num = num};
  for (int i = 0; i < num; ++i) {
    a[i] = random_bf16(static_cast<size_t>(kSlots * kRank * k), static_cast<uint32_t>(74 + i));
    b[i] = random_bf16(static_cast<size_t>(kSlots * outs[i] * kRank), static_cast<uint32_t>(78 + i));
    for (int64_t s = 0; s < kSlots; ++s)
      for (int64_t o = 0; o < outs[i]; ++o)
        std::memcpy(wext.data() + (row0[i] + o) * cols + tail[i] + s * kRank,
                    b[i].data() + (s * outs[i] + o) * kRank, kRank * 2);
    h.shrink.w[i] = {.a = a[i].data(),
                     .b = b[i].data(),
                     .dtype = DType::kBF16,
                     .scale = scale.data(),
                     .slots = kSlots,
                     .rank = kRank,
                     .in = k,
                     .out = outs[i]};
    h.tail[i] = tail[i];
    dl.w[i] = h.shrink.w[i];
    dl.w[i].a = up(a[i].data(), a[i].size() * 2);
    dl.w[i].b = up(b[i].data(), b[i].size() * 2);
    dl.w[i].scale = dscale;
  }
  h.w = WeightView{.data = wext.data(), .dtype = DType::kBF16, .rows = n, .cols = cols};
  h.bias_col = bias_col;
  auto* dy = static_cast<float*>(be.alloc(static_cast<size_t>(m * n) * sizeof(float)));
  ptrs.push_back(dy);
  LinearLoraExtArgs d = h;
  d.x = dx;
  d.w.data = up(wext.data(), wext.size() * 2);
  d.y = dy;
  d.shrink = dl;
  be.linear_lora_ext(d);
  std::vector<float> row(static_cast<size_t>(n)), ref(static_cast<size_t>(n));
  double worst = 0;
  for (int64_t i = 0; i < 8; ++i) {
    const int64_t r = i * (m - 1) / 7;
    be.copy_to_host(row.data(), dy + r * n, row.size() * sizeof(float));
    LinearLoraExtArgs one = h;
    one.x = x.data() + r * k;
    one.m = 1;
    one.y = ref.data();
    one.shrink.x = one.x;
    one.shrink.m = 1;
    one.shrink.token_slots = slots.data() + r;
    ref::linear_lora_ext(one);
    double sq = 0, err = 0;
    for (int64_t j = 0; j < n; ++j) {
      sq += double(ref[j]) * ref[j];
      err = std::max(err, std::fabs(double(ref[j]) - row[j]));
    }
    const double rel = err / std::max(1e-30, std::sqrt(sq / static_cast<double>(n)));
    worst = std::max(worst, rel);
    if (!(rel <= 1e-2))
      fail("linear_lora_ext m={} row {}: max error {:.3g} of the row's rms (tolerance 1e-2); not timing", m,
           r, rel);
  }
  OpTiming t = time_backend_op(
      be, [&] { be.linear_lora_ext(d); }, 20, true);
  // What it replaces: the product (stacked rows, bias) and lora_batch into its outputs.
  LinearArgs plain{
      .x = dx,
      .m = m,
      .ldx = k,
      .w = WeightView{.data = up(w.data(), w.size() * 2), .dtype = DType::kBF16, .rows = n, .cols = k},
      .bias = static_cast<const float*>(up(bias.data(), bias.size() * sizeof(float))),
      .y = dy,
      .ldy = n};
  for (int i = 0; i < num; ++i) {
    dl.y[i] = dy + row0[i];
    dl.ldy[i] = n;
  }
  OpTiming t0 = time_backend_op(
      be,
      [&] {
        be.linear(plain);
        be.lora_batch(dl);
      },
      20, true);
  be.synchronize();
  for (void* p : ptrs) be.free(p);
  const double tflops = 2.0 * m * n * cols / t.seconds / 1e12;
  char shape[200];
  std::snprintf(shape, sizeof shape,
                "m=%ld %s %ldx%ld +%ld K, 8 slots r16: product + lora_batch %.3f ms; err %.0e",
                static_cast<long>(m), qkv ? "qkv" : "o", static_cast<long>(n), static_cast<long>(k),
                static_cast<long>(cols - k), t0.seconds * 1e3, worst);
  return {"linear lora ext",     shape, t.seconds * 1e3, tflops, "TFLOP/s", 100.0 * tflops / gemm_tflops,
          t0.seconds / t.seconds};
}

// add_rms_norm (the residual add fused with the next RMSNorm) at GPT-OSS-20B's hidden size 2880, m rows.
// Validated first against ref::add_rms_norm (x exact, y within 1e-5 + 1e-5·|ref|), then timed, and the pair
// it replaces (add_inplace, rms_norm) timed the same way (speedup column: pair time / fused time). Bytes:
// x read and written, delta read, y written (w is 11 KB, cached), against the copy bandwidth.
KernelResult bench_add_rms_norm_device(Backend& be, int64_t m, double copy_gbs) {
  constexpr int64_t n = 2880;
  DeviceBuffers buf(be);
  const std::vector<float> x0 = random_floats(static_cast<size_t>(m * n), 61);
  const std::vector<float> delta = random_floats(static_cast<size_t>(m * n), 62);
  std::vector<float> w = random_floats(static_cast<size_t>(n), 63);
  for (float& v : w) v = 1.0f + 0.5f * v;
  AddRmsNormArgs h{.x = nullptr,
                   .ldx = n,
                   .delta = delta.data(),
                   .ld_delta = n,
                   .y = nullptr,
                   .ldy = n,
                   .m = m,
                   .n = n,
                   .w = w.data(),
                   .eps = 1e-5f};
  AddRmsNormArgs d = h;
  d.x = buf.up(x0);
  d.delta = buf.up(delta);
  d.y = buf.up(std::vector<float>(static_cast<size_t>(m * n), 0.0f));
  d.w = buf.up(w);
  be.add_rms_norm(d);
  std::vector<float> x_ref = x0, y_ref(static_cast<size_t>(m * n));
  h.x = x_ref.data();
  h.y = y_ref.data();
  ref::add_rms_norm(h);
  if (buf.down(d.x, x_ref.size()) != x_ref) fail("add_rms_norm m={}: x is not x + delta; not timing", m);
  const double worst = worst_tolerance_ratio(buf.down(d.y, y_ref.size()), y_ref);
  if (!(worst <= 1.0))
    fail("add_rms_norm m={}: y off the reference by {:.3g} times the tolerance 1e-5 + 1e-5·|ref|; not timing",
         m, worst);
  // x keeps accumulating delta over the timed calls (as the residual stream does); the time does not
  // depend on it.
  const OpTiming t = time_backend_op(
      be, [&] { be.add_rms_norm(d); }, 200, true);
  const OpTiming pair = time_backend_op(
      be,
      [&] {
        be.add_inplace(d.x, d.delta, m * n);
        be.rms_norm({.x = d.x, .ldx = n, .y = d.y, .ldy = n, .m = m, .n = n, .w = d.w, .eps = d.eps});
      },
      200, true);
  const double gbs = 4.0 * m * n * 4 / t.seconds / 1e9;
  char shape[96];
  std::snprintf(shape, sizeof shape, "m=%ld n=%ld (pair %.2f us)%s err %.1f tol", static_cast<long>(m),
                static_cast<long>(n), pair.seconds * 1e6, t.graph ? "" : " (no graph)", worst);
  return {"add_rms_norm",          shape, t.seconds * 1e3, gbs, "GB/s", 100.0 * gbs / copy_gbs,
          pair.seconds / t.seconds};
}

// rope_kv_write at GPT-OSS-20B's attention shape (64 q / 8 kv heads of 64, YaRN attention_scaling 1.35) or
// Qwen3-30B-A3B's (32 / 4 heads of 128, qk_norm), m tokens at positions up to ~4k, each to a slot of its
// own in a paged cache of 16-token blocks (reverse block order). Validated first against
// ref::rope_kv_write (q and the cache within 1e-5 + 1e-5·|ref|), then timed, and the op sequence it
// replaces (rms_norm on q and k with qk_norm, rope on q and k, write_kv) timed the same way (speedup column).
// Timed with attention_scaling 1 (a pure rotation, so q stays bounded over the repeated calls; the work is
// the same). Bytes: q read and written, k and v read, k and v written to the cache, against the copy
// bandwidth.
KernelResult bench_rope_kv_write_device(Backend& be, int64_t m, bool qwen3, double copy_gbs) {
  const int64_t heads = qwen3 ? 32 : 64, kv_heads = qwen3 ? 4 : 8, dim = qwen3 ? 128 : 64;
  constexpr int64_t kBlock = 16;
  const int64_t qs = heads * dim, kvs = kv_heads * dim, blocks = (m + kBlock - 1) / kBlock + 1;
  DeviceBuffers buf(be);
  const std::vector<float> q0 = random_floats(static_cast<size_t>(m * qs), 71);
  const std::vector<float> kk = random_floats(static_cast<size_t>(m * kvs), 72);
  const std::vector<float> v = random_floats(static_cast<size_t>(m * kvs), 73);
  std::vector<float> q_norm = random_floats(static_cast<size_t>(dim), 74), k_norm = q_norm;
  for (size_t i = 0; i < q_norm.size(); ++i)
    q_norm[i] = 1.0f + 0.5f * q_norm[i], k_norm[i] = 1.0f - 0.25f * k_norm[i];
  std::vector<float> inv_freq(static_cast<size_t>(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i)
    inv_freq[i] = std::pow(150000.0f, -2.0f * i / static_cast<float>(dim));
  std::vector<int32_t> pos(static_cast<size_t>(m));
  std::vector<int64_t> slots(static_cast<size_t>(m));
  for (int64_t t = 0; t < m; ++t) {
    pos[t] = static_cast<int32_t>(4000 + t);
    slots[t] = (blocks - 1 - t / kBlock) * kBlock + t % kBlock;
  }
  const std::vector<float> cache0(static_cast<size_t>(blocks * kBlock * kvs), 0.0f);
  RopeKvWriteArgs h{
      .q = nullptr,
      .ldq = qs,
      .k = kk.data(),
      .ldk = kvs,
      .v = v.data(),
      .ldv = kvs,
      .m = m,
      .num_heads = heads,
      .num_kv_heads = kv_heads,
      .head_dim = dim,
      .positions = pos.data(),
      .inv_freq = inv_freq.data(),
      .attention_scaling = qwen3 ? 1.0f : 1.3466f,
      .q_norm = qwen3 ? q_norm.data() : nullptr,
      .k_norm = qwen3 ? k_norm.data() : nullptr,
      .eps = 1e-6f,
      .slot_mapping = slots.data(),
      .cache = {.num_blocks = blocks, .block_size = kBlock, .num_kv_heads = kv_heads, .head_dim = dim}};
  RopeKvWriteArgs d = h;
  d.q = buf.up(q0);
  float* d_k = buf.up(kk);
  d.k = d_k;
  d.v = buf.up(v);
  d.positions = buf.up(pos);
  d.inv_freq = buf.up(inv_freq);
  if (qwen3) {
    d.q_norm = buf.up(q_norm);
    d.k_norm = buf.up(k_norm);
  }
  d.slot_mapping = buf.up(slots);
  d.cache.k = buf.up(cache0);
  d.cache.v = buf.up(cache0);
  be.rope_kv_write(d);
  std::vector<float> q_ref = q0, ck_ref = cache0, cv_ref = cache0;
  h.q = q_ref.data();
  h.cache.k = ck_ref.data();
  h.cache.v = cv_ref.data();
  ref::rope_kv_write(h);
  const double worst = std::max({worst_tolerance_ratio(buf.down(d.q, q_ref.size()), q_ref),
                                 worst_tolerance_ratio(buf.down(d.cache.kf(), ck_ref.size()), ck_ref),
                                 worst_tolerance_ratio(buf.down(d.cache.vf(), cv_ref.size()), cv_ref)});
  const char* name = qwen3 ? "rope_kv_write qwen3" : "rope_kv_write gpt-oss";
  if (!(worst <= 1.0))
    fail("{} m={}: off the reference by {:.3g} times the tolerance 1e-5 + 1e-5·|ref|; not timing", name, m,
         worst);
  d.attention_scaling = 1.0f;
  const OpTiming t = time_backend_op(
      be, [&] { be.rope_kv_write(d); }, 200, true);
  // The replaced sequence (k rotated in place: its values do not matter to the time).
  const OpTiming seq = time_backend_op(
      be,
      [&] {
        if (qwen3) {
          be.rms_norm({.x = d.q,
                       .ldx = dim,
                       .y = d.q,
                       .ldy = dim,
                       .m = m * heads,
                       .n = dim,
                       .w = d.q_norm,
                       .eps = d.eps});
          be.rms_norm({.x = d_k,
                       .ldx = dim,
                       .y = d_k,
                       .ldy = dim,
                       .m = m * kv_heads,
                       .n = dim,
                       .w = d.k_norm,
                       .eps = d.eps});
        }
        be.rope({.x = d.q,
                 .ldx = qs,
                 .m = m,
                 .num_heads = heads,
                 .head_dim = dim,
                 .positions = d.positions,
                 .inv_freq = d.inv_freq,
                 .attention_scaling = 1.0f});
        be.rope({.x = d_k,
                 .ldx = kvs,
                 .m = m,
                 .num_heads = kv_heads,
                 .head_dim = dim,
                 .positions = d.positions,
                 .inv_freq = d.inv_freq,
                 .attention_scaling = 1.0f});
        be.write_kv({.k = d_k,
                     .ldk = kvs,
                     .v = d.v,
                     .ldv = kvs,
                     .m = m,
                     .slot_mapping = d.slot_mapping,
                     .cache = d.cache});
      },
      200, true);
  const double gbs = (2.0 * m * qs + 4.0 * m * kvs) * 4 / t.seconds / 1e9;
  char shape[112];
  std::snprintf(shape, sizeof shape, "m=%ld %ld/%ld heads x %ld%s (seq %.2f us)%s err %.1f tol",
                static_cast<long>(m), static_cast<long>(heads), static_cast<long>(kv_heads),
                static_cast<long>(dim), qwen3 ? " qk_norm" : "", seq.seconds * 1e6,
                t.graph ? "" : " (no graph)", worst);
  return {name, shape, t.seconds * 1e3, gbs, "GB/s", 100.0 * gbs / copy_gbs, seq.seconds / t.seconds};
}

// Paged attention at GPT-OSS-20B's shape (64 query / 8 KV heads of 64, attention sinks, 16-token blocks in a
// shuffled order), on the backend's kernels: prefill (seqs prompts of `len` tokens each, the whole context
// in the step) or decode (seqs rows, each with a context of `len` tokens). Validated first on a smaller
// instance of the same path (prefill 2 x 320 tokens, decode 8 rows of 900) against ref::attention, within
// 1e-5 + 1e-4·|ref| for the f32 kernels and 2e-2 + 2e-2·|ref| for the bf16 tensor-core prefill (a failure is
// an error), then timed. Prefill: TFLOP/s of the causal products (4 · heads · head_dim per visible (query,
// key) pair) against the bf16 GEMM rate measured in the same run; `mma` times the bf16 tensor-core kernel
// (tuning attention_prefill_mma) with the CUDA-core f32 kernel's time in the speedup column, else the f32
// kernel alone. Decode: GB/s of the K and V bytes read against the copy bandwidth, with an f32 or a bf16
// cache (kv; the reference reads the bf16 values widened).
KernelResult bench_attention_device(Backend& be, bool prefill, bool mma, int64_t seqs, int64_t len,
                                    double limit, DType kv = DType::kF32, bool gqa = false) {
  constexpr int64_t kHeads = 64, kKvHeads = 8, kDim = 64, kBlock = 16;
  struct Problem {
    std::vector<float> q, kc, vc, sinks;
    std::vector<uint16_t> kc16, vc16;  // BF16 cache
    std::vector<int32_t> qs, ctx, tables;
    int64_t tokens = 0, max_blocks = 0, num_blocks = 0;
  };
  auto make = [&](int64_t n_seqs, int64_t n_len) {
    Problem p;
    p.max_blocks = (n_len + kBlock - 1) / kBlock;
    p.num_blocks = p.max_blocks * n_seqs;
    std::vector<int32_t> perm(static_cast<size_t>(p.num_blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(5));
    p.tables = perm;
    p.qs.assign(static_cast<size_t>(n_seqs + 1), 0);
    p.ctx.assign(static_cast<size_t>(n_seqs), static_cast<int32_t>(n_len));
    for (int64_t i = 0; i < n_seqs; ++i) p.qs[i + 1] = p.qs[i] + static_cast<int32_t>(prefill ? n_len : 1);
    p.tokens = p.qs[n_seqs];
    const size_t kv_elems = static_cast<size_t>(p.num_blocks * kBlock * kKvHeads * kDim);
    p.kc = random_floats(kv_elems, 81);
    p.vc = random_floats(kv_elems, 82);
    if (kv == DType::kBF16) {  // the cache's values, as the reference reads them
      for (float& x : p.kc) p.kc16.push_back(f32_to_bf16(x)), x = bf16_to_f32(p.kc16.back());
      for (float& x : p.vc) p.vc16.push_back(f32_to_bf16(x)), x = bf16_to_f32(p.vc16.back());
    }
    p.q = random_floats(static_cast<size_t>(p.tokens * kHeads * kDim), 83);
    p.sinks = random_floats(static_cast<size_t>(kHeads), 84);
    return p;
  };
  auto args = [&](const Problem& p, int64_t n_seqs) {
    return AttentionArgs{.q = p.q.data(),
                         .ldq = kHeads * kDim,
                         .out = nullptr,
                         .ldo = kHeads * kDim,
                         .num_seqs = n_seqs,
                         .num_tokens = p.tokens,
                         .query_start = p.qs.data(),
                         .context_lens = p.ctx.data(),
                         .block_tables = p.tables.data(),
                         .max_blocks_per_seq = p.max_blocks,
                         .num_heads = kHeads,
                         .scale = 0.125f,
                         .window = 0,
                         .sinks = p.sinks.data(),
                         .cache = {.k = nullptr,
                                   .v = nullptr,
                                   .num_blocks = p.num_blocks,
                                   .block_size = kBlock,
                                   .num_kv_heads = kKvHeads,
                                   .head_dim = kDim}};
  };
  auto upload = [&](DeviceBuffers& buf, const Problem& p, AttentionArgs& a) {
    a.q = buf.up(p.q);
    a.out = buf.up(std::vector<float>(p.q.size(), 0.0f));
    a.query_start = buf.up(p.qs);
    a.context_lens = buf.up(p.ctx);
    a.block_tables = buf.up(p.tables);
    a.sinks = buf.up(p.sinks);
    if (kv == DType::kBF16) {
      a.cache.k = buf.up(p.kc16);
      a.cache.v = buf.up(p.vc16);
      a.cache.dtype = DType::kBF16;
    } else {
      a.cache.k = buf.up(p.kc);
      a.cache.v = buf.up(p.vc);
    }
  };
  KernelTuning tuning = kernel_tuning(TuningShape{});
  auto set_mma = [&](bool on) {
    KernelTuning t = tuning;
    t.attention_prefill_mma = on ? 1 : 0;
    t.attention_decode_gqa = gqa ? 1 : 0;
    override_kernel_tuning(t);
  };
  const char* name = prefill ? (mma ? "attention prefill (bf16 mma)" : "attention prefill (f32)")
                     : kv == DType::kBF16
                         ? (gqa ? "attention decode gqa (bf16 cache)" : "attention decode (bf16 cache)")
                         : (gqa ? "attention decode gqa" : "attention decode");
  set_mma(mma);
  {  // validation on a smaller instance of the same path
    const int64_t vs = prefill ? 2 : 8, vl = prefill ? 320 : 900;
    const Problem p = make(vs, vl);
    AttentionArgs h = args(p, vs);
    std::vector<float> ref(p.q.size(), 0.0f);
    h.out = ref.data();
    ref::attention(h);
    DeviceBuffers buf(be);
    AttentionArgs d = args(p, vs);
    upload(buf, p, d);
    be.attention(d);
    const std::vector<float> got = buf.down(d.out, ref.size());
    const double atol = prefill && mma ? 2e-2 : 1e-5, rtol = prefill && mma ? 2e-2 : 1e-4;
    double worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double r = std::fabs(double(got[i]) - ref[i]) / (atol + rtol * std::fabs(double(ref[i])));
      worst = std::max(worst, std::isnan(r) ? 1e30 : r);
    }
    if (!(worst <= 1.0)) {
      override_kernel_tuning(std::nullopt);
      fail("{} ({} x {}): off the reference by {:.3g} times the tolerance; not timing", name, vs, vl, worst);
    }
  }
  const Problem p = make(seqs, len);
  DeviceBuffers buf(be);
  AttentionArgs d = args(p, seqs);
  upload(buf, p, d);
  const OpTiming t = time_backend_op(
      be, [&] { be.attention(d); }, prefill ? 20 : 200, true);
  double other = -1.0;
  if (prefill && mma) {
    set_mma(false);
    other = time_backend_op(
                be, [&] { be.attention(d); }, 20, true)
                .seconds;
  }
  override_kernel_tuning(std::nullopt);
  char shape[128];
  if (prefill) {
    const double pairs =
        static_cast<double>(seqs) * static_cast<double>(len) * static_cast<double>(len + 1) / 2;
    const double tflops = 4.0 * kHeads * kDim * pairs / t.seconds / 1e12;
    std::snprintf(shape, sizeof shape, "%ld x %ld tokens, %ld/%ld heads x %ld, sinks%s%s",
                  static_cast<long>(seqs), static_cast<long>(len), static_cast<long>(kHeads),
                  static_cast<long>(kKvHeads), static_cast<long>(kDim), t.graph ? "" : " (no graph)",
                  other > 0 ? " (speedup: vs the f32 kernel)" : "");
    return {name,
            shape,
            t.seconds * 1e3,
            tflops,
            "TFLOP/s",
            limit > 0 ? 100.0 * tflops / limit : -1.0,
            other > 0 ? other / t.seconds : -1.0};
  }
  const double bytes =
      2.0 * static_cast<double>(seqs * len * kKvHeads * kDim) * static_cast<double>(dtype_size(kv));
  const double gbs = bytes / t.seconds / 1e9;
  std::snprintf(shape, sizeof shape, "%ld rows x %ld context, %ld/%ld heads x %ld, %s cache%s",
                static_cast<long>(seqs), static_cast<long>(len), static_cast<long>(kHeads),
                static_cast<long>(kKvHeads), static_cast<long>(kDim), kv == DType::kBF16 ? "bf16" : "f32",
                t.graph ? "" : " (no graph)");
  return {name, shape, t.seconds * 1e3, gbs, "GB/s", 100.0 * gbs / limit, -1.0};
}

}  // namespace

int run_device_kernels(bool json) {
  std::unique_ptr<Backend> be = make_backend({.device = DeviceKind::kCuda});
  const double copy_gbs = measure_backend_copy_gbs(*be);
  std::vector<KernelResult> rs;
  for (int64_t m : {1, 16, 64, 256, 8192}) rs.push_back(bench_lora_batch_device(*be, m, true, copy_gbs));
  for (int64_t m : {1, 64, 8192}) rs.push_back(bench_lora_batch_device(*be, m, false, copy_gbs));
  for (int64_t m : {1, 64, 2048}) rs.push_back(bench_add_rms_norm_device(*be, m, copy_gbs));
  for (bool qwen3 : {false, true})
    for (int64_t m : {1, 64, 2048}) rs.push_back(bench_rope_kv_write_device(*be, m, qwen3, copy_gbs));
  const double gemm_tflops = measure_backend_gemm_tflops(*be);
  // q/k/v of GPT-OSS-20B as one product (4096 + 512 + 512 outputs) and o, with 8 x r16 columns more.
  // The extended products of model/lora_dense_ext.h for 8 slots of rank 16: q/k/v stacked with three
  // modules' tails and the bias columns (3 x 128 + 2, to 8), o with one module's.
  rs.push_back(bench_linear_extra_k_device(*be, 8192, 5120, 2880, 392, gemm_tflops));
  rs.push_back(bench_linear_extra_k_device(*be, 8192, 2880, 4096, 136, gemm_tflops));
  rs.push_back(bench_linear_lora_ext_device(*be, 8192, true, gemm_tflops));
  rs.push_back(bench_linear_lora_ext_device(*be, 8192, false, gemm_tflops));
  rs.push_back(bench_attention_device(*be, false, false, 64, 4096, copy_gbs));
  rs.push_back(bench_attention_device(*be, false, false, 1, 8192, copy_gbs));
  rs.push_back(bench_attention_device(*be, false, false, 64, 4096, copy_gbs, DType::kBF16));
  // The GQA decode kernel (attention_decode_gqa): K and V read once per 8 query heads.
  rs.push_back(bench_attention_device(*be, false, false, 64, 4096, copy_gbs, DType::kF32, true));
  rs.push_back(bench_attention_device(*be, false, false, 64, 4096, copy_gbs, DType::kBF16, true));
  rs.push_back(bench_attention_device(*be, true, false, 4, 2048, gemm_tflops));
  // The tensor-core prefill last: a failed validation ends the run.
  rs.push_back(bench_attention_device(*be, true, true, 4, 2048, gemm_tflops));
  if (json) {
    std::printf(
        "{\n  \"device\": \"%s\",\n  \"copy_bandwidth_gbs\": %.3f,\n  \"gemm_bf16_tflops\": %.3f,\n  "
        "\"kernels\": [\n",
        be->name().c_str(), copy_gbs, gemm_tflops);
    for (size_t i = 0; i < rs.size(); ++i) {
      const KernelResult& r = rs[i];
      std::printf(
          "    {\"name\": \"%s\", \"shape\": \"%s\", \"ms\": %.6f, \"value\": %.3f, \"unit\": \"%s\", "
          "\"percent_of_limit\": %.2f",
          r.name.c_str(), r.shape.c_str(), r.ms, r.value, r.unit.c_str(), r.pct);
      if (r.speedup > 0) std::printf(", \"speedup_vs_unfused\": %.3f", r.speedup);
      std::printf("}%s\n", i + 1 < rs.size() ? "," : "");
    }
    std::printf("  ]\n}\n");
    return 0;
  }
  std::printf(
      "device: %s, copy bandwidth %.1f GB/s (read + write), bf16 GEMM %.1f TFLOP/s (cuBLAS, 8192^3)\n\n",
      be->name().c_str(), copy_gbs, gemm_tflops);
  std::printf("%-22s %-68s %10s %12s %8s %10s %11s\n", "kernel", "shape", "ms/call", "throughput", "unit",
              "% of limit", "vs unfused");
  for (const KernelResult& r : rs) {
    char sp[32] = "-";
    if (r.speedup > 0) std::snprintf(sp, sizeof sp, "%.2fx", r.speedup);
    std::printf("%-22s %-68s %10.4f %12.1f %8s %9ld%% %11s\n", r.name.c_str(), r.shape.c_str(), r.ms, r.value,
                r.unit.c_str(), std::lround(r.pct), sp);
  }
  return 0;
}

}  // namespace polylora::bench
