// tests/unit/runtime/rank_threads_test.cc: RankThreads (runtime/rank_threads.h): a job runs on every rank
// at once with working collectives, run after run; a rank that throws (before, between or inside
// collectives) makes run() throw an Error naming it and its message, never a hang, and the group stays
// failed.
#include "runtime/rank_threads.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>

#include "common/error.h"

namespace polylora {
namespace {

std::string error_of(RankThreads& t, const std::function<void(int)>& job) {
  try {
    t.run(job);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RankThreads, EveryRankRunsTheJobOnItsOwnThreadWithCollectives) {
  for (int n : {1, 2, 3, 4}) {
    RankThreads t(n);
    EXPECT_EQ(t.size(), n);
    for (int step = 0; step < 20; ++step) {
      std::vector<float> out(static_cast<size_t>(n));
      std::mutex mu;
      std::set<std::thread::id> threads;
      t.run([&](int rank) {
        {
          std::lock_guard<std::mutex> lock(mu);
          threads.insert(std::this_thread::get_id());
        }
        float x[2] = {static_cast<float>(rank + 1), static_cast<float>(step)};
        t.communicator(rank).all_reduce(x, x, 2, DType::kF32, ReduceOp::kSum);
        out[static_cast<size_t>(rank)] = x[0] + x[1];
      });
      for (float v : out) EXPECT_EQ(v, static_cast<float>(n * (n + 1) / 2 + n * step));
      EXPECT_EQ(threads.size(), static_cast<size_t>(n));
      EXPECT_TRUE(threads.count(std::this_thread::get_id())) << "rank 0 runs on the calling thread";
    }
  }
}

TEST(RankThreads, ARankThatThrowsIsAClearErrorNotAHang) {
  // Rank 1 throws before its collective while the others wait in theirs.
  {
    RankThreads t(3);
    std::string e = error_of(t, [&](int rank) {
      if (rank == 1) fail("weights of layer 7 are missing");
      float x = 1;
      t.communicator(rank).all_reduce(&x, &x, 1, DType::kF32, ReduceOp::kSum);
    });
    EXPECT_EQ(e, "tensor-parallel rank 1 of 3 failed: weights of layer 7 are missing");
    // The group stays failed: the next run throws the same error at once, running nothing.
    std::atomic<int> ran{0};
    EXPECT_EQ(error_of(t, [&](int) { ++ran; }), e);
    EXPECT_EQ(ran.load(), 0);
  }
  // Rank 0 throws after a first collective, the others wait in the second.
  {
    RankThreads t(4);
    std::string e = error_of(t, [&](int rank) {
      float x = 1;
      t.communicator(rank).all_reduce(&x, &x, 1, DType::kF32, ReduceOp::kSum);
      if (rank == 0) throw std::runtime_error("out of memory");
      t.communicator(rank).all_reduce(&x, &x, 1, DType::kF32, ReduceOp::kSum);
    });
    EXPECT_EQ(e, "tensor-parallel rank 0 of 4 failed: out of memory");
  }
  // Mismatched collectives: every rank gets the group's error, which run() passes on.
  {
    RankThreads t(2);
    std::string e = error_of(t, [&](int rank) {
      float x[2] = {1, 2};
      t.communicator(rank).all_reduce(x, x, rank == 0 ? 1 : 2, DType::kF32, ReduceOp::kSum);
    });
    EXPECT_NE(e.find("collective mismatch"), std::string::npos) << e;
  }
  // Every rank but the last throws: the lowest rank's message is reported.
  {
    RankThreads t(3);
    std::string e = error_of(t, [&](int rank) {
      if (rank < 2) fail("rank {} failed", rank);
      float x = 1;
      t.communicator(rank).all_reduce(&x, &x, 1, DType::kF32, ReduceOp::kSum);
    });
    EXPECT_TRUE(e == "tensor-parallel rank 0 of 3 failed: rank 0 failed" ||
                e == "tensor-parallel rank 1 of 3 failed: rank 1 failed")
        << e;
  }
}

}  // namespace
}  // namespace polylora
