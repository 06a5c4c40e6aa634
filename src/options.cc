#include "kvtier/options.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kernels/page_layout.h"
#include "src/redis_connection.h"
#include "src/remote_mac.h"
#include "src/status_macros.h"

namespace kvtier {
namespace {

// Blocks whose metadata a cache may hold: one per page the whole budget holds in the palette's
// densest format (about 100 bytes of host metadata each, 1.6 GiB at the limit).
constexpr uint64_t kMaxBlocks = uint64_t{1} << 24;

absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("Options.", field, ": ", why));
}

absl::Status CheckRange(absl::string_view field, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi) {
    return Invalid(field, absl::StrCat(value, " is outside [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckAmax(absl::string_view field, const std::vector<float>& amax, int layers) {
  if (amax.empty()) return absl::OkStatus();
  if (static_cast<int>(amax.size()) != layers) {
    return Invalid(field, absl::StrCat("has ", amax.size(), " values for ", layers, " layers"));
  }
  for (float a : amax) {
    if (!(std::isfinite(a) && a > 0)) return Invalid(field, absl::StrCat(a, " is not finite positive"));
  }
  return absl::OkStatus();
}

// Checks the palette's formats, one by one, against the geometry and the slab size, and sets
// *densest to the most pages of any of them that one slab holds.
absl::Status CheckPalette(const Options& o, uint64_t* densest) {
  const Geometry& g = o.geometry;
  if (o.palette.empty() || o.palette.size() > 8) {
    return Invalid("palette", absl::StrCat("has ", o.palette.size(), " formats; 1 to 8 allowed"));
  }
  *densest = 0;
  for (size_t i = 0; i < o.palette.size(); ++i) {
    const FormatSpec& f = o.palette[i];
    const std::string field = absl::StrCat("palette[", i, "]");
    for (const CodecSpec* c : {&f.k, &f.v}) {
      const absl::Status s = ValidateCodec(*c);
      if (!s.ok()) return Invalid(field, s.message());
      if (c->axis == MicroAxis::kTokens && g.block_tokens % kMicroBlock != 0) {
        return Invalid(field, "NVFP4 along tokens needs block_tokens to be a multiple of 16");
      }
    }
    for (size_t j = 0; j < i; ++j) {
      if (o.palette[j] == f) return Invalid(field, absl::StrCat(FormatName(f), " appears twice"));
    }
    const PageLayout layout = MakePageLayout(g.num_kv_heads, g.block_tokens, g.head_dim, f);
    if (layout.page_bytes > o.slab_bytes) {
      return Invalid(field, absl::StrCat("a page of ", layout.page_bytes,
                                         " bytes does not fit a slab of ", o.slab_bytes));
    }
    // Pages never straddle slabs, so a page over half a slab that does not divide it would leave
    // some slabs with no whole page.
    if (2 * layout.page_bytes > o.slab_bytes && o.slab_bytes % layout.page_bytes != 0) {
      return Invalid(field, absl::StrCat("a page of ", layout.page_bytes, " bytes leaves some ",
                                         "slabs of ", o.slab_bytes, " bytes without a whole page; ",
                                         "use a slab that is a multiple of the page or at least ",
                                         "twice its size"));
    }
    *densest = std::max<uint64_t>(*densest, o.slab_bytes / layout.page_bytes);
  }
  if (!IsTokenWise(o.palette[0])) {
    return Invalid("palette[0]", absl::StrCat("the hot format ", FormatName(o.palette[0]),
                                              " needs whole blocks to compute its scales; use "
                                              "FP16, BF16, or a per-tensor or per-token scale"));
  }
  return absl::OkStatus();
}

// The budget against the palette: with several formats, at least two slabs per layer (a
// demotion reads a slab of its source while it writes one of its target), and block metadata
// that stays bounded.
absl::Status CheckBudget(const Options& o, uint64_t densest) {
  const uint64_t slabs = o.memory_budget_bytes / o.slab_bytes / o.geometry.num_layers;
  if (o.palette.size() > 1 && slabs < 2) {
    return Invalid("memory_budget_bytes",
                   absl::StrCat(o.memory_budget_bytes, " holds one slab of ", o.slab_bytes,
                                " bytes per layer: a palette of ", o.palette.size(),
                                " formats needs two, or no block can ever be demoted"));
  }
  if (slabs > kMaxBlocks / densest) {
    return Invalid("memory_budget_bytes",
                   absl::StrCat(o.memory_budget_bytes, " holds up to ", slabs, " x ", densest,
                                " blocks per layer; block metadata is limited to ", kMaxBlocks,
                                " blocks; lower the budget or use larger pages"));
  }
  return absl::OkStatus();
}

// The host tier: none, or at least one slab per layer; its blocks keep their metadata, so the
// two tiers together stay within the metadata bound.
absl::Status CheckHostTier(const Options& o, uint64_t densest) {
  const uint64_t layers = static_cast<uint64_t>(o.geometry.num_layers);
  const uint64_t slabs = o.host_tier_bytes / o.slab_bytes / layers;
  if (o.host_tier_bytes != 0 && slabs == 0) {
    return Invalid("host_tier_bytes",
                   absl::StrCat(o.host_tier_bytes, " is neither 0 nor room for a slab of ",
                                o.slab_bytes, " bytes in each of ", layers, " layers"));
  }
  if (slabs + o.memory_budget_bytes / o.slab_bytes / layers > kMaxBlocks / densest) {
    return Invalid("host_tier_bytes",
                   absl::StrCat(o.host_tier_bytes, " with the device budget holds more than ",
                                kMaxBlocks, " blocks of metadata; lower either"));
  }
  return CheckRange("host_tier_format", o.host_tier_format, -1,
                    static_cast<int64_t>(o.palette.size()) - 1);
}

// KV events: the endpoints are checked by ZeroMQ when the cache binds them. Events keep every
// block's token ids and origin (4 x block_tokens + 16 bytes a block), allocated at creation for
// every block of both tiers: at most kMaxEventBytes.
absl::Status CheckEvents(const Options& o, uint64_t densest) {
  constexpr uint64_t kMaxEventBytes = uint64_t{2} << 30;
  const uint64_t layers = static_cast<uint64_t>(o.geometry.num_layers);
  const uint64_t blocks =
      (o.memory_budget_bytes / o.slab_bytes / layers + o.host_tier_bytes / o.slab_bytes / layers) *
      densest;
  const uint64_t per_block = 4 * static_cast<uint64_t>(o.geometry.block_tokens) + 16;
  if (!o.kv_events_endpoint.empty() && blocks * per_block > kMaxEventBytes) {
    return Invalid("kv_events_endpoint",
                   absl::StrCat("KV events keep ", per_block, " bytes for each of up to ", blocks,
                                " blocks, over the ", kMaxEventBytes,
                                " bytes allowed; lower the budgets or use shorter blocks"));
  }
  for (const auto& [field, endpoint] :
       {std::pair{"kv_events_endpoint", &o.kv_events_endpoint},
        std::pair{"kv_events_replay_endpoint", &o.kv_events_replay_endpoint}}) {
    if (absl::StartsWith(*endpoint, "inproc://")) {
      return Invalid(field, "is inproc://, which only sockets of the publisher's own ZeroMQ "
                            "context reach: no subscriber could; use ipc:// or tcp://");
    }
  }
  if (o.kv_events_endpoint.empty() && !o.kv_events_replay_endpoint.empty()) {
    return Invalid("kv_events_replay_endpoint", "is set but kv_events_endpoint is empty");
  }
  if (o.kv_events_endpoint.empty() && !o.kv_events_vllm_hash_seed.empty()) {
    return Invalid("kv_events_vllm_hash_seed", "is set but kv_events_endpoint is empty");
  }
  constexpr int64_t kMaxBatches = int64_t{1} << 20;
  KVTIER_RETURN_IF_ERROR(
      CheckRange("kv_events_replay_batches", o.kv_events_replay_batches, 1, kMaxBatches));
  return CheckRange("kv_events_queue_batches", o.kv_events_queue_batches, 1, kMaxBatches);
}

// The remote tier: off, or a redis:// URL with a model id and maybe a secret; its bounds either
// way.
absl::Status CheckRemoteTier(const Options& o) {
  absl::Status s = CheckRange("remote_timeout_ms", o.remote_timeout_ms, 1, 10000);
  if (s.ok()) s = CheckRange("remote_write_queue_blocks", o.remote_write_queue_blocks, 1, 65536);
  if (s.ok()) s = CheckRange("remote_max_fetch_blocks", o.remote_max_fetch_blocks, 1, 4096);
  if (!s.ok()) return s;
  if (o.remote_model_id.size() > 256) {
    return Invalid("remote_model_id", absl::StrCat("is ", o.remote_model_id.size(),
                                                   " bytes long, more than 256"));
  }
  // The Redis identity appends other options' text to it: a NUL could make two differ as one.
  if (o.remote_model_id.find('\0') != std::string::npos) {
    return Invalid("remote_model_id", "holds a NUL byte");
  }
  if (!o.remote_secret.empty()) {  // RemoteMac's own rule for a secret
    if (absl::StatusOr<RemoteMac> mac = RemoteMac::Create(o.remote_secret); !mac.ok()) {
      return Invalid("remote_secret", mac.status().message());
    }
  }
  if (o.remote_tier_url.empty()) {
    return o.remote_secret.empty()
               ? absl::OkStatus()
               : Invalid("remote_secret", "is set, but remote_tier_url is empty");
  }
  if (absl::StatusOr<RedisAddress> a = ParseRedisUrl(o.remote_tier_url); !a.ok()) {
    return Invalid("remote_tier_url", a.status().message());
  }
  if (o.remote_model_id.empty()) {
    return Invalid("remote_model_id",
                   "is empty: a remote tier needs it, so that models never share blocks");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateOptions(const Options& o) {
  const Geometry& g = o.geometry;
  if (o.backend != BackendKind::kCpu && o.backend != BackendKind::kCuda) {
    return Invalid("backend", absl::StrCat(static_cast<int>(o.backend),
                                           " is not a BackendKind (kCpu or kCuda)"));
  }
  absl::Status s = CheckRange("geometry.num_layers", g.num_layers, 1, 1024);
  if (s.ok()) s = CheckRange("geometry.num_kv_heads", g.num_kv_heads, 1, 256);
  if (s.ok()) s = CheckRange("geometry.head_dim", g.head_dim, 16, 1024);
  if (s.ok()) s = CheckRange("geometry.block_tokens", g.block_tokens, 1, 1024);
  if (!s.ok()) return s;
  if (g.head_dim % kMicroBlock != 0) {
    return Invalid("geometry.head_dim", absl::StrCat(g.head_dim, " is not a multiple of 16"));
  }
  constexpr size_t kGranularity = size_t{2} << 20;
  if (o.slab_bytes == 0 || o.slab_bytes % kGranularity != 0) {
    return Invalid("slab_bytes", absl::StrCat(o.slab_bytes, " is not a positive multiple of 2 MiB"));
  }
  if (o.memory_budget_bytes / o.slab_bytes < static_cast<size_t>(g.num_layers)) {
    return Invalid("memory_budget_bytes",
                   absl::StrCat(o.memory_budget_bytes, " holds no slab of ", o.slab_bytes,
                                " bytes in each of ", g.num_layers, " layers"));
  }
  if (o.key_rotation != KeyRotation::kNone && o.key_rotation != KeyRotation::kHadamard) {
    return Invalid("key_rotation", absl::StrCat(static_cast<int>(o.key_rotation),
                                                " is not a KeyRotation (kNone or kHadamard)"));
  }
  if (o.key_rotation == KeyRotation::kHadamard && (g.head_dim & (g.head_dim - 1)) != 0) {
    return Invalid("key_rotation", absl::StrCat("kHadamard needs a power-of-two head_dim; "
                                                "geometry.head_dim is ", g.head_dim));
  }
  uint64_t densest = 0;
  KVTIER_RETURN_IF_ERROR(CheckPalette(o, &densest));
  KVTIER_RETURN_IF_ERROR(CheckBudget(o, densest));
  KVTIER_RETURN_IF_ERROR(CheckHostTier(o, densest));
  KVTIER_RETURN_IF_ERROR(CheckEvents(o, densest));
  KVTIER_RETURN_IF_ERROR(CheckRemoteTier(o));
  s = CheckAmax("k_tensor_amax", o.k_tensor_amax, g.num_layers);
  if (s.ok()) s = CheckAmax("v_tensor_amax", o.v_tensor_amax, g.num_layers);
  return s;
}

}  // namespace kvtier
