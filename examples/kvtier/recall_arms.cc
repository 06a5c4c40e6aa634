#include "examples/kvtier/recall_arms.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kvtier/attention.h"
#include "kvtier/reference_attention.h"
#include "src/relative_error.h"
#include "src/status_macros.h"

namespace kvtier::tool {
namespace {

FormatSpec Format(const char* name) { return *ParseFormat(name); }

bool HasTensorScope(const std::vector<FormatSpec>& palette) {
  for (const FormatSpec& f : palette) {
    if (f.k.scope == ScaleScope::kTensor || f.v.scope == ScaleScope::kTensor) return true;
  }
  return false;
}

}  // namespace

Arm SingleFormatArm(const FormatSpec& cold) {
  Arm arm;
  arm.name = FormatName(cold);
  arm.palette = {Format("fp16")};
  if (cold != arm.palette[0]) arm.palette.push_back(cold);
  const int32_t last = static_cast<int32_t>(arm.palette.size()) - 1;
  arm.format_of = [last](int64_t, int64_t, int32_t) { return last; };
  return arm;
}

Arm ChainArm(const std::string& name, const std::vector<FormatSpec>& formats) {
  Arm arm;
  arm.name = name;
  arm.palette = {Format("fp16")};
  arm.palette.insert(arm.palette.end(), formats.begin(), formats.end());
  const int32_t last = static_cast<int32_t>(arm.palette.size()) - 1;
  arm.format_of = [last](int64_t, int64_t, int32_t) { return last; };
  arm.step_through = true;
  return arm;
}

Arm PolicyArm(const Policy& policy) {
  Arm arm;
  arm.name = "policy:" + policy.name;
  arm.palette = PolicyPalette(policy);
  const std::vector<PolicyTier> tiers = policy.tiers;
  const int64_t sink_tokens = policy.sink_tokens;
  arm.format_of = [=](int64_t block, int64_t length, int32_t block_tokens) -> int32_t {
    const int64_t first = block * block_tokens;
    const int64_t age = length - 1 - (first + block_tokens - 1);
    if (first < sink_tokens) return 0;
    for (size_t i = 0; i + 1 < tiers.size(); ++i) {
      if (age < tiers[i].max_age_tokens) return static_cast<int32_t>(i);
    }
    return static_cast<int32_t>(tiers.size() - 1);
  };
  arm.policy = policy;
  arm.policy->pressure_watermark = 0;
  arm.key_rotation = PresetKeyRotation(policy.name);
  arm.observe_prompt = policy.attention_keep_ratio > 0;
  return arm;
}

Arm RotatedArm(Arm arm) {
  arm.name += "+rot";
  arm.key_rotation = KeyRotation::kHadamard;
  return arm;
}

std::vector<Arm> StandardArms() {
  std::vector<Arm> arms;
  for (const char* name :
       {"fp16", "fp8_e4m3/tensor", "fp8_e4m3/block_head", "fp8_e4m3/token_head",
        "fp8_e5m2/tensor", "fp8_e5m2/block_head", "fp8_e5m2/token_head", "nvfp4/tensor",
        "nvfp4/block_head", "nvfp4_channel/block_head",
        "k:nvfp4_channel/block_head,v:nvfp4/block_head"}) {
    arms.push_back(SingleFormatArm(Format(name)));
  }
  arms.push_back(ChainArm("fp8_e4m3/block_head->nvfp4/block_head",
                          {Format("fp8_e4m3/block_head"), Format("nvfp4/block_head")}));
  for (const std::string& preset : PolicyPresetNames()) {
    if (preset != "fp16") arms.push_back(PolicyArm(*PolicyPreset(preset)));  // fp16: the first arm
  }
  // Rotated keys (docs/formats.md), and split palettes: keys one tier above values.
  const FormatSpec split = Format("k:fp8_e4m3/block_head,v:nvfp4/block_head");
  arms.push_back(SingleFormatArm(split));
  for (const char* name : {"nvfp4/block_head", "nvfp4/tensor", "fp8_e4m3/tensor",
                           "k:nvfp4_channel/block_head,v:nvfp4/block_head"}) {
    arms.push_back(RotatedArm(SingleFormatArm(Format(name))));
  }
  arms.push_back(RotatedArm(SingleFormatArm(split)));
  arms.push_back(RotatedArm(PolicyArm(*PolicyPreset("balanced"))));
  arms.push_back(RotatedArm(PolicyArm(*PolicyPreset("max_capacity"))));
  return arms;
}

Options ArmOptions(const Arm& arm, int32_t kv_heads, int32_t head_dim) {
  Options o;
  o.geometry = Geometry{1, kv_heads, head_dim, 16};
  o.palette = arm.palette;
  o.key_rotation = arm.key_rotation;
  if (arm.fixed_k_amax > 0 || arm.fixed_v_amax > 0) {
    o.k_tensor_amax = {arm.fixed_k_amax > 0 ? arm.fixed_k_amax : 1.f};
    o.v_tensor_amax = {arm.fixed_v_amax > 0 ? arm.fixed_v_amax : 1.f};
  }
  o.memory_budget_bytes = o.slab_bytes * (2 * arm.palette.size() + 2);
  return o;
}

absl::Status CheckArmGeometry(const Arm& arm, int32_t kv_heads, int32_t head_dim) {
  const absl::Status s = ValidateOptions(ArmOptions(arm, kv_heads, head_dim));
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("arm ", arm.name, " cannot hold heads of ", kv_heads,
                                             " x ", head_dim, ": ", s.message()));
}

absl::StatusOr<std::unique_ptr<ArmRunner>> ArmRunner::Create(const Arm& arm, int32_t kv_heads,
                                                             int32_t head_dim, int64_t max_length,
                                                             int64_t chunk_tokens,
                                                             BackendKind backend) {
  if (arm.palette.empty() || !arm.format_of) {
    return absl::InvalidArgumentError(absl::StrCat("arm ", arm.name, " has no palette or rule"));
  }
  Options o = ArmOptions(arm, kv_heads, head_dim);
  o.backend = backend;
  // Room for the whole trial in FP16 plus a chunk, and one slab per format for rounding.
  const size_t fp16_token = static_cast<size_t>(kv_heads) * head_dim * 2 * 2;
  size_t need = fp16_token * static_cast<size_t>(max_length + 2 * chunk_tokens + 64) +
                o.slab_bytes * (2 * arm.palette.size() + 2);
  // Aging a whole observed prompt at once: the FP16 slabs stay mapped while the blocks kept hot
  // are scattered over them, so the colder copies need room of their own.
  if (arm.observe_prompt) need += fp16_token * static_cast<size_t>(max_length) / 2;
  o.memory_budget_bytes = (need + o.slab_bytes - 1) / o.slab_bytes * o.slab_bytes;
  absl::StatusOr<std::unique_ptr<Cache>> cache = Cache::Create(o);
  absl::Status status = cache.status();
  if (status.ok() && arm.policy) status = (*cache)->SetPolicy(*arm.policy);
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("arm ", arm.name, ": ", status.message()));
  }
  return std::unique_ptr<ArmRunner>(new ArmRunner(arm, std::move(*cache), chunk_tokens));
}

absl::Status ArmRunner::Write(const Trial& trial, SequenceId seq) {
  const Geometry& g = cache_->options().geometry;
  const size_t row = static_cast<size_t>(trial.kv_heads) * trial.head_dim;
  const int32_t formats = static_cast<int32_t>(arm_.palette.size());
  int64_t demoted_blocks = 0;
  std::vector<std::vector<BlockId>> by_format(formats);
  for (int64_t at = 0; at < trial.length; at += chunk_tokens_) {
    const int64_t n = std::min(chunk_tokens_, trial.length - at);
    slots_.clear();
    absl::Status s = cache_->Append(seq, n, &slots_);
    if (!s.ok()) return s;
    const KVInput kv{DType::kFloat16, trial.k_half.data() + at * row,
                     trial.v_half.data() + at * row, n, trial.kv_heads, trial.head_dim};
    s = io_.WriteKV(*cache_, 0, slots_, kv);
    if (!s.ok()) return s;
    if (arm_.observe_prompt) continue;  // aged once the prompt was observed
    if (arm_.policy) {  // the engine ages what this chunk made old
      s = cache_->EndStep();
      if (!s.ok()) return s;
      continue;
    }
    // Full blocks of this chunk go to their final format.
    const int64_t full = (at + n) / g.block_tokens;
    if (full == demoted_blocks) continue;
    absl::StatusOr<std::vector<BlockId>> blocks = cache_->SequenceBlocks(seq);
    if (!blocks.ok()) return blocks.status();
    for (auto& list : by_format) list.clear();
    for (int64_t b = demoted_blocks; b < full; ++b) {
      const int32_t f = arm_.format_of(b, trial.length, g.block_tokens);
      if (f < 0 || f >= formats) {
        return absl::InternalError(absl::StrCat("arm ", arm_.name, " sent block ", b,
                                                " to palette index ", f));
      }
      by_format[f].push_back((*blocks)[b]);
    }
    demoted_blocks = full;
    if (arm_.step_through) {  // every block whose final format is >= f passes through f
      std::vector<BlockId> moving;
      for (int32_t f = formats - 1; f >= 1; --f) {
        moving.insert(moving.end(), by_format[f].begin(), by_format[f].end());
        by_format[f] = moving;
      }
    }
    for (int32_t f = 1; f < formats; ++f) {
      if (by_format[f].empty()) continue;
      s = cache_->Demote(by_format[f], f);
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ArmRunner::ObservePrompt(const Trial& trial, SequenceId seq) {
  PageTables tables;
  KVTIER_RETURN_IF_ERROR(cache_->BuildPageTables({seq}, &tables));
  const int q_heads = trial.kv_heads * trial.group;
  std::vector<float> out(static_cast<size_t>(q_heads) * trial.head_dim), lse(q_heads),
      weight(tables.packed.size(), 0.f);
  KVTIER_RETURN_IF_ERROR(io_.Attend(
      *cache_, 0, tables, DecodeQueries{trial.q, q_heads, trial.softmax_scale},
      DecodeOutputs{absl::MakeSpan(out), absl::MakeSpan(lse), {}, 0, absl::MakeSpan(weight)}));
  KVTIER_RETURN_IF_ERROR(cache_->RecordAttention(seq, weight));
  // Aging a whole prompt at once demotes more than one step's budget holds: the slabs it empties
  // return to the budget at the end of the step, and the next step demotes what found no room.
  KVTIER_RETURN_IF_ERROR(cache_->EndStep());
  return cache_->EndStep();
}

absl::Status ArmRunner::CheckPlacement(int64_t length, SequenceId seq,
                                       std::vector<int32_t>* formats) const {
  const int32_t block_tokens = cache_->options().geometry.block_tokens;
  absl::StatusOr<std::vector<BlockId>> blocks = cache_->SequenceBlocks(seq);
  if (!blocks.ok()) return blocks.status();
  formats->clear();
  for (size_t b = 0; b < blocks->size(); ++b) {
    absl::StatusOr<BlockInfo> info = cache_->GetBlockInfo((*blocks)[b]);
    if (!info.ok()) return info.status();
    const bool full = info->num_tokens == block_tokens;
    int32_t want = full ? arm_.format_of(static_cast<int64_t>(b), length, block_tokens) : 0;
    if (arm_.observe_prompt && info->attention >= arm_.policy->attention_keep_ratio) {
      want = std::max(want - 1, 0);  // kept one tier hotter
    }
    if (info->format != want) {
      return absl::InternalError(absl::StrCat("arm ", arm_.name, ": block ", b, " of ", length,
                                              " tokens is in palette format ", info->format,
                                              ", expected ", want));
    }
    formats->push_back(info->format);
  }
  return absl::OkStatus();
}

absl::Status ArmRunner::Run(const Trial& trial, bool measure_compute_error, Result* result) {
  result->compute_rel_error = -1;  // a result reused from another arm keeps none of its error
  const Geometry& g = cache_->options().geometry;
  if (trial.kv_heads != g.num_kv_heads || trial.head_dim != g.head_dim) {
    return absl::InvalidArgumentError("trial geometry differs from the arm's cache");
  }
  if (arm_.fixed_k_amax == 0 && arm_.fixed_v_amax == 0 && HasTensorScope(arm_.palette)) {
    const KVInput all{DType::kFloat16, trial.k_half.data(), trial.v_half.data(), trial.length,
                      trial.kv_heads, trial.head_dim};
    absl::Status s = cache_->CalibrateTensorScales(0, all);
    if (!s.ok()) return s;
  }
  absl::StatusOr<SequenceId> seq = cache_->AddSequence();
  if (!seq.ok()) return seq.status();
  absl::Status status = Write(trial, *seq);
  if (status.ok() && arm_.observe_prompt) status = ObservePrompt(trial, *seq);
  if (status.ok() && arm_.policy) status = io_.SettleSteps(*cache_);
  if (status.ok()) status = CheckPlacement(trial.length, *seq, &result->block_formats);
  const int q_heads = trial.kv_heads * trial.group;
  if (status.ok()) {
    result->bits_per_element = cache_->GetStats().effective_bits_per_element;
    PageTables tables;
    status = cache_->BuildPageTables({*seq}, &tables);
    if (status.ok()) {
      result->logits.resize(static_cast<size_t>(q_heads) * trial.length);
      result->out.resize(static_cast<size_t>(q_heads) * trial.head_dim);
      result->lse.resize(q_heads);
      const DecodeQueries queries{trial.q, q_heads, trial.softmax_scale};
      status = io_.Attend(
          *cache_, 0, tables, queries,
          DecodeOutputs{absl::MakeSpan(result->out), absl::MakeSpan(result->lse),
                        absl::MakeSpan(result->logits), trial.length, {}});
    }
    if (status.ok() && measure_compute_error) {
      std::vector<float> k(trial.k.size()), v(trial.v.size()), out(result->out.size()),
          lse(q_heads);
      status = cache_->ReadKV(*seq, 0, absl::MakeSpan(k), absl::MakeSpan(v));
      if (status.ok()) {
        const DenseSequence dense{k, v, trial.length};
        status = DenseDecodeAttention({dense}, trial.kv_heads, trial.head_dim,
                                      DecodeQueries{trial.q, q_heads, trial.softmax_scale},
                                      DecodeOutputs{absl::MakeSpan(out), absl::MakeSpan(lse), {}, 0, {}});
      }
      result->compute_rel_error = RelativeError(result->out, out);
    }
  }
  const absl::Status released = cache_->Release(*seq);
  const absl::Status ended = cache_->EndStep();
  if (!status.ok()) return status;
  return released.ok() ? ended : released;
}

}  // namespace kvtier::tool
