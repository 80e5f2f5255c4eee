// tests/gpu/nccl_communicator_gpu_test.cc: the NCCL communicator (runtime/cuda/nccl_communicator.h) against
// the CPU group (runtime/communicator.h) on the same inputs: all_reduce (sum, max; F32, I32, BF16),
// all_gather (also in place), reduce_scatter, broadcast, all_to_all_v (uneven and zero counts) and barrier,
// at 1 rank and, where the machine has the GPUs, 2 and 4 ranks (one thread per rank). The inputs are small
// multiples of 1/8 (exact in F32 and BF16 whatever the order of the sums), so every result must be equal
// byte for byte. Also: a bad argument aborts the group with a clear Error, and NVLink multicast is off.
// Skipped without a GPU (and the multi-rank cases without enough GPUs); built only with NCCL.
#if POLYLORA_HAVE_NCCL

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "common/error.h"
#include "runtime/communicator.h"
#include "runtime/cuda/nccl_communicator.h"

namespace polylora {
namespace {

using Bytes = std::vector<uint8_t>;

// Runs f(rank) on one thread per rank; rethrows the first exception.
void on_ranks(int n, const std::function<void(int)>& f) {
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        f(r);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

template <typename T>
Bytes bytes_of(const std::vector<T>& v) {
  Bytes b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Where a rank's buffers live: host memory (CPU group) or its GPU (NCCL); one call's output comes back as
// bytes.
struct Memory {
  bool device = false;
  int gpu = 0;
  std::vector<void*> owned;
  ~Memory() {
    for (void* p : owned) {
      if (device)
        cudaFree(p);
      else
        std::free(p);
    }
  }
  void* put(const Bytes& host, size_t bytes) {
    void* p = nullptr;
    const size_t n = std::max<size_t>(bytes, 1);
    if (device) {
      cudaSetDevice(gpu);
      EXPECT_EQ(cudaMalloc(&p, n), cudaSuccess);
      EXPECT_EQ(cudaMemset(p, 0xAB, n), cudaSuccess);
      if (!host.empty()) {
        EXPECT_EQ(cudaMemcpy(p, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
      }
      // The collectives run on a non-blocking stream: the fill must be done before they are queued.
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    } else {
      p = std::malloc(n);
      std::memset(p, 0xAB, n);
      if (!host.empty()) std::memcpy(p, host.data(), host.size());
    }
    owned.push_back(p);
    return p;
  }
  Bytes get(const void* p, size_t bytes) {
    Bytes out(bytes);
    if (device) {
      cudaSetDevice(gpu);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(out.data(), p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    } else {
      std::memcpy(out.data(), p, bytes);
    }
    return out;
  }
};

// Every collective of the interface on rank r of n; the outputs in call order.
std::vector<Bytes> run_collectives(Communicator& c, Memory& mem, const std::function<void()>& sync) {
  const int r = c.rank(), n = c.size();
  std::vector<Bytes> out;
  auto eighths = [&](size_t count, int salt) {
    std::vector<float> v(count);
    for (size_t i = 0; i < count; ++i)
      v[i] = static_cast<float>((static_cast<int>(i) * 7 + (r + 1) * (salt + 3)) % 41 - 20) * 0.125f;
    return v;
  };
  {  // all_reduce sum, F32, in place
    const size_t count = 1000;
    void* b = mem.put(bytes_of(eighths(count, 1)), count * 4);
    c.all_reduce(b, b, count, DType::kF32, ReduceOp::kSum);
    sync();
    out.push_back(mem.get(b, count * 4));
  }
  {  // all_reduce max, I32, out of place
    const size_t count = 37;
    std::vector<int32_t> v(count);
    for (size_t i = 0; i < count; ++i)
      v[i] = static_cast<int32_t>((i * 13 + static_cast<size_t>(r) * 29) % 97) - 40;
    void* s = mem.put(bytes_of(v), count * 4);
    void* d = mem.put({}, count * 4);
    c.all_reduce(s, d, count, DType::kI32, ReduceOp::kMax);
    sync();
    out.push_back(mem.get(d, count * 4));
  }
  {  // all_reduce sum, BF16 (small integers: exact)
    const size_t count = 64;
    std::vector<uint16_t> v(count);
    for (size_t i = 0; i < count; ++i)
      v[i] = f32_to_bf16(static_cast<float>((static_cast<int>(i) + r * 5) % 11 - 5));
    void* b = mem.put(bytes_of(v), count * 2);
    c.all_reduce(b, b, count, DType::kBF16, ReduceOp::kSum);
    sync();
    out.push_back(mem.get(b, count * 2));
  }
  {  // all_gather, F32
    const size_t count = 33;
    void* s = mem.put(bytes_of(eighths(count, 2)), count * 4);
    void* d = mem.put({}, count * 4 * static_cast<size_t>(n));
    c.all_gather(s, d, count, DType::kF32);
    sync();
    out.push_back(mem.get(d, count * 4 * static_cast<size_t>(n)));
  }
  {  // all_gather in place, I64
    const size_t count = 5;
    std::vector<int64_t> v(count * static_cast<size_t>(n), -1);
    for (size_t i = 0; i < count; ++i)
      v[static_cast<size_t>(r) * count + i] = (int64_t{r} << 40) + static_cast<int64_t>(i);
    auto* d = static_cast<char*>(mem.put(bytes_of(v), v.size() * 8));
    c.all_gather(d + static_cast<size_t>(r) * count * 8, d, count, DType::kI64);
    sync();
    out.push_back(mem.get(d, v.size() * 8));
  }
  {  // reduce_scatter sum, F32
    const size_t count = 29;
    void* s =
        mem.put(bytes_of(eighths(count * static_cast<size_t>(n), 3)), count * 4 * static_cast<size_t>(n));
    void* d = mem.put({}, count * 4);
    c.reduce_scatter(s, d, count, DType::kF32, ReduceOp::kSum);
    sync();
    out.push_back(mem.get(d, count * 4));
  }
  {  // broadcast from the last rank, F32
    const size_t count = 100;
    void* b = mem.put(bytes_of(eighths(count, 4)), count * 4);
    c.broadcast(b, count, DType::kF32, n - 1);
    sync();
    out.push_back(mem.get(b, count * 4));
  }
  {  // all_to_all_v, F32: rank i sends (i + 2j) % 3 values to rank j (some counts zero)
    std::vector<size_t> send_counts(static_cast<size_t>(n)), recv_counts(static_cast<size_t>(n));
    std::vector<float> send;
    size_t total_recv = 0;
    for (int j = 0; j < n; ++j) {
      send_counts[static_cast<size_t>(j)] = static_cast<size_t>((r + 2 * j) % 3);
      recv_counts[static_cast<size_t>(j)] = static_cast<size_t>((j + 2 * r) % 3);
      for (size_t i = 0; i < send_counts[static_cast<size_t>(j)]; ++i)
        send.push_back(static_cast<float>(r * 100 + j * 10 + static_cast<int>(i)) * 0.125f);
      total_recv += recv_counts[static_cast<size_t>(j)];
    }
    void* s = mem.put(bytes_of(send), send.size() * 4);
    void* d = mem.put({}, total_recv * 4);
    c.all_to_all_v(s, send_counts, d, recv_counts, DType::kF32);
    sync();
    out.push_back(mem.get(d, total_recv * 4));
  }
  {  // all_to_all_v, I32, only to itself
    std::vector<size_t> counts(static_cast<size_t>(n), 0);
    counts[static_cast<size_t>(r)] = 3;
    const std::vector<int32_t> v = {r, r * 7, -r};
    void* s = mem.put(bytes_of(v), 12);
    void* d = mem.put({}, 12);
    c.all_to_all_v(s, counts, d, counts, DType::kI32);
    sync();
    out.push_back(mem.get(d, 12));
  }
  c.barrier();
  return out;
}

// Every rank's outputs from the CPU group of n ranks.
std::vector<std::vector<Bytes>> cpu_results(int n) {
  CpuCommunicatorGroup group(n);
  std::vector<std::vector<Bytes>> out(static_cast<size_t>(n));
  on_ranks(n, [&](int r) {
    Memory mem;
    out[static_cast<size_t>(r)] = run_collectives(group.communicator(r), mem, [] {});
  });
  return out;
}

std::vector<std::vector<Bytes>> nccl_results(int n) {
  std::vector<int> devices;
  for (int d = 0; d < n; ++d) devices.push_back(d);
  NcclCommunicatorGroup group(devices);
  std::vector<std::vector<Bytes>> out(static_cast<size_t>(n));
  on_ranks(n, [&](int r) {
    NcclCommunicator& c = group.communicator(r);
    Memory mem;
    mem.device = true;
    mem.gpu = c.device();
    out[static_cast<size_t>(r)] = run_collectives(c, mem, [&] { c.synchronize(); });
  });
  return out;
}

// The harness itself, on the CPU group alone (runs without a GPU): its inputs are consistent (the
// all_to_all_v counts match between ranks) and the outputs are not trivial: the F32 sum is the serial sum
// of the ranks' inputs, different ranks' inputs differ, the broadcast carries the last rank's values.
TEST(NcclCommunicatorHarness, RunsOnTheCpuGroupWithTellingValues) {
  for (int n : {1, 2, 4}) {
    const auto out = cpu_results(n);
    for (int r = 1; r < n; ++r)  // the replicated outputs (not reduce_scatter's, all_to_all_v's)
      for (size_t k : {0, 1, 2, 3, 4, 6})
        EXPECT_TRUE(out[static_cast<size_t>(r)][k] == out[0][k]) << "output " << k << " of rank " << r;
    if (n > 1) EXPECT_FALSE(out[1][5] == out[0][5]) << "reduce_scatter: each rank its own part";
    std::vector<float> sum(1000), single(1000);
    std::memcpy(sum.data(), out[0][0].data(), 4000);
    CpuCommunicatorGroup one(1);
    Memory mem;
    std::memcpy(single.data(), run_collectives(one.communicator(0), mem, [] {})[0].data(), 4000);
    float expected0 = 0;
    for (int r = 0; r < n; ++r) expected0 += static_cast<float>((r + 1) * 4 % 41 - 20) * 0.125f;
    EXPECT_EQ(sum[0], expected0) << n << " ranks";
    if (n > 1) EXPECT_NE(sum, single) << "the ranks' inputs differ";
    std::vector<Bytes> gathered = out[0];
    EXPECT_EQ(gathered[3].size(), static_cast<size_t>(33 * 4 * n));
  }
}

class NcclCommunicatorTest : public ::testing::TestWithParam<int> {};

TEST_P(NcclCommunicatorTest, EqualsTheCpuGroup) {
  const int n = GetParam();
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  if (cuda_device_count() < n)
    GTEST_SKIP() << n << " ranks need " << n << " GPUs; " << cuda_device_count() << " here";
  const auto ref = cpu_results(n);
  const auto got = nccl_results(n);
  const char* names[] = {"all_reduce sum F32", "all_reduce max I32",      "all_reduce sum BF16",
                         "all_gather F32",     "all_gather I64 in place", "reduce_scatter F32",
                         "broadcast F32",      "all_to_all_v F32",        "all_to_all_v I32 self"};
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(got[static_cast<size_t>(r)].size(), ref[static_cast<size_t>(r)].size());
    for (size_t k = 0; k < ref[static_cast<size_t>(r)].size(); ++k)
      EXPECT_TRUE(got[static_cast<size_t>(r)][k] == ref[static_cast<size_t>(r)][k])
          << names[k] << ", rank " << r << " of " << n;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, NcclCommunicatorTest, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "_ranks"; });

// A reduction of a dtype without one is an Error naming it; the group stays aborted (the next call throws
// the same message). NCCL_NVLS_ENABLE is 0 once a group exists, unless the environment set it.
TEST(NcclCommunicator, BadArgumentsAbortTheGroupAndNvlsIsOff) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  const char* before = std::getenv("NCCL_NVLS_ENABLE");
  const std::string set_before = before ? before : "";
  const int devices[] = {0};
  NcclCommunicatorGroup group(devices);
  const char* after = std::getenv("NCCL_NVLS_ENABLE");
  ASSERT_NE(after, nullptr);
  EXPECT_EQ(std::string(after), set_before.empty() ? "0" : set_before);
  NcclCommunicator& c = group.communicator(0);
  void* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, 64), cudaSuccess);
  std::string first;
  try {
    c.all_reduce(buf, buf, 8, DType::kU8, ReduceOp::kSum);
  } catch (const Error& e) {
    first = e.what();
  }
  EXPECT_NE(first.find("all_reduce of U8: no reduction for this dtype"), std::string::npos) << first;
  std::string second;
  try {
    c.broadcast(buf, 4, DType::kF32, 0);
  } catch (const Error& e) {
    second = e.what();
  }
  EXPECT_EQ(second, first);
  cudaFree(buf);
}

}  // namespace
}  // namespace polylora

#endif  // POLYLORA_HAVE_NCCL
