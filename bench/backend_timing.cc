// bench/backend_timing.cc: time_backend_op, measure_backend_copy_gbs and measure_backend_gemm_tflops (see
// backend_timing.h).
#include "backend_timing.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "common/error.h"
#include "kernels/linear/linear.h"
#include "machine_limits.h"

namespace polylora::bench {

OpTiming time_backend_op(Backend& be, const std::function<void()>& fn, int iters, bool use_graphs) {
  CHECK_MSG(iters >= 1, "time_backend_op: iters must be >= 1, got {}", iters);
  OpTiming t;
  t.iters = iters;
  if (be.kind() == DeviceKind::kCpu) {
    t.seconds = time_per_call(fn, 1.0, iters);
    return t;
  }
  for (int i = 0; i < 3; ++i) fn();  // sizes the workspace before any capture
  be.synchronize();
  void* graph = nullptr;
  if (use_graphs && be.supports_graphs()) {
    be.begin_capture();
    fn();
    graph = be.end_capture();
  }
  t.graph = graph != nullptr;
  auto run = [&] {
    if (graph) {
      be.run_graph(graph);
    } else {
      fn();
    }
  };
  run();
  be.synchronize();
  void* e0 = be.create_event();
  void* e1 = be.create_event();
  std::vector<double> batches;
  for (int b = 0; b < 5; ++b) {
    be.record_event(e0);
    for (int i = 0; i < iters; ++i) run();
    be.record_event(e1);
    be.wait_event(e1);
    batches.push_back(be.event_elapsed(e0, e1) / iters);
  }
  be.destroy_event(e0);
  be.destroy_event(e1);
  if (graph) be.destroy_graph(graph);
  std::nth_element(batches.begin(), batches.begin() + 2, batches.end());
  t.seconds = batches[2];
  return t;
}

double measure_backend_copy_gbs(Backend& be) {
  const int64_t cols = 4096;
  const int64_t rows = (be.kind() == DeviceKind::kCpu ? (int64_t{256} << 20) : (int64_t{1} << 30)) /
                       (cols * static_cast<int64_t>(sizeof(float)));
  const size_t bytes = static_cast<size_t>(rows * cols) * sizeof(float);
  auto* src = static_cast<float*>(be.alloc(bytes));
  auto* dst = static_cast<float*>(be.alloc(bytes));
  std::vector<int32_t> idx(static_cast<size_t>(rows));
  std::iota(idx.begin(), idx.end(), 0);
  auto* d_idx = static_cast<int32_t*>(be.alloc(idx.size() * sizeof(int32_t)));
  be.copy_to_device(d_idx, idx.data(), idx.size() * sizeof(int32_t));
  double best = 1e30;
  for (int pass = 0; pass < 5; ++pass) {
    OpTiming t = time_backend_op(
        be, [&] { be.gather_rows(src, d_idx, rows, cols, dst); }, be.kind() == DeviceKind::kCpu ? 3 : 10,
        false);
    best = std::min(best, t.seconds);
  }
  be.synchronize();
  be.free(src);
  be.free(dst);
  be.free(d_idx);
  return 2.0 * static_cast<double>(bytes) / best / 1e9;
}

double measure_backend_gemm_tflops(Backend& be, int64_t n) {
  CHECK_MSG(n >= 64, "measure_backend_gemm_tflops: n must be >= 64, got {}", n);
  const auto elems = static_cast<size_t>(n * n);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<uint16_t> w_host(elems);
  std::vector<float> x_host(elems);
  for (size_t i = 0; i < elems; ++i) {
    const float v = dist(rng) * 0.05f;
    uint32_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    w_host[i] = static_cast<uint16_t>(bits >> 16);  // truncated to bf16: any values will do
    x_host[i] = dist(rng);
  }
  void* w = be.alloc(elems * sizeof(uint16_t));
  auto* x = static_cast<float*>(be.alloc(elems * sizeof(float)));
  auto* y = static_cast<float*>(be.alloc(elems * sizeof(float)));
  be.copy_to_device(w, w_host.data(), elems * sizeof(uint16_t));
  be.copy_to_device(x, x_host.data(), elems * sizeof(float));
  kernels::LinearArgs a;
  a.x = x;
  a.m = n;
  a.ldx = n;
  a.w = kernels::WeightView{.data = w, .dtype = DType::kBF16, .rows = n, .cols = n};
  a.y = y;
  a.ldy = n;
  double best = 1e30;
  for (int pass = 0; pass < 3; ++pass) {
    OpTiming t = time_backend_op(
        be, [&] { be.linear(a); }, be.kind() == DeviceKind::kCpu ? 1 : 10, true);
    best = std::min(best, t.seconds);
  }
  be.synchronize();
  be.free(w);
  be.free(x);
  be.free(y);
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / best / 1e12;
}

}  // namespace polylora::bench
