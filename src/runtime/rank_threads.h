// runtime/rank_threads.h: the threads of a tensor-parallel group in one process (docs/tensor-parallel.md).
// Owns: a CpuCommunicatorGroup of N ranks and N - 1 worker threads (ranks 1..N-1; rank 0 is the calling
// thread), and run(job): the same job on every rank at once, returning when all are done.
// Must not: know about models, shards or steps (the job does); hang when a rank fails.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/communicator.h"

namespace polylora {

class RankThreads {
 public:
  explicit RankThreads(int size);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int size() const { return group_.size(); }
  Communicator& communicator(int rank) { return group_.communicator(rank); }

  // Runs job(r) for every rank r at once (r = 0 on the calling thread) and returns when every rank has
  // returned. A rank that throws aborts the group, so the others leave their collectives (they throw the
  // group's error) instead of waiting; run() then throws polylora::Error naming the rank that failed
  // first and its message ("tensor-parallel rank 1 of 2 failed: ..."). The group stays aborted: every
  // later run() throws the same error at once. One run() at a time (the engine thread's).
  void run(const std::function<void(int rank)>& job);
  // Also called (on the failing rank's thread) when a rank fails, with its message: communicators of
  // the group other than this one's CPU group (NCCL on GPUs) are aborted there, so their other ranks do
  // not wait for it.
  void set_abort_hook(std::function<void(const std::string& reason)> hook) { abort_hook_ = std::move(hook); }

 private:
  void worker_main(int rank);
  void run_rank(int rank);

  CpuCommunicatorGroup group_;
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;  // moves at every run()
  int pending_ = 0;          // worker ranks still running the current job
  bool stop_ = false;
  // The first failure: preferably one a rank raised itself (`original`) rather than the group's abort
  // error it caused on the other ranks.
  struct Failure {
    int rank = -1;
    std::string message;
    bool original = false;
  };
  Failure failure_;
  std::string failed_;  // set once run() has thrown: the error every later run() throws
  std::vector<std::thread> threads_;
  std::function<void(const std::string&)> abort_hook_;
};

}  // namespace polylora
