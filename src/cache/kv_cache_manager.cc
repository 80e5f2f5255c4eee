// cache/kv_cache_manager.cc: block pool, LRU free list, chained block hashes and block tables.
// Owns: the implementation of KvCacheManager (see the header for the semantics of each call).
// Must not: include CUDA headers, touch KV data, or know about models or the scheduler's queues.
#include "cache/kv_cache_manager.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "common/error.h"

namespace polylora {
namespace {

void append_bytes(std::string& buffer, const void* data, size_t size) {
  buffer.append(static_cast<const char*>(data), size);
}

void append_u64(std::string& buffer, uint64_t value) {
  append_bytes(buffer, &value, sizeof(value));
}

// Length-prefixed, so ("ab", "c") and ("a", "bc") hash differently.
void append_string(std::string& buffer, const std::string& value) {
  append_u64(buffer, value.size());
  buffer.append(value);
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

KvCacheManager::KvCacheManager(int64_t num_blocks, int64_t block_size, bool enable_prefix_caching)
    : block_size_(block_size), prefix_caching_(enable_prefix_caching) {
  CHECK_MSG(num_blocks > 0 && num_blocks <= INT32_MAX, "num_blocks = {}", num_blocks);
  CHECK_MSG(block_size > 0, "block_size = {}", block_size);
  blocks_.resize(num_blocks);
  for (int32_t block_id = 0; block_id < static_cast<int32_t>(num_blocks); ++block_id) push_free(block_id);
}

int64_t KvCacheManager::num_blocks() const {
  return static_cast<int64_t>(blocks_.size());
}
int64_t KvCacheManager::block_size() const {
  return block_size_;
}
int64_t KvCacheManager::num_free_blocks() const {
  return num_free_;
}

double KvCacheManager::usage() const {
  return static_cast<double>(num_blocks() - num_free_) / static_cast<double>(num_blocks());
}

uint64_t KvCacheManager::block_hash(uint64_t parent_hash, std::span<const int32_t> block_tokens,
                                    const CacheKeyExtra& extra) {
  std::string buffer;
  buffer.reserve(sizeof(uint64_t) * 4 + block_tokens.size_bytes() +
                 extra.cache_salt.size());
  append_u64(buffer, parent_hash);
  append_u64(buffer, block_tokens.size());
  append_bytes(buffer, block_tokens.data(), block_tokens.size_bytes());
  append_u64(buffer, extra.adapter.version);
  append_string(buffer, extra.cache_salt);
  return XXH3_64bits(buffer.data(), buffer.size());
}

KvCacheManager::CachedPrefix KvCacheManager::find_cached_prefix(std::span<const int32_t> tokens,
                                                                const CacheKeyExtra& extra) {
  CachedPrefix prefix;
  if (!prefix_caching_ || tokens.empty()) return prefix;
  stats_.queries += static_cast<int64_t>(tokens.size());
  // At most tokens.size() − 1 tokens, rounded down to full blocks: the last token is always computed.
  const int64_t max_blocks = (static_cast<int64_t>(tokens.size()) - 1) / block_size_;
  uint64_t parent = kRootBlockHash;
  for (int64_t i = 0; i < max_blocks; ++i) {
    const uint64_t hash = block_hash(parent, tokens.subspan(i * block_size_, block_size_), extra);
    auto it = cached_.find(hash);
    if (it == cached_.end()) break;
    prefix.blocks.push_back(it->second);
    parent = hash;
  }
  prefix.num_tokens = static_cast<int64_t>(prefix.blocks.size()) * block_size_;
  stats_.hits += prefix.num_tokens;
  return prefix;
}

bool KvCacheManager::allocate(RequestId request, std::span<const int32_t> tokens, int64_t num_computed_tokens,
                              int64_t num_new_tokens, const CacheKeyExtra& extra,
                              const CachedPrefix* prefix) {
  CHECK_MSG(num_computed_tokens >= 0 && num_new_tokens >= 0,
            "request {}: num_computed_tokens = {}, "
            "num_new_tokens = {}",
            request, num_computed_tokens, num_new_tokens);
  const int64_t num_tokens = num_computed_tokens + num_new_tokens;
  CHECK_MSG(static_cast<int64_t>(tokens.size()) >= num_computed_tokens,
            "request {}: allocate() with {} computed tokens got only {} token ids", request, num_computed_tokens,
            tokens.size());
  auto existing = requests_.find(request);
  const bool is_new = existing == requests_.end();

  // Prefix blocks (first call only): validate them against the tokens, and count those that sit in the
  // free list, since taking them shrinks what is left for new blocks.
  std::span<const int32_t> prefix_blocks;
  std::vector<uint64_t> prefix_hashes;
  int64_t num_prefix_free = 0;
  if (is_new) {
    const int64_t prefix_tokens = prefix != nullptr ? prefix->num_tokens : 0;
    CHECK_MSG(num_computed_tokens == prefix_tokens,
              "request {}: first allocate() has num_computed_tokens = {} but the cached prefix has {} tokens",
              request, num_computed_tokens, prefix_tokens);
    if (prefix != nullptr) {
      prefix_blocks = prefix->blocks;
      CHECK_MSG(prefix->num_tokens == static_cast<int64_t>(prefix_blocks.size()) * block_size_,
                "request {}: cached prefix of {} blocks claims {} tokens", request, prefix_blocks.size(),
                prefix->num_tokens);
      CHECK_MSG(prefix_blocks.empty() || prefix_caching_, "request {}: a cached prefix with caching off",
                request);
      uint64_t parent = kRootBlockHash;
      for (size_t i = 0; i < prefix_blocks.size(); ++i) {
        const int32_t block_id = prefix_blocks[i];
        CHECK_MSG(block_id >= 0 && block_id < num_blocks(), "request {}: bad block id {}", request, block_id);
        parent = block_hash(parent, tokens.subspan(i * block_size_, block_size_), extra);
        CHECK_MSG(blocks_[block_id].hash == parent,
                  "request {}: cached prefix block {} (index {}) was evicted or changed since "
                  "find_cached_prefix(); call allocate() right after it",
                  request, block_id, i);
        prefix_hashes.push_back(parent);
        if (blocks_[block_id].ref_count == 0) ++num_prefix_free;
      }
    }
  } else {
    CHECK_MSG(prefix == nullptr || prefix->blocks.empty(),
              "request {}: a cached prefix is only taken on the first allocate()", request);
    CHECK_MSG(num_computed_tokens <= static_cast<int64_t>(existing->second.blocks.size()) * block_size_,
              "request {}: num_computed_tokens = {} exceeds its {} blocks", request, num_computed_tokens,
              existing->second.blocks.size());
  }

  const int64_t num_held = is_new ? static_cast<int64_t>(prefix_blocks.size())
                                  : static_cast<int64_t>(existing->second.blocks.size());
  const int64_t num_needed = std::max<int64_t>(0, ceil_div(num_tokens, block_size_) - num_held);
  if (num_needed > num_free_ - num_prefix_free) return false;

  // Committed: nothing below fails.
  RequestState& state = is_new ? requests_[request] : existing->second;
  if (is_new) {
    for (int32_t block_id : prefix_blocks) {
      Block& block = blocks_[block_id];
      if (block.ref_count == 0) remove_free(block_id);
      ++block.ref_count;
      state.blocks.push_back(block_id);
    }
    state.block_hashes = std::move(prefix_hashes);
    state.num_tokens = static_cast<int64_t>(prefix_blocks.size()) * block_size_;
  }
  for (int64_t i = 0; i < num_needed; ++i) {
    const int32_t block_id = pop_free();
    blocks_[block_id].ref_count = 1;
    state.blocks.push_back(block_id);
  }
  state.num_tokens = std::max(state.num_tokens, num_tokens);
  cache_full_blocks(state, tokens, num_tokens, extra);
  return true;
}

void KvCacheManager::cache_full_blocks(RequestState& state, std::span<const int32_t> tokens,
                                       int64_t num_tokens, const CacheKeyExtra& extra) {
  if (!prefix_caching_) return;
  // Only blocks whose ids are all known (a later call hashes the rest once they are).
  const int64_t num_full = std::min(num_tokens, static_cast<int64_t>(tokens.size())) / block_size_;
  for (int64_t i = static_cast<int64_t>(state.block_hashes.size()); i < num_full; ++i) {
    const uint64_t parent = i == 0 ? kRootBlockHash : state.block_hashes[i - 1];
    const uint64_t hash = block_hash(parent, tokens.subspan(i * block_size_, block_size_), extra);
    state.block_hashes.push_back(hash);
    const int32_t block_id = state.blocks[i];
    Block& block = blocks_[block_id];
    if (block.hash.has_value()) continue;  // shared from a fork or prefix hit: already registered
    // An identical block from another request is already cached: keep that mapping; this block stays
    // unregistered (it is freed like any other and simply cannot be hit).
    if (cached_.emplace(hash, block_id).second) block.hash = hash;
  }
}

void KvCacheManager::free(RequestId request) {
  auto it = requests_.find(request);
  if (it == requests_.end()) return;
  const std::vector<int32_t>& table = it->second.blocks;
  for (auto block_it = table.rbegin(); block_it != table.rend(); ++block_it) {
    Block& block = blocks_[*block_it];
    CHECK_MSG(block.ref_count > 0, "request {}: block {} freed with reference count {}", request, *block_it,
              block.ref_count);
    if (--block.ref_count == 0) push_free(*block_it);
  }
  requests_.erase(it);
}

int64_t KvCacheManager::fork(RequestId parent, RequestId child) {
  auto parent_it = requests_.find(parent);
  CHECK_MSG(parent_it != requests_.end(), "fork from unknown request {}", parent);
  CHECK_MSG(!requests_.contains(child), "fork into request {} that already holds blocks", child);
  const RequestState& source = parent_it->second;
  const int64_t num_full = source.num_tokens / block_size_;
  RequestState state;
  state.blocks.assign(source.blocks.begin(), source.blocks.begin() + num_full);
  const int64_t num_hashes = std::min<int64_t>(num_full, static_cast<int64_t>(source.block_hashes.size()));
  state.block_hashes.assign(source.block_hashes.begin(), source.block_hashes.begin() + num_hashes);
  state.num_tokens = num_full * block_size_;
  for (int32_t block_id : state.blocks) ++blocks_[block_id].ref_count;
  requests_.emplace(child, std::move(state));
  return num_full * block_size_;
}

const std::vector<int32_t>& KvCacheManager::block_table(RequestId request) const {
  static const std::vector<int32_t> kEmpty;
  auto it = requests_.find(request);
  return it == requests_.end() ? kEmpty : it->second.blocks;
}

bool KvCacheManager::has_request(RequestId request) const {
  return requests_.contains(request);
}

void KvCacheManager::reset_prefix_cache() {
  for (const auto& [hash, block_id] : cached_) blocks_[block_id].hash.reset();
  cached_.clear();
}

PrefixCacheStats KvCacheManager::stats() const {
  return stats_;
}

int64_t KvCacheManager::num_cached_blocks() const {
  return static_cast<int64_t>(cached_.size());
}

std::optional<uint64_t> KvCacheManager::cached_block_hash(int32_t block_id) const {
  CHECK_MSG(block_id >= 0 && block_id < num_blocks(), "bad block id {}", block_id);
  return blocks_[block_id].hash;
}

int32_t KvCacheManager::pop_free() {
  CHECK_MSG(free_head_ >= 0, "pop_free() on an empty free list");
  const int32_t block_id = free_head_;
  remove_free(block_id);
  Block& block = blocks_[block_id];
  if (block.hash.has_value()) {  // evict: the block is about to hold other tokens
    auto it = cached_.find(*block.hash);
    CHECK(it != cached_.end() && it->second == block_id);
    cached_.erase(it);
    block.hash.reset();
  }
  return block_id;
}

void KvCacheManager::push_free(int32_t block_id) {
  Block& block = blocks_[block_id];
  CHECK_MSG(!block.in_free_list && block.ref_count == 0, "block {} freed twice", block_id);
  block.prev_free = free_tail_;
  block.next_free = -1;
  if (free_tail_ >= 0) {
    blocks_[free_tail_].next_free = block_id;
  } else {
    free_head_ = block_id;
  }
  free_tail_ = block_id;
  block.in_free_list = true;
  ++num_free_;
}

void KvCacheManager::remove_free(int32_t block_id) {
  Block& block = blocks_[block_id];
  CHECK_MSG(block.in_free_list, "block {} is not in the free list", block_id);
  if (block.prev_free >= 0) {
    blocks_[block.prev_free].next_free = block.next_free;
  } else {
    free_head_ = block.next_free;
  }
  if (block.next_free >= 0) {
    blocks_[block.next_free].prev_free = block.prev_free;
  } else {
    free_tail_ = block.prev_free;
  }
  block.prev_free = block.next_free = -1;
  block.in_free_list = false;
  --num_free_;
}

std::string KvCacheManager::check_invariants() const {
  const int64_t n = num_blocks();
  // Free list: well linked, acyclic, only unreferenced blocks, length num_free_.
  int64_t num_listed = 0;
  int32_t prev = -1;
  for (int32_t block_id = free_head_; block_id >= 0; block_id = blocks_[block_id].next_free) {
    if (block_id >= n) return fmt::format("free list holds bad block id {}", block_id);
    if (++num_listed > n) return "free list has a cycle";
    const Block& block = blocks_[block_id];
    if (!block.in_free_list)
      return fmt::format("block {} is linked in the free list but not marked", block_id);
    if (block.prev_free != prev)
      return fmt::format("block {}: prev_free {} != {}", block_id, block.prev_free, prev);
    prev = block_id;
  }
  if (prev != free_tail_) return fmt::format("free list tail {} != last listed block {}", free_tail_, prev);
  if (num_listed != num_free_)
    return fmt::format("free list has {} blocks, num_free = {}", num_listed, num_free_);

  // Reference counts equal the number of block tables holding each block; free xor referenced.
  std::vector<int32_t> holders(n, 0);
  for (const auto& [request, state] : requests_) {
    std::unordered_set<int32_t> seen;
    for (int32_t block_id : state.blocks) {
      if (block_id < 0 || block_id >= n)
        return fmt::format("request {} holds bad block id {}", request, block_id);
      if (!seen.insert(block_id).second)
        return fmt::format("request {} holds block {} twice", request, block_id);
      ++holders[block_id];
    }
    if (state.num_tokens > static_cast<int64_t>(state.blocks.size()) * block_size_)
      return fmt::format("request {}: {} tokens in {} blocks", request, state.num_tokens,
                         state.blocks.size());
    if (static_cast<int64_t>(state.block_hashes.size()) > state.num_tokens / block_size_)
      return fmt::format("request {}: {} block hashes for {} tokens", request, state.block_hashes.size(),
                         state.num_tokens);
    for (size_t i = 0; i < state.blocks.size(); ++i) {
      const std::optional<uint64_t>& hash = blocks_[state.blocks[i]].hash;
      if (!hash.has_value()) continue;
      if (i >= state.block_hashes.size() || state.block_hashes[i] != *hash)
        return fmt::format("request {}: block {} (index {}) is registered under another hash", request,
                           state.blocks[i], i);
    }
  }
  int64_t num_used = 0;
  for (int32_t block_id = 0; block_id < n; ++block_id) {
    const Block& block = blocks_[block_id];
    if (block.ref_count != holders[block_id])
      return fmt::format("block {}: ref_count {} but held by {} requests", block_id, block.ref_count,
                         holders[block_id]);
    if (block.in_free_list == (block.ref_count > 0))
      return fmt::format("block {}: ref_count {} and in_free_list {}", block_id, block.ref_count,
                         block.in_free_list);
    if (block.ref_count > 0) ++num_used;
    if (block.hash.has_value()) {
      auto it = cached_.find(*block.hash);
      if (it == cached_.end() || it->second != block_id)
        return fmt::format("block {} has a hash that does not map back to it", block_id);
    }
  }
  if (num_used + num_free_ != n) return fmt::format("used {} + free {} != total {}", num_used, num_free_, n);

  // Hash map entries point to blocks with that hash.
  if (!prefix_caching_ && !cached_.empty()) return "prefix caching is off but blocks are cached";
  for (const auto& [hash, block_id] : cached_) {
    if (block_id < 0 || block_id >= n) return fmt::format("hash map points to bad block id {}", block_id);
    if (blocks_[block_id].hash != hash) return fmt::format("hash map entry for block {} is stale", block_id);
  }
  return "";
}

}  // namespace polylora
