#!/usr/bin/env python3
"""The engine benchmark (docs/engine.md): a Llama model decoding with kvtier as its only KV cache.

  python3 examples/engine/bench_engine.py --out engine.json            # the H200 run
  python3 examples/engine/bench_engine.py --smoke --out smoke.json     # a reduced run
  python3 examples/engine/bench_engine.py --smoke --device cpu ...     # the same on the CPU
  python3 examples/engine/bench_engine.py --tables engine.json         # docs/engine.md's tables

Sections (each written to the JSON as soon as it is done, so a timeout keeps what finished):
- correctness: transformers' generate() (its default cache, the same weights and dtype) for each
  prompt, 256 new greedy tokens; the engine with the FP16 palette free-running (tokens identical?
  where do they first differ?) and teacher-forced on generate()'s tokens (largest logit
  difference, argmax agreement); the fp8 and balanced policies teacher-forced on the same tokens
  (argmax agreement with FP16, mean KL(FP16 || palette) of the next-token distributions) and
  free-running (token agreement with generate()).
- speed: for the contiguous FP16 + SDPA loop, FlashInfer's paged FP16 decode (when flashinfer
  imports) and kvtier with fp16, fp8 and balanced, 64 requests
  prefilled to each context, then decode at batch 64, 16 and 1 (requests cancelled in between):
  tokens/s over timed steps (device synchronised around them), and profiled steps split into
  attention, append, page tables, policy, model (projections, MLP, norms, LM head) and Python
  (the rest: the loop, sampling, bookkeeping).
- capacity: per palette, at a fixed budget, the most requests of each context the engine held
  at once (requests wait and are preempted when the cache is full).

Correctness runs on a byte-level Llama trained for --train-steps on the standard library's
source (kvtier_engine.train; on the CPU and with --train-steps 0, the speed model). The speed
model is random (kvtier_engine.random_llama, fixed seed; docs/engine.md says why): on CUDA,
Llama-3-8B's attention and MLP geometry (32 query / 8 KV heads, head_dim 128) with 4 layers
(--layers), float16; on the CPU, the TINY model in float32. With flashinfer importable (CUDA),
the speed section adds FlashInfer's paged FP16 decode as a second baseline.
"""
import argparse
import gc
import json
import os
import sys
import time
import urllib.request

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvtier_engine import (LLAMA8B_GEOMETRY, TINY, ContiguousKV, Engine,  # noqa: E402
                           KvtierKV, LlamaCompute, MetricsServer, StepTimer, llama_config,
                           random_llama)
from kvtier_engine.flashinfer_kv import FlashInferKV  # noqa: E402
from kvtier_engine.train import BYTE_LLAMA, stdlib_corpus, train_byte_llama  # noqa: E402

PALETTES = {"fp16": dict(palette=["fp16"]), "fp8": dict(policy="fp8"),
            "balanced": dict(policy="balanced")}
SECTIONS = StepTimer.SECTIONS + ("python",)

# Contexts longest first: should the time limit cut the run short, the 32K cases have run.
FULL = dict(layers=4, system=128, tails=[32, 1000, 2500], new_tokens=256,
            contexts=[32768, 8192], batches=[64, 16, 1], warmup=3, timed=16, profiled=16,
            capacity_budget=4 << 30, capacity_contexts=[32768, 8192])
SMOKE = dict(layers=2, system=32, tails=[16, 200, 400], new_tokens=32,
             contexts=[1024, 4096], batches=[8, 1], warmup=2, timed=4, profiled=1,
             capacity_budget=256 << 20, capacity_contexts=[1024])
CPU_SMOKE = dict(SMOKE, contexts=[256], capacity_budget=32 << 20, capacity_contexts=[384],
                 tails=[16, 100, 200])


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_tokens(n, vocab, seed):
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def make_cache(model, name, budget):
    import kvtier
    backend = "cuda" if model.device.type == "cuda" else "cpu"
    return kvtier.Cache(num_layers=model.num_layers, num_kv_heads=model.num_kv_heads,
                        head_dim=model.head_dim, budget_bytes=int(budget), backend=backend,
                        **PALETTES[name])


def kv_bytes_per_token(model):
    return 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2  # FP16 K and V


# ---- correctness ----

def generate_reference(hf, prompts, new_tokens):
    out = []
    for p in prompts:
        g = hf.generate(torch.tensor([p], device=hf.device), max_new_tokens=new_tokens,
                        do_sample=False, output_logits=True,
                        return_dict_in_generate=True)
        out.append((g.sequences[0, len(p):].tolist(), torch.stack([x[0].float().cpu()
                                                                  for x in g.logits])))
    return out


def engine_run(model, palette, budget, prompts, new_tokens, forced=None):
    """(tokens, logits [new_tokens, V] float32 on the CPU) per prompt, all in one batch."""
    engine = Engine(model, make_cache(model, palette, budget))
    ids = [engine.submit(p, new_tokens, forced=forced[i] if forced else None,
                         record_logits=True) for i, p in enumerate(prompts)]
    engine.run()
    return [(engine.results[r].tokens, torch.stack(engine.results[r].logits)) for r in ids], \
        [engine.results[r].cached_tokens for r in ids]


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def mean_kl(p_logits, q_logits):
    """Mean over positions of KL(P || Q), natural log."""
    lp, lq = p_logits.log_softmax(-1), q_logits.log_softmax(-1)
    return float((lp.exp() * (lp - lq)).sum(-1).mean())


def top2_gap(logits):
    """The gap between the two largest logits of each row ([..., V] -> [...])."""
    top2 = logits.topk(2, dim=-1).values
    return top2[..., 0] - top2[..., 1]


def compare_free(ref, free, cached, new):
    """Free-running tokens against generate()'s: identical, where they first differ, the top-2
    logit gap there of generate() and of the engine (whose tokens are the same up to there)
    and the largest difference of their logits there, the fraction of equal positions."""
    row = {"cached_tokens": cached, "identical": [], "first_difference": [],
           "top2_gap_at_first_difference": [], "engine_top2_gap_at_first_difference": [],
           "logit_difference_at_first_difference": [], "token_agreement": []}
    for (want, want_logits), (got, got_logits) in zip(ref, free):
        row["identical"].append(got == want)
        at = first_difference(got, want)
        row["first_difference"].append(at)
        there = at is not None
        row["top2_gap_at_first_difference"].append(
            float(top2_gap(want_logits[at])) if there else None)
        row["engine_top2_gap_at_first_difference"].append(
            float(top2_gap(got_logits[at])) if there else None)
        row["logit_difference_at_first_difference"].append(
            float((got_logits[at] - want_logits[at]).abs().max()) if there else None)
        row["token_agreement"].append(sum(x == y for x, y in zip(got, want)) / new)
    return row


def near_ties(ref, margin):
    """How close generate()'s greedy choices are: over every position of every prompt, the
    smallest top-2 logit gap, and how many gaps are at most `margin` (the largest logit
    difference the engine showed, teacher-forced: positions where a difference of that size
    could change the argmax), of how many positions."""
    gaps = torch.cat([top2_gap(logits) for _, logits in ref])
    return {"positions": int(gaps.numel()), "min_top2_gap": float(gaps.min()),
            "gaps_within_max_logit_difference": int((gaps <= margin).sum()),
            "gaps_below_0.01": int((gaps < 0.01).sum())}


def text_tokens(corpus, n, seed):
    """n bytes of `corpus` from a seeded offset, as token ids (the byte model's vocabulary)."""
    at = int(torch.randint(0, len(corpus) - n, (1,),
                           generator=torch.Generator().manual_seed(seed)))
    return list(corpus[at:at + n])


def correctness_model(args, cfg, hf, model, device):
    """(hf, model, prompts, description) for the correctness section: the byte-level Llama
    trained for --train-steps on the standard library's source (kvtier_engine.train) with
    prompts cut from that text, or with --train-steps 0 the speed model with random
    prompts. A shared system prompt, then a tail per request."""
    if args.train_steps <= 0:
        vocab = model.config.vocab_size
        system = random_tokens(cfg["system"], vocab, 1)
        return hf, model, [system + random_tokens(n, vocab, 10 + i)
                           for i, n in enumerate(cfg["tails"])], {"model": "random"}
    corpus = stdlib_corpus()
    trained, info = train_byte_llama(corpus, args.train_steps, args.seed, device,
                                     log=lambda m: print(m, flush=True))
    trained = trained.to(hf.dtype)
    trained.generation_config.eos_token_id = None
    trained.generation_config.pad_token_id = 0
    system = text_tokens(corpus, cfg["system"], 1)
    prompts = [system + text_tokens(corpus, n, 10 + i) for i, n in enumerate(cfg["tails"])]
    info = dict(info, model="byte_llama", geometry=BYTE_LLAMA,
                prompt_text=[bytes(p[:80]).decode("utf-8", "replace") for p in prompts])
    return trained, LlamaCompute(trained), prompts, info


def correctness(hf, model, cfg, prompts, info):
    new = cfg["new_tokens"]
    # Room for every request in FP16 four times over, and slabs for every pool of the palette.
    budget = (4 * kv_bytes_per_token(model) * (max(map(len, prompts)) + new + 64) * len(prompts)
              + (256 << 20))
    ref = generate_reference(hf, prompts, new)
    result = {"prompts": [len(p) for p in prompts], "new_tokens": new, "palettes": {},
              "model": info}
    forced = [t for t, _ in ref]
    fp16_forced, _ = engine_run(model, "fp16", budget, prompts, new, forced)
    # FP16, each prompt alone in its own cache: no prefix sharing, so that prefill is
    # transformers' own single call, as in generate().
    alone = [engine_run(model, "fp16", budget, [p], new) for p in prompts]
    row = compare_free(ref, [a[0][0] for a in alone], [a[1][0] for a in alone], new)
    alone_forced = torch.cat([engine_run(model, "fp16", budget, [p], new, [forced[i]])[0][0][1]
                              for i, p in enumerate(prompts)])
    want_logits = torch.cat([lg for _, lg in ref])
    row["max_logit_difference"] = float((alone_forced - want_logits).abs().max())
    row["forced_argmax_agreement"] = float(
        (alone_forced.argmax(-1) == want_logits.argmax(-1)).float().mean())
    row["near_ties"] = near_ties(ref, row["max_logit_difference"])
    result["palettes"]["fp16_alone"] = row
    print(f"correctness fp16_alone: {json.dumps(row)}", flush=True)
    for name in PALETTES:
        free, cached = engine_run(model, name, budget, prompts, new)
        tf = fp16_forced if name == "fp16" else engine_run(model, name, budget, prompts, new,
                                                           forced)[0]
        row = compare_free(ref, free, cached, new)
        tf_logits = torch.cat([lg for _, lg in tf])
        base = torch.cat([lg for _, lg in fp16_forced])
        if name == "fp16":
            row["max_logit_difference"] = float((tf_logits - want_logits).abs().max())
            row["forced_argmax_agreement"] = float(
                (tf_logits.argmax(-1) == want_logits.argmax(-1)).float().mean())
            row["near_ties"] = near_ties(ref, row["max_logit_difference"])
        else:
            row["forced_argmax_agreement_vs_fp16"] = float(
                (tf_logits.argmax(-1) == base.argmax(-1)).float().mean())
            row["mean_kl_vs_fp16"] = mean_kl(base, tf_logits)
        result["palettes"][name] = row
        print(f"correctness {name}: {json.dumps(row)}", flush=True)
    return result


# ---- speed ----

def make_backend(model, name, batch, context, timer):
    if name == "contiguous":
        return ContiguousKV(model, batch, context, timer)
    if name == "flashinfer":
        return FlashInferKV(model, batch * context, timer)
    # All of it in FP16 (prefill writes hot) plus room for the policy's colder copies.
    budget = kv_bytes_per_token(model) * batch * context * 1.75 + (1 << 30)
    return KvtierKV(make_cache(model, name, budget), model, timer)


def timed_steps(engine, steps, device):
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    sync(device)
    return time.perf_counter() - start


def profiled_steps(engine, steps, device):
    """Mean per-step milliseconds of each section over `steps` synchronised steps."""
    engine.timer.reset()
    engine.timer.enabled = True
    total = timed_steps(engine, steps, device)
    engine.timer.enabled = False
    ms = {k: 1e3 * v / steps for k, v in engine.timer.totals.items()}
    ms["python"] = 1e3 * total / steps - sum(ms.values())
    ms["step"] = 1e3 * total / steps
    return ms


def settle_policy(engine, device, most=256):
    """After prefill, EndStep alone (no decode, no new tokens) until the policy has nothing
    queued (an EndStep that adds no policy_demotion_failures) and no freed page awaits its
    fence, at most `most` times: the rest of the one-off demotion of the prompts (which the
    prefill step's own EndStep begins), kept out of the measured steps. Returns its EndSteps
    and seconds and the blocks demoted since the cache was made (the prefill step's EndStep
    and these), or None for the contiguous baseline."""
    if not isinstance(engine.kv, KvtierKV):
        return None
    cache = engine.kv.cache
    calls, settled = 0, False
    sync(device)
    start = time.perf_counter()
    while calls < most and not settled:
        failures = cache.stats()["policy_demotion_failures"]
        cache.end_step()
        sync(device)
        calls += 1
        stats = cache.stats()
        settled = (stats["policy_demotion_failures"] == failures and
                   stats["pages_pending_reclaim"] == 0)
    return {"end_steps": calls, "seconds": time.perf_counter() - start,
            "blocks_migrated": sum(m["blocks"] for m in cache.stats()["migrations"]),
            "settled": settled}


def kv_bytes(engine):
    if isinstance(engine.kv, ContiguousKV):
        return sum(t.numel() * t.element_size() for t in engine.kv.k + engine.kv.v)
    if isinstance(engine.kv, FlashInferKV):
        return sum(t.numel() * t.element_size() for t in engine.kv.pools)
    return engine.kv.cache.stats()["used_bytes"]


def speed_one(model, name, context, cfg):
    """Rows for one (backend, context): prefill max(batches) requests, let the policy settle,
    then decode at each batch size, largest first, cancelling requests in between. The timed
    and profiled windows are whole multiples of the block size (16 steps), so that each
    request's periodic demotion (a block leaves the hot window every 16 tokens, for every
    request at once since they are of equal length) is in each window exactly as often as in
    steady state."""
    device = model.device
    batches = sorted(cfg["batches"], reverse=True)
    steps = cfg["warmup"] + cfg["timed"] + cfg["profiled"]
    room = context + len(batches) * steps + 8
    timer = StepTimer(device)
    engine = Engine(model, backend=make_backend(model, name, batches[0], room, timer),
                    max_batch=batches[0], timer=timer)
    vocab = model.config.vocab_size
    ids = [engine.submit(random_tokens(context, vocab, 1000 + i), room - context)
           for i in range(batches[0])]
    start = time.perf_counter()
    engine.step()  # admits and prefills every request, then the first decode step
    sync(device)
    prefill_s = time.perf_counter() - start
    settle = settle_policy(engine, device)
    server = MetricsServer(engine)  # the Prometheus endpoint, live while the engine decodes
    rows = []
    for batch in batches:
        for rid in ids[batch:]:
            engine.cancel(rid)
        assert len(engine.running) == batch
        timed_steps(engine, cfg["warmup"], device)
        seconds = timed_steps(engine, cfg["timed"], device)
        row = {"backend": name, "context": context, "batch": batch,
               "tokens_per_s": batch * cfg["timed"] / seconds,
               "step_ms": 1e3 * seconds / cfg["timed"],
               "profiled_ms": profiled_steps(engine, cfg["profiled"], device),
               "kv_bytes": kv_bytes(engine), "prefill_s_all": prefill_s,
               "metrics_live": scrape_running(server) == batch, "policy_settle": settle}
        if name == "contiguous":
            row["sdpa_backend"] = engine.kv.sdpa_choice[batch]
            row["sdpa_probe_ms"] = engine.kv.sdpa_probe_ms[batch]
        elif name != "flashinfer":
            stats = engine.kv.cache.stats()
            row["effective_bits_per_element"] = stats["effective_bits_per_element"]
            row["policy_demotion_failures"] = stats["policy_demotion_failures"]
            row["formats"] = {f["name"]: f["blocks_in_use"] for f in stats["formats"]}
        rows.append(row)
        print(f"speed {json.dumps(row)}", flush=True)
    server.close()
    for rid in ids:
        engine.cancel(rid)
    return rows


def scrape_running(server):
    """The running-request count a scrape of the engine's /metrics reports."""
    url = f"http://127.0.0.1:{server.port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith('kvtier_engine_requests{state="running"}'):
                return int(line.split()[-1])
    return None


def flashinfer_missing():
    """None when FlashInfer's decode runs here, else why not (its rows are then skipped)."""
    try:
        import flashinfer  # noqa: F401
        return None
    except Exception as e:  # noqa: BLE001 (an import can fail in many ways)
        return f"{type(e).__name__}: {str(e)[:200]}"


def speed(model, cfg, deadline, only=None):
    """Rows of every speed case (or those named in `only`), contexts longest first."""
    rows = []
    missing = flashinfer_missing() if model.device.type == "cuda" else "CPU run"
    if missing:
        print(f"speed: no FlashInfer baseline ({missing})", flush=True)
    names = ["contiguous"] + ([] if missing else ["flashinfer"]) + list(PALETTES)
    for context in cfg["contexts"]:
        for name in [n for n in names if only is None or n in only]:
            if time.monotonic() > deadline:
                print(f"speed: skipped {name} at {context} (time limit)", flush=True)
                continue
            rows += speed_one(model, name, context, cfg)
            gc.collect()  # the case's cache or contiguous tensors go before the next is made
            if model.device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


# ---- capacity ----

def capacity_one(model, name, context, budget, max_steps=400):
    cache = make_cache(model, name, budget)
    engine = Engine(model, cache, max_batch=1 << 20)
    cold = cache.stats()["formats"][-1]["page_bytes"] / cache.block_tokens * model.num_layers
    offered = int(budget / (cold * context)) + 2
    vocab = model.config.vocab_size
    for i in range(offered):
        engine.submit(random_tokens(context, vocab, 5000 + i), 64)
    most, since = 0, 0
    for _ in range(max_steps):
        engine.step()
        if len(engine.running) > most:
            most, since = len(engine.running), 0
        else:
            since += 1
        if not engine.waiting or since >= 8:
            break
    stats = cache.stats()
    row = {"palette": name, "context": context, "budget_bytes": budget, "offered": offered,
           "most_running": most, "tokens": most * context, "steps": engine.steps,
           "preemptions": sum(r.preemptions for r in engine.results.values()),
           "effective_bits_per_element": stats["effective_bits_per_element"],
           "policy_demotion_failures": stats["policy_demotion_failures"]}
    for rid in list(engine.running) + list(engine.waiting):
        engine.cancel(rid)
    print(f"capacity {json.dumps(row)}", flush=True)
    return row


def capacity(model, cfg, deadline):
    rows = []
    for context in cfg["capacity_contexts"]:
        for name in PALETTES:
            if time.monotonic() > deadline:
                print(f"capacity: skipped {name} at {context} (time limit)", flush=True)
                continue
            rows.append(capacity_one(model, name, context, cfg["capacity_budget"]))
    return rows


# ---- the run and the tables ----

def write(path, result):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, path)


def run(args):
    device = torch.device(args.device)
    # Every decode step's length is new, and cuDNN's SDPA builds a graph per new length unless
    # it takes its ragged path (read when SDPA first runs): the baseline's backend probe then
    # times cuDNN at its best.
    os.environ.setdefault("TORCH_CUDNN_SDPA_AVOID_RECOMPILE", "1")
    cfg = dict((SMOKE if device.type == "cuda" else CPU_SMOKE) if args.smoke else FULL)
    if args.layers:
        cfg["layers"] = args.layers
    geometry = dict(LLAMA8B_GEOMETRY if device.type == "cuda" else TINY, layers=cfg["layers"])
    geometry["max_positions"] = max(cfg["contexts"] + cfg["capacity_contexts"]) + 1024
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    hf = random_llama(llama_config(**geometry), seed=args.seed, dtype=dtype, device=device)
    model = LlamaCompute(hf)
    deadline = time.monotonic() + args.time_limit
    result = {"config": dict(cfg, geometry=geometry, dtype=str(dtype), seed=args.seed,
                             device=torch.cuda.get_device_name(device)
                             if device.type == "cuda" else "cpu",
                             torch=torch.__version__,
                             cudnn_sdpa_avoid_recompile=os.environ[
                                 "TORCH_CUDNN_SDPA_AVOID_RECOMPILE"],
                             transformers=__import__("transformers").__version__,
                             flashinfer=flashinfer_missing() or
                             __import__("flashinfer").__version__
                             if device.type == "cuda" else None)}
    for section in args.sections.split(","):
        start = time.monotonic()
        with torch.inference_mode():
            if section == "correctness":
                c_hf, c_model, prompts, info = correctness_model(args, cfg, hf, model, device)
                result[section] = correctness(c_hf, c_model, cfg, prompts, info)
                del c_hf, c_model
            elif section == "speed":
                result[section] = speed(model, cfg, deadline,
                                        args.backends.split(",") if args.backends else None)
            elif section == "capacity":
                result[section] = capacity(model, cfg, deadline)
            else:
                raise SystemExit(f"unknown section {section}")
        result.setdefault("seconds", {})[section] = time.monotonic() - start
        write(args.out, result)
        print(f"{section}: done in {time.monotonic() - start:.1f} s; wrote {args.out}", flush=True)


def md_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def fmt(value, spec):
    return "-" if value is None else format(value, spec)


def tables(result):
    out = []
    c = result.get("correctness")
    if c:
        rows = []
        for name, r in c["palettes"].items():
            ties = r.get("near_ties")
            rows.append([name, f"{sum(r['identical'])}/{len(r['identical'])}",
                         ", ".join(fmt(x, "d") for x in r["first_difference"]),
                         ", ".join(fmt(x, ".4f") for x in r["top2_gap_at_first_difference"]),
                         ", ".join(fmt(x, ".4f") for x in
                                   r.get("engine_top2_gap_at_first_difference", [])),
                         ", ".join(fmt(x, ".4f") for x in
                                   r.get("logit_difference_at_first_difference", [])),
                         f"{sum(r['token_agreement']) / len(r['token_agreement']):.3f}",
                         fmt(r.get("max_logit_difference"), ".4f"),
                         fmt(r.get("forced_argmax_agreement",
                                   r.get("forced_argmax_agreement_vs_fp16")), ".4f"),
                         fmt(r.get("mean_kl_vs_fp16"), ".2e"),
                         f"{ties['gaps_within_max_logit_difference']}/{ties['positions']}"
                         if ties else "-"])
        m = c.get("model", {"model": "random"})
        model = ("the random speed model, random prompts" if m["model"] == "random" else
                 f"the byte-level Llama trained {m['steps']} steps ({m['seconds']:.0f} s, "
                 f"{m['tokens'] / 1e6:.0f}M bytes, final loss {m['loss']:.2f} nats/byte) "
                 "on the standard library's source, prompts cut from it")
        out.append(f"Correctness ({model}): prompts of {c['prompts']} tokens, "
                   f"{c['new_tokens']} new tokens each, against transformers' generate()\n\n" +
                   md_table(
                       ["palette", "identical", "first difference", "top-2 gap there",
                        "engine's top-2 gap there", "logit diff there", "token agreement",
                        "max logit diff (forced)", "argmax agreement (forced)",
                        "mean KL vs FP16", "near ties"], rows) +
                   "\n\nnear ties: generate()'s positions whose top-2 logit gap is at most the "
                   "largest logit difference (forced), of all positions.")
    s = result.get("speed")
    if s:
        base = {(r["context"], r["batch"]): r["tokens_per_s"] for r in s
                if r["backend"] == "contiguous"}
        rows = []
        for r in s:
            p = r["profiled_ms"]
            speedup = r["tokens_per_s"] / base[(r["context"], r["batch"])] if (
                r["context"], r["batch"]) in base else float("nan")
            label = r["backend"] + (f" ({r['sdpa_backend']})" if "sdpa_backend" in r else "")
            rows.append([label, r["context"], r["batch"], f"{r['tokens_per_s']:.0f}",
                         f"{speedup:.2f}", f"{r['step_ms']:.2f}"] +
                        [f"{p[k]:.2f}" for k in SECTIONS] +
                        [f"{100 * p['attention'] / p['step']:.0f}%",
                         f"{r['kv_bytes'] / 2**30:.2f}"])
        out.append("Decode speed (ms per step; sections from synchronised profiled steps)\n\n" +
                   md_table(["backend", "context", "batch", "tokens/s", "vs contiguous",
                             "step ms"] + list(SECTIONS) + ["attention share", "KV GiB"], rows))
        settles = {(r["backend"], r["context"]): r["policy_settle"] for r in s
                   if r.get("policy_settle")}
        if settles:
            out.append("One-off demotion of the prefilled prompts: EndStep alone after the "
                       "prefill step until the policy has nothing queued, before the measured "
                       "steps (blocks: demoted since the case began)\n\n" + md_table(
                           ["palette", "context", "EndSteps", "ms", "blocks demoted", "settled"],
                           [[b, c, x["end_steps"], f"{1e3 * x['seconds']:.1f}",
                             x["blocks_migrated"], x["settled"]]
                            for (b, c), x in settles.items()]))
    cap = result.get("capacity")
    if cap:
        rows = [[r["palette"], r["context"], f"{r['budget_bytes'] / 2**30:.2f}",
                 r["most_running"], r["tokens"], f"{r['effective_bits_per_element']:.2f}",
                 r["preemptions"], r["steps"], r["policy_demotion_failures"]] for r in cap]
        out.append("Capacity at a fixed budget\n\n" + md_table(
            ["palette", "context", "budget GiB", "requests held", "tokens", "bits/element",
             "preemptions", "steps", "demotion failures (block-steps)"], rows))
    return "\n\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="the JSON to write")
    p.add_argument("--tables", metavar="JSON", help="print docs/engine.md's tables of a result")
    p.add_argument("--smoke", action="store_true", help="a reduced run")
    p.add_argument("--device", default="cuda")
    p.add_argument("--layers", type=int, default=0, help="decoder layers (default 4; smoke 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sections", default="correctness,speed,capacity")
    p.add_argument("--train-steps", type=int, default=None,
                   help="train the correctness model for this many steps (kvtier_engine.train; "
                        "about 20 s on the H200); 0: the random speed model. Default: 400 on "
                        "CUDA, 0 on the CPU")
    p.add_argument("--backends", default=None,
                   help="comma-separated speed cases to run (contiguous, flashinfer, fp16, fp8, "
                        "balanced). Default: all")
    p.add_argument("--time-limit", type=float, default=420,
                   help="seconds after which speed and capacity cases are skipped")
    args = p.parse_args()
    if args.train_steps is None:
        args.train_steps = 400 if args.device.startswith("cuda") and not args.smoke else 0
    if args.tables:
        with open(args.tables) as f:
            print(tables(json.load(f)))
    elif args.out:
        run(args)
    else:
        p.error("give --out or --tables")


if __name__ == "__main__":
    main()
