// tests/unit/model/staged_communicator_test.cc: StagedCommunicator (model/staged_communicator.h), the
// communicator of GPU ranks that share a GPU, here over CPU backends (so its staging runs on every commit):
// each collective on backend buffers equals the same collective run directly on a CPU group, for 3 ranks,
// in place and not, uneven all_to_all_v counts with zeros; a mismatch between ranks is the group's error.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "common/error.h"
#include "model/staged_communicator.h"
#include "runtime/communicator.h"

namespace polylora {
namespace {

// Runs fn(rank, comm) on one thread per rank, each rank's StagedCommunicator over group `g` and a CPU
// backend of its own; returns each rank's error message ("" when it returned).
std::vector<std::string> run_staged(int n, const std::function<void(int, Communicator&, Backend&)>& fn) {
  CpuCommunicatorGroup g(n);
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      std::unique_ptr<Backend> be = make_cpu_backend();
      StagedCommunicator comm(g.communicator(r), *be);
      try {
        fn(r, comm, *be);
      } catch (const Error& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (std::thread& t : threads) t.join();
  return errors;
}

// Backend memory holding `v`.
template <typename T>
T* put(Backend& be, const std::vector<T>& v) {
  auto* p = static_cast<T*>(be.alloc(std::max<size_t>(1, v.size()) * sizeof(T)));
  be.copy_to_device(p, v.data(), v.size() * sizeof(T));
  return p;
}
template <typename T>
std::vector<T> get(Backend& be, const T* p, size_t n) {
  std::vector<T> v(n);
  be.copy_to_host(v.data(), p, n * sizeof(T));
  return v;
}

TEST(StagedCommunicator, CollectivesEqualTheHostGroups) {
  constexpr int n = 3;
  constexpr size_t count = 7;
  auto value = [](int rank, size_t i) { return static_cast<float>(rank * 100 + static_cast<int>(i)) * 0.5f; };
  const auto errors = run_staged(n, [&](int r, Communicator& c, Backend& be) {
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.size(), n);
    std::vector<float> mine(count);
    for (size_t i = 0; i < count; ++i) mine[i] = value(r, i);
    // all_reduce, in place: sums over the ranks.
    float* x = put(be, mine);
    c.all_reduce(x, x, count, DType::kF32, ReduceOp::kSum);
    std::vector<float> sum = get(be, x, count);
    for (size_t i = 0; i < count; ++i) EXPECT_EQ(sum[i], value(0, i) + value(1, i) + value(2, i)) << i;
    // all_reduce max into another buffer.
    float* y = put(be, std::vector<float>(count, -1.0f));
    c.all_reduce(put(be, mine), y, count, DType::kF32, ReduceOp::kMax);
    for (size_t i = 0; i < count; ++i) EXPECT_EQ(get(be, y, count)[i], value(2, i));
    // all_gather: the ranks' buffers in rank order.
    float* all = put(be, std::vector<float>(n * count, -1.0f));
    c.all_gather(put(be, mine), all, count, DType::kF32);
    const std::vector<float> gathered = get(be, all, n * count);
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < count; ++i) EXPECT_EQ(gathered[q * count + i], value(q, i));
    // reduce_scatter: this rank's block of the sums.
    std::vector<float> blocks(n * count);
    for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<float>(r + 1) * static_cast<float>(i);
    float* part = put(be, std::vector<float>(count, -1.0f));
    c.reduce_scatter(put(be, blocks), part, count, DType::kF32, ReduceOp::kSum);
    const std::vector<float> got = get(be, part, count);
    for (size_t i = 0; i < count; ++i) EXPECT_EQ(got[i], 6.0f * static_cast<float>(r * count + i)) << i;
    // broadcast of int32 from rank 1.
    std::vector<int32_t> ids = {r, r + 10, r + 20};
    int32_t* d_ids = put(be, ids);
    c.broadcast(d_ids, ids.size(), DType::kI32, 1);
    EXPECT_EQ(get(be, d_ids, ids.size()), (std::vector<int32_t>{1, 11, 21}));
    // all_to_all_v: rank r sends (q + r) % 3 values to rank q (some zero), each value r * 10 + q.
    std::vector<size_t> send_counts(n), recv_counts(n);
    std::vector<int32_t> out;
    for (int q = 0; q < n; ++q) {
      send_counts[q] = static_cast<size_t>((q + r) % 3);
      recv_counts[q] = static_cast<size_t>((r + q) % 3);
      for (size_t k = 0; k < send_counts[q]; ++k) out.push_back(r * 10 + q);
    }
    const size_t in = std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0});
    int32_t* d_in = put(be, std::vector<int32_t>(in, -1));
    c.all_to_all_v(put(be, out), send_counts, d_in, recv_counts, DType::kI32);
    std::vector<int32_t> expect;
    for (int q = 0; q < n; ++q)
      for (size_t k = 0; k < recv_counts[q]; ++k) expect.push_back(q * 10 + r);
    EXPECT_EQ(get(be, d_in, in), expect);
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
}

TEST(StagedCommunicator, AMismatchIsTheGroupsError) {
  const auto errors = run_staged(2, [&](int r, Communicator& c, Backend& be) {
    float* x = put(be, std::vector<float>(4, 1.0f));
    c.all_reduce(x, x, r == 0 ? 4 : 3, DType::kF32, ReduceOp::kSum);
  });
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_NE(errors[0].find("collective mismatch"), std::string::npos) << errors[0];
  EXPECT_EQ(errors[0], errors[1]);
}

}  // namespace
}  // namespace polylora
