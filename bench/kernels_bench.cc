// bench/kernels_bench.cc: `polylora_bench kernels [--json] [--device cpu|cuda]`: the CPU fast kernels at
// model shapes, judged against the machine's limits measured in the same run (memory bandwidth, OpenBLAS
// sgemm) and against their references (speedup). Every benchmarked kernel is also covered by tests/kernels/.
// --device cuda: the CUDA kernels' entries (kernels_bench_device.cc). The MoE experts' entry is
// `polylora_bench moe-lora` (base_us, base_GBps, base_TFLOPs against the same limits).
// Must not: run longer than about a minute.
#include <omp.h>

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
#include "bench_command.h"
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

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<uint16_t> random_bf16(size_t n, uint32_t seed) {
  std::vector<float> f = random_floats(n, seed);
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = f32_to_bf16(f[i] * 0.05f);
  return v;
}

namespace {

using namespace polylora::kernels;

WeightView bf16_view(const std::vector<uint16_t>& v, int64_t rows, int64_t cols) {
  return {.data = v.data(), .dtype = DType::kBF16, .rows = rows, .cols = cols};
}

std::string shape3(const char* a, int64_t x, const char* b, int64_t y, const char* c, int64_t z) {
  return std::string(a) + "=" + std::to_string(x) + " " + b + "=" + std::to_string(y) + " " + c + "=" +
         std::to_string(z);
}

// Decode linear: enough weight copies to overflow the last-level cache, so W really streams from DRAM.
KernelResult bench_linear_decode(double bandwidth) {
  constexpr int64_t n = 4096, k = 1024, kCopies = 12;  // 12 × 8 MiB = 96 MiB
  std::vector<std::vector<uint16_t>> ws;
  for (int64_t c = 0; c < kCopies; ++c) ws.push_back(random_bf16(static_cast<size_t>(n * k), 10 + c));
  std::vector<float> x = random_floats(k, 1), y(n);
  int64_t next = 0;
  auto args = [&](int64_t c) {
    return LinearArgs{.x = x.data(), .m = 1, .ldx = k, .w = bf16_view(ws[c], n, k), .y = y.data(), .ldy = n};
  };
  double t = time_per_call([&] { cpu::linear(args(next++ % kCopies)); }, 0.3);
  double t_ref = time_per_call([&] { ref::linear(args(next++ % kCopies)); }, 0.1, 5);
  double gbs = n * k * 2.0 / t / 1e9;
  return {"linear decode bf16",
          shape3("m", 1, "n", n, "k", k),
          t * 1e3,
          gbs,
          "GB/s",
          100.0 * gbs / bandwidth,
          t_ref / t};
}

KernelResult bench_linear_prefill(int64_t n, double sgemm, bool with_ref) {
  constexpr int64_t m = 512, k = 1024;
  std::vector<uint16_t> w = random_bf16(static_cast<size_t>(n * k), 3);
  std::vector<float> x = random_floats(static_cast<size_t>(m * k), 4), y(static_cast<size_t>(m * n));
  LinearArgs a{.x = x.data(), .m = m, .ldx = k, .w = bf16_view(w, n, k), .y = y.data(), .ldy = n};
  double t = time_per_call([&] { cpu::linear(a); }, 0.3);
  double speedup = with_ref ? time_per_call([&] { ref::linear(a); }, 0.0, 1) / t : -1.0;
  double gflops = 2.0 * m * n * k / t / 1e9;
  return {"linear prefill bf16",
          shape3("m", m, "n", n, "k", k),
          t * 1e3,
          gflops,
          "GFLOP/s",
          100.0 * gflops / sgemm,
          speedup};
}

// Qwen3-MoE-like experts: hidden 1024, I 512, 32 experts, top-4, BF16; routing changes every call so the
// active experts' weights come from DRAM at m=1.
KernelResult bench_moe(int64_t m, double bandwidth, double sgemm) {
  constexpr int64_t H = 1024, I = 512, E = 32, K = 4;
  std::vector<std::vector<uint16_t>> gu, down;
  std::vector<ExpertView> experts(E);
  for (int64_t e = 0; e < E; ++e) {
    gu.push_back(random_bf16(static_cast<size_t>(2 * I * H), 100 + e));
    down.push_back(random_bf16(static_cast<size_t>(H * I), 200 + e));
    experts[e].gate_up = bf16_view(gu.back(), 2 * I, H);
    experts[e].down = bf16_view(down.back(), H, I);
  }
  constexpr int kRoutings = 16;
  std::vector<std::vector<int32_t>> ids(kRoutings);
  std::mt19937 rng(5);
  for (auto& r : ids) {
    for (int64_t t = 0; t < m; ++t) {
      std::vector<int32_t> order(E);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      r.insert(r.end(), order.begin(), order.begin() + K);
    }
  }
  std::vector<float> x = random_floats(static_cast<size_t>(m * H), 6), w(static_cast<size_t>(m * K), 0.25f);
  std::vector<float> out(static_cast<size_t>(m * H));
  int next = 0;
  auto args = [&](int r) {
    return MoeExpertsArgs{.x = x.data(),
                          .ldx = H,
                          .m = m,
                          .hidden = H,
                          .inter = I,
                          .num_experts = E,
                          .top_k = K,
                          .ids = ids[r].data(),
                          .weights = w.data(),
                          .experts = experts.data(),
                          .out = out.data(),
                          .ldo = H};
  };
  double t = time_per_call([&] { cpu::moe_experts(args(next++ % kRoutings)); }, 0.3);
  double t_ref = time_per_call([&] { ref::moe_experts(args(next++ % kRoutings)); }, 0.0, 1);
  std::string shape = "m=" + std::to_string(m) + " H=1024 I=512 E=32 top4";
  if (m == 1) {
    double gbs = K * 3.0 * H * I * 2.0 / t / 1e9;  // 4 experts × (gate_up + down) BF16 bytes
    return {"moe_experts decode", shape, t * 1e3, gbs, "GB/s", 100.0 * gbs / bandwidth, t_ref / t};
  }
  double gflops = 2.0 * m * K * 3.0 * H * I / t / 1e9;
  return {"moe_experts prefill", shape, t * 1e3, gflops, "GFLOP/s", 100.0 * gflops / sgemm, t_ref / t};
}

// Paged attention, block size 16, 16 query heads / 8 KV heads, head_dim 128.
KernelResult bench_attention(bool decode, double bandwidth) {
  constexpr int64_t bs = 16, heads = 16, kvh = 8, d = 128;
  int64_t num_seqs = decode ? 8 : 1, ctx = decode ? 1024 : 512, q_len = decode ? 1 : 512;
  int64_t blocks_per_seq = ctx / bs, num_blocks = num_seqs * blocks_per_seq;
  std::vector<float> kc = random_floats(static_cast<size_t>(num_blocks * bs * kvh * d), 1);
  std::vector<float> vc = random_floats(kc.size(), 2);
  std::vector<int32_t> tables(static_cast<size_t>(num_blocks));
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), std::mt19937(3));
  std::vector<int32_t> qs(static_cast<size_t>(num_seqs + 1)), ctx_lens(static_cast<size_t>(num_seqs), ctx);
  for (int64_t s = 0; s <= num_seqs; ++s) qs[s] = static_cast<int32_t>(s * q_len);
  int64_t tokens = num_seqs * q_len;
  std::vector<float> q = random_floats(static_cast<size_t>(tokens * heads * d), 4), o(q.size());
  AttentionArgs a{.q = q.data(),
                  .ldq = heads * d,
                  .out = o.data(),
                  .ldo = heads * d,
                  .num_seqs = num_seqs,
                  .query_start = qs.data(),
                  .context_lens = ctx_lens.data(),
                  .block_tables = tables.data(),
                  .max_blocks_per_seq = blocks_per_seq,
                  .num_heads = heads,
                  .scale = 1.0f / std::sqrt(128.0f),
                  .cache = {.k = kc.data(),
                            .v = vc.data(),
                            .num_blocks = num_blocks,
                            .block_size = bs,
                            .num_kv_heads = kvh,
                            .head_dim = d}};
  double t = time_per_call([&] { cpu::attention(a); }, 0.3);
  double t_ref = time_per_call([&] { ref::attention(a); }, 0.0, 1);
  std::string shape = "seqs=" + std::to_string(num_seqs) + " ctx=" + std::to_string(ctx) +
                      " q=" + std::to_string(q_len) + " h=16/8 d=128";
  if (decode) {
    double gbs = 2.0 * num_seqs * ctx * kvh * d * 4.0 / t / 1e9;  // K and V bytes read
    return {"attention decode", shape, t * 1e3, gbs, "GB/s", 100.0 * gbs / bandwidth, t_ref / t};
  }
  double flops = 4.0 * heads * d * (q_len * (q_len + 1) / 2.0);  // QKᵀ and PV over the causal triangle
  return {"attention prefill", shape, t * 1e3, flops / t / 1e9, "GFLOP/s", -1.0, t_ref / t};
}

// The 1-minute load average before the run (Linux; −1 elsewhere): above the thread count, other processes
// compete for the cores and fork-join timings degrade by whole scheduler time slices.
double load_average() {
  double load = -1.0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = -1.0;
    std::fclose(f);
  }
  return load;
}

void print_table(double bandwidth, double sgemm, const std::vector<KernelResult>& rs) {
  std::printf("machine: %d threads, memory bandwidth %.1f GB/s, OpenBLAS sgemm %.1f GFLOP/s\n",
              omp_get_max_threads(), bandwidth, sgemm);
  double load = load_average();
  if (load > omp_get_max_threads()) {
    std::printf(
        "warning: load average %.1f exceeds %d threads; other processes share the cores, timings are "
        "unreliable\n",
        load, omp_get_max_threads());
  }
  std::printf("\n%-22s %-34s %10s %12s %8s %10s %9s\n", "kernel", "shape", "ms/call", "throughput", "unit",
              "% of limit", "vs ref");
  for (const KernelResult& r : rs) {
    std::string pct = r.pct >= 0 ? std::to_string(static_cast<int>(std::lround(r.pct))) + "%" : "-";
    char sp[32] = "-";
    if (r.speedup > 0) std::snprintf(sp, sizeof sp, "%.1fx", r.speedup);
    std::printf("%-22s %-34s %10.3f %12.1f %8s %10s %9s\n", r.name.c_str(), r.shape.c_str(), r.ms, r.value,
                r.unit.c_str(), pct.c_str(), sp);
  }
}

void print_json(double bandwidth, double sgemm, const std::vector<KernelResult>& rs) {
  std::printf("{\n  \"load_average\": %.2f,\n  \"threads\": %d,\n", load_average(), omp_get_max_threads());
  std::printf("  \"memory_bandwidth_gbs\": %.3f,\n  \"sgemm_gflops\": %.3f,\n  \"kernels\": [\n", bandwidth,
              sgemm);
  for (size_t i = 0; i < rs.size(); ++i) {
    const KernelResult& r = rs[i];
    std::printf("    {\"name\": \"%s\", \"shape\": \"%s\", \"ms\": %.6f, \"value\": %.3f, \"unit\": \"%s\"",
                r.name.c_str(), r.shape.c_str(), r.ms, r.value, r.unit.c_str());
    if (r.pct >= 0) std::printf(", \"percent_of_limit\": %.2f", r.pct);
    if (r.speedup > 0) std::printf(", \"speedup_vs_ref\": %.2f", r.speedup);
    std::printf("}%s\n", i + 1 < rs.size() ? "," : "");
  }
  std::printf("  ]\n}\n");
}

int run_kernels_bench(int argc, char** argv) {
  bool json = false, cuda = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json")) {
      json = true;
    } else if (!std::strcmp(argv[i], "--device") && i + 1 < argc &&
               (!std::strcmp(argv[i + 1], "cpu") || !std::strcmp(argv[i + 1], "cuda"))) {
      cuda = !std::strcmp(argv[++i], "cuda");
    } else {
      std::fprintf(stderr, "usage: polylora_bench kernels [--json] [--device cpu|cuda]\n");
      return 2;
    }
  }
  if (cuda) return run_device_kernels(json);
  double sgemm = measure_sgemm_gflops();  // first: before OpenMP threads exist and spin
  double bandwidth = measure_memory_bandwidth_gbs();
  std::vector<KernelResult> rs;
  rs.push_back(bench_linear_decode(bandwidth));
  rs.push_back(bench_linear_prefill(1024, sgemm, true));
  rs.push_back(bench_linear_prefill(2048, sgemm, false));
  rs.push_back(bench_linear_prefill(4096, sgemm, false));
  rs.push_back(bench_moe(1, bandwidth, sgemm));
  rs.push_back(bench_moe(256, bandwidth, sgemm));
  rs.push_back(bench_attention(true, bandwidth));
  rs.push_back(bench_attention(false, bandwidth));
  if (json) {
    print_json(bandwidth, sgemm, rs);
  } else {
    print_table(bandwidth, sgemm, rs);
  }
  return 0;
}

const BenchRegistrar kRegister("kernels",
                               "CPU (or --device cuda) kernels vs machine limits and references [--json]",
                               run_kernels_bench);

}  // namespace
}  // namespace polylora::bench
