// tests/unit/runtime/communicator_test.cc: CpuCommunicatorGroup with real threads, one per rank.
// Owns: every collective against a serial reference (bit-exact, rank-order sums; BF16 accumulated in f32
// and rounded once), uneven and zero counts, in-place calls, 1000 random collectives back to back, and
// failures: mismatched collectives or counts, bad arguments, a rank that throws or aborts, shutdown().
// Each must end as the same polylora::Error on every rank; a watchdog turns a hang into a failure.
// Must not: depend on a GPU.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <limits>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/dtype.h"
#include "common/error.h"
#include "runtime/communicator.h"

namespace polylora {
namespace {

using namespace std::chrono_literals;

// Runs fn(comm) on one thread per rank and returns each rank's polylora::Error message ("" when fn
// returned; other exceptions are reported with a prefix). If the ranks are not all done after 60 s the
// group is shut down and the test fails, so a hang ends the test instead of the test run.
std::vector<std::string> run_ranks(CpuCommunicatorGroup& group,
                                   const std::function<void(Communicator&)>& fn) {
  const int n = group.size();
  std::vector<std::string> errors(n);
  std::mutex mutex;
  std::condition_variable cv;
  int done = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(group.communicator(r));
      } catch (const Error& e) {
        errors[r] = e.what();
      } catch (const std::exception& e) {
        errors[r] = std::string("non-Error exception: ") + e.what();
      }
      std::lock_guard<std::mutex> lock(mutex);
      ++done;
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mutex);
    if (!cv.wait_for(lock, 60s, [&] { return done == n; })) {
      ADD_FAILURE() << "ranks still running after 60 s (a hang): shutting the group down";
      group.shutdown("test watchdog");
    }
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// Every rank failed with the same message, which contains each of `parts`.
void expect_same_error(const std::vector<std::string>& errors, const std::vector<std::string>& parts) {
  ASSERT_FALSE(errors.empty());
  for (size_t r = 0; r < errors.size(); ++r) {
    EXPECT_NE(errors[r], "") << "rank " << r << " did not fail";
    EXPECT_EQ(errors[r], errors[0]) << "rank " << r;
  }
  for (const std::string& part : parts)
    EXPECT_NE(errors[0].find(part), std::string::npos) << "'" << part << "' not in: " << errors[0];
}

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A value distinct per (rank, element, salt), magnitudes 2^-12..2^12 with mixed signs, so that a sum's
// value depends on the order of its additions.
float value(int rank, size_t i, uint64_t salt = 0) {
  const uint64_t h = mix(mix(salt) ^ (static_cast<uint64_t>(rank) << 40) ^ i);
  const float v =
      std::ldexp(1.0f + static_cast<float>(h & 0xffff) / 65536.0f, static_cast<int>((h >> 16) % 25) - 12);
  return (h >> 63) ? -v : v;
}

// An integer naming (rank, element, salt) for the data-movement collectives.
int32_t code(int rank, size_t i, uint64_t salt = 0) {
  return static_cast<int32_t>((salt % 1000) * 1000000 + rank * 10000 + i);
}

uint32_t bits(float f) {
  return std::bit_cast<uint32_t>(f);
}

std::vector<float> values(int rank, size_t count, uint64_t salt = 0) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = value(rank, i, salt);
  return v;
}

float serial_sum(int n, size_t i, uint64_t salt = 0) {
  float acc = value(0, i, salt);
  for (int r = 1; r < n; ++r) acc += value(r, i, salt);
  return acc;
}

float serial_max(int n, size_t i, uint64_t salt = 0) {
  float acc = value(0, i, salt);
  for (int r = 1; r < n; ++r) acc = std::max(acc, value(r, i, salt));
  return acc;
}

uint16_t bf16_value(int rank, size_t i, uint64_t salt = 0) {
  return f32_to_bf16(value(rank, i, salt));
}

// BF16 all_reduce sum reference: f32 accumulation in rank order, one rounding.
uint16_t bf16_sum(int n, size_t i, uint64_t salt = 0) {
  float acc = bf16_to_f32(bf16_value(0, i, salt));
  for (int r = 1; r < n; ++r) acc += bf16_to_f32(bf16_value(r, i, salt));
  return f32_to_bf16(acc);
}

class CommunicatorTest : public ::testing::TestWithParam<int> {};
class CommunicatorFailureTest : public ::testing::TestWithParam<int> {};

// Counts that leave some ranks an empty share of an all_reduce (count < size) and uneven shares.
const size_t kCounts[] = {0, 1, 5, 1000, 1537};

TEST_P(CommunicatorTest, AllReduceF32SumAndMaxMatchSerialRankOrder) {
  const int n = GetParam();
  CpuCommunicatorGroup group(n);
  std::vector<std::vector<float>> sums(n), maxes(n);
  std::vector<std::string> errors = run_ranks(group, [&](Communicator& comm) {
    EXPECT_EQ(comm.size(), n);
    for (size_t count : kCounts) {
      std::vector<float> send = values(comm.rank(), count, count), recv(count, -1.0f);
      comm.all_reduce(send.data(), recv.data(), count, DType::kF32, ReduceOp::kSum);
      sums[comm.rank()].insert(sums[comm.rank()].end(), recv.begin(), recv.end());
      std::fill(recv.begin(), recv.end(), -1.0f);
      comm.all_reduce(send.data(), recv.data(), count, DType::kF32, ReduceOp::kMax);
      maxes[comm.rank()].insert(maxes[comm.rank()].end(), recv.begin(), recv.end());
      EXPECT_EQ(send, values(comm.rank(), count, count)) << "the input was modified";
    }
  });
  expect_no_errors(errors);
  EXPECT_FALSE(group.aborted());
  for (int r = 0; r < n; ++r) {
    size_t k = 0;
    for (size_t count : kCounts) {
      for (size_t i = 0; i < count; ++i, ++k) {
        ASSERT_EQ(bits(sums[r][k]), bits(serial_sum(n, i, count)))
            << "rank " << r << " count " << count << " i " << i;
        ASSERT_EQ(bits(maxes[r][k]), bits(serial_max(n, i, count)))
            << "rank " << r << " count " << count << " i " << i;
      }
    }
  }
  if (n >= 3) {  // the values are order-sensitive: a reversed sum differs somewhere
    bool differs = false;
    for (size_t i = 0; i < 1000 && !differs; ++i) {
      float reversed = value(n - 1, i, 1000);
      for (int r = n - 2; r >= 0; --r) reversed += value(r, i, 1000);
      differs = bits(reversed) != bits(serial_sum(n, i, 1000));
    }
    EXPECT_TRUE(differs);
  }
}

TEST_P(CommunicatorTest, AllReduceBf16SumIsF32AccumulatedRoundedOnceAndIdenticalOnEveryRank) {
  const int n = GetParam();
  const size_t count = 1537;
  CpuCommunicatorGroup group(n);
  std::vector<std::vector<uint16_t>> out(n);
  std::vector<std::string> errors = run_ranks(group, [&](Communicator& comm) {
    std::vector<uint16_t> send(count), recv(count, 0xffff);
    for (size_t i = 0; i < count; ++i) send[i] = bf16_value(comm.rank(), i);
    comm.all_reduce(send.data(), recv.data(), count, DType::kBF16, ReduceOp::kSum);
    out[comm.rank()] = recv;
  });
  expect_no_errors(errors);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(out[r], out[0]) << "rank " << r << " differs from rank 0";
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(out[r][i], bf16_sum(n, i)) << "rank " << r << " i " << i;
  }
  if (n >= 3) {  // rounding after every addition would give a different result somewhere
    bool differs = false;
    for (size_t i = 0; i < count && !differs; ++i) {
      uint16_t acc = bf16_value(0, i);
      for (int r = 1; r < n; ++r) acc = f32_to_bf16(bf16_to_f32(acc) + bf16_to_f32(bf16_value(r, i)));
      differs = acc != bf16_sum(n, i);
    }
    EXPECT_TRUE(differs);
  }
}

TEST_P(CommunicatorTest, AllReduceInPlace) {
  const int n = GetParam();
  const size_t count = 777;
  CpuCommunicatorGroup group(n);
  std::vector<std::vector<float>> f32(n);
  std::vector<std::vector<uint16_t>> bf16(n);
  std::vector<std::string> errors = run_ranks(group, [&](Communicator& comm) {
    std::vector<float> buf = values(comm.rank(), count);
    comm.all_reduce(buf.data(), buf.data(), count, DType::kF32, ReduceOp::kSum);
    f32[comm.rank()] = buf;
    std::vector<uint16_t> b(count);
    for (size_t i = 0; i < count; ++i) b[i] = bf16_value(comm.rank(), i);
    comm.all_reduce(b.data(), b.data(), count, DType::kBF16, ReduceOp::kSum);
    bf16[comm.rank()] = b;
  });
  expect_no_errors(errors);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(bits(f32[r][i]), bits(serial_sum(n, i))) << "rank " << r << " i " << i;
      ASSERT_EQ(bf16[r][i], bf16_sum(n, i)) << "rank " << r << " i " << i;
    }
  }
}

TEST_P(CommunicatorTest, OtherReductionDtypes) {
  const int n = GetParam();
  const size_t count = 300;
  CpuCommunicatorGroup group(n);
  std::vector<std::vector<uint16_t>> f16(n), bf16_max(n);
  std::vector<std::vector<int32_t>> i32(n);
  std::vector<std::vector<int64_t>> i64(n);
  auto i32_value = [](int r, size_t i) {  // near INT32_MAX for even i, so sums wrap
    const int64_t k = static_cast<int64_t>(i);
    return static_cast<int32_t>(k % 2 == 0 ? std::numeric_limits<int32_t>::max() - 7 * r - k : -1000 * r + k);
  };
  auto i64_value = [](int r, size_t i) { return static_cast<int64_t>(mix(r * 1000 + i)); };
  std::vector<std::string> errors = run_ranks(group, [&](Communicator& comm) {
    const int r = comm.rank();
    std::vector<uint16_t> h(count), b(count);
    std::vector<int32_t> a(count);
    std::vector<int64_t> l(count);
    for (size_t i = 0; i < count; ++i) {
      h[i] = f32_to_f16(value(r, i) / 64);
      b[i] = bf16_value(r, i);
      a[i] = i32_value(r, i);
      l[i] = i64_value(r, i);
    }
    comm.all_reduce(h.data(), h.data(), count, DType::kF16, ReduceOp::kSum);
    comm.all_reduce(b.data(), b.data(), count, DType::kBF16, ReduceOp::kMax);
    comm.all_reduce(a.data(), a.data(), count, DType::kI32, ReduceOp::kSum);
    comm.all_reduce(l.data(), l.data(), count, DType::kI64, ReduceOp::kMax);
    f16[r] = h;
    bf16_max[r] = b;
    i32[r] = a;
    i64[r] = l;
  });
  expect_no_errors(errors);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) {
      float hs = f16_to_f32(f32_to_f16(value(0, i) / 64));
      float bm = bf16_to_f32(bf16_value(0, i));
      uint32_t is = static_cast<uint32_t>(i32_value(0, i));
      int64_t lm = i64_value(0, i);
      for (int j = 1; j < n; ++j) {
        hs += f16_to_f32(f32_to_f16(value(j, i) / 64));
        bm = std::max(bm, bf16_to_f32(bf16_value(j, i)));
        is += static_cast<uint32_t>(i32_value(j, i));
        lm = std::max(lm, i64_value(j, i));
      }
      ASSERT_EQ(f16[r][i], f32_to_f16(hs)) << "rank " << r << " i " << i;
      ASSERT_EQ(bf16_max[r][i], f32_to_bf16(bm)) << "rank " << r << " i " << i;
      ASSERT_EQ(i32[r][i], static_cast<int32_t>(is)) << "rank " << r << " i " << i;
      ASSERT_EQ(i64[r][i], lm) << "rank " << r << " i " << i;
    }
  }
}

TEST_P(CommunicatorTest, MaxPropagatesNan) {
  const int n = GetParam();
  CpuCommunicatorGroup group(n);
  std::vector<std::vector<float>> out(n);
  std::vector<std::string> errors = run_ranks(group, [&](Communicator& comm) {
    std::vector<float> buf = values(comm.rank(), 8);
    if (comm.rank() == n - 1) buf[3] = std::numeric_limits<float>::quiet_NaN();
    comm.all_reduce(buf.data(), buf.data(), buf.size(), DType::kF32, ReduceOp::kMax);
    out[comm.rank()] = buf;
  });
  expect_no_errors(errors);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < 8; ++i) {
      if (i == 3) {
        EXPECT_TRUE(std::isnan(out[r][i])) << "rank " << r;
      } else {
        EXPECT_EQ(bits(out[r][i]), bits(serial_max(n, i))) << "rank " << r << " i " << i;
      }
    }
  }
}

TEST_P(CommunicatorTest, AllGatherConcatenatesInRankOrder) {
  const int n = GetParam();
  CpuCommunicatorGroup group(n);
  const int32_t kGuard = -7;
  std::vector<std::string> mistakes(n);
  std::vector<std::string> errors = run_ranks(group, [&](Communicator& comm) {
    const int r = comm.rank();
    for (size_t count : {size_t{0}, size_t{1}, size_t{13}}) {
      std::vector<int32_t> send(count);
      for (size_t i = 0; i < count; ++i) send[i] = code(r, i, count);
      std::vector<int32_t> recv(n * count + 1, kGuard);
      comm.all_gather(send.data(), recv.data(), count, DType::kI32);
      for (int j = 0; j < n; ++j)
        for (size_t i = 0; i < count; ++i)
          if (recv[j * count + i] != code(j, i, count))
            mistakes[r] += fmt::format("count {} [{}][{}]; ", count, j, i);
      if (recv.back() != kGuard) mistakes[r] += "wrote past recv; ";
      // In place: this rank's input already sits at its place in recv.
      std::vector<int32_t> buf(n * count, kGuard);
      std::copy(send.begin(), send.end(), buf.begin() + r * count);
      comm.all_gather(buf.data() + r * count, buf.data(), count, DType::kI32);
      for (int j = 0; j < n; ++j)
        for (size_t i = 0; i < count; ++i)
          if (buf[j * count + i] != code(j, i, count))
            mistakes[r] += fmt::format("in place count {} [{}][{}]; ", count, j, i);
    }
    // BF16: a 2-byte dtype.
    std::vector<uint16_t> send(7), recv(7 * n);
    for (size_t i = 0; i < 7; ++i) send[i] = bf16_value(r, i);
    comm.all_gather(send.data(), recv.data(), 7, DType::kBF16);
    for (int j = 0; j < n; ++j)
      for (size_t i = 0; i < 7; ++i)
        if (recv[j * 7 + i] != bf16_value(j, i)) mistakes[r] += fmt::format("bf16 [{}][{}]; ", j, i);
  });
  expect_no_errors(errors);
  for (int r = 0; r < n; ++r) EXPECT_EQ(mistakes[r], "") << "rank " << r;
}

TEST_P(CommunicatorTest, ReduceScatterSumsEachRanksShare) {
  const int n = GetParam();
  CpuCommunicatorGroup group(n);
  std::vector<std::string> mistakes(n);
  std::vector<std::string> errors = run_ranks(group, [&](Communicator& comm) {
    const int r = comm.rank();
    for (size_t count : {size_t{0}, size_t{1}, size_t{9}, size_t{600}}) {
      std::vector<float> send = values(r, n * count, count);
      std::vector<float> recv(count + 1, -1.0f);
      comm.reduce_scatter(send.data(), recv.data(), count, DType::kF32, ReduceOp::kSum);
      for (size_t i = 0; i < count; ++i)
        if (bits(recv[i]) != bits(serial_sum(n, r * count + i, count)))
          mistakes[r] += fmt::format("count {} i {}; ", count, i);
      if (recv[count] != -1.0f) mistakes[r] += "wrote past recv; ";
      // In place (NCCL's convention): recv is this rank's share of send.
      comm.reduce_scatter(send.data(), send.data() + r * count, count, DType::kF32, ReduceOp::kMax);
      for (size_t i = 0; i < count; ++i)
        if (bits(send[r * count + i]) != bits(serial_max(n, r * count + i, count)))
          mistakes[r] += fmt::format("in place count {} i {}; ", count, i);
    }
    std::vector<uint16_t> send(n * 5), recv(5);
    for (size_t i = 0; i < send.size(); ++i) send[i] = bf16_value(r, i);
    comm.reduce_scatter(send.data(), recv.data(), 5, DType::kBF16, ReduceOp::kSum);
    for (size_t i = 0; i < 5; ++i)
      if (recv[i] != bf16_sum(n, r * 5 + i)) mistakes[r] += fmt::format("bf16 i {}; ", i);
  });
  expect_no_errors(errors);
  for (int r = 0; r < n; ++r) EXPECT_EQ(mistakes[r], "") << "rank " << r;
}

TEST_P(CommunicatorTest, BroadcastFromEveryRoot) {
  const int n = GetParam();
  CpuCommunicatorGroup group(n);
  std::vector<std::string> mistakes(n);
  std::vector<std::string> errors = run_ranks(group, [&](Communicator& comm) {
    const int r = comm.rank();
    for (int root = 0; root < n; ++root) {
      for (size_t count : {size_t{0}, size_t{3}, size_t{1000}}) {
        std::vector<int32_t> buf(count + 1);
        for (size_t i = 0; i <= count; ++i) buf[i] = code(r, i, root);
        comm.broadcast(buf.data(), count, DType::kI32, root);
        for (size_t i = 0; i < count; ++i)
          if (buf[i] != code(root, i, root))
            mistakes[r] += fmt::format("root {} count {} i {}; ", root, count, i);
        if (buf[count] != code(r, count, root)) mistakes[r] += "wrote past buf; ";
      }
    }
  });
  expect_no_errors(errors);
  for (int r = 0; r < n; ++r) EXPECT_EQ(mistakes[r], "") << "rank " << r;
}

// counts[i][j]: what rank i sends rank j, zeros included (and a rank that sends nothing at all).
std::vector<std::vector<size_t>> uneven_counts(int n) {
  std::vector<std::vector<size_t>> counts(n, std::vector<size_t>(n));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      counts[i][j] = (n > 1 && i == 1) ? 0 : (i * 3 + j * 5 + 1) % 4 + (i == j ? 2 : 0);
  return counts;
}

// Rank r's all_to_all_v of codes(src, dst, k) under `counts`; returns a description of any mistake.
std::string check_all_to_all(Communicator& comm, const std::vector<std::vector<size_t>>& counts,
                             uint64_t salt) {
  const int n = comm.size(), r = comm.rank();
  std::vector<size_t> send_counts(n), recv_counts(n);
  std::vector<int32_t> send;
  for (int j = 0; j < n; ++j) {
    send_counts[j] = counts[r][j];
    recv_counts[j] = counts[j][r];
    for (size_t k = 0; k < counts[r][j]; ++k) send.push_back(code(r, j * 100 + k, salt));
  }
  size_t total = 0;
  for (size_t c : recv_counts) total += c;
  std::vector<int32_t> recv(total + 1, -7);
  comm.all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, DType::kI32);
  std::string mistakes;
  size_t at = 0;
  for (int i = 0; i < n; ++i)
    for (size_t k = 0; k < counts[i][r]; ++k, ++at)
      if (recv[at] != code(i, r * 100 + k, salt)) mistakes += fmt::format("from {} k {}; ", i, k);
  if (recv[total] != -7) mistakes += "wrote past recv; ";
  return mistakes;
}

TEST_P(CommunicatorTest, AllToAllVWithUnevenAndZeroCounts) {
  const int n = GetParam();
  CpuCommunicatorGroup group(n);
  std::vector<std::string> mistakes(n);
  const std::vector<std::vector<size_t>> counts = uneven_counts(n);
  const std::vector<std::vector<size_t>> zeros(n, std::vector<size_t>(n, 0));
  std::vector<std::string> errors = run_ranks(group, [&](Communicator& comm) {
    mistakes[comm.rank()] += check_all_to_all(comm, counts, 1);
    mistakes[comm.rank()] += check_all_to_all(comm, zeros, 2);
  });
  expect_no_errors(errors);
  for (int r = 0; r < n; ++r) EXPECT_EQ(mistakes[r], "") << "rank " << r;
}

// 1000 collectives of random kinds and sizes (one seeded generator per rank, the same sequence on all),
// each checked against its reference on every rank.
TEST_P(CommunicatorTest, ThousandRandomCollectivesBackToBack) {
  const int n = GetParam();
  CpuCommunicatorGroup group(n);
  std::vector<std::string> mistakes(n);
  std::vector<int> kinds_seen(9, 0);
  std::vector<std::string> errors = run_ranks(group, [&](Communicator& comm) {
    const int r = comm.rank();
    std::mt19937 rng(20260);
    std::string& m = mistakes[r];
    for (uint64_t it = 0; it < 1000; ++it) {
      const int kind = static_cast<int>(rng() % 9);
      const size_t count = rng() % 4 == 0 ? rng() % 3 : rng() % 400;
      if (r == 0) ++kinds_seen[kind];
      switch (kind) {
        case 0: {
          std::vector<float> send = values(r, count, it), recv(count + 1, -1.0f);
          comm.all_reduce(send.data(), recv.data(), count, DType::kF32, ReduceOp::kSum);
          for (size_t i = 0; i < count; ++i)
            if (bits(recv[i]) != bits(serial_sum(n, i, it))) m += fmt::format("it {} f32 sum i {}; ", it, i);
          if (recv[count] != -1.0f) m += fmt::format("it {} past recv; ", it);
          break;
        }
        case 1: {
          std::vector<uint16_t> buf(count);
          for (size_t i = 0; i < count; ++i) buf[i] = bf16_value(r, i, it);
          comm.all_reduce(buf.data(), buf.data(), count, DType::kBF16, ReduceOp::kSum);
          for (size_t i = 0; i < count; ++i)
            if (buf[i] != bf16_sum(n, i, it)) m += fmt::format("it {} bf16 sum i {}; ", it, i);
          break;
        }
        case 2: {
          std::vector<float> buf = values(r, count, it);
          comm.all_reduce(buf.data(), buf.data(), count, DType::kF32, ReduceOp::kMax);
          for (size_t i = 0; i < count; ++i)
            if (bits(buf[i]) != bits(serial_max(n, i, it))) m += fmt::format("it {} max i {}; ", it, i);
          break;
        }
        case 3: {
          std::vector<int32_t> send(count), recv(n * count + 1, -7);
          for (size_t i = 0; i < count; ++i) send[i] = code(r, i, it);
          comm.all_gather(send.data(), recv.data(), count, DType::kI32);
          for (int j = 0; j < n; ++j)
            for (size_t i = 0; i < count; ++i)
              if (recv[j * count + i] != code(j, i, it))
                m += fmt::format("it {} gather [{}][{}]; ", it, j, i);
          if (recv[n * count] != -7) m += fmt::format("it {} past recv; ", it);
          break;
        }
        case 4: {
          std::vector<float> send = values(r, n * count, it), recv(count);
          comm.reduce_scatter(send.data(), recv.data(), count, DType::kF32, ReduceOp::kSum);
          for (size_t i = 0; i < count; ++i)
            if (bits(recv[i]) != bits(serial_sum(n, r * count + i, it)))
              m += fmt::format("it {} rs i {}; ", it, i);
          break;
        }
        case 5: {
          const int root = static_cast<int>(rng() % n);
          std::vector<int32_t> buf(count);
          for (size_t i = 0; i < count; ++i) buf[i] = code(r, i, it);
          comm.broadcast(buf.data(), count, DType::kI32, root);
          for (size_t i = 0; i < count; ++i)
            if (buf[i] != code(root, i, it)) m += fmt::format("it {} bcast i {}; ", it, i);
          break;
        }
        case 6:
        case 7: {
          std::vector<std::vector<size_t>> counts(n, std::vector<size_t>(n));
          for (auto& row : counts)
            for (size_t& c : row) c = rng() % 3 == 0 ? 0 : rng() % 50;
          m += check_all_to_all(comm, counts, it);
          break;
        }
        default:
          comm.barrier();
      }
    }
    if (m.size() > 2000) m.resize(2000);
  });
  expect_no_errors(errors);
  for (int r = 0; r < n; ++r) EXPECT_EQ(mistakes[r], "") << "rank " << r;
  for (int kind = 0; kind < 9; ++kind) EXPECT_GT(kinds_seen[kind], 50) << "kind " << kind;
}

TEST(CommunicatorGroupTest, RejectsBadSizesAndRanks) {
  EXPECT_THROW(CpuCommunicatorGroup(0), Error);
  CpuCommunicatorGroup group(2);
  EXPECT_EQ(group.size(), 2);
  EXPECT_EQ(group.communicator(1).rank(), 1);
  EXPECT_THROW(group.communicator(2), Error);
  EXPECT_THROW(group.communicator(-1), Error);
}

TEST_P(CommunicatorFailureTest, MismatchedCountsFailOnEveryRank) {
  const int n = GetParam();
  CpuCommunicatorGroup group(n);
  std::vector<std::string> later(n);
  std::vector<std::string> errors = run_ranks(group, [&](Communicator& comm) {
    for (int i = 0; i < 3; ++i) comm.barrier();
    const size_t count = comm.rank() == n - 1 ? 11 : 10;
    std::vector<float> send = values(comm.rank(), 11), recv(11);
    try {
      comm.all_reduce(send.data(), recv.data(), count, DType::kF32, ReduceOp::kSum);
    } catch (const Error&) {
      // Every later collective fails too, with the same message.
      try {
        comm.barrier();
      } catch (const Error& e) {
        later[comm.rank()] = e.what();
      }
      throw;
    }
  });
  expect_same_error(errors, {"collective mismatch at collective 3 of a " + std::to_string(n) + "-rank",
                             "rank 0 called all_reduce(count=10, F32, sum)",
                             fmt::format("rank {} called all_reduce(count=11, F32, sum)", n - 1)});
  for (int r = 0; r < n; ++r) EXPECT_EQ(later[r], errors[0]) << "rank " << r;
  EXPECT_TRUE(group.aborted());
}

TEST_P(CommunicatorFailureTest, DifferentCollectiveOnOneRankFailsOnEveryRank) {
  const int n = GetParam();
  CpuCommunicatorGroup group(n);
  std::vector<std::string> errors = run_ranks(group, [&](Communicator& comm) {
    std::vector<float> send = values(comm.rank(), 8), recv(8 * n);
    comm.all_reduce(send.data(), recv.data(), 8, DType::kF32, ReduceOp::kSum);
    if (comm.rank() == 1) {
      comm.all_gather(send.data(), recv.data(), 8, DType::kF32);
    } else {
      comm.all_reduce(send.data(), recv.data(), 8, DType::kF32, ReduceOp::kSum);
    }
  });
  expect_same_error(errors,
                    {"collective mismatch at collective 1", "rank 0 called all_reduce(count=8, F32, sum)",
                     "rank 1 called all_gather(count=8, F32)"});
}

TEST_P(CommunicatorFailureTest, OtherMismatchesFailOnEveryRank) {
  const int n = GetParam();
  struct Case {
    std::string name;
    std::function<void(Communicator&)> fn;
    std::vector<std::string> parts;
  };
  const int last = n - 1;
  std::vector<Case> cases = {
      {"dtype",
       [&](Communicator& comm) {
         std::vector<float> buf(4);
         comm.all_reduce(buf.data(), buf.data(), comm.rank() == last ? 8 : 4,
                         comm.rank() == last ? DType::kBF16 : DType::kF32, ReduceOp::kSum);
       },
       {"collective mismatch", fmt::format("rank {} called all_reduce(count=8, BF16, sum)", last)}},
      {"op",
       [&](Communicator& comm) {
         std::vector<float> buf(4 * n);
         comm.reduce_scatter(buf.data(), buf.data() + comm.rank() * 4, 4, DType::kF32,
                             comm.rank() == last ? ReduceOp::kMax : ReduceOp::kSum);
       },
       {fmt::format("rank {} called reduce_scatter(count=4, F32, max)", last)}},
      {"root",
       [&](Communicator& comm) {
         std::vector<float> buf(4);
         comm.broadcast(buf.data(), 4, DType::kF32, comm.rank() == last ? 1 : 0);
       },
       {"rank 0 called broadcast(count=4, F32, root=0)",
        fmt::format("rank {} called broadcast(count=4, F32, root=1)", last)}},
      {"barrier vs all_gather",
       [&](Communicator& comm) {
         std::vector<float> buf(4 * n);
         if (comm.rank() == 0) {
           comm.barrier();
         } else {
           comm.all_gather(buf.data(), buf.data() + comm.rank() * 4, 4, DType::kF32);
         }
       },
       {"rank 0 called barrier() but rank 1 called all_gather(count=4, F32)"}},
      {"all_to_all_v counts",
       [&](Communicator& comm) {
         // Everyone sends 2 to every rank, but the last rank expects 3 from rank 0.
         std::vector<size_t> send_counts(n, 2), recv_counts(n, 2);
         if (comm.rank() == last) recv_counts[0] = 3;
         std::vector<float> send(2 * n), recv(2 * n + 1);
         comm.all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, DType::kF32);
       },
       {"all_to_all_v count mismatch at collective 0",
        fmt::format("rank 0 sends 2 elements to rank {}, but rank {} expects 3 from rank 0", last, last)}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    CpuCommunicatorGroup group(n);
    expect_same_error(run_ranks(group, c.fn), c.parts);
  }
}

// Bad arguments on one rank abort the group before that rank would leave the others waiting.
TEST_P(CommunicatorFailureTest, BadArgumentsOnOneRankFailOnEveryRank) {
  const int n = GetParam();
  const int last = n - 1;
  struct Case {
    std::string name;
    std::function<void(Communicator&)> fn;
    std::vector<std::string> parts;
  };
  std::vector<Case> cases = {
      {"u8 reduction",
       [&](Communicator& comm) {
         std::vector<uint8_t> buf(4);
         comm.all_reduce(buf.data(), buf.data(), 4, comm.rank() == last ? DType::kU8 : DType::kI32,
                         ReduceOp::kSum);
       },
       {fmt::format("rank {} of a {}-rank CPU communicator group called all_reduce(count=4, U8, sum)", last,
                    n),
        "U8 has no reduction"}},
      {"root out of range",
       [&](Communicator& comm) {
         std::vector<float> buf(4);
         comm.broadcast(buf.data(), 4, DType::kF32, comm.rank() == last ? n : 0);
       },
       {fmt::format("root {} is not a rank of the group", n)}},
      {"count list length",
       [&](Communicator& comm) {
         std::vector<size_t> send_counts(comm.rank() == last ? n + 1 : n, 1), recv_counts(n, 1);
         std::vector<float> send(n + 1), recv(n);
         comm.all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, DType::kF32);
       },
       {fmt::format("need {} entries (one per rank), not {} and {}", n, n + 1, n)}},
      {"partially overlapping all_reduce buffers",
       [&](Communicator& comm) {
         std::vector<float> buf(8);
         comm.all_reduce(buf.data(), buf.data() + (comm.rank() == last ? 1 : 0), 4, DType::kF32,
                         ReduceOp::kSum);
       },
       {"send and recv overlap without being the same buffer"}},
      {"null buffer",
       [&](Communicator& comm) {
         std::vector<float> send(4), recv(4 * n);
         comm.all_gather(comm.rank() == last ? nullptr : send.data(), recv.data(), 4, DType::kF32);
       },
       {"a null buffer for a non-empty transfer"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    CpuCommunicatorGroup group(n);
    expect_same_error(run_ranks(group, c.fn), c.parts);
  }
}

TEST_P(CommunicatorFailureTest, RankThatThrowsReleasesTheOthers) {
  const int n = GetParam();
  const int thrower = n / 2;
  CpuCommunicatorGroup group(n);
  std::vector<int> completed(n, 0);
  std::vector<std::string> errors = run_ranks(group, [&](Communicator& comm) {
    AbortOnUnwind guard(comm);
    std::vector<float> buf(64);
    for (int it = 0; it < 20; ++it) {
      if (comm.rank() == thrower && it == 5) throw std::runtime_error("rank failed on purpose");
      buf = values(comm.rank(), 64, it);
      comm.all_reduce(buf.data(), buf.data(), 64, DType::kF32, ReduceOp::kSum);
      if (bits(buf[7]) == bits(serial_sum(n, 7, it))) ++completed[comm.rank()];
    }
  });
  for (int r = 0; r < n; ++r) {
    if (r == thrower) {
      EXPECT_EQ(errors[r], "non-Error exception: rank failed on purpose");
    } else {
      EXPECT_EQ(errors[r],
                fmt::format("CPU communicator group aborted by rank {}: it threw an exception", thrower))
          << "rank " << r;
    }
    EXPECT_EQ(completed[r], 5) << "rank " << r;
  }
}

TEST_P(CommunicatorFailureTest, AbortDuringCollectivesReleasesTheOthers) {
  const int n = GetParam();
  const size_t count = 4096;
  CpuCommunicatorGroup group(n);
  std::vector<int> completed(n, 0);
  std::vector<std::string> errors = run_ranks(group, [&](Communicator& comm) {
    const int r = comm.rank();
    std::vector<float> send = values(r, count), recv(count * n);
    for (int it = 0; it < 200; ++it) {
      if (r == n - 1 && it == 100) {
        comm.abort("stopping at iteration 100");
        comm.barrier();  // throws: the group is aborted
      }
      comm.all_gather(send.data(), recv.data(), count, DType::kF32);
      if (bits(recv[(n - 1) * count + 5]) == bits(value(n - 1, 5))) ++completed[r];
    }
  });
  expect_same_error(
      errors, {fmt::format("CPU communicator group aborted by rank {}: stopping at iteration 100", n - 1)});
  for (int r = 0; r < n; ++r) EXPECT_EQ(completed[r], 100) << "rank " << r;
}

TEST_P(CommunicatorFailureTest, ShutdownReleasesWaitingRanks) {
  const int n = GetParam();
  CpuCommunicatorGroup group(n);
  std::vector<std::string> errors = run_ranks(group, [&](Communicator& comm) {
    if (comm.rank() == 0) {
      // The others wait in barrier() for a rank that will not come until the group is shut down.
      std::this_thread::sleep_for(50ms);
      group.shutdown("the server is stopping");
    }
    comm.barrier();
  });
  expect_same_error(errors, {"CPU communicator group shut down: the server is stopping"});
}

// Shutdown at arbitrary moments, while ranks may be copying from each other's buffers: every rank ends
// with the shutdown's Error, and no rank reads a buffer its owner has already freed on the way out
// (which a sanitizer build reports).
TEST_P(CommunicatorFailureTest, ShutdownAtArbitraryMomentsEndsEveryRank) {
  const int n = GetParam();
  const size_t count = 1 << 14;
  std::vector<std::vector<float>> inputs(n);
  for (int r = 0; r < n; ++r) inputs[r] = values(r, count);
  for (int trial = 0; trial < 24; ++trial) {
    SCOPED_TRACE(trial);
    CpuCommunicatorGroup group(n);
    std::thread stopper([&] {
      std::this_thread::sleep_for(std::chrono::microseconds(100 * trial));
      group.shutdown("trial over");
    });
    std::vector<std::string> errors = run_ranks(group, [&](Communicator& comm) {
      for (;;) {  // until the shutdown; the buffers are freed as each call throws
        std::vector<float> send = inputs[comm.rank()], recv(count * n);
        comm.all_gather(send.data(), recv.data(), count, DType::kF32);
      }
    });
    stopper.join();
    expect_same_error(errors, {"CPU communicator group shut down: trial over"});
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, CommunicatorTest, ::testing::Values(1, 2, 3, 4, 8),
                         [](const auto& info) { return "ranks" + std::to_string(info.param); });
INSTANTIATE_TEST_SUITE_P(Sizes, CommunicatorFailureTest, ::testing::Values(2, 3, 4, 8),
                         [](const auto& info) { return "ranks" + std::to_string(info.param); });

}  // namespace
}  // namespace polylora
