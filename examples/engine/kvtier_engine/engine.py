"""A continuous-batching serving loop for a Llama model whose only KV cache is kvtier.

    engine = Engine(LlamaCompute(model), kvtier.Cache(...))  # or backend=ContiguousKV(...)
    rid = engine.submit(prompt_tokens, max_new_tokens=64)    # greedy; temperature/seed to sample
    while engine.busy():
        engine.step()                                        # admit + prefill, decode, EndStep
    engine.results[rid].tokens

Each step: waiting requests are admitted (up to `max_batch` running, and while the backend has
room for the prompt beyond its reserve, `room_for`) and prefilled one by one:
the cache attaches the longest cached prefix of the prompt (prefix sharing, AddSequence with
the prompt's tokens), the rest of the prompt is appended with its token ids (so that its full
blocks become shareable) and written layer by layer, prefill attention being transformers'
SDPA over the cached prefix (read back from the cache) and the new tokens. Then every running
request decodes one token: one AppendBatch for the batch, one PreparedDecode for every layer,
kvtier's decode attention per layer, sampling, and EndStep (the precision policy). Requests
that finish leave the batch; their blocks stay cached for later prompts.

Errors: `submit` raises RequestError (a ValueError) for an empty prompt, a request the budget
can never hold, or bad sampling arguments, and leaves everything else as it was. A decode step
that finds the budget full preempts the most recently admitted request (released, and requeued
with its generated tokens as part of its prompt). A request alone in the cache (or on the
device) that still does not fit fails (`Request.error`), as does one whose prefill raises
(the error is raised too; the requests behind it are admitted at the next step). `cancel` ends
a request at any time.
"""
import contextlib
import dataclasses
import math
import numbers
import operator
import time

import torch

from .backends import KvtierKV, RequestError


def _token_ids(name, ids):
    """The token ids as ints; RequestError when one is not an integer (3.7 was cut to 3)."""
    try:
        return [operator.index(t) for t in ids]
    except TypeError:
        raise RequestError(f"{name} token ids must be integers") from None


@dataclasses.dataclass
class Request:
    prompt: list
    max_new_tokens: int
    temperature: float = 0.0          # 0: greedy
    top_k: int = 0                    # 0: the whole vocabulary
    seed: int = 0                     # sampling seed (torch.Generator per request)
    forced: list = None               # teacher forcing: feed these tokens instead of sampling
    record_logits: bool = False       # keep each next-token distribution's logits (float32)
    tokens: list = dataclasses.field(default_factory=list)
    logits: list = dataclasses.field(default_factory=list)
    cached_tokens: int = 0            # prompt tokens found in the cache at admission
    preemptions: int = 0
    done: bool = False
    error: str = None                 # why it failed after submit (no room, a prefill raised)


class StepTimer:
    """Per-section wall time of engine steps. Disabled (the default) it costs a context manager
    per call. Enabled, each section is bracketed by device synchronisations, so that its time is
    its own host and device work; the step total minus the sections is the Python in between.
    Thread-safety: none."""

    SECTIONS = ("attention", "append", "page_tables", "policy", "model")

    def __init__(self, device=None):
        self.enabled = False
        self.sync = (lambda: torch.cuda.synchronize(device)) if (
            device is not None and torch.device(device).type == "cuda") else (lambda: None)
        self.totals = dict.fromkeys(self.SECTIONS, 0.0)

    @contextlib.contextmanager
    def __call__(self, name):
        if not self.enabled:
            yield
            return
        self.sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            self.totals[name] += time.perf_counter() - start

    def reset(self):
        self.totals = dict.fromkeys(self.SECTIONS, 0.0)


class Engine:
    """The serving loop (see the module docstring). Thread-safety: none; one thread drives it."""

    def __init__(self, model, cache=None, backend=None, max_batch=64, timer=None):
        """REQUIRES: exactly one of `cache` (a kvtier.Cache for this model: same layer count,
        KV heads and head_dim, else ValueError naming both) and `backend`; max_batch >= 1."""
        if operator.index(max_batch) < 1:
            raise ValueError(f"max_batch must be at least 1, not {max_batch}")
        self.model = model
        self.timer = timer or StepTimer(model.device)
        if (cache is None) == (backend is None):
            raise ValueError("give the engine a kvtier.Cache or a backend, not both or neither")
        self.kv = backend if backend is not None else KvtierKV(cache, model, self.timer)
        self.max_batch = max_batch
        self.waiting = []   # request ids, in arrival order
        self.running = {}   # request id -> cache handle, in admission order
        self.results = {}   # request id -> Request
        self._next_id = 0
        self.steps = 0
        self.tokens_total = 0       # tokens emitted, for /metrics (results may be pruned)
        self.preemptions_total = 0

    # ---- Requests ----

    def submit(self, prompt, max_new_tokens, temperature=0.0, top_k=0, seed=0, forced=None,
               record_logits=False):
        """Queues a request; returns its id. RequestError (nothing queued) for an empty prompt,
        a max_new_tokens that is not an integer >= 1, a temperature that is negative or not
        finite, a top_k or seed that is not an integer (top_k also negative), forced tokens
        fewer than max_new_tokens, token ids (prompt or forced) that are not integers or lie
        outside the vocabulary, or a request longer than the budget can ever hold."""
        prompt = _token_ids("prompt", prompt)
        vocab = self.model.config.vocab_size
        if not prompt:
            raise RequestError("the prompt has 0 tokens: a request needs at least one")
        if not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens < 1:
            raise RequestError(f"max_new_tokens must be an integer >= 1, not {max_new_tokens!r}")
        max_new_tokens = int(max_new_tokens)
        if not isinstance(temperature, numbers.Real) or not math.isfinite(temperature) \
                or temperature < 0:
            raise RequestError(f"temperature must be a finite number >= 0, not {temperature!r}")
        if not isinstance(top_k, numbers.Integral) or top_k < 0:
            raise RequestError(f"top_k must be an integer >= 0 (0: the whole vocabulary), "
                               f"not {top_k!r}")
        if not isinstance(seed, numbers.Integral):
            raise RequestError(f"seed must be an integer, not {seed!r}")
        temperature, top_k, seed = float(temperature), int(top_k), int(seed)
        if forced is not None:
            forced = _token_ids("forced", forced)
            if len(forced) < max_new_tokens:
                raise RequestError("forced must hold max_new_tokens tokens")
            if min(forced) < 0 or max(forced) >= vocab:
                raise RequestError(f"forced token ids must be in [0, {vocab})")
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise RequestError(f"prompt token ids must be in [0, {vocab})")
        self.kv.check(len(prompt), max_new_tokens)
        rid = self._next_id
        self._next_id += 1
        self.results[rid] = Request(prompt, max_new_tokens, temperature, top_k, seed, forced,
                                    record_logits)
        self.waiting.append(rid)
        return rid

    def cancel(self, rid):
        """Ends request rid now (a client went away): released if running, dropped if waiting;
        its tokens so far stay in results. KeyError for an unknown id; a finished one is left."""
        req = self.results[rid]
        if rid in self.running:
            self.kv.release(self.running.pop(rid))
        elif rid in self.waiting:
            self.waiting.remove(rid)
        req.done = True

    def busy(self):
        return bool(self.waiting or self.running)

    def run(self):
        """Steps until every request has finished; returns the results."""
        while self.busy():
            self.step()
        return self.results

    # ---- One step ----

    @torch.inference_mode()
    def step(self):
        self._admit()
        if self.running:
            self._decode()
        self.kv.end_step()
        self.steps += 1

    def _admit(self):
        while self.waiting and len(self.running) < self.max_batch:
            rid = self.waiting[0]
            req = self.results[rid]
            context = req.prompt + req.tokens  # a preempted request resumes after its tokens
            if self.running and not self.kv.room_for(len(context), len(self.running)):
                return  # keep the reserve free for the policy; retried next step
            try:
                h, cached = self.kv.add(context)
                try:
                    choice = self._choose(rid, self._prefill(h, context, cached))
                except BaseException:  # any failure: the sequence is not kept half-admitted,
                    self.kv.abandon(h)     # nor the prefix blocks it could not write matched
                    raise
            except (MemoryError, torch.OutOfMemoryError) as e:
                if self.running:
                    return  # retried when running requests finish
                self.waiting.pop(0)  # alone and still too large: it fails
                where = "cache" if isinstance(e, MemoryError) else "device"
                req.error, req.done = f"does not fit the {where}: {e}", True
                continue
            except Exception as e:  # fails alone, so that it is not retried first at every step
                self.waiting.pop(0)
                req.error, req.done = f"prefill failed: {type(e).__name__}: {e}", True
                raise
            self.waiting.pop(0)
            if not req.tokens:
                req.cached_tokens = cached
            self.running[rid] = h
            self._emit(rid, choice)

    def _prefill(self, h, tokens, cached):
        """Computes tokens[cached:] into the cache; returns the last position's logits [1, V]."""
        m = self.model
        new = tokens[cached:]
        slots = self.kv.append([h], [len(new)], new)
        with self.timer("model"):
            ids = torch.tensor(new, device=m.device)
            hidden = m.embed(ids)
            rope = m.rope(hidden, torch.arange(cached, len(tokens), device=m.device))
        for layer in range(m.num_layers):
            with self.timer("model"):
                q, k, v = m.qkv(layer, hidden, rope)
            self.kv.write(layer, slots, k, v)
            with self.timer("model"):
                # Attend the chunk's K/V as the cache holds them in its hot format (FP16), so
                # that a prompt gives the same result whether its prefix was cached or not.
                k, v = k.to(torch.float16).to(m.dtype), v.to(torch.float16).to(m.dtype)
                if cached:
                    pk, pv = self.kv.prefix_kv(h, layer, cached)
                    k, v = torch.cat([pk, k]), torch.cat([pv, v])
                out = m.prefill_attention(layer, q, k, v, cached)
                hidden = m.finish_layer(layer, hidden, out)
        with self.timer("model"):
            return m.logits(hidden[-1:])

    def _decode(self):
        rids = list(self.running)
        while True:
            handles = [self.running[r] for r in rids]
            feed = [self.results[r].tokens[-1] for r in rids]
            try:
                slots = self.kv.append(handles, [1] * len(rids), feed)
                break
            except MemoryError as e:
                if len(rids) == 1:  # alone in the cache and still too large: it fails
                    req = self.results[rids[0]]
                    self.kv.release(self.running.pop(rids[0]))
                    req.error, req.done = f"does not fit the cache: {e}", True
                    return
                self._preempt(rids.pop())
        try:
            logits, greedy = self._decode_layers(rids, handles, feed, slots)
            choices = [self._choose(r, logits[i:i + 1], greedy[i]) for i, r in enumerate(rids)]
        except BaseException:  # the new token's K/V may be in some layers only, and no request
            for rid in reversed(rids):  # has its token: the sequences are abandoned (no block
                with contextlib.suppress(Exception):  # they filled stays indexed) and the
                    self._preempt(rid, abandon=True)  # requests resume from their tokens; the
            raise                                     # step's own error is the one raised
        for rid, choice in zip(rids, choices):
            self._emit(rid, choice)

    def _decode_layers(self, rids, handles, feed, slots):
        """The model over the step's tokens, whose slots the cache appended; returns the logits
        [len(rids), V] and their argmax per request (a device failure surfaces by then)."""
        m = self.model
        step = self.kv.prepare(handles)
        with self.timer("model"):
            positions = torch.tensor(
                [len(self.results[r].prompt) + len(self.results[r].tokens) - 1 for r in rids],
                device=m.device)
            hidden = m.embed(torch.tensor(feed, device=m.device))
            rope = m.rope(hidden, positions)
        for layer in range(m.num_layers):
            with self.timer("model"):
                q, k, v = m.qkv(layer, hidden, rope)
            self.kv.write(layer, slots, k, v)
            out = self.kv.attend(layer, step, q)
            with self.timer("model"):
                hidden = m.finish_layer(layer, hidden, out)
        del step  # its device copy is freed on the stream, after this step's launches
        with self.timer("model"):
            logits = m.logits(hidden)
            return logits, logits.argmax(-1).tolist()  # one device synchronisation

    def _choose(self, rid, logits, greedy=None):
        """Request rid's next token from `logits` [1, V] (`greedy`: its argmax, when known), and
        the logits to record (None unless recorded), changing nothing: whatever raises here
        (a sampling or device error) leaves the request as it was."""
        req = self.results[rid]
        recorded = logits[0].cpu() if req.record_logits else None
        if req.forced is not None:
            token = req.forced[len(req.tokens)]
        elif req.temperature == 0 and greedy is not None:
            token = greedy
        else:
            token = sample(logits[0], req, len(req.tokens))
        return int(token), recorded

    def _emit(self, rid, choice):
        """Gives request rid its token (a _choose result); finishes the request when done."""
        req = self.results[rid]
        token, recorded = choice
        if recorded is not None:
            req.logits.append(recorded)
        req.tokens.append(token)
        self.tokens_total += 1
        if len(req.tokens) >= req.max_new_tokens:
            req.done = True
            self.kv.release(self.running.pop(rid))

    def _preempt(self, rid, abandon=False):
        """Puts running request rid first in the queue, its sequence released (abandoned: with
        the blocks it filled this step withdrawn from the prefix index)."""
        req = self.results[rid]
        req.preemptions += 1
        self.preemptions_total += 1
        self.waiting.insert(0, rid)  # first, so that a failing release cannot lose the request
        h = self.running.pop(rid)
        if abandon:
            self.kv.abandon(h)
        else:
            self.kv.release(h)


def sample(logits, req, index):
    """Greedy when req.temperature is 0; otherwise softmax(logits / temperature) over the top_k,
    drawn with a generator seeded by (req.seed, index), so that a request's tokens depend only on
    its seed and its logits, not on the batch it ran in."""
    if req.temperature == 0:
        return int(torch.argmax(logits))
    scaled = logits.float() / req.temperature
    if req.top_k:
        kth = torch.topk(scaled, min(req.top_k, scaled.numel())).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1).cpu()
    gen = torch.Generator().manual_seed((req.seed * 1000003 + index) % (1 << 64))
    return int(torch.multinomial(probs, 1, generator=gen))
