// tests/unit/cache/kv_cache_manager_test.cc: KvCacheManager block accounting and prefix caching: hashes,
// shared prefixes, extra keys (adapter, generation, salt), LRU eviction, allocation failure, fork, reset,
// and a randomized scheduler-like run with the invariants checked after every step.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cache/kv_cache_manager.h"

namespace polylora {
namespace {

constexpr int64_t kBlockSize = 4;

std::vector<int32_t> iota_tokens(int32_t start, int64_t count) {
  std::vector<int32_t> tokens(count);
  std::iota(tokens.begin(), tokens.end(), start);
  return tokens;
}

// Finds the cached prefix and allocates the whole prompt for a new request, as the scheduler does.
bool admit(KvCacheManager& cache, RequestId request, const std::vector<int32_t>& tokens,
           const CacheKeyExtra& extra = {}) {
  KvCacheManager::CachedPrefix prefix = cache.find_cached_prefix(tokens, extra);
  return cache.allocate(request, tokens, prefix.num_tokens,
                        static_cast<int64_t>(tokens.size()) - prefix.num_tokens, extra, &prefix);
}

// Everything observable about the manager, to compare before and after a failed call.
struct Snapshot {
  int64_t num_free_blocks;
  int64_t num_cached_blocks;
  std::vector<std::optional<uint64_t>> hashes;
  std::map<RequestId, std::vector<int32_t>> tables;
  bool operator==(const Snapshot&) const = default;
};

Snapshot snapshot(const KvCacheManager& cache, const std::vector<RequestId>& requests) {
  Snapshot s{cache.num_free_blocks(), cache.num_cached_blocks(), {}, {}};
  for (int32_t b = 0; b < cache.num_blocks(); ++b) s.hashes.push_back(cache.cached_block_hash(b));
  for (RequestId r : requests) s.tables[r] = cache.block_table(r);
  return s;
}

TEST(BlockHashTest, DependsOnEveryTokenTheParentAndEachExtraKey) {
  const std::vector<int32_t> tokens = {11, 22, 33, 44};
  const CacheKeyExtra extra{AdapterId{3}, "salt"};
  const uint64_t base = KvCacheManager::block_hash(KvCacheManager::kRootBlockHash, tokens, extra);
  EXPECT_EQ(base, KvCacheManager::block_hash(KvCacheManager::kRootBlockHash, tokens, extra));
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::vector<int32_t> changed = tokens;
    ++changed[i];
    EXPECT_NE(base, KvCacheManager::block_hash(KvCacheManager::kRootBlockHash, changed, extra))
        << "token " << i;
  }
  EXPECT_NE(base, KvCacheManager::block_hash(KvCacheManager::kRootBlockHash + 1, tokens, extra));
  EXPECT_NE(base, KvCacheManager::block_hash(base, tokens, extra));
  EXPECT_NE(base, KvCacheManager::block_hash(KvCacheManager::kRootBlockHash, tokens, {AdapterId{4}, "salt"}));
  EXPECT_NE(base, KvCacheManager::block_hash(KvCacheManager::kRootBlockHash, tokens, {AdapterId{3}, "salT"}));
  EXPECT_NE(base, KvCacheManager::block_hash(KvCacheManager::kRootBlockHash, tokens, {AdapterId{3}, ""}));
  // Field boundaries matter: the salt is length-prefixed after the adapter's version.
  EXPECT_NE(KvCacheManager::block_hash(KvCacheManager::kRootBlockHash, tokens, {AdapterId{0}, "ab"}),
            KvCacheManager::block_hash(KvCacheManager::kRootBlockHash, tokens, {AdapterId{0}, "abc"}));
}

TEST(KvCacheManagerTest, SharedPrefixHitsTheSameBlocks) {
  KvCacheManager cache(16, kBlockSize, true);
  std::vector<int32_t> a = iota_tokens(100, 10);  // 2 full blocks + 2 tokens
  ASSERT_TRUE(admit(cache, 1, a));
  EXPECT_EQ(cache.block_table(1).size(), 3u);
  EXPECT_EQ(cache.stats().queries, 10);
  EXPECT_EQ(cache.stats().hits, 0);

  std::vector<int32_t> b = a;
  b.resize(8);
  b.insert(b.end(), {7, 7, 7, 7, 7});  // same first 2 blocks, different tail
  KvCacheManager::CachedPrefix prefix = cache.find_cached_prefix(b, {});
  ASSERT_EQ(prefix.num_tokens, 8);
  EXPECT_EQ(prefix.blocks,
            std::vector<int32_t>(cache.block_table(1).begin(), cache.block_table(1).begin() + 2));
  EXPECT_EQ(cache.stats().queries, 23);
  EXPECT_EQ(cache.stats().hits, 8);
  ASSERT_TRUE(cache.allocate(2, b, prefix.num_tokens, 5, {}, &prefix));
  const auto& table_b = cache.block_table(2);
  ASSERT_EQ(table_b.size(), 4u);
  EXPECT_EQ(table_b[0], cache.block_table(1)[0]);
  EXPECT_EQ(table_b[1], cache.block_table(1)[1]);
  EXPECT_NE(table_b[2], cache.block_table(1)[2]);
  EXPECT_EQ(cache.num_free_blocks(), 16 - 5);
  EXPECT_DOUBLE_EQ(cache.usage(), 5.0 / 16);
  EXPECT_EQ(cache.check_invariants(), "");

  // Shared blocks have reference count 2: freeing one request keeps them used.
  cache.free(1);
  EXPECT_EQ(cache.num_free_blocks(), 16 - 4);
  EXPECT_EQ(cache.check_invariants(), "");
  cache.free(2);
  EXPECT_EQ(cache.num_free_blocks(), 16);
  EXPECT_EQ(cache.check_invariants(), "");
}

TEST(KvCacheManagerTest, FullyCachedPromptStillComputesItsLastToken) {
  KvCacheManager cache(16, kBlockSize, true);
  std::vector<int32_t> a = iota_tokens(0, 8);  // exactly 2 full blocks
  ASSERT_TRUE(admit(cache, 1, a));
  EXPECT_EQ(cache.num_cached_blocks(), 2);
  // Same 8 tokens: at most 7 may be cached, rounded down to full blocks: 1 block.
  KvCacheManager::CachedPrefix prefix = cache.find_cached_prefix(a, {});
  EXPECT_EQ(prefix.num_tokens, 4);
  // 9 tokens: both full blocks are usable.
  a.push_back(99);
  EXPECT_EQ(cache.find_cached_prefix(a, {}).num_tokens, 8);
  EXPECT_EQ(cache.find_cached_prefix(std::vector<int32_t>{}, {}).num_tokens, 0);
  EXPECT_EQ(cache.find_cached_prefix(std::vector<int32_t>{0}, {}).num_tokens, 0);
}

class ExtraKeyTest : public ::testing::TestWithParam<std::pair<CacheKeyExtra, CacheKeyExtra>> {};

TEST_P(ExtraKeyTest, DifferentExtraKeysNeverShare) {
  const auto& [first, second] = GetParam();
  KvCacheManager cache(16, kBlockSize, true);
  std::vector<int32_t> tokens = iota_tokens(5, 13);
  ASSERT_TRUE(admit(cache, 1, tokens, first));
  EXPECT_EQ(cache.find_cached_prefix(tokens, second).num_tokens, 0);
  ASSERT_TRUE(admit(cache, 2, tokens, second));
  for (int32_t b : cache.block_table(2)) {
    const auto& table_1 = cache.block_table(1);
    EXPECT_EQ(std::count(table_1.begin(), table_1.end(), b), 0) << "block " << b << " shared";
  }
  // Freed, both remain cached under their own keys, and each hits only its own blocks.
  cache.free(1);
  cache.free(2);
  EXPECT_EQ(cache.num_cached_blocks(), 6);
  KvCacheManager::CachedPrefix hit_1 = cache.find_cached_prefix(tokens, first);
  KvCacheManager::CachedPrefix hit_2 = cache.find_cached_prefix(tokens, second);
  ASSERT_EQ(hit_1.num_tokens, 12);
  ASSERT_EQ(hit_2.num_tokens, 12);
  for (int32_t b : hit_1.blocks) EXPECT_EQ(std::count(hit_2.blocks.begin(), hit_2.blocks.end(), b), 0);
  EXPECT_EQ(cache.check_invariants(), "");
}

INSTANTIATE_TEST_SUITE_P(
    Keys, ExtraKeyTest,
    ::testing::Values(std::make_pair(CacheKeyExtra{}, CacheKeyExtra{AdapterId{1}, ""}),
                      std::make_pair(CacheKeyExtra{AdapterId{1}, ""}, CacheKeyExtra{AdapterId{7}, ""}),
                      std::make_pair(CacheKeyExtra{AdapterId{1}, ""}, CacheKeyExtra{AdapterId{2}, ""}),  // reloaded
                      std::make_pair(CacheKeyExtra{}, CacheKeyExtra{AdapterId{}, "tenant-a"}),
                      std::make_pair(CacheKeyExtra{AdapterId{}, "tenant-a"}, CacheKeyExtra{AdapterId{}, "tenant-b"})),
    [](const auto& info) { return "Case" + std::to_string(info.index); });

TEST(KvCacheManagerTest, LruEvictsTheLeastRecentlyFreedFirst) {
  KvCacheManager cache(4, kBlockSize, true);
  std::vector<int32_t> a = iota_tokens(0, 5);   // blocks {0 (cached), 1}
  std::vector<int32_t> b = iota_tokens(50, 5);  // blocks {2 (cached), 3}
  ASSERT_TRUE(admit(cache, 1, a));
  ASSERT_TRUE(admit(cache, 2, b));
  EXPECT_EQ(cache.block_table(1), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(cache.block_table(2), (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(cache.num_free_blocks(), 0);
  cache.free(1);  // free list: 1 0
  cache.free(2);  // free list: 1 0 3 2 (each request in reverse order)
  EXPECT_EQ(cache.num_free_blocks(), 4);
  EXPECT_DOUBLE_EQ(cache.usage(), 0.0);
  EXPECT_EQ(cache.find_cached_prefix(a, {}).blocks, std::vector<int32_t>{0});
  EXPECT_EQ(cache.find_cached_prefix(b, {}).blocks, std::vector<int32_t>{2});

  ASSERT_TRUE(admit(cache, 3, iota_tokens(200, 2)));  // takes block 1: nothing evicted
  EXPECT_EQ(cache.block_table(3), std::vector<int32_t>{1});
  EXPECT_EQ(cache.find_cached_prefix(a, {}).num_tokens, 4);
  EXPECT_EQ(cache.find_cached_prefix(b, {}).num_tokens, 4);

  ASSERT_TRUE(admit(cache, 4, iota_tokens(300, 2)));  // takes block 0: evicts a's block
  EXPECT_EQ(cache.block_table(4), std::vector<int32_t>{0});
  EXPECT_EQ(cache.find_cached_prefix(a, {}).num_tokens, 0);
  EXPECT_EQ(cache.find_cached_prefix(b, {}).num_tokens, 4);
  EXPECT_FALSE(cache.cached_block_hash(0).has_value());
  EXPECT_TRUE(cache.cached_block_hash(2).has_value());

  ASSERT_TRUE(admit(cache, 5, iota_tokens(400, 2)));  // takes block 3, b's block 2 is still cached
  EXPECT_EQ(cache.block_table(5), std::vector<int32_t>{3});
  EXPECT_EQ(cache.find_cached_prefix(b, {}).num_tokens, 4);
  EXPECT_EQ(cache.check_invariants(), "");
}

TEST(KvCacheManagerTest, HitOnAFreedBlockTakesItOutOfTheFreeList) {
  KvCacheManager cache(8, kBlockSize, true);
  std::vector<int32_t> a = iota_tokens(0, 9);  // blocks 0 1 cached, 2 partial
  ASSERT_TRUE(admit(cache, 1, a));
  cache.free(1);
  EXPECT_EQ(cache.num_free_blocks(), 8);
  KvCacheManager::CachedPrefix prefix = cache.find_cached_prefix(a, {});
  EXPECT_EQ(prefix.blocks, (std::vector<int32_t>{0, 1}));
  ASSERT_TRUE(cache.allocate(2, a, 8, 1, {}, &prefix));
  EXPECT_EQ(cache.block_table(2)[0], 0);
  EXPECT_EQ(cache.block_table(2)[1], 1);
  EXPECT_EQ(cache.num_free_blocks(), 5);
  EXPECT_EQ(cache.check_invariants(), "");
  // A second request hitting the same blocks while they are referenced: reference count 2.
  ASSERT_TRUE(admit(cache, 3, a));
  EXPECT_EQ(cache.block_table(3)[0], 0);
  EXPECT_EQ(cache.num_free_blocks(), 4);
  EXPECT_EQ(cache.check_invariants(), "");
  cache.free(2);
  EXPECT_EQ(cache.num_free_blocks(), 5);  // only request 2's own last block
  cache.free(3);
  EXPECT_EQ(cache.num_free_blocks(), 8);
  EXPECT_EQ(cache.stats().hits, 16);
  EXPECT_EQ(cache.stats().queries, 27);
  EXPECT_EQ(cache.check_invariants(), "");
}

TEST(KvCacheManagerTest, AllocateFailureLeavesEverythingUnchanged) {
  KvCacheManager cache(4, kBlockSize, true);
  std::vector<int32_t> a = iota_tokens(0, 9);  // blocks 0 1 (cached) 2
  ASSERT_TRUE(admit(cache, 1, a));
  cache.free(1);                                      // free list: 3 2 1 0; 0 and 1 still cached
  ASSERT_TRUE(admit(cache, 2, iota_tokens(500, 3)));  // takes block 3
  // Request 3 shares a's 2 cached blocks but then needs 3 more blocks: 2 + 3 > 3 free.
  std::vector<int32_t> c = a;
  c.resize(8);
  for (int i = 0; i < 9; ++i) c.push_back(1000 + i);
  const Snapshot before = snapshot(cache, {1, 2, 3});
  const PrefixCacheStats stats_before = cache.stats();
  KvCacheManager::CachedPrefix prefix = cache.find_cached_prefix(c, {});
  ASSERT_EQ(prefix.num_tokens, 8);
  EXPECT_FALSE(cache.allocate(3, c, 8, 9, {}, &prefix));
  EXPECT_FALSE(cache.has_request(3));
  EXPECT_EQ(snapshot(cache, {1, 2, 3}), before);
  EXPECT_EQ(cache.check_invariants(), "");
  // Growing an existing request past the pool fails the same way.
  EXPECT_FALSE(cache.allocate(2, iota_tokens(500, 20), 3, 17, {}));
  EXPECT_EQ(snapshot(cache, {1, 2, 3}), before);
  // The prefix's blocks are still cached and free, and the free list order is intact: a's prefix
  // blocks are evicted last (block 2 goes first).
  EXPECT_EQ(cache.find_cached_prefix(c, {}).num_tokens, 8);
  EXPECT_EQ(cache.stats().queries, stats_before.queries + 2 * 17);
  ASSERT_TRUE(admit(cache, 4, iota_tokens(900, 3)));
  EXPECT_EQ(cache.block_table(4), std::vector<int32_t>{2});
  EXPECT_EQ(cache.find_cached_prefix(c, {}).num_tokens, 8);
  // Once a block is freed, a smaller tail fits next to the same prefix (the prefix blocks are not popped).
  cache.free(2);  // free list: 1 0 3
  c.resize(10);
  ASSERT_TRUE(admit(cache, 3, c));
  EXPECT_EQ(cache.block_table(3), (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(cache.num_free_blocks(), 0);
  EXPECT_EQ(cache.check_invariants(), "");
}

TEST(KvCacheManagerTest, GrowingWithinThePartialLastBlockTakesNoBlock) {
  KvCacheManager cache(8, kBlockSize, true);
  std::vector<int32_t> tokens = iota_tokens(0, 5);
  ASSERT_TRUE(admit(cache, 1, tokens));
  EXPECT_EQ(cache.block_table(1).size(), 2u);
  for (int step = 0; step < 3; ++step) {  // tokens 6, 7, 8 fill block 1
    tokens.push_back(100 + step);
    ASSERT_TRUE(cache.allocate(1, tokens, static_cast<int64_t>(tokens.size()) - 1, 1, {}));
    EXPECT_EQ(cache.block_table(1).size(), 2u);
    EXPECT_EQ(cache.num_free_blocks(), 6);
  }
  EXPECT_EQ(cache.num_cached_blocks(), 2);  // block 1 became full and was registered
  tokens.push_back(7);
  ASSERT_TRUE(cache.allocate(1, tokens, 8, 1, {}));
  EXPECT_EQ(cache.block_table(1).size(), 3u);
  EXPECT_EQ(cache.num_free_blocks(), 5);
  // Zero new tokens: nothing changes.
  ASSERT_TRUE(cache.allocate(1, tokens, 9, 0, {}));
  EXPECT_EQ(cache.block_table(1).size(), 3u);
  EXPECT_EQ(cache.check_invariants(), "");
}

TEST(KvCacheManagerTest, PartialBlocksAreNotCached) {
  KvCacheManager cache(8, kBlockSize, true);
  std::vector<int32_t> tokens = iota_tokens(0, 7);  // 1 full block + 3 tokens
  ASSERT_TRUE(admit(cache, 1, tokens));
  EXPECT_EQ(cache.num_cached_blocks(), 1);
  EXPECT_TRUE(cache.cached_block_hash(cache.block_table(1)[0]).has_value());
  EXPECT_FALSE(cache.cached_block_hash(cache.block_table(1)[1]).has_value());
  cache.free(1);
  std::vector<int32_t> longer = tokens;
  longer.push_back(7);
  longer.push_back(8);
  EXPECT_EQ(cache.find_cached_prefix(longer, {}).num_tokens, 4);  // the partial block never hits
}

TEST(KvCacheManagerTest, ForkSharesFullBlocksAndFreesCorrectly) {
  KvCacheManager cache(16, kBlockSize, true);
  std::vector<int32_t> prompt = iota_tokens(0, 10);  // blocks: 2 full + 1 partial
  ASSERT_TRUE(admit(cache, 1, prompt));
  const std::vector<int32_t> parent_table = cache.block_table(1);
  EXPECT_EQ(cache.fork(1, 2), 8);
  EXPECT_EQ(cache.block_table(2), std::vector<int32_t>(parent_table.begin(), parent_table.begin() + 2));
  EXPECT_EQ(cache.num_free_blocks(), 13);
  EXPECT_EQ(cache.check_invariants(), "");
  // The child computes the rest of the prompt into its own block; when it fills with the same tokens as
  // the parent's block, the parent's mapping stays.
  ASSERT_TRUE(cache.allocate(2, prompt, 8, 2, {}));
  EXPECT_EQ(cache.block_table(2).size(), 3u);
  EXPECT_NE(cache.block_table(2)[2], parent_table[2]);
  EXPECT_EQ(cache.num_free_blocks(), 12);
  EXPECT_EQ(cache.check_invariants(), "");
  cache.free(1);
  EXPECT_EQ(cache.num_free_blocks(), 13);  // only the parent's own last block
  EXPECT_EQ(cache.check_invariants(), "");
  cache.free(2);
  EXPECT_EQ(cache.num_free_blocks(), 16);
  EXPECT_EQ(cache.check_invariants(), "");
}

TEST(KvCacheManagerTest, IdenticalFullBlockKeepsTheExistingMapping) {
  KvCacheManager cache(16, kBlockSize, true);
  std::vector<int32_t> tokens = iota_tokens(0, 3);
  ASSERT_TRUE(admit(cache, 1, tokens));
  ASSERT_TRUE(admit(cache, 2, tokens));  // nothing cached yet: separate blocks
  const int32_t block_1 = cache.block_table(1)[0];
  const int32_t block_2 = cache.block_table(2)[0];
  ASSERT_NE(block_1, block_2);
  tokens.push_back(3);
  tokens.push_back(4);
  ASSERT_TRUE(cache.allocate(1, tokens, 3, 2, {}));  // fills block_1 first: it is registered
  ASSERT_TRUE(cache.allocate(2, tokens, 3, 2, {}));  // same hash: block_2 stays unregistered
  EXPECT_TRUE(cache.cached_block_hash(block_1).has_value());
  EXPECT_FALSE(cache.cached_block_hash(block_2).has_value());
  EXPECT_EQ(cache.find_cached_prefix(tokens, {}).blocks, std::vector<int32_t>{block_1});
  EXPECT_EQ(cache.check_invariants(), "");
  // Request 2 keeps chaining its later blocks from the shared hash.
  for (int32_t t = 5; t < 9; ++t) tokens.push_back(t);
  ASSERT_TRUE(cache.allocate(2, tokens, 5, 4, {}));
  cache.free(1);
  cache.free(2);
  EXPECT_EQ(cache.find_cached_prefix(tokens, {}).num_tokens, 8);
  EXPECT_EQ(cache.check_invariants(), "");
}

TEST(KvCacheManagerTest, ResetPrefixCacheDropsHashesButKeepsReferencedBlocks) {
  KvCacheManager cache(8, kBlockSize, true);
  std::vector<int32_t> a = iota_tokens(0, 9);
  std::vector<int32_t> b = iota_tokens(100, 9);
  ASSERT_TRUE(admit(cache, 1, a));
  ASSERT_TRUE(admit(cache, 2, b));
  cache.free(1);
  const std::vector<int32_t> table_b = cache.block_table(2);
  EXPECT_EQ(cache.num_cached_blocks(), 4);
  cache.reset_prefix_cache();
  EXPECT_EQ(cache.num_cached_blocks(), 0);
  for (int32_t block = 0; block < cache.num_blocks(); ++block) EXPECT_FALSE(cache.cached_block_hash(block));
  EXPECT_EQ(cache.block_table(2), table_b);
  EXPECT_EQ(cache.num_free_blocks(), 5);
  EXPECT_EQ(cache.find_cached_prefix(a, {}).num_tokens, 0);
  EXPECT_EQ(cache.find_cached_prefix(b, {}).num_tokens, 0);
  EXPECT_EQ(cache.check_invariants(), "");
  // Caching works again afterwards.
  ASSERT_TRUE(admit(cache, 3, a));
  EXPECT_EQ(cache.find_cached_prefix(a, {}).num_tokens, 8);
  EXPECT_EQ(cache.check_invariants(), "");
}

TEST(KvCacheManagerTest, PrefixCachingOffNeverHitsOrCounts) {
  KvCacheManager cache(8, kBlockSize, false);
  std::vector<int32_t> a = iota_tokens(0, 9);
  ASSERT_TRUE(admit(cache, 1, a));
  ASSERT_TRUE(admit(cache, 2, a));
  EXPECT_EQ(cache.num_cached_blocks(), 0);
  EXPECT_EQ(cache.num_free_blocks(), 2);
  EXPECT_EQ(cache.stats().queries, 0);
  EXPECT_EQ(cache.stats().hits, 0);
  EXPECT_EQ(cache.fork(1, 3), 8);
  EXPECT_EQ(cache.check_invariants(), "");
  cache.free(1);
  cache.free(2);
  cache.free(3);
  EXPECT_EQ(cache.num_free_blocks(), 8);
  EXPECT_EQ(cache.check_invariants(), "");
}

TEST(KvCacheManagerTest, UnknownRequests) {
  KvCacheManager cache(4, kBlockSize, true);
  EXPECT_FALSE(cache.has_request(42));
  EXPECT_TRUE(cache.block_table(42).empty());
  cache.free(42);
  EXPECT_EQ(cache.num_free_blocks(), 4);
  EXPECT_EQ(cache.check_invariants(), "");
}

// A scheduler-like run: requests arrive with prompts built from a few shared prefixes (and a few
// extra-key sets), are admitted with their cached prefix, grow one token at a time, fork, finish, or are
// preempted (freed, later re-admitted from scratch). A shadow copy of what every block holds checks that
// every hit is exact and that no block in use is ever handed to another request.
TEST(KvCacheManagerTest, RandomizedStepsKeepInvariants) {
  constexpr int64_t kNumBlocks = 40;
  constexpr int kNumSteps = 6000;
  KvCacheManager cache(kNumBlocks, kBlockSize, true);
  std::mt19937 rng(1234);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };

  std::vector<std::vector<int32_t>> prefixes;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p(uniform(3, 14));
    for (int32_t& t : p) t = uniform(0, 999);
    prefixes.push_back(p);
  }
  const std::vector<CacheKeyExtra> extras = {{}, {AdapterId{1}, ""}, {AdapterId{2}, ""}, {AdapterId{}, "salt"}};

  struct SimRequest {
    RequestId id;
    std::vector<int32_t> tokens;
    int extra_idx;
    size_t target_len;
  };
  std::vector<SimRequest> waiting;
  std::map<RequestId, SimRequest> running;
  RequestId next_id = 1;
  // What a block holds (extra keys and every token up to its end), recorded when it becomes full.
  std::vector<std::string> content(kNumBlocks);
  auto key_of = [&](const SimRequest& r, size_t block_idx) {
    const CacheKeyExtra& e = extras[r.extra_idx];
    std::string key = std::to_string(e.adapter.version) + "/" + e.cache_salt + ":";
    for (size_t i = 0; i < (block_idx + 1) * kBlockSize; ++i) key += std::to_string(r.tokens[i]) + ",";
    return key;
  };
  auto record_full = [&](const SimRequest& r, size_t from_block) {
    const auto& table = cache.block_table(r.id);
    for (size_t i = from_block; i < r.tokens.size() / kBlockSize; ++i) content[table[i]] = key_of(r, i);
  };
  int64_t num_admitted = 0, num_admit_failed = 0, num_hit_blocks = 0, num_preempted = 0, num_forks = 0;

  auto preempt = [&](RequestId id) {
    cache.free(id);
    SimRequest r = running.at(id);
    running.erase(id);
    waiting.push_back(r);
    ++num_preempted;
  };

  for (int step = 0; step < kNumSteps; ++step) {
    const int action = uniform(0, 99);
    if (action < 12) {  // arrival
      if (waiting.size() + running.size() < 14) {
        SimRequest r{next_id++, prefixes[uniform(0, 3)], uniform(0, 3), 0};
        for (int n = uniform(0, 6); n > 0; --n) r.tokens.push_back(uniform(0, 2));
        r.target_len = r.tokens.size() + uniform(1, 24);
        waiting.push_back(r);
      }
    } else if (action < 30) {  // admit a waiting request
      if (!waiting.empty()) {
        const size_t idx = uniform(0, static_cast<int>(waiting.size()) - 1);
        SimRequest r = waiting[idx];
        const CacheKeyExtra& extra = extras[r.extra_idx];
        KvCacheManager::CachedPrefix prefix = cache.find_cached_prefix(r.tokens, extra);
        ASSERT_LT(prefix.num_tokens, static_cast<int64_t>(r.tokens.size()));
        ASSERT_EQ(prefix.num_tokens, static_cast<int64_t>(prefix.blocks.size()) * kBlockSize);
        for (size_t i = 0; i < prefix.blocks.size(); ++i)
          ASSERT_EQ(content[prefix.blocks[i]], key_of(r, i)) << "inexact hit at step " << step;
        const int64_t free_before = cache.num_free_blocks();
        if (cache.allocate(r.id, r.tokens, prefix.num_tokens,
                           static_cast<int64_t>(r.tokens.size()) - prefix.num_tokens, extra, &prefix)) {
          const auto& table = cache.block_table(r.id);
          ASSERT_TRUE(std::equal(prefix.blocks.begin(), prefix.blocks.end(), table.begin()));
          record_full(r, prefix.blocks.size());
          running.emplace(r.id, r);
          waiting.erase(waiting.begin() + idx);
          ++num_admitted;
          num_hit_blocks += static_cast<int64_t>(prefix.blocks.size());
        } else {
          ASSERT_FALSE(cache.has_request(r.id));
          ASSERT_EQ(cache.num_free_blocks(), free_before);
          ++num_admit_failed;
        }
      }
    } else if (action < 80) {  // decode one token for a running request
      if (!running.empty()) {
        auto it = std::next(running.begin(), uniform(0, static_cast<int>(running.size()) - 1));
        SimRequest& r = it->second;
        r.tokens.push_back(uniform(0, 2));
        const int64_t n = static_cast<int64_t>(r.tokens.size());
        if (cache.allocate(r.id, r.tokens, n - 1, 1, extras[r.extra_idx])) {
          if (n % kBlockSize == 0) record_full(r, n / kBlockSize - 1);
          if (r.tokens.size() >= r.target_len) {  // finished
            cache.free(r.id);
            running.erase(it);
          }
        } else {
          r.tokens.pop_back();  // the token was not computed; preempted, recomputed later
          preempt(r.id);
        }
      }
    } else if (action < 86) {  // preempt
      if (!running.empty())
        preempt(std::next(running.begin(), uniform(0, static_cast<int>(running.size()) - 1))->first);
    } else if (action < 92) {  // finish early (abort)
      if (!running.empty()) {
        auto it = std::next(running.begin(), uniform(0, static_cast<int>(running.size()) - 1));
        cache.free(it->first);
        running.erase(it);
      }
    } else if (action < 99) {  // fork (n > 1)
      if (!running.empty()) {
        const SimRequest& parent =
            std::next(running.begin(), uniform(0, static_cast<int>(running.size()) - 1))->second;
        SimRequest child{next_id++, parent.tokens, parent.extra_idx, parent.target_len};
        const int64_t covered = cache.fork(parent.id, child.id);
        ASSERT_EQ(covered, static_cast<int64_t>(child.tokens.size()) / kBlockSize * kBlockSize);
        if (cache.allocate(child.id, child.tokens, covered,
                           static_cast<int64_t>(child.tokens.size()) - covered, extras[child.extra_idx])) {
          running.emplace(child.id, child);
          ++num_forks;
        } else {
          cache.free(child.id);
        }
      }
    } else if (uniform(0, 9) == 0) {
      cache.reset_prefix_cache();
    }

    ASSERT_EQ(cache.check_invariants(), "") << "step " << step;
    int64_t min_used = 0;
    for (const auto& [id, r] : running) {
      const auto& table = cache.block_table(id);
      const size_t n = r.tokens.size();
      ASSERT_EQ(table.size(), (n + kBlockSize - 1) / kBlockSize) << "request " << id << " step " << step;
      // Every full block still holds this request's tokens: no block in use was handed out again.
      for (size_t i = 0; i < n / kBlockSize; ++i)
        ASSERT_EQ(content[table[i]], key_of(r, i)) << "request " << id << " block " << i << " step " << step;
      min_used = std::max<int64_t>(min_used, static_cast<int64_t>(table.size()));
    }
    for (const SimRequest& r : waiting) ASSERT_FALSE(cache.has_request(r.id));
    ASSERT_GE(kNumBlocks - cache.num_free_blocks(), min_used);
    ASSERT_DOUBLE_EQ(cache.usage(), static_cast<double>(kNumBlocks - cache.num_free_blocks()) / kNumBlocks);
    ASSERT_LE(cache.stats().hits, cache.stats().queries);
  }
  // The run exercised what it means to.
  EXPECT_GT(num_admitted, 200);
  EXPECT_GT(num_admit_failed, 0);
  EXPECT_GT(num_hit_blocks, 100);
  EXPECT_GT(num_preempted, 50);
  EXPECT_GT(num_forks, 20);
  for (const auto& [id, r] : running) cache.free(id);
  EXPECT_EQ(cache.num_free_blocks(), kNumBlocks);
  EXPECT_EQ(cache.check_invariants(), "");
}

}  // namespace
}  // namespace polylora
