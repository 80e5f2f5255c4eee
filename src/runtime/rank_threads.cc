// runtime/rank_threads.cc: see rank_threads.h.
#include "runtime/rank_threads.h"

#include <exception>

#include "common/error.h"

namespace polylora {

RankThreads::RankThreads(int size) : group_(size) {
  for (int r = 1; r < size; ++r) threads_.emplace_back([this, r] { worker_main(r); });
}

RankThreads::~RankThreads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void RankThreads::run_rank(int rank) {
  std::string message;
  try {
    (*job_)(rank);
    return;
  } catch (const std::exception& e) {
    message = e.what();
  } catch (...) {
    message = "an exception that is not a std::exception";
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Ranks released by an abort throw the group's error; the rank that caused it raised its own first.
    const bool original = !group_.aborted();
    if (failure_.rank < 0 || (original && !failure_.original) ||
        (original == failure_.original && rank < failure_.rank))
      failure_ = {rank, message, original};
  }
  group_.communicator(rank).abort(message);
  if (abort_hook_) {
    try {
      abort_hook_(message);
    } catch (...) {  // the group is failed already; the hook's own error adds nothing
    }
  }
}

void RankThreads::worker_main(int rank) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    lock.unlock();
    run_rank(rank);
    lock.lock();
    if (--pending_ == 0) cv_.notify_all();
  }
}

void RankThreads::run(const std::function<void(int rank)>& job) {
  if (!failed_.empty()) fail("{}", failed_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &job;
    pending_ = size() - 1;
    failure_ = {};
    ++generation_;
  }
  cv_.notify_all();
  run_rank(0);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
  if (failure_.rank < 0) return;
  failed_ = failure_.original ? fmt::format("tensor-parallel rank {} of {} failed: {}", failure_.rank, size(),
                                            failure_.message)
                              : failure_.message;
  fail("{}", failed_);
}

}  // namespace polylora
