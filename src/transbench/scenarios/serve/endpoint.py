"""One serve cell against an HTTP endpoint (`serve --url`): the same plan as in-process serving (arrivals, lengths,
warm-up, closed loops), prompts of the planned lengths, the requests through http_client, then the accounting and,
with a reference folder, a correctness check on a sample of the answers.

Failed requests are never dropped from the figures. Each latency percentile ranks a failed request as slower than
every answered one: where a percentile falls on failures it is not reported (empty), and `error_rate` and the
counts by kind (`failures` in the cell's info) say why. Goodput counts a failed request as missing any target, and
the max-rate search takes such a percentile for a missed target. A server that refuses work fast never looks faster
for it."""

from __future__ import annotations

import math
from collections import Counter

from ...cells import CellResult
from ...measure.timer import carried
from .cell import ServeCell
from .http_client import MAX_IN_FLIGHT, QUIET_S, HttpTrace, Sent, payload, run_http_load
from .measure import plan_for
from .prompts import WordTokenizer, local_tokenizer, make_prompts
from . import tails
from .stats import DEFAULT_PERCENTILES, STORED, name, percentile, token_figures, within

# The client fell behind when its send lag's p99 passes the larger of these: a fixed floor (the event loop sleeps
# in whole milliseconds) and a share of the mean gap between planned arrivals (a lag that size reshapes the
# offered arrival process itself).
LAG_FLOOR_MS = 1.0
LAG_GAP_SHARE = 0.1
REFERENCE_SAMPLE = 8  # answered requests checked against the reference
MIN_COSINE = 0.99  # an embedding this far from the fp32 reference's is wrong (fp16/bf16 stay above 0.999)
MIN_FIRST_AGREEMENT = 0.5  # greedy completions: a share of first tokens below this against fp32 is wrong


def asked(plan, rid: int, new_tokens: int) -> int:
    """The tokens request `rid` asks for: a trace's output_length, at most --new-tokens, as in-process serving decodes
    it (load.Request.output); else --new-tokens. Every request of a trace asked for --new-tokens (32 by default)."""
    return min(plan.outputs[rid % len(plan.outputs)], new_tokens) if plan.outputs else new_tokens


def tokenizer_for(cell: ServeCell):
    return local_tokenizer(cell.tokenizer, cell.reference_model)


def _failed_percentile(ok_ms: list[float], failed: int, q: float) -> float | None:
    """The q-th percentile with failed requests ranked last; None where it falls on (or between) failures, or where
    the requests are too few to carry it (timer.carried)."""
    n = len(ok_ms) + failed
    if not n or not carried(q / 100, n):
        return None
    value = percentile(ok_ms + [math.inf] * failed, q) if ok_ms else math.inf
    return None if math.isinf(value) or math.isnan(value) else value


def _tokens(r) -> int:
    """An answer's tokens: its usage count (http_client._usage has checked it is one), else its events (fill_counts
    sets the count of an answer not streamed before the accounting)."""
    return r.completion_tokens if r.completion_tokens is not None else len(r.steps)


def _reasoning(r) -> int:
    """Of a streamed answer's tokens, its reasoning's: usage.completion_tokens_details.reasoning_tokens, else its events
    that carried reasoning alone (a reasoning token is an output token: _tokens counts it too)."""
    return r.reasoning_tokens if r.reasoning_tokens is not None else r.reasoning_events


def _tpot_ms(r) -> float | None:
    """(end to end - TTFT) / (tokens - 1) of a streamed answer; None for one token, none streamed, or an answer not
    streamed (http_client._whole): its tokens all came at once, and 0 ms a token would flatter the server."""
    count = _tokens(r)
    return (r.done - r.steps[0]) * 1e3 / (count - 1) if r.steps and r.streamed and count > 1 else None


def _meets(r, objectives: dict[str, float]) -> bool:
    """Whether an answered request meets every objective (ms), judged as an in-process one (stats.within)."""
    ttft = (r.steps[0] - r.arrival) * 1e3 if r.steps else None
    return within(objectives, (r.done - r.arrival) * 1e3, ttft, _tpot_ms(r))


def account(trace: HttpTrace, slo_ms: float | None, offered_rate: float | None, tail_share: float = 0.99, *,
            objectives: dict[str, float] | None = None, percentiles=DEFAULT_PERCENTILES) -> tuple:
    """(record, latency samples of the answered requests in ms, info), requests arriving in the warm-up left out.
    The same figures as in-process serving (stats.account): the `percentiles` asked with LoadGen's early-stopping
    estimate of each, goodput against every objective ({ttft, tpot, e2e: ms}; `slo_ms` is the e2e one) and its
    verdict at `tail_share`; a failed request ranks after every answered one and misses every objective."""
    objectives = {**(objectives or {}), **({"e2e": slo_ms} if slo_ms is not None else {})}
    w = trace.plan.warmup_s
    reqs = sorted((r for r in trace.requests if r.arrival >= w), key=lambda r: r.arrival)
    n = len(reqs)
    if not n:
        return {"requests": 0}, [], {}
    ok = [r for r in reqs if r.ok]
    lat_ok = [(r.done - r.arrival) * 1e3 for r in ok]
    failed = n - len(ok)
    last = max(max((r.done for r in reqs), default=trace.end), trace.plan.span_s)
    # The rates' span opens at the warm-up's end for a planned load: a request that arrived in a stall was offered
    # and waited. A closed loop offers nothing while every client waits on its warm-up request: its span opens at
    # its first measured request, when a client was free to send it. Opened at the warm-up's end, an endpoint that
    # stalled its first seconds (graphs captured under load) left them in the offline probe's rate: 52/s against
    # the 1,000/s it answered after (a 1.2 s stall), and the max-rate search began from that.
    start = w if trace.plan.arrivals is not None else reqs[0].arrival
    span = max(last - start, 1e-9)
    rec = {"requests": n, "failed": failed, "error_rate": failed / n, "achieved_rate": len(ok) / span,
           "rate_from_s": start, "offered_rate": offered_rate}
    chosen = sorted(set(percentiles))
    rec.update({f"latency_{name(q)}_ms": _failed_percentile(lat_ok, failed, q) for q in sorted(set(STORED) | set(chosen))})
    ranked = lat_ok + [math.inf] * failed
    for q in chosen:  # LoadGen's estimate; empty where it falls on a failed request (or below its minimum count)
        est = tails.upper_estimate(ranked, q / 100)
        rec[f"latency_{name(q)}_upper_ms"] = None if est is None or math.isinf(est) else est
    rec.update(latency_max_ms=max(lat_ok) if lat_ok and not failed else None,
               latency_mean_ms=sum(lat_ok) / len(lat_ok) if lat_ok and not failed else None)
    rec.update(latency_ms=rec["latency_p50_ms"], n_samples=n)
    # LoadGen's early-stopping verdict (tails.verdict), as in-process serving judges (stats.account): a failed
    # request misses the target, and too few requests for the percentile make the verdict not valid, never met
    need = tails.min_requests(tail_share)
    rec.update(n_requests=n, tail_percentile=tail_share * 100, tail_min_requests=need,
               tail_valid=n >= need)
    if objectives:
        good = sum(1 for r in ok if _meets(r, objectives))
        valid, met = tails.verdict(n, n - good, tail_share)
        rec.update(goodput=good / n, goodput_rate=good / span, slo_misses=n - good,
                   slo_allowed_misses=tails.allowed_overs(n, tail_share), tail_valid=valid, slo_met=met)
        if "e2e" in objectives:
            rec["slo_ms"] = objectives["e2e"]
    streamed = [r for r in ok if r.steps]
    if streamed:
        # TTFT and TPOT per request, failures ranked last; the gaps between tokens are the answered streams' own
        # (a failure has no place among them), and tokens_per_s the tokens that arrived in answered requests
        gaps = [(b - a) * 1e3 for r in streamed for a, b in zip(r.steps, r.steps[1:])]
        tpot = [t for t in map(_tpot_ms, streamed) if t is not None]
        rec.update(token_figures([(r.steps[0] - r.arrival) * 1e3 for r in streamed] + [math.inf] * failed,
                                 tpot + [math.inf] * failed if tpot else [], gaps, chosen))
        counts = [_tokens(r) for r in streamed]
        rec.update(tokens_per_s=sum(counts) / span, completion_tokens_mean=sum(counts) / len(counts))
        thoughts = [_reasoning(r) for r in streamed]
        if any(thoughts):  # a reasoning model's: how many of the output tokens counted above were its reasoning
            rec["reasoning_tokens_mean"] = sum(thoughts) / len(thoughts)
    prompts = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    rec["prompt_tokens_mean"] = sum(prompts) / len(prompts) if prompts else None
    info = {"failures": dict(Counter(r.status for r in reqs if not r.ok)), "measured_span_s": span,
            "warmup_requests": len(trace.requests) - n, "connections": trace.pool,
            "peak_in_flight": trace.peak_in_flight, "connection_waits": trace.waited,
            "not_sent": trace.unsent}
    whole = sum(1 for r in ok if not r.streamed)
    if whole:  # answers sent as one JSON body (http_client._whole): their TTFT is the whole answer's time
        info["not_streamed"] = whole
    errors = [r for r in reqs if not r.ok]
    if errors:
        info["first_errors"] = [f"{r.status}: {r.error}"[:200] for r in errors[:5]]
    if trace.plan.arrivals is not None:
        lags = [(r.sent - r.arrival) * 1e3 for r in reqs if r.sent is not None]  # as every figure: after warm-up
        if lags:
            rec.update(client_lag_p50_ms=percentile(lags, 50), client_lag_p99_ms=percentile(lags, 99),
                       client_lag_max_ms=max(lags))
    return rec, lat_ok, info


def _text_tokens(tokenizer, text: str) -> int:
    """The tokens of a completion's text: through the local tokenizer without its special tokens (a model's [CLS] is
    no generated token), else a word a token, as synthetic prompts count (prompts.WordTokenizer); at least one, as
    the text is not empty (http_client._whole)."""
    if tokenizer is not None and not isinstance(tokenizer, WordTokenizer):
        return max(1, len(tokenizer.tok(text, add_special_tokens=False)["input_ids"]))
    return max(1, len(text.split()))


def fill_counts(trace: HttpTrace, prompts, tokenizer) -> str:
    """Token counts the endpoint did not report (`usage`): a prompt's through the local tokenizer (or its planned
    length: synthetic words are a token each where no tokenizer is given), a completion's as its streamed events, or
    where it was not streamed (http_client._whole), as its text's tokens (_text_tokens). Returns where the counts came
    from. `prompts[rid]`: request rid's prompt (prompts.Prompts)."""
    answered = [r for r in trace.requests if r.ok]
    missing_prompt = [r for r in answered if r.prompt_tokens is None]
    missing_completion = [r for r in answered if r.steps and r.completion_tokens is None]
    for r in missing_prompt:  # each request's own prompt: no two are the same
        r.prompt_tokens = len(tokenizer.encode(prompts[r.rid])) if tokenizer is not None else r.length
    for r in missing_completion:
        r.completion_tokens = len(r.steps) if r.streamed else _text_tokens(tokenizer, r.uncounted or "")
    for r in trace.requests:  # counted: the text is not kept past the load's first answers (r.text)
        r.uncounted = None
    if not missing_prompt and not missing_completion:
        return "usage"
    parts = []
    if missing_prompt:
        parts.append("prompts: " + ("the local tokenizer" if tokenizer is not None else "planned words"))
    if any(r.streamed for r in missing_completion):
        parts.append("completions: streamed events")
    if any(not r.streamed for r in missing_completion):
        local = tokenizer is not None and not isinstance(tokenizer, WordTokenizer)
        parts.append("completions not streamed: their text through " + ("the local tokenizer" if local else
                                                                         "words"))
    return "usage where given; " + ", ".join(parts)


def lag_warning(rec: dict, plan) -> str | None:
    """A warning when the client sent its requests later than planned by more than the threshold."""
    lag = rec.get("client_lag_p99_ms")
    if lag is None or not plan.arrivals or len(plan.arrivals) < 2:
        return None
    gap_ms = (plan.arrivals[-1] - plan.arrivals[0]) / (len(plan.arrivals) - 1) * 1e3
    limit = max(LAG_FLOOR_MS, LAG_GAP_SHARE * gap_ms)
    if lag <= limit:
        return None
    return (f"the client fell behind: its send lag p99 was {lag:.2f} ms (max {rec['client_lag_max_ms']:.2f} ms), "
            f"over {limit:.2f} ms (the larger of {LAG_FLOOR_MS:g} ms and {LAG_GAP_SHARE:.0%} of the mean gap): the "
            "offered load was not the planned one; run the client on a less busy machine or lower the rate")


def stretch_warning(stretch: dict | None, window_s: float) -> str | None:
    """What a closed loop did past its window (http_client.past_window): went on until the cell's minimum of requests
    was measured, or stopped short of it, and why."""
    if not stretch:
        return None
    need, got, past = stretch["need"], stretch["measured"], stretch["sent_past"]
    went = (f"went on past its {window_s:g} s window to {stretch['ended_s']:.1f} s ({past:,} requests more)"
            if past else "")
    if stretch["why"] == "measured":
        return f"the closed loop {went} until {need:,} requests were measured, the cell's minimum"
    why = {"silent": "no request was answered", "quiet": f"no request had been answered for {QUIET_S:g} s",
           "limit": "a request's --request-timeout would outlast what --timeout leaves"}[stretch["why"]]
    return (f"the closed loop measured {got:,} of the {need:,} requests the cell asks for: "
            + (f"it {went}, then stopped: " if past else "it stopped at its window's end: ") + why)


def reference_check(cell: ServeCell, trace: HttpTrace, tokenizer) -> tuple[dict, str | None]:
    """(record entries, why the cell is wrong or None): the first answered requests' outputs against the fp32
    reference of the --reference-model folder (embeddings: cosine; completions: greedy token agreement)."""
    import torch
    from transformers import AutoModel, AutoModelForCausalLM

    sample = [r for r in trace.requests if r.ok and (r.embedding is not None or r.text)][:REFERENCE_SAMPLE]
    if not sample:
        return {"reference_checked": 0}, "no answered request was kept for the reference check"
    tok = tokenizer or WordTokenizer(_vocab(cell.reference_model))
    prompts = {r.rid: p for r, p in zip(sample, _prompts_of(cell, [r.rid for r in sample], tokenizer))}
    if cell.api == "openai-embeddings":
        model = AutoModel.from_pretrained(cell.reference_model, torch_dtype=torch.float32).eval()
        cosines = []
        for r in sample:
            ids = torch.tensor([tok.encode(prompts[r.rid])])
            with torch.inference_mode():
                hidden = model(input_ids=ids).last_hidden_state[0]
            got = torch.tensor(r.embedding, dtype=torch.float32)
            if got.shape != hidden.shape[-1:]:  # another model's vectors
                cosines.append(-1.0)
                continue
            # the endpoint's pooling is its own (mean, or the first token's): the closer of the two is its match
            cosines.append(max(float(torch.nn.functional.cosine_similarity(got, ref, dim=0))
                               for ref in (hidden.mean(0), hidden[0])))
        worst = min(cosines)
        out = {"reference_checked": len(sample), "reference_cosine_min": worst}
        return out, (None if worst >= MIN_COSINE else f"an embedding's cosine to the fp32 reference is {worst:.4f}, "
                     f"under {MIN_COSINE}")
    model = AutoModelForCausalLM.from_pretrained(cell.reference_model, torch_dtype=torch.float32).eval()
    agree, first = [], []
    for r in sample:
        ids = torch.tensor([tok.encode(prompts[r.rid])])
        ref = greedy_reference(model, ids, asked(trace.plan, r.rid, cell.new_tokens))  # what the request asked
        got = _generated_ids(tok, r.text)
        same = sum(1 for a, b in zip(got, ref) if a == b)
        agree.append(same / max(1, len(ref)))
        first.append(1.0 if got[:1] == ref[:1] else 0.0)
    out = {"reference_checked": len(sample), "reference_token_agreement": sum(agree) / len(agree),
           "reference_first_token_agreement": sum(first) / len(first)}
    share = out["reference_first_token_agreement"]
    return out, (None if share >= MIN_FIRST_AGREEMENT else f"only {share:.0%} of first tokens agree with the fp32 "
                 "reference's greedy choice")


def greedy_reference(model, ids, new_tokens: int) -> list[int]:
    """`model`'s greedy decoding of exactly `new_tokens` tokens after `ids` (one row), its generation config replaced
    by transformers' defaults: the folder's generation_config.json would otherwise set beams, a repetition penalty or
    banned n-grams (a config passed to generate() takes them from the model's where it leaves them at their
    defaults), and the reference would not be the greedy answer the endpoint is asked for."""
    import torch
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return out[0, ids.shape[1]:].tolist()


def _vocab(folder: str) -> int:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(folder).vocab_size


def _generated_ids(tok, text: str) -> list[int]:
    if isinstance(tok, WordTokenizer):  # transbench server shows a tokenizer-less model's ids as " w<id>"
        return [int(w[1:]) for w in text.split() if w[:1] == "w" and w[1:].isdigit()]
    return tok.tok(text, add_special_tokens=False)["input_ids"]


def _prompts_of(cell: ServeCell, rids: list[int], tokenizer) -> list[str]:
    plan, _ = plan_for(cell)
    prompts, _ = make_prompts(plan.lengths, cell.seed + 2, tokenizer)
    return [prompts[i] for i in rids]


def run(cell: ServeCell) -> CellResult:
    tokenizer = tokenizer_for(cell)
    plan, offered = plan_for(cell)
    prompts, source = make_prompts(plan.lengths, cell.seed + 2, tokenizer)
    model = cell.served_model or cell.model

    def body(r: Sent) -> dict:
        return payload(cell.api, model, prompts[r.rid], asked(plan, r.rid, cell.new_tokens))  # made as it is sent

    trace = run_http_load(cell.url, cell.api, body, plan, cell.request_timeout)
    info_counts = fill_counts(trace, prompts, tokenizer)
    rec, samples, info = account(trace, None, offered, cell.tail_share, objectives=cell.objectives(),
                                 percentiles=cell.percentiles)
    info.update(prompts=source, url=cell.url, api=cell.api, served_model=model, token_counts=info_counts)
    capped = None
    if trace.capped_s is not None:
        failed = Counter(r.status for r in trace.requests if not r.ok)
        capped = (f"the closed loop stopped at {len(trace.requests):,} requests, the most a load keeps, "
                  f"{trace.capped_s:.1f} s into its {cell.warmup + cell.duration:g} s"
                  + (f" ({', '.join(f'{k} {v:,}' for k, v in sorted(failed.items()))})" if failed else ""))
    stretched = stretch_warning(trace.stretch, plan.span_s)
    if stretched:
        info["window"] = trace.stretch
    if not rec.get("requests"):  # a closed loop's clients all still waiting on their warm-up requests: say why
        return CellResult("error", record=rec, info=info, error=f"{capped}, within the warm-up: none was measured"
                          if capped else stretched or
                          "no request was sent after the warm-up: lengthen --duration or raise the rate")
    warnings = []
    if rec["failed"]:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(info["failures"].items()))
        warnings.append(f"{rec['failed']} of {rec['requests']} requests failed ({kinds}; first: "
                        f"{info['first_errors'][0]}): counted in every figure, as missing any target")
    lag = lag_warning(rec, plan)
    if lag:
        warnings.append(lag)
    if capped:
        warnings.append(f"{capped}: every figure is over those seconds")
    if stretched:
        warnings.append(stretched)
    if plan.outputs and cell.api != "openai-embeddings" and max(plan.outputs) > cell.new_tokens:
        warnings.append(f"trace requests asking more than --new-tokens {cell.new_tokens} output tokens were cut to it")
    if info.get("not_streamed"):
        warnings.append(f"{info['not_streamed']} of {rec['requests'] - rec['failed']} answers were not "
                        "streamed (one JSON body, the request's \"stream\" ignored): their TTFT is the whole answer's "
                        "time, and they have no TPOT or gaps between tokens")
    if trace.unsent:  # an open loop's requests planned while http_client.MAX_IN_FLIGHT were in flight
        warnings.append(f"{trace.unsent:,} request(s) were not sent, {MAX_IN_FLIGHT:,} being in flight, the most the "
                        "client keeps at once: each counts as a timeout (the endpoint fell far behind the rate)")
    if trace.waited:  # requests that found every connection busy; a pool as large as the load's requests never does
        warnings.append(f"{trace.waited} request(s) waited for one of the {trace.pool} connections, every one busy "
                        "(their wait is in their latency)")
    if rec["failed"] == rec["requests"]:
        return CellResult("error", record=rec, info=info, warnings=warnings,
                          error=f"every request failed (first: {info['first_errors'][0]})")
    if cell.reference_model:
        checked, wrong = reference_check(cell, trace, tokenizer)
        rec.update(checked)
        if wrong:  # a wrong answer's speed is never reported
            return CellResult("wrong", record=checked, info=info, warnings=warnings, error=wrong)
    return CellResult("ok", record=rec, samples_ms=samples, info=info, warnings=warnings)


def measure(cell: dict, state: dict) -> CellResult:
    """The sweep's target for serve cells with a URL."""
    return run(ServeCell.from_dict(cell))
