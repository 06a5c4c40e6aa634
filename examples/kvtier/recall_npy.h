// A minimal reader of NumPy `.npy` files, for loading K/V captured from a real model into
// `kvtier recall`.
//
// Accepted: format versions 1.0, 2.0 and 3.0; dtype '<f2' (float16) or '<f4' (float32), little
// endian ('=' and '|' are refused: say the byte order); fortran_order False (C order); any
// shape of 1 to 4 dimensions and at most 2^33 elements. What `kvtier recall` expects of the
// shape is stated in LoadKVDump below. Anything else is InvalidArgument with the reason (a file
// or stream is read no further than its header declares); an unreadable file is NotFound.
#ifndef KVTIER_EXAMPLES_KVTIER_RECALL_NPY_H_
#define KVTIER_EXAMPLES_KVTIER_RECALL_NPY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvtier::tool {

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;  // all elements, C order, converted to float
};

absl::StatusOr<NpyArray> ReadNpy(const std::string& path);

// K and V of one layer as the cache stores them (after RoPE), [tokens, kv_heads, head_dim].
struct KVDump {
  int64_t tokens = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
  std::vector<float> k, v;
};

// Loads a K file and a V file of identical shape, either [tokens, kv_heads, head_dim] or
// [layers, tokens, kv_heads, head_dim] (then `layer` picks one; it must be 0 for 3-D files).
// REQUIRES of the data: kv_heads 1 to 256 and head_dim a multiple of 16 from 16 to 1024 (the
// cache's geometry); every value finite and within FP16 range (the cache is written in FP16).
// InvalidArgument otherwise.
absl::StatusOr<KVDump> LoadKVDump(const std::string& k_path, const std::string& v_path,
                                  int32_t layer);

// Queries, [count, head_dim] (or [head_dim]); rows are used in turn by the generator.
absl::StatusOr<NpyArray> LoadQueries(const std::string& path, int32_t head_dim);

}  // namespace kvtier::tool

#endif  // KVTIER_EXAMPLES_KVTIER_RECALL_NPY_H_
