// bench/moe_lora_bench.cc: `polylora_bench moe-lora [--device cuda|cpu]`: the slot-stacked expert LoRA
// (MoeExpertsArgs::lora_stack) at the shapes of ../shared/peers/bench_vllm_moe_lora.py, so that the two
// run side by side in one device run: GPT-OSS-20B experts (H = I = 2880, E = 32, top 4), rank 16, 8 adapter
// slots, separate gate and up LoRAs (gu_slices 2, as the harness's two w13 slices) plus down, M = 1 (one
// active adapter) and 16 / 64 / 256 (8 adapters, tokens round-robin); random bf16 weights (std 0.02, LoRA
// std 0.05 as the harness), routing by softmax + top-k of random logits.
// For each M: first validated against the CPU reference (ref::moe_experts on a sample of tokens covering
// every active adapter, with and without LoRA; fails with exit code 1 above the tolerance), then timed
// (backend_timing.h: CUDA-graph replays between CUDA events) without LoRA and with the stacked LoRA. The
// LoRA's cost is the difference, per layer (w13 + w2 LoRA, what the harness's vllm_w13_us + vllm_w2_us
// measure for vLLM's fused_moe_lora). One JSON line per M (and a final "RESULTS [...]" line, as the
// harness prints), fields:
//   M, active_adapters, slots, rank, gu_slices, act, weight_dtype, lora_dtype, device, graphs, iters;
//   validated_tokens, max_abs_err (GPU vs reference output with LoRA), max_rel_err (that / rms of the
//   reference), lora_delta_max_rel_err (max |(out_lora − out_base) − reference's same| / its rms), tolerance;
//   base_us (experts without LoRA), lora_us (with the stacked LoRA), lora_delta_us (lora_us − base_us);
//   lora_pairs (distinct (slot, expert) pairs routed: each reads its A/B matrices once), lora_bytes_MB
//   (pairs × bytes of their A_gu, B_gu, A_down, B_down, as the harness computes), lora_delta_GBps
//   (lora_bytes / lora_delta_us), lora_delta_fraction_of_copy (that / copy_GBps), lora_copy_roofline_us
//   (lora_bytes / copy_GBps); base_experts (experts routed), base_bytes_MB, base_GBps,
//   base_fraction_of_copy; copy_GBps (the backend's device copy bandwidth, read + write bytes, measured in
//   the same run); base_TFLOPs (the experts' product FLOPs, 2 x M x top_k x 3 x I x H, over base_us: the
//   prefill sizes' figure), gemm_peak_TFLOPs (the backend's bf16 GEMM at 8192^3, cuBLAS, same run; null on
//   the CPU) and base_fraction_of_gemm_peak; issue_goal_lora_us (issue 15's goal for lora_delta_us at this M,
//   null elsewhere); with --old-views: old_views_lora_us / old_views_lora_delta_us (the same LoRA through the
//   per-adapter ExpertLoraView table of f32 matrices, the path before the stacks) and old_views_max_rel_diff
//   (its output vs the stacked one, over the rms); with --route-norm: route_norm_separate_us (route,
//   moe_experts, add_rms_norm as three calls) and route_norm_fused_us (one moe_experts given its routing and
//   the norm, both fused launches on), after checking their outputs equal bit for bit.
// --dtype mxfp4: the experts as GPT-OSS ships them (random codes, block scales 2^-7), bf16 compute; the
// reference decodes the same codes.
// Must not: run the vLLM harness (scripts do, in the same device run).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend_timing.h"
#include "bench_alloc.h"
#include "bench_command.h"
#include "common/dtype.h"
#include "common/error.h"
#include "kernels/moe/moe.h"
#include "kernels/tuning.h"

namespace polylora::bench {
namespace {

using namespace polylora::kernels;

int run_moe_lora_bench(int argc, char** argv) {
  CLI::App app{"Slot-stacked expert LoRA at the shapes of ../shared/peers/bench_vllm_moe_lora.py",
               "polylora_bench moe-lora"};
  std::string device = "cuda", dtype = "bfloat16", lora_dtype = "bfloat16", act_name = "swiglu",
              ms_text = "1,16,64,256";
  std::string json_path;
  int64_t rank = 16, slots = 8, validate_tokens = 16, active = 0;
  int gu_slices = 2, iters = 0;
  bool no_graphs = false, old_views = false, route_norm = false;
  app.add_option("--device", device, "cuda | cpu")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--dtype", dtype,
                 "Expert weight dtype: bfloat16 | float32 (CUDA; the CPU keeps bf16) | mxfp4 (GPT-OSS as "
                 "shipped: random codes, every block scale 2^-7, as --load-format dummy; bf16 compute)")
      ->check(CLI::IsMember({"bfloat16", "float32", "mxfp4"}));
  app.add_option("--lora-dtype", lora_dtype, "Stack dtype: bfloat16 | float32")
      ->check(CLI::IsMember({"bfloat16", "float32"}));
  app.add_option(
         "--act", act_name,
         "swiglu: GPT-OSS (fused interleaved gate_up with biases; gate/up slice n & 1) | silu: gate rows "
         "then up rows, no biases (slice n >= I, the harness's w13 layout)")
      ->check(CLI::IsMember({"swiglu", "silu"}));
  app.add_option("--gu-slices", gu_slices, "1: one gate_up LoRA, 2: separate gate and up LoRAs (the harness)")
      ->check(CLI::Range(1, 2));
  app.add_option("--rank", rank, "LoRA rank (every slot)")->check(CLI::Range(1, 1024));
  app.add_option("--slots", slots, "Adapter slots in the stack (the harness's max_loras)")
      ->check(CLI::Range(1, 256));
  app.add_option("--m", ms_text, "Comma-separated token counts");
  app.add_option("--active", active,
                 "Adapters the tokens round-robin over (default: the harness's, 1 at M = 1 and min(8, slots) "
                 "above; 1 with a large M is a prefill chunk of one sequence)")
      ->check(CLI::Range(int64_t{1}, int64_t{256}));
  app.add_option("--iters", iters, "Timed calls per batch (default 200 on CUDA, 2 on the CPU)");
  app.add_option("--validate-tokens", validate_tokens, "Tokens checked against the CPU reference per M")
      ->check(CLI::Range(1, 100000));
  app.add_flag("--no-graphs", no_graphs, "Time queued calls instead of CUDA-graph replays");
  app.add_flag(
      "--old-views", old_views,
      "Also time the per-adapter ExpertLoraView path (f32 matrices, one allocation each) on the same "
      "values (gu_slices 2 over the interleaved layout as one gate_up LoRA of rank 2r)");
  app.add_flag("--route-norm", route_norm,
               "Also the routing and the next add + norm around the experts (no LoRA): route, moe_experts, "
               "add_rms_norm as three calls against one moe_experts given them with both fused launches on "
               "(moe_route_fused_max_tokens, moe_combine_norm), checked bit for bit, then timed");
  app.add_option("--json-out", json_path, "Also write the results as a JSON array here");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const std::vector<int64_t> ms = parse_list(ms_text);
  if (ms.empty() || *std::min_element(ms.begin(), ms.end()) < 1) fail("--m needs token counts >= 1");
  const int64_t H = 2880, I = 2880, E = 32, K = 4, R = rank, S = slots, G = gu_slices;
  const ExpertAct act = act_name == "swiglu" ? ExpertAct::kGptOssSwiglu : ExpertAct::kSiluGate;
  const DType ldt = lora_dtype == "float32" ? DType::kF32 : DType::kBF16;

  BackendOptions bo;
  bo.device = device == "cuda" ? DeviceKind::kCuda : DeviceKind::kCpu;
  bo.weight_dtype = dtype == "float32" ? DType::kF32 : DType::kBF16;
  std::unique_ptr<Backend> be_ptr = make_backend(bo);
  Backend& be = *be_ptr;
  const bool on_cpu = be.kind() == DeviceKind::kCpu;
  if (iters <= 0) iters = on_cpu ? 2 : 200;
  Device dev(be);
  std::fprintf(stderr, "moe-lora on %s: measuring the copy bandwidth...\n", be.name().c_str());
  const double copy_gbs = measure_backend_copy_gbs(be);
  // The bf16 GEMM rate of the same GPU (cuBLAS through Backend::linear), what base_TFLOPs is judged against.
  double gemm_tflops = 0;
  if (!on_cpu && bo.weight_dtype == DType::kBF16) {
    std::fprintf(stderr, "moe-lora: measuring the bf16 GEMM rate (8192^3)...\n");
    gemm_tflops = measure_backend_gemm_tflops(be);
  }

  // Experts: random on the backend, copied back for the reference (the CPU backend's are host memory).
  std::fprintf(stderr, "making %ld experts (H %ld, I %ld) and the LoRA stack (%ld slots, rank %ld)...\n",
               static_cast<long>(E), static_cast<long>(H), static_cast<long>(I), static_cast<long>(S),
               static_cast<long>(R));
  std::vector<ExpertView> d_experts(static_cast<size_t>(E)), h_experts(static_cast<size_t>(E));
  std::vector<std::vector<uint8_t>> host_bytes;
  std::vector<std::vector<float>> biases;
  host_bytes.reserve(static_cast<size_t>(2 * E));
  biases.reserve(static_cast<size_t>(2 * E));
  auto host_copy = [&](const WeightView& w) {
    if (on_cpu) return w;
    const bool q = w.mxfp4();
    host_bytes.emplace_back(static_cast<size_t>(w.rows * w.cols) * dtype_size(w.dtype) / (q ? 2 : 1));
    be.copy_to_host(host_bytes.back().data(), w.data, host_bytes.back().size());
    WeightView h = w;
    h.data = host_bytes.back().data();
    if (q) {
      host_bytes.emplace_back(static_cast<size_t>(w.rows * w.cols / kMxfp4BlockSize));
      be.copy_to_host(host_bytes.back().data(), w.scales, host_bytes.back().size());
      h.scales = host_bytes.back().data();
    }
    return h;
  };
  const bool mxfp4 = dtype == "mxfp4";
  constexpr uint8_t kDummyScale = 120;  // 2^-7, as --load-format dummy's MXFP4 experts
  for (int64_t e = 0; e < E; ++e) {
    const auto seed = static_cast<uint64_t>(1000 + 2 * e);
    d_experts[e].gate_up =
        mxfp4 ? be.random_mxfp4(2 * I, H, kDummyScale, seed) : be.random_matrix(2 * I, H, 0.02f, seed);
    d_experts[e].down =
        mxfp4 ? be.random_mxfp4(H, I, kDummyScale, seed + 1) : be.random_matrix(H, I, 0.02f, seed + 1);
    h_experts[e].gate_up = host_copy(d_experts[e].gate_up);
    h_experts[e].down = host_copy(d_experts[e].down);
    if (act == ExpertAct::kGptOssSwiglu) {
      Rng rng(static_cast<uint64_t>(5000 + e));
      biases.emplace_back(static_cast<size_t>(2 * I));
      for (float& b : biases.back()) b = rng.uniform(0.1f);
      h_experts[e].gate_up_bias = biases.back().data();
      d_experts[e].gate_up_bias = be.vector_from_host(biases.back().data(), biases.back().size());
      biases.emplace_back(static_cast<size_t>(H));
      for (float& b : biases.back()) b = rng.uniform(0.1f);
      h_experts[e].down_bias = biases.back().data();
      d_experts[e].down_bias = be.vector_from_host(biases.back().data(), biases.back().size());
    }
  }
  const ExpertView* dev_experts = dev.up(d_experts);
  // The stack: every slot has LoRA on every expert (the harness enables all), scale 1.
  const HostTensor a_gu(ldt, static_cast<size_t>(S * E * G * R * H), 0.05f, 11);
  const HostTensor b_gu(ldt, static_cast<size_t>(S * E * 2 * I * R), 0.05f, 12);
  const HostTensor a_down(ldt, static_cast<size_t>(S * E * R * I), 0.05f, 13);
  const HostTensor b_down(ldt, static_cast<size_t>(S * E * H * R), 0.05f, 14);
  std::vector<float> scale(static_cast<size_t>(S * E * 3), 1.0f);
  if (G == 1)
    for (int64_t i = 0; i < S * E; ++i) scale[static_cast<size_t>(i * 3 + 1)] = 0.0f;
  MoeLoraStack h_stack{.a_gu = a_gu.data(),
                       .b_gu = b_gu.data(),
                       .a_down = a_down.data(),
                       .b_down = b_down.data(),
                       .dtype = ldt,
                       .scale = scale.data(),
                       .slots = S,
                       .rank = R,
                       .gu_slices = gu_slices};
  MoeLoraStack d_stack = h_stack;
  d_stack.a_gu = dev.up(a_gu.data(), a_gu.bytes());
  d_stack.b_gu = dev.up(b_gu.data(), b_gu.bytes());
  d_stack.a_down = dev.up(a_down.data(), a_down.bytes());
  d_stack.b_down = dev.up(b_down.data(), b_down.bytes());
  d_stack.scale = dev.up(scale);
  // The old path's table on the device (--old-views): per (slot, expert) f32 copies of the same values.
  std::vector<ExpertLoraView> old_table(static_cast<size_t>(S * E));
  const ExpertLoraView* d_old_table = nullptr;
  if (old_views) {
    auto val = [&](const HostTensor& t, int64_t i) {
      return t.dtype == DType::kBF16 ? bf16_to_f32(t.h[static_cast<size_t>(i)]) : t.f[static_cast<size_t>(i)];
    };
    auto up_f32 = [&](const std::vector<float>& v) { return static_cast<const float*>(dev.up(v)); };
    const bool interleaved = act == ExpertAct::kGptOssSwiglu;
    for (int64_t se = 0; se < S * E; ++se) {
      ExpertLoraView& v = old_table[static_cast<size_t>(se)];
      std::vector<float> ag(static_cast<size_t>(G * R * H)), bg(static_cast<size_t>(2 * I * R));
      for (int64_t i = 0; i < G * R * H; ++i) ag[i] = val(a_gu, se * G * R * H + i);
      for (int64_t i = 0; i < 2 * I * R; ++i) bg[i] = val(b_gu, se * 2 * I * R + i);
      if (G == 1) {
        v.gate_up = {.a = up_f32(ag), .b = up_f32(bg), .rank = R, .in = H, .out = 2 * I, .scale = 1.0f};
      } else if (!interleaved) {
        std::vector<float> a0(ag.begin(), ag.begin() + R * H), a1(ag.begin() + R * H, ag.end());
        std::vector<float> b0(bg.begin(), bg.begin() + I * R), b1(bg.begin() + I * R, bg.end());
        v.gate = {.a = up_f32(a0), .b = up_f32(b0), .rank = R, .in = H, .out = I, .scale = 1.0f};
        v.up = {.a = up_f32(a1), .b = up_f32(b1), .rank = R, .in = H, .out = I, .scale = 1.0f};
      } else {
        std::vector<float> fb(static_cast<size_t>(2 * I * 2 * R), 0.0f);
        for (int64_t n = 0; n < 2 * I; ++n)
          for (int64_t i = 0; i < R; ++i) fb[n * 2 * R + (n & 1) * R + i] = bg[n * R + i];
        v.gate_up = {.a = up_f32(ag), .b = up_f32(fb), .rank = 2 * R, .in = H, .out = 2 * I, .scale = 1.0f};
      }
      std::vector<float> ad(static_cast<size_t>(R * I)), bd(static_cast<size_t>(H * R));
      for (int64_t i = 0; i < R * I; ++i) ad[i] = val(a_down, se * R * I + i);
      for (int64_t i = 0; i < H * R; ++i) bd[i] = val(b_down, se * H * R + i);
      v.down = {.a = up_f32(ad), .b = up_f32(bd), .rank = R, .in = I, .out = H, .scale = 1.0f};
    }
    d_old_table = dev.up(old_table);
  }
  const double pair_bytes = static_cast<double>(G * R * H + 2 * I * R + R * I + H * R) * dtype_size(ldt);
  const double expert_bytes =
      static_cast<double>(h_experts[0].gate_up.num_bytes() + h_experts[0].down.num_bytes());
  const double tolerance = dtype == "float32" && !on_cpu ? 1e-3 : 2e-2;

  nlohmann::ordered_json all = nlohmann::ordered_json::array();
  for (int64_t M : ms) {
    const int64_t nact = active > 0 ? std::min(active, S) : (M == 1 ? 1 : std::min<int64_t>(8, S));
    // Inputs: x as bf16 values (the harness's activations), routing = top-k of softmax(random logits).
    Rng rng(static_cast<uint64_t>(77 + M));
    std::vector<float> x(static_cast<size_t>(M * H)), logits(static_cast<size_t>(M * E));
    for (float& v : x) v = bf16_to_f32(f32_to_bf16(rng.uniform(1.0f)));
    for (float& v : logits) v = rng.uniform(1.0f);
    std::vector<int32_t> ids(static_cast<size_t>(M * K)), token_slots(static_cast<size_t>(M));
    std::vector<float> w(ids.size());
    ref::route({.logits = logits.data(),
                .m = M,
                .num_experts = E,
                .top_k = K,
                .scoring = RouterScoring::kSoftmaxTopK,
                .renormalize = false,
                .ids = ids.data(),
                .weights = w.data()});
    for (int64_t t = 0; t < M; ++t) token_slots[t] = static_cast<int32_t>(t % nact);
    std::set<std::pair<int32_t, int32_t>> pairs;
    std::set<int32_t> experts_used;
    for (int64_t t = 0; t < M; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        pairs.insert({token_slots[t], ids[t * K + k]});
        experts_used.insert(ids[t * K + k]);
      }
    }
    MoeExpertsArgs base;
    base.x = dev.up(x);
    base.ldx = H;
    base.m = M;
    base.hidden = H;
    base.inter = I;
    base.num_experts = E;
    base.top_k = K;
    base.ids = dev.up(ids);
    base.weights = dev.up(w);
    base.experts = dev_experts;
    base.act = act;
    base.experts_mxfp4 = mxfp4;
    base.out = dev.zeros(static_cast<size_t>(M * H));
    base.ldo = H;
    MoeExpertsArgs lora = base;
    lora.token_slots = dev.up(token_slots);
    lora.lora_stack = d_stack;
    lora.out = dev.zeros(static_cast<size_t>(M * H));

    // Validation on a sample: the first token of every active adapter, then evenly spaced tokens.
    std::vector<int64_t> sample;
    for (int64_t t = 0; t < std::min(M, nact); ++t) sample.push_back(t);
    const int64_t extra =
        std::max<int64_t>(0, std::min(M, validate_tokens) - static_cast<int64_t>(sample.size()));
    for (int64_t j = 0; j < extra; ++j) {
      int64_t t = nact + (M - nact) * j / std::max<int64_t>(1, extra);
      if (t < M && t >= nact) sample.push_back(t);
    }
    std::sort(sample.begin(), sample.end());
    sample.erase(std::unique(sample.begin(), sample.end()), sample.end());
    const int64_t n = static_cast<int64_t>(sample.size());
    be.moe_experts(base);
    be.moe_experts(lora);
    std::vector<float> got_base(static_cast<size_t>(M * H)), got_lora(got_base.size());
    be.copy_to_host(got_base.data(), base.out, got_base.size() * sizeof(float));
    be.copy_to_host(got_lora.data(), lora.out, got_lora.size() * sizeof(float));
    std::vector<float> sx(static_cast<size_t>(n * H)), sw(static_cast<size_t>(n * K));
    std::vector<int32_t> sids(static_cast<size_t>(n * K)), sslots(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) {
      const int64_t t = sample[j];
      std::copy_n(x.begin() + t * H, H, sx.begin() + j * H);
      std::copy_n(ids.begin() + t * K, K, sids.begin() + j * K);
      std::copy_n(w.begin() + t * K, K, sw.begin() + j * K);
      sslots[j] = token_slots[t];
    }
    MoeExpertsArgs rb;
    rb.x = sx.data();
    rb.ldx = H;
    rb.m = n;
    rb.hidden = H;
    rb.inter = I;
    rb.num_experts = E;
    rb.top_k = K;
    rb.ids = sids.data();
    rb.weights = sw.data();
    rb.experts = h_experts.data();
    rb.act = act;
    rb.experts_mxfp4 = mxfp4;
    rb.ldo = H;
    MoeExpertsArgs rl = rb;
    rl.token_slots = sslots.data();
    rl.lora_stack = h_stack;
    std::vector<float> ref_base(static_cast<size_t>(n * H)), ref_lora(ref_base.size());
    rb.out = ref_base.data();
    rl.out = ref_lora.data();
    std::fprintf(stderr, "M=%ld: CPU reference on %ld tokens...\n", static_cast<long>(M),
                 static_cast<long>(n));
    ref::moe_experts(rb);
    ref::moe_experts(rl);
    double max_abs = 0, delta_err = 0;
    std::vector<float> ref_delta(ref_base.size());
    for (int64_t j = 0; j < n; ++j) {
      const int64_t t = sample[j];
      for (int64_t i = 0; i < H; ++i) {
        const float gl = got_lora[t * H + i], gb = got_base[t * H + i];
        const float rlv = ref_lora[j * H + i], rbv = ref_base[j * H + i];
        max_abs = std::max(max_abs, static_cast<double>(std::fabs(gl - rlv)));
        ref_delta[j * H + i] = rlv - rbv;
        delta_err = std::max(delta_err, static_cast<double>(std::fabs((gl - gb) - (rlv - rbv))));
      }
    }
    const double rel = max_abs / std::max(1e-30, rms(ref_lora));
    const double delta_rel = delta_err / std::max(1e-30, rms(ref_delta));
    const bool valid =
        std::isfinite(rel) && std::isfinite(delta_rel) && rel <= tolerance && delta_rel <= tolerance;
    nlohmann::ordered_json r = {
        {"M", M},
        {"active_adapters", nact},
        {"slots", S},
        {"rank", R},
        {"gu_slices", G},
        {"act", act_name},
        {"weight_dtype", mxfp4 ? std::string("MXFP4") : std::string(dtype_name(h_experts[0].gate_up.dtype))},
        {"lora_dtype", dtype_name(ldt)},
        {"device", be.name()},
        {"validated_tokens", n},
        {"max_abs_err", max_abs},
        {"max_rel_err", rel},
        {"lora_delta_max_rel_err", delta_rel},
        {"tolerance", tolerance}};
    if (!valid) {
      std::printf("%s\n", r.dump().c_str());
      std::fprintf(stderr,
                   "polylora_bench moe-lora: VALIDATION FAILED at M=%ld: max relative error %.3g, LoRA delta "
                   "relative error %.3g (tolerance %.3g); not timing\n",
                   static_cast<long>(M), rel, delta_rel, tolerance);
      return 1;
    }
    std::fprintf(stderr, "M=%ld: valid (max rel err %.2e, LoRA delta %.2e); timing...\n",
                 static_cast<long>(M), rel, delta_rel);
    const OpTiming tb = time_backend_op(
        be, [&] { be.moe_experts(base); }, iters, !no_graphs);
    const OpTiming tl = time_backend_op(
        be, [&] { be.moe_experts(lora); }, iters, !no_graphs);
    const double delta_s = tl.seconds - tb.seconds;
    const double lora_bytes = static_cast<double>(pairs.size()) * pair_bytes;
    const double base_bytes = static_cast<double>(experts_used.size()) * expert_bytes;
    const double lora_gbs = delta_s > 0 ? lora_bytes / delta_s / 1e9 : 0.0;
    const double base_gbs = base_bytes / tb.seconds / 1e9;
    auto goal = [&]() -> nlohmann::ordered_json {
      switch (M) {
        case 1:
          return 12;
        case 16:
          return 28;
        case 64:
          return 53;
        case 256:
          return 82;
        default:
          return nullptr;
      }
    };
    r["graphs"] = tb.graph && tl.graph;
    r["iters"] = iters;
    r["base_us"] = tb.seconds * 1e6;
    r["lora_us"] = tl.seconds * 1e6;
    r["lora_delta_us"] = delta_s * 1e6;
    r["lora_pairs"] = pairs.size();
    r["lora_bytes_MB"] = lora_bytes / 1e6;
    r["lora_delta_GBps"] = lora_gbs;
    r["lora_delta_fraction_of_copy"] = lora_gbs / copy_gbs;
    r["lora_copy_roofline_us"] = lora_bytes / (copy_gbs * 1e9) * 1e6;
    r["base_experts"] = experts_used.size();
    r["base_bytes_MB"] = base_bytes / 1e6;
    r["base_GBps"] = base_gbs;
    r["base_fraction_of_copy"] = base_gbs / copy_gbs;
    r["copy_GBps"] = copy_gbs;
    // The experts' products (gate_up 2I x H and down H x I per token-expert pair) over base_us.
    const double base_tflops =
        2.0 * static_cast<double>(M * K) * static_cast<double>(3 * I * H) / tb.seconds / 1e12;
    r["base_TFLOPs"] = base_tflops;
    r["gemm_peak_TFLOPs"] =
        gemm_tflops > 0 ? nlohmann::ordered_json(gemm_tflops) : nlohmann::ordered_json(nullptr);
    r["base_fraction_of_gemm_peak"] =
        gemm_tflops > 0 ? nlohmann::ordered_json(base_tflops / gemm_tflops) : nlohmann::ordered_json(nullptr);
    r["issue_goal_lora_us"] = goal();
    if (route_norm) {
      // The routing, the experts and the next add + norm: three calls, or one with both fused launches on
      // (the same values, bit for bit: checked before timing).
      const std::vector<float> resid0(static_cast<size_t>(M * H), 0.5f);
      std::vector<float> norm_w(static_cast<size_t>(H));
      for (float& v : norm_w) v = 1.0f + 0.25f * rng.uniform(1.0f);
      const float* d_logits = static_cast<const float*>(dev.up(logits));
      const float* d_norm_w = static_cast<const float*>(dev.up(norm_w));
      struct Variant {
        MoeExpertsArgs moe;
        RouteArgs route;
        AddRmsNormArgs norm;
      };
      auto variant = [&] {
        Variant v;
        v.moe = base;
        v.moe.ids = static_cast<int32_t*>(dev.up(std::vector<int32_t>(ids.size(), 0)));
        v.moe.weights = dev.zeros(w.size());
        v.moe.out = dev.zeros(static_cast<size_t>(M * H));
        v.route = {.logits = d_logits,
                   .m = M,
                   .num_experts = E,
                   .top_k = K,
                   .scoring = RouterScoring::kSoftmaxTopK,
                   .renormalize = false,
                   .ids = const_cast<int32_t*>(v.moe.ids),
                   .weights = const_cast<float*>(v.moe.weights)};
        v.norm = {.x = static_cast<float*>(dev.up(resid0)),
                  .ldx = H,
                  .delta = v.moe.out,
                  .ld_delta = H,
                  .y = dev.zeros(static_cast<size_t>(M * H)),
                  .ldy = H,
                  .m = M,
                  .n = H,
                  .w = d_norm_w,
                  .eps = 1e-5f,
                  .lora_delta = {}};
        return v;
      };
      Variant sep = variant(), one = variant();
      one.moe.route = one.route;
      one.moe.then_norm = one.norm;
      KernelTuning t0 = kernel_tuning(TuningShape{.hidden = H, .inter = I, .experts = E});
      t0.moe_route_fused_max_tokens = 0;
      t0.moe_combine_norm = 0;
      KernelTuning t1 = t0;
      t1.moe_route_fused_max_tokens = M;
      t1.moe_combine_norm = 1;
      auto run_sep = [&] {
        override_kernel_tuning(t0);
        be.route(sep.route);
        be.moe_experts(sep.moe);
        be.add_rms_norm(sep.norm);
      };
      auto run_one = [&] {
        override_kernel_tuning(t1);
        be.moe_experts(one.moe);
      };
      run_sep();
      run_one();
      auto down = [&](const float* p) {
        std::vector<float> h(static_cast<size_t>(M * H));
        be.copy_to_host(h.data(), p, h.size() * sizeof(float));
        return h;
      };
      const bool same = down(sep.moe.out) == down(one.moe.out) && down(sep.norm.x) == down(one.norm.x) &&
                        down(sep.norm.y) == down(one.norm.y);
      if (!same) {
        override_kernel_tuning(std::nullopt);
        std::fprintf(stderr,
                     "polylora_bench moe-lora: the fused routing / norm launches differ from the separate "
                     "calls at M=%ld; not timing\n",
                     static_cast<long>(M));
        return 1;
      }
      // The tuning is read when the calls are queued (graph capture included).
      const OpTiming ts = time_backend_op(be, run_sep, iters, !no_graphs);
      const OpTiming tf = time_backend_op(be, run_one, iters, !no_graphs);
      override_kernel_tuning(std::nullopt);
      r["route_norm_separate_us"] = ts.seconds * 1e6;
      r["route_norm_fused_us"] = tf.seconds * 1e6;
    }
    if (old_views) {
      // The same LoRA through the ExpertLoraView table: checked against the stacked result, then timed.
      MoeExpertsArgs ov = lora;
      ov.lora_stack = {};
      ov.lora = d_old_table;
      ov.num_slots = S;
      ov.out = dev.zeros(static_cast<size_t>(M * H));
      be.moe_experts(ov);
      std::vector<float> got_old(got_lora.size());
      be.copy_to_host(got_old.data(), ov.out, got_old.size() * sizeof(float));
      double diff = 0;
      for (size_t j = 0; j < got_old.size(); ++j)
        diff = std::max(diff, double(std::fabs(got_old[j] - got_lora[j])));
      const double old_rel = diff / std::max(1e-30, rms(got_lora));
      if (!(old_rel <= tolerance)) {
        std::fprintf(stderr,
                     "polylora_bench moe-lora: the old views disagree with the stack at M=%ld (%.3g)\n",
                     static_cast<long>(M), old_rel);
        return 1;
      }
      const OpTiming to = time_backend_op(
          be, [&] { be.moe_experts(ov); }, iters, !no_graphs);
      r["old_views_max_rel_diff"] = old_rel;
      r["old_views_lora_us"] = to.seconds * 1e6;
      r["old_views_lora_delta_us"] = (to.seconds - tb.seconds) * 1e6;
    }
    std::printf("%s\n", r.dump().c_str());
    std::fflush(stdout);
    all.push_back(r);
  }
  std::printf("RESULTS %s\n", all.dump().c_str());
  if (!json_path.empty()) std::ofstream(json_path) << all.dump(2) << "\n";
  return 0;
}

const BenchRegistrar kRegister("moe-lora",
                               "Stacked expert LoRA at vLLM's fused_moe_lora harness shapes, validated, then "
                               "timed [--device cuda|cpu]",
                               run_moe_lora_bench);

}  // namespace
}  // namespace polylora::bench
