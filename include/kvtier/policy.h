// Precision policies: declarative rules that give each full block the format it should have
// as it ages. A policy is data, not code: a struct, a JSON file, or a named preset.
//
// A block's age is the number of tokens between its last token and its sequence's tail. Tiers
// are listed hottest first; a block belongs to the first tier whose `max_age_tokens` exceeds its
// age (the last tier has none). Blocks only move colder (no promotion in place); blocks holding
// any of the first `sink_tokens` tokens, and partial tail blocks, stay in palette[0]. A request's
// minimum precision (SequenceOptions::coldest_format) caps how cold its blocks go, and a block
// shared by several sequences moves only once every sharer's age for it has crossed the
// boundary. Under memory pressure (free budget below `pressure_watermark`) every window
// shrinks by `pressure_window_scale`, demoting before cached prefixes are evicted.
//
// Attention-aware precision (`attention_keep_ratio`): blocks that attention singled out, as
// the engine reports with Cache::RecordAttention (e.g. the weights of a prompt's last tokens,
// SnapKV's observation window, or of decode steps), stay one tier hotter than their age says.
// A block qualifies when some query head gave it at least `attention_keep_ratio` times the
// uniform share (1 / the sequence's block count at the report). Reports only matter for blocks
// that have not yet aged past the tier they would be kept in (blocks never move hotter).
//
// JSON form (every field optional but `tiers`; token counts are integers, each key appears once):
//   {"name": "balanced",
//    "tiers": [{"format": "fp16", "max_age_tokens": 256},
//              {"format": "fp8_e4m3/block_head", "max_age_tokens": 2048},
//              {"format": "k:nvfp4_channel/block_head,v:nvfp4/block_head"}],
//    "sink_tokens": 4, "pressure_watermark": 0.05, "pressure_window_scale": 0.5,
//    "attention_keep_ratio": 0}
#ifndef KVTIER_POLICY_H_
#define KVTIER_POLICY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kvtier/export.h"
#include "kvtier/format.h"
#include "kvtier/options.h"

namespace kvtier {

// The largest token count a policy may name (2^53: exact in a double, so windows scaled under
// pressure and JSON numbers convert without overflow).
inline constexpr int64_t kMaxPolicyTokens = int64_t{1} << 53;
// The most tiers a policy may have (the cache keeps per-tier state in arrays of this size).
inline constexpr int kMaxPolicyTiers = 8;
// The largest Policy::attention_keep_ratio.
inline constexpr double kMaxAttentionKeepRatio = 1 << 20;

struct PolicyTier {
  FormatSpec format;
  // Blocks younger than this (in tokens) stay in this tier. -1 on the last tier: no bound.
  // REQUIRES: at most kMaxPolicyTokens.
  int64_t max_age_tokens = -1;
};

struct Policy {
  std::string name;
  // Hottest first. REQUIRES: 1 to kMaxPolicyTiers tiers, strictly increasing bounds, the last
  // unbounded, formats distinct.
  std::vector<PolicyTier> tiers;
  // Leading tokens of each sequence whose blocks never leave palette[0]. REQUIRES: 0 to
  // kMaxPolicyTokens. Default: 4.
  int64_t sink_tokens = 4;
  // Fraction of the budget that must stay free; below it windows shrink. 0 disables.
  // Default: 0.05.
  double pressure_watermark = 0.05;
  // Factor applied to every tier bound under pressure, in (0, 1]. Default: 0.5.
  double pressure_window_scale = 0.5;
  // Blocks whose recorded attention reaches this multiple of a uniform share stay one tier
  // hotter than their age says. REQUIRES: 0 or in [1, kMaxAttentionKeepRatio].
  // Default: 0 (off).
  double attention_keep_ratio = 0;
};

// OK when `policy` is well formed; otherwise InvalidArgument naming the field.
KVTIER_EXPORT absl::Status ValidatePolicy(const Policy& policy);

// The formats of the tiers, hottest first: the palette a cache needs to run `policy`.
KVTIER_EXPORT std::vector<FormatSpec> PolicyPalette(const Policy& policy);

// Named presets: "fp16", "fp8", "balanced", "max_capacity", "balanced_rot", "attentive",
// "fp8_keys". NotFound for another name. "fp8_keys" keeps the last 256 tokens in FP16 and
// stores older keys in FP8, values in NVFP4 (a split palette, about 6.3 bits per element). "attentive" is "balanced" with windows of 128 and 1024 tokens and
// attention_keep_ratio 32: blocks that the engine's reported attention (Cache::RecordAttention)
// singled out before they aged stay one tier hotter, which holds long-range recall at NVFP4's
// density (docs/recall.md). "balanced_rot" is "balanced" with NVFP4 keys in micro-blocks along head_dim,
// which hold recall only when keys are rotated: run it on a cache created with
// Options::key_rotation = PresetKeyRotation("balanced_rot") (kHadamard). Key rotation is a
// cache option, fixed at creation, so a policy (which SetPolicy may change) cannot carry it.
KVTIER_EXPORT absl::StatusOr<Policy> PolicyPreset(absl::string_view name);
KVTIER_EXPORT std::vector<std::string> PolicyPresetNames();
// The key rotation a preset is meant for: kHadamard for "balanced_rot", kNone otherwise
// (also for names that are no preset).
KVTIER_EXPORT KeyRotation PresetKeyRotation(absl::string_view name);

// Parses the JSON form above. InvalidArgument naming the field (e.g. "tiers[1].format").
KVTIER_EXPORT absl::StatusOr<Policy> ParsePolicyJson(absl::string_view json);

// A preset (PolicyPreset), or the JSON file at `name_or_path` when it holds a '/' or ends in
// .json (`./mine` for a file named `mine`). NotFound for an unknown preset or a missing file.
KVTIER_EXPORT absl::StatusOr<Policy> LoadPolicy(absl::string_view name_or_path);

// The JSON form of `policy` (round-trips through ParsePolicyJson).
KVTIER_EXPORT std::string PolicyToJson(const Policy& policy);

}  // namespace kvtier

#endif  // KVTIER_POLICY_H_
