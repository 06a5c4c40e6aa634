// vLLM-compatible block hashes for the KV events (src/events/vllm_block_hash.h,
// src/events/vllm_hashing_sink.h): SHA-256 against FIPS 180 vectors and the padding
// boundaries, the sha256_cbor chain against values computed with Python's cbor2 and hashlib
// (cbor2.dumps(x, canonical=True), as vLLM's sha256_cbor), and the sink's renaming of a
// block's events through offload, release and an unknown parent.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"
#include "src/events/sha256.h"
#include "src/events/vllm_block_hash.h"
#include "src/events/vllm_hashing_sink.h"
#include "src/prefix_hash.h"

namespace kvtier {
namespace {

std::string Hex(const Sha256Digest& d) {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(d.data()), d.size()));
}

TEST(Sha256Test, MatchesPublishedVectorsAcrossPaddingBoundaries) {
  EXPECT_EQ(Hex(Sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Hex(Sha256("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Hex(Sha256(std::string(1000, 'a'))),
            "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
  std::string ramp;
  for (int i = 0; i < 64; ++i) ramp.push_back(static_cast<char>(i));
  // 55 bytes pad into one chunk, 56 need two, 64 fill one exactly.
  EXPECT_EQ(Hex(Sha256(ramp.substr(0, 55))),
            "463eb28e72f82e0a96c0a4cc53690c571281131f672aa229e0d45ae59b598b59");
  EXPECT_EQ(Hex(Sha256(ramp.substr(0, 56))),
            "da2ae4d6b36748f2a318f23e7ab1dfdf45acdc9d049bd80e59de82a60895f562");
  EXPECT_EQ(Hex(Sha256(ramp)), "fdeab9acf3710362bd2658cdc9a29e8f9c757fcf9811603a8c447cd1d9151108");
}

std::vector<int32_t> Ramp16() {
  std::vector<int32_t> t(16);
  for (int i = 0; i < 16; ++i) t[i] = i;
  return t;
}

TEST(VllmBlockHashTest, ChainEqualsVllmsSha256Cbor) {
  const VllmBlockHasher hasher("0");  // PYTHONHASHSEED=0
  // NONE_HASH = sha256(cbor2.dumps("0", canonical=True))
  EXPECT_EQ(Hex(hasher.root()),
            "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e");
  // sha256(cbor2.dumps((NONE_HASH, tuple(range(16)), None), canonical=True))
  const Sha256Digest b1 = hasher.Block(hasher.root(), Ramp16(), 0);
  EXPECT_EQ(Hex(b1), "d830de3d42c00f25a2949b5d12d98642664a44872c1614c5b0147556276afc9c");
  EXPECT_EQ(VllmEventHash(b1), 0xb0147556276afc9cu);  // int.from_bytes(b1, "big") & (2**64-1)
  // Every CBOR integer width in one block, chained from b1.
  const std::vector<int32_t> widths = {0,      23, 24,     255, 256, 65535, 65536, 2147483647,
                                       7, 100000, 1,  2, 3, 4, 5, 6};
  EXPECT_EQ(Hex(hasher.Block(b1, widths, 0)),
            "27872c5601d6b69d4facb8692e9c514dd66c939571c2dd91ad63754ea68965e2");
  // extra_keys (12345678901,)
  EXPECT_EQ(Hex(hasher.Block(hasher.root(), Ramp16(), 12345678901u)),
            "417aab3f2bd4c49260aae9e95746ca28b77a63e381bc136b980de27763be09b1");
}

struct Seen {
  char kind;  // 'S' stored, 'R' removed, 'F' format changed, 'C' cleared
  Medium medium;
  uint64_t hash;
  uint64_t parent;
};

class RecordingSink : public BlockEventSink {
 public:
  explicit RecordingSink(std::vector<Seen>* log) : log_(log) {}
  void Stored(Medium m, uint64_t hash, uint64_t parent, uint64_t, absl::Span<const int32_t>) override {
    log_->push_back({'S', m, hash, parent});
  }
  void Removed(Medium m, uint64_t hash) override { log_->push_back({'R', m, hash, 0}); }
  void FormatChanged(Medium m, uint64_t hash, int) override { log_->push_back({'F', m, hash, 0}); }
  void AllBlocksCleared() override { log_->push_back({'C', Medium::kDevice, 0, 0}); }
  void EndStep() override {}

 private:
  std::vector<Seen>* log_;
};

TEST(VllmHashingSinkTest, RenamesEveryEventOfAChainAndForgetsWhatLeavesEveryTier) {
  std::vector<Seen> log;
  VllmHashingSink sink(std::make_unique<RecordingSink>(&log), "0");
  const VllmBlockHasher hasher("0");
  const std::vector<int32_t> t1 = Ramp16();
  std::vector<int32_t> t2(16, 7);
  const uint64_t h1 = HashBlock(kRootParentHash, t1, 0), h2 = HashBlock(h1, t2, 0);
  const Sha256Digest v1 = hasher.Block(hasher.root(), t1, 0), v2 = hasher.Block(v1, t2, 0);
  sink.Stored(Medium::kDevice, h1, kRootParentHash, 0, t1);
  sink.Stored(Medium::kDevice, h2, h1, 0, t2);
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[0].hash, 0xb0147556276afc9cu);
  EXPECT_EQ(log[0].parent, kRootParentHash);  // a first block: nil in the event
  EXPECT_EQ(log[1].hash, VllmEventHash(v2));
  EXPECT_EQ(log[1].parent, VllmEventHash(v1));
  // Offload of the leaf: removed from the device, stored in the host tier under the same name.
  sink.Removed(Medium::kDevice, h2);
  sink.Stored(Medium::kHost, h2, h1, 0, t2);
  sink.FormatChanged(Medium::kHost, h2, 1);
  EXPECT_EQ(log[2].kind, 'R');
  EXPECT_EQ(log[2].hash, VllmEventHash(v2));
  EXPECT_EQ(log[3].kind, 'S');
  EXPECT_EQ(log[3].hash, VllmEventHash(v2));
  EXPECT_EQ(log[4].kind, 'F');
  // The root stays known while its child is held, though no tier holds the root itself.
  sink.Removed(Medium::kDevice, h1);
  EXPECT_EQ(sink.known_blocks(), 2u);
  sink.Removed(Medium::kHost, h2);
  EXPECT_EQ(sink.known_blocks(), 0u);
  // A block whose parent it never heard of has no vLLM name: nothing passes, nothing is kept.
  const size_t before = log.size();
  sink.Stored(Medium::kDevice, 42, 41, 0, t2);
  sink.Removed(Medium::kDevice, 42);
  sink.Removed(Medium::kDevice, h1);  // already gone: ignored
  EXPECT_EQ(log.size(), before);
  EXPECT_EQ(sink.known_blocks(), 0u);
  sink.Stored(Medium::kDevice, h1, kRootParentHash, 0, t1);
  sink.AllBlocksCleared();
  EXPECT_EQ(sink.known_blocks(), 0u);
  EXPECT_EQ(log.back().kind, 'C');
}

}  // namespace
}  // namespace kvtier
