// Benchmarks of the remote tier's keyed MAC (src/remote_mac.h, Options::remote_secret) over a
// block's value: signing (the writer thread, once per block written) and verifying (the
// reading AddSequence, once per block read). Bytes per second are the value's. Results and
// the command that produced them are recorded in docs/benchmarks.md.
#include <cstdint>
#include <string>

#include "benchmark/benchmark.h"
#include "src/remote_mac.h"

namespace kvtier {
namespace {

// A value of `state.range(0)` KiB: 512 is an FP16 block of 16 tokens x 8 KV heads x 128 dims
// for 16 layers; 2048 the same for 64 layers.
std::string Value(const benchmark::State& state) {
  std::string value(static_cast<size_t>(state.range(0)) << 10, '\0');
  for (size_t i = 0; i < value.size(); ++i) value[i] = static_cast<char>(i * 131);
  return value;
}

RemoteMac Mac() { return RemoteMac::Create("a secret of 32 bytes for the MAC").value(); }

void BM_RemoteMacSign(benchmark::State& state) {
  const RemoteMac mac = Mac();
  const std::string value = Value(state);
  std::string signed_value = value;
  signed_value.reserve(value.size() + RemoteMac::kTrailerBytes);  // as the cache stages it
  for (auto _ : state) {
    signed_value.resize(value.size());  // the last trailer off, the capacity kept
    benchmark::DoNotOptimize(mac.Sign(&signed_value).ok());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(value.size()));
}
BENCHMARK(BM_RemoteMacSign)->Arg(512)->Arg(2048)->Unit(benchmark::kMicrosecond);

void BM_RemoteMacVerify(benchmark::State& state) {
  const RemoteMac mac = Mac();
  std::string value = Value(state);
  if (!mac.Sign(&value).ok()) state.SkipWithError("Sign failed");
  for (auto _ : state) benchmark::DoNotOptimize(mac.Verify(value));
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(value.size()));
}
BENCHMARK(BM_RemoteMacVerify)->Arg(512)->Arg(2048)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvtier
