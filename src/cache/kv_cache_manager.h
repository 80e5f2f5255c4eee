// cache/kv_cache_manager.h: paged KV-cache block accounting with prefix caching (host code only).
// Owns: the block pool (ids 0..num_blocks−1), each request's block table, reference counts, the chained
// block hashes of full blocks, the LRU free list (freed blocks keep their hash and can be hit again until
// reused), and prefix-cache counters.
// Must not: include CUDA headers, touch KV data, or know about models (it sees token ids and keys only).
//
// Block hash of full block i of a request = xxh3_64(parent hash of block i−1 (or a seed for i = 0),
// the block's block_size token ids, the request's extra keys). Extra keys carry the adapter's AdapterId
// (a version per registration, so an adapter reloaded under the same name never hits stale blocks) and an
// optional per-request cache_salt; requests with different extra keys never share blocks.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "lora/adapter_id.h"

namespace polylora {

using RequestId = uint64_t;

// Keys that, besides the token ids, decide whether two blocks hold the same KV values.
struct CacheKeyExtra {
  AdapterId adapter;        // base model: version 0; a reloaded adapter has a new version
  std::string cache_salt;           // empty: none
};

struct PrefixCacheStats {
  int64_t queries = 0;  // tokens looked up (prompt tokens of requests that asked)
  int64_t hits = 0;     // tokens found cached
};

class KvCacheManager {
 public:
  KvCacheManager(int64_t num_blocks, int64_t block_size, bool enable_prefix_caching);

  int64_t num_blocks() const;
  int64_t block_size() const;
  int64_t num_free_blocks() const;  // free list length (includes cached-but-unreferenced blocks)
  double usage() const;             // fraction of blocks referenced by some request (0..1)

  // The longest prefix of full blocks of `tokens` already cached for these extra keys (at most
  // tokens.size() − 1 tokens, so at least one token is always computed). Counts queries/hits in stats()
  // (when prefix caching is on). Does not change any state besides the counters.
  struct CachedPrefix {
    std::vector<int32_t> blocks;
    int64_t num_tokens = 0;  // blocks.size() · block_size
  };
  CachedPrefix find_cached_prefix(std::span<const int32_t> tokens, const CacheKeyExtra& extra);

  // Makes `request` hold blocks for num_computed_tokens + num_new_tokens tokens. On the first call for a
  // request, `prefix` (from find_cached_prefix, possibly empty) becomes the start of its block table and
  // num_computed_tokens must equal prefix->num_tokens. Takes new blocks from the free list (evicting the
  // least recently freed cached block). Returns false and changes nothing if there are not enough free
  // blocks. After success, every full block within the first num_computed_tokens + num_new_tokens
  // tokens whose ids are all in `tokens` is hashed and registered in the prefix cache. `tokens` holds the
  // ids known so far (prompt and generated; at least num_computed_tokens of them): with asynchronous
  // scheduling the last scheduled token may still be being sampled, and a block it completes is then
  // hashed by the request's next allocate().
  bool allocate(RequestId request, std::span<const int32_t> tokens, int64_t num_computed_tokens,
                int64_t num_new_tokens, const CacheKeyExtra& extra, const CachedPrefix* prefix = nullptr);

  // Releases a request's blocks (reference count −1; at 0 a block goes to the free list tail, keeping its
  // hash, so it can still be hit until it is reused). Freed in reverse order, so the prefix's first
  // blocks are evicted last. No-op for an unknown request.
  void free(RequestId request);

  // Starts a sequence that forks from `parent`'s blocks (n > 1 sharing a prompt): the child's table is
  // the parent's full blocks (shared, reference count +1). Returns the number of tokens covered.
  int64_t fork(RequestId parent, RequestId child);

  const std::vector<int32_t>& block_table(RequestId request) const;  // empty for an unknown request
  bool has_request(RequestId request) const;

  // Drops every cached hash (e.g. when the KV data is invalidated); referenced blocks are unaffected.
  void reset_prefix_cache();

  PrefixCacheStats stats() const;
  int64_t num_cached_blocks() const;  // blocks registered in the prefix cache (referenced or free)
  // The hash a block is registered under in the prefix cache; nullopt when it is not registered.
  std::optional<uint64_t> cached_block_hash(int32_t block_id) const;

  // Parent hash of a request's first block.
  static constexpr uint64_t kRootBlockHash = 0x9e3779b97f4a7c15ULL;
  // xxh3_64 of (parent_hash, block_tokens, every field of extra); the chain step described above.
  static uint64_t block_hash(uint64_t parent_hash, std::span<const int32_t> block_tokens,
                             const CacheKeyExtra& extra);

  // Verifies internal invariants (each block free xor referenced, ref counts equal the number of block
  // tables holding it, free + used = total, hash map entries point to blocks with that hash). Returns an
  // empty string when all hold, else a description of the first violation.
  std::string check_invariants() const;

 private:
  struct Block {
    int32_t ref_count = 0;
    std::optional<uint64_t> hash;
    int32_t prev_free = -1;  // intrusive doubly linked free list
    int32_t next_free = -1;
    bool in_free_list = false;
  };
  struct RequestState {
    std::vector<int32_t> blocks;
    std::vector<uint64_t> block_hashes;  // hashes of its full blocks, in order (prefix caching only)
    int64_t num_tokens = 0;              // tokens its blocks hold so far (the largest allocate() total)
  };
  int32_t pop_free();
  void push_free(int32_t block);
  void remove_free(int32_t block);
  void cache_full_blocks(RequestState& state, std::span<const int32_t> tokens, int64_t num_tokens,
                         const CacheKeyExtra& extra);

  int64_t block_size_;
  bool prefix_caching_;
  std::vector<Block> blocks_;
  int32_t free_head_ = -1, free_tail_ = -1;
  int64_t num_free_ = 0;
  std::unordered_map<uint64_t, int32_t> cached_;  // block hash -> block id
  std::unordered_map<RequestId, RequestState> requests_;
  PrefixCacheStats stats_;
};

}  // namespace polylora
