// Arms of the recall sweep: what a trial's K/V go through before attention reads them.
//
// An arm is a palette plus a rule that says, for each full block of a sequence, which palette
// format the block ends in, given the block's index and the sequence's length at query time.
// Single-format arms send every full block to one cold format; a policy arm places blocks as
// one of the library's precision policies does (sinks and a hot window in FP16, then colder
// tiers by age). New arms are new `Arm` values: no other code changes.
//
// ArmRunner pushes a trial through kvtier itself: Append + WriteKV in FP16 (chunk by chunk),
// then either Demote of the full blocks of each chunk to their final format (directly, or
// through every palette format in between for a requantisation chain) or, for a policy arm,
// EndStep so that the cache's policy engine demotes what aged; then kvtier's DecodeAttention
// over the cache pages: the CPU reference on the CPU backend, the fused kernel (and the logits
// kernel) on the CUDA backend, whose own kernels also write and demote the pages. The partial
// tail block stays hot, as the cache requires.
#ifndef KVTIER_EXAMPLES_KVTIER_RECALL_ARMS_H_
#define KVTIER_EXAMPLES_KVTIER_RECALL_ARMS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "examples/kvtier/recall_cache_io.h"
#include "examples/kvtier/recall_generator.h"
#include "kvtier/cache.h"
#include "kvtier/format.h"
#include "kvtier/policy.h"

namespace kvtier::tool {

struct Arm {
  std::string name;
  // palette[0] is the hot format the K/V are written in (FP16 for every built-in arm).
  std::vector<FormatSpec> palette;
  // The palette index full block `block` (0-based) of a `length`-token sequence ends in.
  std::function<int32_t(int64_t block, int64_t length, int32_t block_tokens)> format_of;
  // Demote through every palette format between the hot one and the final one, in order
  // (FP16 -> FP8 -> NVFP4), as blocks that age through tiers do. Otherwise directly.
  bool step_through = false;
  // Per-tensor scales: calibrated on each trial's own K/V (Cache::CalibrateTensorScales), or,
  // when `fixed_k_amax` / `fixed_v_amax` are set, static (Options::k_tensor_amax).
  float fixed_k_amax = 0;
  float fixed_v_amax = 0;
  // When set, the cache's own policy engine ages the blocks instead of `format_of`: the runner
  // calls Cache::SetPolicy, and EndStep after each chunk it appends (a prefill in chunks), so
  // blocks land where the engine puts them (`format_of` then only describes the intent).
  std::optional<Policy> policy;
  // The cache's Options::key_rotation: rotated arms ("...+rot") store R k and attend with R q.
  KeyRotation key_rotation = KeyRotation::kNone;
  // For a policy with Policy::attention_keep_ratio: the prompt is written whole, the trial's
  // queries attend over its FP16 pages (the question at the end of the prompt, SnapKV's
  // observation window), the cache records their page weights (Cache::RecordAttention), and
  // only then does one EndStep age the prompt. Blocks the queries singled out sit one tier
  // hotter than `format_of` says.
  bool observe_prompt = false;
};

// Every full block in `cold` (palette {fp16, cold}); the arm's name is the format's name.
Arm SingleFormatArm(const FormatSpec& cold);

// FP16 -> `formats[0]` -> ... -> `formats.back()`, one step at a time, every full block.
Arm ChainArm(const std::string& name, const std::vector<FormatSpec>& formats);

// A precision policy as a whole ("policy:<name>"), run by the cache's policy engine
// (Arm::policy; memory pressure off, so windows keep their size). `format_of` states where the
// engine puts each full block at query time: the tier its age (tokens from the block's last
// token to the sequence's last token) falls in; sink blocks stay in the hot tier. Keys are
// rotated when the policy is a preset meant for it (PresetKeyRotation). A policy with
// attention_keep_ratio observes the prompt first (Arm::observe_prompt).
Arm PolicyArm(const Policy& policy);

// `arm` with rotated keys (Options::key_rotation = kHadamard), named arm.name + "+rot".
Arm RotatedArm(Arm arm);

// The arms of the default sweep, FP16 first.
std::vector<Arm> StandardArms();

// The cache Options of `arm` for one layer of `kv_heads` x `head_dim` heads in 16-token blocks,
// with a budget of one slab per format and two more (ArmRunner sizes its own).
Options ArmOptions(const Arm& arm, int32_t kv_heads, int32_t head_dim);
// OK when ArmOptions validates: InvalidArgument, naming the arm, for a geometry its cache
// refuses (a page larger than a slab; rotated keys with head_dim not a power of two).
absl::Status CheckArmGeometry(const Arm& arm, int32_t kv_heads, int32_t head_dim);

// Runs trials through one arm. One cache per runner, reused across trials (each trial's
// sequence is released at the end). Thread-compatible: use one runner per thread.
class ArmRunner {
 public:
  // `max_length`: the longest trial it will run. `chunk_tokens`: tokens appended per step.
  // `backend`: the cache's (kCuda: see recall_cache_io.h; Cache::Create's error where CUDA is
  // not usable, and the fused kernel's refusals, e.g. of head_dim 64, come from Run).
  static absl::StatusOr<std::unique_ptr<ArmRunner>> Create(const Arm& arm, int32_t kv_heads,
                                                           int32_t head_dim, int64_t max_length,
                                                           int64_t chunk_tokens = 4096,
                                                           BackendKind backend = BackendKind::kCpu);

  struct Result {
    std::vector<float> logits;  // [q_heads, length]
    std::vector<float> out;     // [q_heads, head_dim]
    std::vector<float> lse;     // [q_heads]
    double bits_per_element = 0;  // of the trial's blocks, payload plus scales
    std::vector<int32_t> block_formats;  // palette index of each block at query time
    // When requested: relative L2 difference between the paged attention output and a dense
    // attention over the cache's own decoding (ReadKV) of the same pages. Zero on the CPU
    // backend (both are the reference; for rotated arms, the FP32 rounding of ReadKV's
    // un-rotation); on the CUDA backend the fused kernel's compute error.
    double compute_rel_error = -1;
  };

  // Writes `trial`, demotes its blocks, attends every query head. The result's buffers are
  // reused across calls. Internal when a block is not where the arm's `format_of` says (for a
  // policy arm: the engine placed it elsewhere), so that no result describes the wrong arm.
  absl::Status Run(const Trial& trial, bool measure_compute_error, Result* result);

  const Arm& arm() const { return arm_; }

 private:
  ArmRunner(const Arm& arm, std::unique_ptr<Cache> cache, int64_t chunk_tokens)
      : arm_(arm), cache_(std::move(cache)), chunk_tokens_(chunk_tokens) {}
  absl::Status Write(const Trial& trial, SequenceId seq);
  // Arm::observe_prompt: the trial's queries attend over the written prompt, the cache records
  // their page weights, then EndStep ages the prompt.
  absl::Status ObservePrompt(const Trial& trial, SequenceId seq);
  // Each block's palette index into `formats`, checked against the arm's `format_of`.
  absl::Status CheckPlacement(int64_t length, SequenceId seq, std::vector<int32_t>* formats) const;

  Arm arm_;
  std::unique_ptr<Cache> cache_;
  int64_t chunk_tokens_;
  std::vector<int64_t> slots_;
  CacheIo io_;
};

}  // namespace kvtier::tool

#endif  // KVTIER_EXAMPLES_KVTIER_RECALL_ARMS_H_
