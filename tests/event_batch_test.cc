// KV-event batches (src/events/event_batch.h): runs merge as vLLM's do, and the msgpack layout
// is vLLM's array_like tagged encoding, decoded here with msgpack-cxx.
#include "src/events/event_batch.h"

#include <msgpack.hpp>

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "src/prefix_hash.h"

namespace kvtier {
namespace {

msgpack::object_handle Decode(const std::string& bytes) {
  return msgpack::unpack(bytes.data(), bytes.size());
}

std::string Str(const msgpack::object& o) { return o.as<std::string>(); }

TEST(EventBatchTest, ChainedStoresAndRunsOfRemovesMerge) {
  EventBatchBuilder b;
  b.Stored(Medium::kDevice, 11, kRootParentHash, {1, 2});
  b.Stored(Medium::kDevice, 12, 11, {3, 4});   // chains: merged
  b.Stored(Medium::kDevice, 20, 99, {5, 6});   // another parent: new event
  b.Stored(Medium::kHost, 21, 20, {7, 8});     // another medium: new event
  b.Removed(Medium::kHost, 21);
  b.Removed(Medium::kHost, 22);                // merged
  b.Removed(Medium::kDevice, 23);              // another medium
  b.FormatChanged(Medium::kDevice, 11, 1);
  b.FormatChanged(Medium::kDevice, 12, 1);     // merged
  b.FormatChanged(Medium::kDevice, 13, 2);     // another format
  b.AllBlocksCleared();
  const std::vector<KvEvent> events = b.Take();
  EXPECT_TRUE(b.empty());
  ASSERT_EQ(events.size(), 8u);
  EXPECT_EQ(events[0].hashes, (std::vector<uint64_t>{11, 12}));
  EXPECT_EQ(events[0].tokens, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(events[0].parent_hash, kRootParentHash);
  EXPECT_EQ(events[1].parent_hash, 99u);
  EXPECT_EQ(events[2].medium, Medium::kHost);
  EXPECT_EQ(events[3].hashes, (std::vector<uint64_t>{21, 22}));
  EXPECT_EQ(events[4].medium, Medium::kDevice);
  EXPECT_EQ(events[5].hashes, (std::vector<uint64_t>{11, 12}));
  EXPECT_EQ(events[6].format, 2);
  EXPECT_EQ(events[7].kind, KvEvent::Kind::kAllCleared);
}

TEST(EventBatchTest, EncodesVllmsArrayLikeTaggedLayout) {
  EventBatchBuilder b;
  b.Stored(Medium::kDevice, 0xFFFFFFFFFFFFFFF0u, kRootParentHash, {1, 2});
  b.Stored(Medium::kHost, 7, 5, {3, 4});
  b.Removed(Medium::kDevice, 9);
  b.FormatChanged(Medium::kHost, 7, 1);
  b.AllBlocksCleared();
  const std::vector<KvEvent> events = b.Take();
  const std::vector<std::string> names = {"fp16", "fp8_e4m3"};
  const msgpack::object_handle h = Decode(EncodeBatch(1.5, events, 2, names));
  const msgpack::object& batch = h.get();
  ASSERT_EQ(batch.type, msgpack::type::ARRAY);
  ASSERT_EQ(batch.via.array.size, 2u);  // [ts, events]: data_parallel_rank omitted (default)
  EXPECT_EQ(batch.via.array.ptr[0].as<double>(), 1.5);
  const msgpack::object_array& ev = batch.via.array.ptr[1].via.array;
  ASSERT_EQ(ev.size, 5u);

  const msgpack::object_array& stored = ev.ptr[0].via.array;
  ASSERT_EQ(stored.size, 7u);
  EXPECT_EQ(Str(stored.ptr[0]), "BlockStored");
  EXPECT_EQ(stored.ptr[1].as<std::vector<uint64_t>>(),
            (std::vector<uint64_t>{0xFFFFFFFFFFFFFFF0u}));
  EXPECT_TRUE(stored.ptr[2].is_nil());  // parent_block_hash of a first block
  EXPECT_EQ(stored.ptr[3].as<std::vector<int32_t>>(), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(stored.ptr[4].as<int>(), 2);  // block_size
  EXPECT_TRUE(stored.ptr[5].is_nil());    // lora_id
  EXPECT_EQ(Str(stored.ptr[6]), "GPU");
  const msgpack::object_array& host = ev.ptr[1].via.array;
  EXPECT_EQ(host.ptr[2].as<uint64_t>(), 5u);
  EXPECT_EQ(Str(host.ptr[6]), "CPU");

  const msgpack::object_array& removed = ev.ptr[2].via.array;
  ASSERT_EQ(removed.size, 3u);
  EXPECT_EQ(Str(removed.ptr[0]), "BlockRemoved");
  EXPECT_EQ(removed.ptr[1].as<std::vector<uint64_t>>(), (std::vector<uint64_t>{9}));
  EXPECT_EQ(Str(removed.ptr[2]), "GPU");

  const msgpack::object_array& format = ev.ptr[3].via.array;
  ASSERT_EQ(format.size, 4u);
  EXPECT_EQ(Str(format.ptr[0]), "BlockFormatChanged");
  EXPECT_EQ(Str(format.ptr[2]), "CPU");
  EXPECT_EQ(Str(format.ptr[3]), "fp8_e4m3");

  const msgpack::object_array& cleared = ev.ptr[4].via.array;
  ASSERT_EQ(cleared.size, 1u);
  EXPECT_EQ(Str(cleared.ptr[0]), "AllBlocksCleared");
}

}  // namespace
}  // namespace kvtier
