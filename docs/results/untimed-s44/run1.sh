#!/usr/bin/env bash
# Session 44: one call for whichever card comes, within CALL_SECONDS (Default: 570). Carry
# variants/s40lib, bundle/BUILD_INFO, variants/s44b (from the bundle of 36ec755 = c7a636d's
# device code: its bench and GPU tests gzipped; peers.tgz, its include/ and libkvtier.so*),
# variants/s44/query_first.gz and variants/s44t (untimed-s43's query_first A/B, main's side the
# bundle's bench): 59 MiB with the tracked files. On an H200: untimed-s39/run1.sh (issue 15's
# figures); on another card: untimed-s43/run1.sh (query_first against main).
set -u
cd "$(dirname "$0")/../../.."
source docs/results/untimed-s39/budget_step.sh
mkdir -p bundle/lib && cp -a variants/s40lib/. bundle/lib/ && tar xzf variants/s44b/peers.tgz -C bundle
unpack variants/s44b/kvtier_gpu_bench.gz bundle/kvtier_gpu_bench
unpack variants/s44b/kvtier_gpu_tests.gz bundle/kvtier_gpu_tests
ln -sfn ../s44b/kvtier_gpu_bench.gz variants/s44/a_main.gz
case "$(nvidia-smi --query-gpu=name --format=csv,noheader)" in
  *H200*) bash docs/results/untimed-s39/run1.sh ;;
  *) bash docs/results/untimed-s43/run1.sh ;;
esac
