// Options that shape a cache: its geometry, memory budget, format palette and backend.
#ifndef KVTIER_OPTIONS_H_
#define KVTIER_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kvtier/export.h"
#include "kvtier/format.h"

namespace kvtier {

struct Geometry {
  // Transformer layers whose K/V the cache holds. REQUIRES: 1 to 1024.
  int32_t num_layers = 1;
  // Key/value heads per layer (GQA groups share one). REQUIRES: 1 to 256.
  int32_t num_kv_heads = 1;
  // Elements per head. REQUIRES: a multiple of 16, 16 to 1024 (NVFP4 micro-blocks are 16 wide).
  int32_t head_dim = 128;
  // Tokens per block (the page size). A larger block reads faster through a page table but
  // shares prefixes more coarsely. REQUIRES: 1 to 1024.
  // Default: 16 (one NVFP4 per-channel micro-block per block column).
  int32_t block_tokens = 16;
};

enum class BackendKind : uint8_t {
  // Host memory; the reference data plane. Runs everywhere.
  kCpu,
  // NVIDIA GPU through the CUDA virtual-memory API. Needs a build with KVTIER_WITH_CUDA.
  kCuda,
};

// How keys are stored (docs/formats.md, "Rotated keys").
enum class KeyRotation : uint8_t {
  // Keys are stored as written.
  kNone,
  // Each KV head's keys are stored multiplied by a randomised Hadamard matrix
  // R_h = H diag(s_h) / sqrt(head_dim) (random signs s_h from key_rotation_seed and the head),
  // which spreads outlier channels over the whole head so that NVFP4's 16-value micro-blocks
  // and FP8's per-head scales fit them. Orthogonal: attention rotates the query the same way
  // and q . k is unchanged. ReadKV un-rotates. External kernels (adapters) do not rotate
  // queries, so the adapters refuse such a cache.
  kHadamard,
};

struct Options {
  Geometry geometry;

  // Bytes of page memory across all layers and formats. The budget is cut into slabs of
  // `slab_bytes` per layer that move between format pools. REQUIRES: at least one slab in
  // every layer, two when the palette has several formats (a demotion holds a slab of its
  // source and one of its target at once), and at most 2^24 pages per layer in the palette's
  // densest format (the host metadata of one block per page is allocated up front).
  // Default: 256 MiB.
  size_t memory_budget_bytes = size_t{256} << 20;

  // The unit of memory that moves between pools, per layer. REQUIRES: a multiple of 2 MiB (the
  // CUDA mapping granularity) and, for every palette format, at least two pages or a multiple of
  // the page. Default: 2 MiB.
  size_t slab_bytes = size_t{2} << 20;

  // Formats blocks may take, hottest first. palette[0] is the hot format: the partially filled
  // tail block of every sequence is in it, so it must encode tokens one at a time (FP16, BF16,
  // FP8 with a per-tensor or per-(token, head) scale, or NVFP4 per tensor). Blocks only move
  // towards the end of the palette. REQUIRES: 1 to 8 distinct formats. Default: {FP16}.
  std::vector<FormatSpec> palette = {FormatSpec{}};

  // Absolute maxima, one per layer, that codecs with ScaleScope::kTensor are scaled for: the
  // scale (real = stored x scale) is amax / 448 for E4M3, amax / 57344 for E5M2 (at least
  // 2^-126, so that its reciprocal is finite), and the NVFP4 second-level decode multiplier is
  // amax / 2688. Empty means uncalibrated: every per-tensor
  // scale is 1.0, which is right only for data already in range (prefer
  // Cache::CalibrateTensorScales). REQUIRES: empty or num_layers finite positive values.
  std::vector<float> k_tensor_amax;
  std::vector<float> v_tensor_amax;

  // Whether keys are rotated before they are encoded (see KeyRotation). Part of the identity
  // of remote-tier blocks. REQUIRES: kHadamard only with a power-of-two head_dim.
  // Default: kNone.
  KeyRotation key_rotation = KeyRotation::kNone;
  // Seeds the random signs of kHadamard; caches that exchange blocks (host or remote tier,
  // another process) must use the same seed. Default: 0x6B76746965723031 ("kvtier01").
  uint64_t key_rotation_seed = 0x6B76746965723031ull;

  // Bytes of host memory for the host tier, below the device pools (docs/tiers.md): a cached
  // block chosen for eviction is copied there instead of dropped, and a prefix hit on it brings
  // it back. Pinned host memory on the CUDA backend; ordinary host memory on the CPU backend.
  // Cut into slabs of `slab_bytes` per layer like the device budget. REQUIRES: 0 or at least
  // slab_bytes * num_layers; with memory_budget_bytes, at most 2^24 pages per layer in the
  // densest format (its blocks keep their metadata). Default: 0 (no host tier: evicted blocks
  // are dropped).
  size_t host_tier_bytes = 0;

  // The palette index blocks take in the host tier: a block hotter than it is demoted as it is
  // offloaded (fewer bytes over PCIe and in host memory), unless a sharer's minimum precision
  // forbids it; a block already this cold or colder keeps its format. REQUIRES: -1 or a
  // palette index. Default: -1 (every block keeps its format).
  int32_t host_tier_format = -1;

  // The remote tier (docs/tiers.md): a Redis server that caches on many machines share. A
  // full block published in the prefix index is written there at the next EndStep (in the
  // background; a full queue drops the write), and AddSequence looks up the blocks after the
  // local match there, waiting up to remote_timeout_ms. "redis://HOST:PORT" (PORT defaults to
  // 6379; an IPv6 HOST in brackets, "redis://[::1]:6379"); a server that is down or slow only
  // costs misses. Takes slab_bytes per layer of
  // host memory (pinned on CUDA) to stage pages. REQUIRES: empty or that form, and
  // remote_model_id non-empty with it. Default: "" (no remote tier).
  std::string remote_tier_url;
  // Names the model whose K/V the blocks hold. With the geometry, the remote codec version
  // and the block hash it makes the Redis key, so caches of different models (or of one model
  // at different geometries) never read each other's blocks. REQUIRES: at most 256 bytes.
  // Default: "".
  std::string remote_model_id;
  // A secret that every cache sharing the Redis server holds: each value then carries a keyed
  // MAC (AES-256-GCM's tag under a key per value, src/remote_mac.h) over header and pages, and
  // a value without a valid one is refused (counted as unauthenticated_values), so that only
  // holders of the secret can place K/V that a cache attends to. Verifying costs the reading
  // AddSequence about 0.07 ms per MiB of blocks read, signing the writer thread as much
  // (13 GB/s with AES-NI and VAES; docs/tiers.md, "Trust"). Caches of different secrets, or
  // with one and without, never look up each other's blocks. Never logged or exported.
  // REQUIRES: empty, or at least 16 random bytes (best 32 from a CSPRNG; not a password) with
  // remote_tier_url set. Default: "" (values carry a checksum only: trust the server's network).
  std::string remote_secret;
  // Bounds every Redis call (connect; the lookup of one AddSequence; one write), milliseconds:
  // AddSequence may wait this long when the local tiers miss, twice when it connects to a host
  // name (its resolution first). REQUIRES: 1 to 10000.
  // Default: 20.
  int32_t remote_timeout_ms = 20;
  // Blocks waiting to be written to Redis; a block published when the queue is full is not
  // written (counted). REQUIRES: 1 to 65536. Default: 256.
  int32_t remote_write_queue_blocks = 256;
  // Blocks one AddSequence looks up in Redis after its local match. REQUIRES: 1 to 4096.
  // Default: 64.
  int32_t remote_max_fetch_blocks = 64;

  // Where pages live. REQUIRES: one of the BackendKind values. Default: kCpu.
  BackendKind backend = BackendKind::kCpu;

  // KV events for routers (docs/events.md): vLLM's KVEventBatch (BlockStored, BlockRemoved,
  // AllBlocksCleared, `medium` "GPU" for the device tier and "CPU" for the host tier), one
  // batch per EndStep, published on a ZeroMQ PUB socket at this endpoint by a thread of the
  // cache; the step never waits for the socket. As vLLM: an endpoint with "*", "::" or ipc:// is
  // bound, any other is connected to; inproc:// is refused (no subscriber could reach it).
  // Needs a build with KVTIER_WITH_EVENTS.
  // Default: empty (no events, and no cost).
  std::string kv_events_endpoint;
  // A ZeroMQ ROUTER endpoint (bound) that replays buffered batches from a sequence number, as
  // vLLM's replay socket. REQUIRES: empty unless kv_events_endpoint is set. Default: empty (none).
  std::string kv_events_replay_endpoint;
  // The topic frame of every message. Default: empty (vLLM's default).
  std::string kv_events_topic;
  // Batches kept for replay, and the most batches the PUB socket queues for a subscriber that
  // stops reading (one that falls further behind misses the newer ones: a gap it can replay
  // while they are kept). REQUIRES: 1 to 2^20. Default: 10000 (vLLM's buffer_steps).
  int32_t kv_events_replay_batches = 10000;
  // Batches waiting for the publisher thread; a batch that finds the queue full is dropped and
  // counted (EventStats), leaving a gap in sequence numbers. REQUIRES: 1 to 2^20. Default: 1024.
  int32_t kv_events_queue_batches = 1024;
  // Also publish kvtier's extension event BlockFormatChanged (a block's precision changed). A
  // strict decoder of vLLM's schema rejects a batch with an unknown tag: turn on only for
  // subscribers that skip unknown events. Default: false.
  bool kv_events_format_changes = false;
  // Name blocks in the events by vLLM's hashes instead of kvtier's: the sha256_cbor chain of a
  // vLLM instance started with PYTHONHASHSEED set to this value, each hash as the uint64 vLLM
  // publishes with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (docs/events.md, "Block hashes"). For
  // routers that hash token blocks as vLLM does. REQUIRES: empty unless kv_events_endpoint is
  // set. Default: empty (kvtier's own hashes).
  std::string kv_events_vllm_hash_seed;
};

// OK when `options` describes a cache that can be created; otherwise InvalidArgument naming
// the offending field.
KVTIER_EXPORT absl::Status ValidateOptions(const Options& options);

}  // namespace kvtier

#endif  // KVTIER_OPTIONS_H_
