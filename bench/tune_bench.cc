// bench/tune_bench.cc: `polylora_bench tune --device cuda [--out FILE]`: measures the CUDA MoE path bounds
// of kernels/tuning.h on this GPU for one expert shape (GPT-OSS-20B's by default) and writes them as a
// tuning file (keyed by the device's name and the shape) for src/kernels/tuning/ or
// POLYLORA_TUNED_CONFIG_FOLDER. Each bound sits between two paths of moe_experts: at each token count of
// its sweep both are run (kernels::override_kernel_tuning forces one, then the other), their outputs are
// compared (a disagreement beyond 2e-2 of the output's rms is an error: a timed path is a validated one;
// the GPU tests and `polylora_bench moe-lora` check each against the CPU reference), then both are timed as
// CUDA-graph replays (backend_timing.h); kernels::pick_crossover takes the smallest count from which the
// second path stays faster. Bounds, in pairs per expert on average (pairs = tokens · top_k):
//   moe_tc_min_per_expert    BF16: fp32 GEMV below, tensor-core GEMV from it (small batches, from 1 token);
//   moe_tc_max_per_expert    BF16: tensor-core GEMV up to it, grouped GEMM above;
//   mxfp4_tc_min_per_expert  MXFP4: fp32 GEMV below, tensor-core GEMV from it (from 1 token: 0 when the
//                            tensor-core kernel wins everywhere);
//   mxfp4_mma_per_expert     MXFP4: tensor-core GEMV below, grouped GEMM from it;
//   moe_lora_mma_per_expert  BF16 experts with 8 slot-stacked r16 adapters on the grouped GEMM: CUDA-core
//                            LoRA below, tensor-core shrink + epilogue expand from it;
//   moe_wgmma_per_expert     BF16 experts on the grouped GEMM: mma.sync below, Hopper warpgroup MMA from it
//                            (moe_gemm_wgmma.cuh; the same on GPUs other than compute capability 9.0, where
//                            it is never taken).
// One JSON line per measured point on stdout, then the file. Takes about a minute on an H200.
// Must not: run on the CPU backend (the bounds are CUDA's; it says so and exits 2).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend_timing.h"
#include "bench_alloc.h"
#include "bench_command.h"
#include "common/error.h"
#include "kernels/moe/moe.h"
#include "kernels/tuning.h"

namespace polylora::bench {
namespace {

using namespace polylora::kernels;

constexpr int64_t kNever = int64_t{1} << 40;  // a bound no batch reaches

struct Shape {
  int64_t hidden = 2880, inter = 2880, experts = 32, top_k = 4;
};

// The experts of one weight format and the inputs of one token count, on the device.
struct Experts {
  const ExpertView* views = nullptr;
  bool mxfp4 = false;
};

Experts make_experts(Backend& be, Device& dev, const Shape& s, bool mxfp4) {
  std::vector<ExpertView> v(static_cast<size_t>(s.experts));
  for (int64_t e = 0; e < s.experts; ++e) {
    const auto seed = static_cast<uint64_t>(3000 + 2 * e);
    v[e].gate_up = mxfp4 ? be.random_mxfp4(2 * s.inter, s.hidden, 120, seed)
                         : be.random_matrix(2 * s.inter, s.hidden, 0.02f, seed);
    v[e].down = mxfp4 ? be.random_mxfp4(s.hidden, s.inter, 120, seed + 1)
                      : be.random_matrix(s.hidden, s.inter, 0.02f, seed + 1);
  }
  return {dev.up(v), mxfp4};
}

struct Point {
  int64_t m = 0, per_expert = 0;  // pairs per expert rounded up (the bound "pairs >= x · E" holds at m)
  int64_t per_expert_floor = 0;   // rounded down (a lower bound x that keeps m on the second path)
  double below_s = 0, above_s = 0, rel_diff = 0;
};

// Runs `a` under tuning `t` (env overrides still apply) and returns its output on the host.
std::vector<float> run_under(Backend& be, const MoeExpertsArgs& a, const KernelTuning& t) {
  override_kernel_tuning(t);
  be.moe_experts(a);
  std::vector<float> out(static_cast<size_t>(a.m * a.ldo));
  be.copy_to_host(out.data(), a.out, out.size() * sizeof(float));
  return out;
}

// One bound: at each m, `below` then `above` (tunings forcing the two paths), checked against each other,
// then timed.
std::vector<Point> sweep(Backend& be, Device& dev, const Shape& s, const Experts& ex,
                         const std::vector<int64_t>& ms, const KernelTuning& below, const KernelTuning& above,
                         const MoeLoraStack* stack, int iters, const char* bound) {
  std::vector<Point> pts;
  for (int64_t m : ms) {
    Rng rng(static_cast<uint64_t>(91 + m));
    std::vector<float> x(static_cast<size_t>(m * s.hidden)), logits(static_cast<size_t>(m * s.experts));
    for (float& v : x) v = bf16_to_f32(f32_to_bf16(rng.uniform(1.0f)));
    for (float& v : logits) v = rng.uniform(1.0f);
    std::vector<int32_t> ids(static_cast<size_t>(m * s.top_k)), slots(static_cast<size_t>(m));
    std::vector<float> w(ids.size());
    ref::route({.logits = logits.data(),
                .m = m,
                .num_experts = s.experts,
                .top_k = s.top_k,
                .scoring = RouterScoring::kSoftmaxTopK,
                .renormalize = false,
                .ids = ids.data(),
                .weights = w.data()});
    MoeExpertsArgs a;
    a.x = dev.up(x);
    a.ldx = s.hidden;
    a.m = m;
    a.hidden = s.hidden;
    a.inter = s.inter;
    a.num_experts = s.experts;
    a.top_k = s.top_k;
    a.ids = dev.up(ids);
    a.weights = dev.up(w);
    a.experts = ex.views;
    a.experts_mxfp4 = ex.mxfp4;
    a.out = dev.zeros(static_cast<size_t>(m * s.hidden));
    a.ldo = s.hidden;
    if (stack != nullptr) {
      for (int64_t t = 0; t < m; ++t) slots[t] = static_cast<int32_t>(t % stack->slots);
      a.token_slots = dev.up(slots);
      a.lora_stack = *stack;
    }
    const std::vector<float> yb = run_under(be, a, below), ya = run_under(be, a, above);
    double diff = 0;
    for (size_t i = 0; i < yb.size(); ++i)
      diff = std::max(diff, static_cast<double>(std::fabs(yb[i] - ya[i])));
    const double rel = diff / std::max(1e-30, rms(yb));
    if (!(rel <= 2e-2))
      fail("polylora_bench tune: the two paths of {} disagree at m={} ({:.3g} of the output's rms)", bound, m,
           rel);
    override_kernel_tuning(below);
    const double tb = time_backend_op(
                          be, [&] { be.moe_experts(a); }, iters, true)
                          .seconds;
    override_kernel_tuning(above);
    const double ta = time_backend_op(
                          be, [&] { be.moe_experts(a); }, iters, true)
                          .seconds;
    override_kernel_tuning(std::nullopt);
    const Point p{.m = m,
                  .per_expert = (m * s.top_k + s.experts - 1) / s.experts,
                  .per_expert_floor = m * s.top_k / s.experts,
                  .below_s = tb,
                  .above_s = ta,
                  .rel_diff = rel};
    std::printf("%s\n", nlohmann::ordered_json({{"bound", bound},
                                                {"m", m},
                                                {"pairs_per_expert", p.per_expert},
                                                {"below_us", tb * 1e6},
                                                {"above_us", ta * 1e6},
                                                {"rel_diff", rel}})
                            .dump()
                            .c_str());
    std::fflush(stdout);
    pts.push_back(p);
  }
  return pts;
}

// floor_x: a bound "second path from x pairs per expert" whose first point is below one pair per expert
// (m = 1): x rounded down, so that a win there keeps m on the second path (x = 0).
int64_t crossover(const std::vector<Point>& pts, int64_t none, bool floor_x = false) {
  std::vector<TunePoint> tp;
  for (const Point& p : pts)
    tp.push_back(
        {.x = floor_x ? p.per_expert_floor : p.per_expert, .below_s = p.below_s, .above_s = p.above_s});
  return pick_crossover(tp, none);
}

// The device name inside the backend's name ("cuda:0 (NVIDIA H200)" -> "NVIDIA H200").
std::string device_name(const std::string& backend_name) {
  const size_t a = backend_name.find('('), b = backend_name.rfind(')');
  return a != std::string::npos && b != std::string::npos && b > a ? backend_name.substr(a + 1, b - a - 1)
                                                                   : backend_name;
}

int run_tune(int argc, char** argv) {
  CLI::App app{"Measure the CUDA MoE path bounds (kernels/tuning.h) and write a tuning file",
               "polylora_bench tune"};
  std::string device = "cuda", out_path;
  Shape s;
  int iters = 50;
  app.add_option("--device", device, "cuda (the bounds are the CUDA kernels')");
  app.add_option("--hidden", s.hidden, "Expert input size (default GPT-OSS-20B's)")
      ->check(CLI::Range(32, 65536));
  app.add_option("--inter", s.inter, "Expert intermediate size")->check(CLI::Range(32, 65536));
  app.add_option("--experts", s.experts, "Experts")->check(CLI::Range(2, 1024));
  app.add_option("--top-k", s.top_k, "Experts per token")->check(CLI::Range(1, 32));
  app.add_option("--iters", iters, "Graph replays per timed batch")->check(CLI::Range(1, 10000));
  app.add_option("--out", out_path, "Write the tuning file here (else only printed)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (device != "cuda") {
    std::fprintf(stderr,
                 "polylora_bench tune: the tuned bounds are the CUDA kernels'; run it with --device cuda\n");
    return 2;
  }
  if (s.hidden % 32 != 0 || s.inter % 32 != 0 || s.top_k > s.experts) {
    std::fprintf(
        stderr,
        "polylora_bench tune: hidden and inter must be multiples of 32 (MXFP4 blocks), top-k <= experts\n");
    return 2;
  }
  BackendOptions bo;
  bo.device = DeviceKind::kCuda;
  bo.weight_dtype = DType::kBF16;
  std::unique_ptr<Backend> be_ptr = make_backend(bo);
  Backend& be = *be_ptr;
  if (be.kind() != DeviceKind::kCuda) {
    std::fprintf(stderr, "polylora_bench tune: no CUDA device\n");
    return 2;
  }
  Device dev(be);
  const std::string name = device_name(be.name());
  std::fprintf(stderr, "tune on %s: experts H %ld, I %ld, E %ld, top %ld\n", name.c_str(),
               static_cast<long>(s.hidden), static_cast<long>(s.inter), static_cast<long>(s.experts),
               static_cast<long>(s.top_k));
  const Experts bf16 = make_experts(be, dev, s, false), mx = make_experts(be, dev, s, true);
  // Token counts giving 1, 2, 4, ... pairs per expert on average.
  auto tokens_for = [&](std::initializer_list<int64_t> per_expert) {
    std::vector<int64_t> ms;
    for (int64_t p : per_expert) ms.push_back(std::max<int64_t>(1, p * s.experts / s.top_k));
    return ms;
  };
  KernelTuning below, above;

  // BF16, small batches: fp32 GEMV vs tensor-core GEMV (both small paths).
  below.moe_small_pairs = above.moe_small_pairs = kNever;
  below.moe_tc_min_per_expert = kNever;
  above.moe_tc_min_per_expert = 0;
  const auto tc_min = sweep(be, dev, s, bf16, {1, 2, 4, 8, 16, 32, 64}, below, above, nullptr, iters,
                            "moe_tc_min_per_expert");
  // BF16: tensor-core GEMV vs grouped GEMM.
  below = above = KernelTuning{};
  below.moe_small_pairs = kNever;
  below.moe_tc_min_per_expert = 0;
  above.moe_small_pairs = 0;
  const auto tc_max = sweep(be, dev, s, bf16, tokens_for({4, 8, 16, 32, 64, 128}), below, above, nullptr,
                            iters, "moe_tc_max_per_expert");
  // MXFP4, small batches: fp32 GEMV vs tensor-core GEMV, from one token.
  below = above = KernelTuning{};
  below.mxfp4_mma_per_expert = above.mxfp4_mma_per_expert = kNever;
  below.mxfp4_tc_min_per_expert = kNever;
  above.mxfp4_tc_min_per_expert = 0;
  const auto mxfp4_tc = sweep(be, dev, s, mx, {1, 2, 4, 8, 16, 32, 64}, below, above, nullptr, iters,
                              "mxfp4_tc_min_per_expert");
  // MXFP4: tensor-core GEMV vs grouped GEMM.
  below = above = KernelTuning{};
  below.mxfp4_tc_min_per_expert = above.mxfp4_tc_min_per_expert = 0;
  below.mxfp4_mma_per_expert = kNever;
  above.mxfp4_mma_per_expert = 0;
  const auto mxfp4 = sweep(be, dev, s, mx, tokens_for({4, 8, 16, 32, 64, 128, 256}), below, above, nullptr,
                           iters, "mxfp4_mma_per_expert");
  // BF16 with 8 slot-stacked r16 adapters on the grouped GEMM: CUDA-core LoRA vs tensor-core LoRA.
  const int64_t S = 8, R = 16;
  const HostTensor a_gu(DType::kBF16, static_cast<size_t>(S * s.experts * R * s.hidden), 0.05f, 21);
  const HostTensor b_gu(DType::kBF16, static_cast<size_t>(S * s.experts * 2 * s.inter * R), 0.05f, 22);
  const HostTensor a_down(DType::kBF16, static_cast<size_t>(S * s.experts * R * s.inter), 0.05f, 23);
  const HostTensor b_down(DType::kBF16, static_cast<size_t>(S * s.experts * s.hidden * R), 0.05f, 24);
  std::vector<float> scale(static_cast<size_t>(S * s.experts * 3), 1.0f);
  for (int64_t i = 0; i < S * s.experts; ++i)
    scale[static_cast<size_t>(i * 3 + 1)] = 0.0f;  // one gate_up LoRA
  const MoeLoraStack stack{.a_gu = dev.up(a_gu.data(), a_gu.bytes()),
                           .b_gu = dev.up(b_gu.data(), b_gu.bytes()),
                           .a_down = dev.up(a_down.data(), a_down.bytes()),
                           .b_down = dev.up(b_down.data(), b_down.bytes()),
                           .dtype = DType::kBF16,
                           .scale = dev.up(scale),
                           .slots = S,
                           .rank = R,
                           .gu_slices = 1};
  below = above = KernelTuning{};
  below.moe_small_pairs = above.moe_small_pairs = 0;  // the grouped GEMM at every size
  below.moe_lora_mma_per_expert = kNever;
  above.moe_lora_mma_per_expert = 0;
  // Up to 1,024 pairs per expert (GPT-OSS-20B: 8,192-token prefill steps): the H100's file said "never"
  // from points up to 256, where serving prefills at 1,024 (session 51). POLYLORA_MOE_WGMMA_LORA_EXT=1 in the
  // environment measures the tensor-core side with the LoRA as extra K slices (env applies on top).
  const auto lora = sweep(be, dev, s, bf16, tokens_for({8, 16, 32, 64, 128, 256, 1024}), below, above, &stack,
                          iters, "moe_lora_mma_per_expert");

  // BF16 on the grouped GEMM: mma.sync vs warpgroup MMA (0: never; 1: from one pair per expert).
  below = above = KernelTuning{};
  below.moe_small_pairs = above.moe_small_pairs = 0;
  below.moe_wgmma_per_expert = 0;
  above.moe_wgmma_per_expert = 1;
  const auto wgmma = sweep(be, dev, s, bf16, tokens_for({16, 32, 64, 128, 256, 512}), below, above, nullptr,
                           iters, "moe_wgmma_per_expert");

  TuningEntry entry{.shape = {.hidden = s.hidden, .inter = s.inter, .experts = s.experts}, .values = {}};
  entry.values.emplace_back("moe_tc_min_per_expert", crossover(tc_min, kNever, true));
  entry.values.emplace_back("moe_tc_max_per_expert", std::max<int64_t>(0, crossover(tc_max, kNever) - 1));
  entry.values.emplace_back("mxfp4_tc_min_per_expert", crossover(mxfp4_tc, kNever, true));
  entry.values.emplace_back("mxfp4_mma_per_expert", crossover(mxfp4, kNever));
  entry.values.emplace_back("moe_lora_mma_per_expert", crossover(lora, kNever));
  {
    const int64_t w = crossover(wgmma, kNever);
    entry.values.emplace_back("moe_wgmma_per_expert", w >= kNever ? 0 : w);  // 0: never
  }
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  const TuningFile file{.device = name,
                        .source = std::string("polylora_bench tune, ") + date + ", " + std::to_string(iters) +
                                  " graph replays per timing",
                        .entries = {entry}};
  const std::string json = tuning_file_json(file);
  std::printf("%s", json.c_str());
  if (!out_path.empty()) {
    std::ofstream(out_path) << json;
    std::fprintf(stderr, "wrote %s\n", out_path.c_str());
  }
  return 0;
}

const BenchRegistrar kRegister("tune",
                               "Measure the CUDA MoE path bounds and write a tuning file [--device cuda]",
                               run_tune);

}  // namespace
}  // namespace polylora::bench
