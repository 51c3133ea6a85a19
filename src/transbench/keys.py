"""Each result key declared once: its column title, unit, how it prints, its JSON type and what it means.

Terminal tables (cli/tables.py), report.md, CSV and JSON columns (store/export.py), the JSON Schema of the
record and docs/records.md (cli/reference.py) all read this catalogue. A key that only one kind of run writes
names that kind; the others are in every record."""

from __future__ import annotations

from dataclasses import dataclass

# A cell's status (the record's `status`): what every scenario writes, what the store reads back (store/db.py refuses
# any other) and what the tables print in red (every one but ok).
STATUSES = ("ok", "oom", "timeout", "error", "wrong", "unsupported", "skipped")

@dataclass(frozen=True)
class Key:
    name: str
    title: str  # the column's header: short, so that tables fit a terminal
    unit: str = ""
    type: str = "number"  # its JSON type: number, integer, string, boolean, array
    fmt: str = "number"  # number (4 significant digits), pct (a 0..1 fraction as %), signed (+1.0), sci (1.0e-03),
    # onoff (a switch in the options' words), yesno (a verdict or a fact about the result: it was never switched)
    kind: str = ""  # "" = every record; else the kind of run that adds it: generation, training, serve
    always: bool = False  # every record of its kind has it (an export's columns put these first)
    doc: str = ""


CATALOGUE = (
    Key('run_id', 'run id', type='string', doc="the run's id"),
    Key('run_name', 'run', type='string', doc="the run's name"),
    Key('scenario', 'scenario', type='string', doc='the kind of cell'),
    Key('model', 'model', type='string', doc='preset or checkpoint folder'),
    Key('task', 'task', type='string', doc='`base`, `mlm`, ...'),
    Key('backend', 'backend', type='string', doc='the backend'),
    Key('dtype', 'dtype', type='string', doc='the dtype'),
    Key('quant', 'quant', type='string',
        doc='`run --quant`: `none`, `int8-weight`, `int8-dynamic`, `fp8-dynamic`, `nf4` ([quantization](quantization.md))'),
    Key('device', 'device', type='string', doc='the device type'),
    Key('gpu', 'GPU', type='string', doc="the GPU's name"),
    Key('batch_size', 'batch', type='integer', doc="batch size (serve: the batcher's cap `max_batch_size`)"),
    Key('seq_len', 'seq', type='integer', doc='sequence length'),
    Key('seq_stdev', 'seq stdev', doc='`--seq-stdev`'),
    Key('embeddings', 'embeddings', type='boolean', fmt='onoff', doc='the embedding layer timed too (`--embeddings`) or not'),
    Key('status', 'status', type='string', doc="the cell's [status](measurement.md#statuses)"),
    Key('latency_ms', 'ms', unit='ms', doc="median latency (serve: the p50 of its requests' latencies)"),
    Key('latency_p90_ms', 'p90 ms', unit='ms', doc='90th percentile (empty under 10 samples: measurement.md)'),
    Key('latency_p99_ms', 'p99 ms', unit='ms', doc='99th percentile (empty under 100 samples)'),
    Key('latency_iqr_ms', 'IQR ms', unit='ms', doc='interquartile range (empty under 4 samples)'),
    Key('n_samples', 'samples', type='integer', doc='timed samples (serve: its requests)'),
    Key('host_ms', 'host ms', unit='ms', doc="the host's time inside one call, or inside a generation's first two "
        "decode steps, the less of the two ([host-bound calls](measurement.md#how-transbench-measures))"),
    Key('throughput_per_s', 'seq/s', unit='1/s', doc='sequences/s'),
    Key('tokens_per_s', 'tokens/s', unit='1/s', doc='real (unpadded) tokens/s'),
    Key('tflops', 'TFLOPS', unit='TFLOPS', doc='achieved TFLOPS'),
    Key('mfu', 'MFU', unit='fraction', fmt='pct', doc='0..1, against the dense datasheet peak of the dtype; the FLOPs the model needs'),
    Key('peak_mem_mb', 'peak MiB', unit='MiB', doc='what the cell allocated'),
    Key('mem_before_mb', 'MiB before', unit='MiB', doc='what the worker held when the cell started (~0)'),
    Key('sm_clock_mhz', 'SM MHz', unit='MHz', doc='SM clock during the timed samples'),
    Key('avg_power_w', 'W', unit='W', doc='board power during the timed samples'),
    Key('j_per_seq', 'J/seq', unit='J', doc='energy per sequence'),
    Key('rel_err', 'rel err', fmt='sci', doc='distance from the fp32 reference ([correctness](measurement.md#correctness))'),
    Key('task_agreement', 'agreement', unit='fraction', fmt='pct',
        doc="share of the model's answers equal to fp32's: `argmax_agreement` for a head, `neighbour_agreement` for a "
            "bare encoder ([task agreement](quantization.md#task-agreement))"),
    Key('argmax_agreement', 'argmax agree', unit='fraction', fmt='pct',
        doc="a head's argmax predictions (token, class, span start and end) equal to fp32's; target 99%"),
    Key('neighbour_agreement', 'neighbours', unit='fraction', fmt='pct',
        doc="a bare encoder: sentences whose nearest neighbour by cosine is fp32's; target 98%"),
    Key('similarity_spearman', 'similarity rho',
        doc="a bare encoder: Spearman correlation of the pairwise cosine similarities with fp32's; target 0.99"),
    Key('agreement_inputs', 'agreement on', type='string',
        doc="what the agreement was measured on: `sentences` (the packaged real sentences: a checkpoint with a "
            "tokenizer) or `benchmark` (the cell's own inputs)"),
    Key('speedup', 'speedup %', unit='%', fmt='signed', doc='% against `--baseline`'),
    Key('mem_saved', 'mem saved %', unit='%', fmt='signed', doc='% against `--baseline`'),
    Key('error', 'error', type='string', doc='why the cell failed'),
    Key('threads', 'threads', type='integer', doc='CPU threads the cell computed with (`--threads`)'),
    Key('load_avg', 'load', doc="the machine's 1-minute load average when the cell ran"),
    Key('busy_processes', 'busy', type='array', doc='other processes busy on the CPU while the cell ran: pid, name, cores'),
    Key('busy_cores', 'busy cores', doc='the cores all other processes used while the cell ran'),
    Key('repeats', 'repeats', type='integer', doc='times the cell was measured (`--repeat`), each in a fresh process'),
    Key('repeat_medians_ms', 'repeat medians', type='array', doc="each repeat's median latency"),
    Key('latency_repeat_min_ms', 'repeat min ms', unit='ms', doc="the fastest repeat's median"),
    Key('latency_repeat_max_ms', 'repeat max ms', unit='ms', doc="the slowest repeat's median"),
    Key('energy_j', 'J', unit='J', doc='energy over the timed region'),
    Key('energy_source', 'energy source', type='string',
        doc="counter (the board's energy counter) or integrated (sampled power integrated over the timed region)"),
    Key('j_per_token', 'J/token', unit='J', doc='energy per real token'),
    Key('sm_clock_min_mhz', 'SM MHz min', unit='MHz', doc='the lowest SM clock sampled during the timed region'),
    Key('temp_c', 'temp C', unit='C', doc="the GPU's temperature during the timed region"),
    Key('algbw_gbs', 'algbw GB/s', unit='GB/s', doc="micro collectives: bytes over time (nccl-tests' algorithm bandwidth)"),
    Key('busbw_gbs', 'busbw GB/s', unit='GB/s', doc="micro collectives: nccl-tests' bus bandwidth"),
    Key('prefill_ms', 'prefill ms', unit='ms', kind='generation', always=True, doc="the prompt's forward"),
    Key('decode_ms_per_token', 'ms/token', unit='ms', kind='generation', always=True, doc='median over decode steps'),
    Key('kv_cache_mb', 'KV MiB', unit='MiB', kind='generation', always=True, doc='the KV cache the generator allocated'),
    Key('kv_cache_analytic_mb', 'KV MiB (analytic)', unit='MiB', kind='generation', always=True,
        doc='the KV cache the config needs: layers x 2 x heads x head size x tokens x bytes'),
    Key('decode_p90_ms_per_token', 'ms/token p90', unit='ms', kind='generation', doc='decode step, 90th percentile'),
    Key('decode_gbs', 'decode GB/s', unit='GB/s', kind='generation',
        doc="the bytes a decode step must read (the weights once, the KV cache at the mean context) over its median "
            "time ([run](run.md#tasks))"),
    Key('decode_hbm_share', 'decode HBM', unit='fraction', fmt='pct', kind='generation',
        doc="decode_gbs against the device's datasheet memory bandwidth: how near the step is to its memory floor"),
    Key('ms_per_token', 'ms/token', unit='ms', doc='causal-lm: latency per token of the sequence'),
    Key('ttft_ms', 'TTFT ms', unit='ms', kind='generation', doc='time to first token'),
    Key('itl_p99_ms', 'ITL p99 ms', unit='ms', kind='generation', doc='inter-token latency, 99th percentile'),
    Key('samples_per_s', 'samples/s', unit='1/s', kind='training', always=True, doc='training samples/s'),
    Key('tflops_per_gpu', 'TFLOPS /GPU', unit='TFLOPS', kind='training', always=True, doc='TFLOPS per GPU'),
    Key('hfu', 'HFU', unit='fraction', fmt='pct', kind='training', doc='0..1; `mfu` counts the FLOPs the model needs, `hfu` what ran ([train](train.md#mfu-and-hfu))'),
    Key('forward_ms', 'fwd ms', unit='ms', kind='training', doc='median forward of a step'),
    Key('backward_ms', 'bwd ms', unit='ms', kind='training', doc='median backward of a step'),
    Key('optimizer_ms', 'optim ms', unit='ms', kind='training', doc='median optimizer step'),
    Key('world_size', 'GPUs', type='integer', kind='training', always=True, doc='processes'),
    Key('strategy', 'strategy', type='string', kind='training', always=True, doc='`none`, `ddp`, `fsdp`, `deepspeed`'),
    Key('kernels', 'kernels', type='string', kind='training', doc='`torch`, `liger`'),
    Key('head', 'head', type='string', kind='training', doc='`all`, `masked`'),
    Key('pad_vocab', 'pad vocab', type='integer', kind='training', doc='`--pad-vocab` N (null: 1)'),
    Key('optim', 'optim', type='string', kind='training', doc='the optimizer (`--optim`)'),
    Key('grad_accum', 'accum', type='integer', kind='training', doc='micro-batches per optimizer step'),
    Key('grad_ckpt', 'grad ckpt', type='boolean', fmt='onoff', kind='training', doc='gradient checkpointing on/off'),
    Key('compile', 'compile', type='boolean', fmt='onoff', kind='training', doc='torch.compile on/off'),
    Key('activation', 'activation', type='string', kind='training', doc="the FFN's activation (null: the model's own)"),
    Key('dropout', 'dropout', kind='training', doc="every dropout probability of the model (`--dropout`; null: the model's own)"),
    Key('zero_stage', 'ZeRO', type='integer', kind='training', doc='DeepSpeed ZeRO stage (deepspeed cells)'),
    Key('nccl', 'nccl', type='string', kind='training', doc="the cell's NCCL environment (`--nccl-p2p`, `--nccl-env`)"),
    Key('scaling_efficiency', 'scaling', fmt='pct', kind='training',
        doc='samples/s over world size x the same step on one GPU'),
    Key('allreduce_ms', 'all-reduce ms', unit='ms', kind='training',
        doc="the gradient all-reduce's time per step, from CUDA events around each bucket (ddp)"),
    Key('comm_share', 'all-reduce share', fmt='pct', kind='training', doc='allreduce_ms over the step time'),
    Key('allreduce_exposed_ms', 'exposed ms', unit='ms', kind='training',
        doc='the part of the all-reduce not hidden behind the backward'),
    Key('allreduce_mb', 'all-reduce MiB', unit='MiB', kind='training', doc='gradient bytes all-reduced per step'),
    Key('allreduce_busbw_gbs', 'all-reduce busbw', unit='GB/s', kind='training',
        doc="the gradient all-reduce's bus bandwidth (nccl-tests' definition)"),
    Key('gain_samples_per_s', 'gain', kind='training',
        doc='ladder: samples/s of this step over the kept steps it changed'),
    Key('peak_reserved_mb', 'reserved MiB', unit='MiB', kind='training', doc="the caching allocator's peak reserve"),
    Key('params_mb', 'params MiB', unit='MiB', kind='training', doc='parameters, per GPU'),
    Key('grads_mb', 'grads MiB', unit='MiB', kind='training', doc='gradients, per GPU'),
    Key('optim_state_mb', 'optim MiB', unit='MiB', kind='training', doc='optimizer state, per GPU'),
    Key('activations_mb', 'activ. MiB', unit='MiB', kind='training',
        doc='peak minus parameters, gradients and optimizer state: activations and workspace'),
    Key('loss_start', 'loss first', kind='training', doc='loss of the first timed step'),
    Key('loss_end', 'loss last', kind='training', doc='loss of the last timed step'),
    Key('mode', 'load', type='string', kind='serve', doc='rate, concurrency, offline or max-rate'),
    Key('rate', 'rate /s', unit='1/s', kind='serve', doc='the Poisson arrival rate asked for (`--rate`)'),
    Key('concurrency', 'clients', type='integer', kind='serve', doc='closed-loop clients (`--concurrency`)'),
    Key('latency_p50_ms', 'p50 ms', unit='ms', kind='serve', doc='median latency of the requests'),
    Key('latency_max_ms', 'max ms', unit='ms', kind='serve', doc='the slowest request'),
    Key('busy_share', 'busy', fmt='pct', kind='serve', doc='share of the window the backend was serving'),
    Key('ttft_p50_ms', 'TTFT p50 ms', unit='ms', kind='serve', doc='time to first token, median (--task generate)'),
    Key('ttft_p99_ms', 'TTFT p99 ms', unit='ms', kind='serve', doc='time to first token, 99th percentile'),
    Key('itl_p50_ms', 'ITL p50 ms', unit='ms', kind='serve', doc='inter-token latency, median'),
    Key('j_per_request', 'J/request', unit='J', kind='serve', doc='energy per request'),
    Key('max_rate', 'max rate /s', unit='1/s', kind='serve', doc='the largest rate meeting the target (--find-max-rate)'),
    Key('n_requests', 'requests', type='integer', kind='serve', doc='requests measured (after the warm-up)'),
    Key('latency_p90_upper_ms', 'p90 upper ms', unit='ms', kind='serve',
        doc="MLPerf LoadGen's early-stopping estimate of the p90: the binomial upper bound at 99% confidence"),
    Key('latency_p99_upper_ms', 'p99 upper ms', unit='ms', kind='serve',
        doc="MLPerf LoadGen's early-stopping estimate of the p99 (null: too few requests for one)"),
    Key('tail_percentile', 'tail pct', kind='serve', doc="the verdict's percentile"),
    Key('tail_min_requests', 'tail min requests', type='integer', kind='serve',
        doc="the requests LoadGen's rule needs for that percentile (64 for p90, 662 for p99)"),
    Key('tail_valid', 'tail valid', type='boolean', fmt='yesno', kind='serve',
        doc='whether the cell had the requests its percentile needs'),
    Key('slo_met', 'SLO met', type='boolean', fmt='yesno', kind='serve',
        doc="the verdict: the early-stopping estimate within every objective (never with too few requests)"),
    Key('slo_misses', 'SLO misses', type='integer', kind='serve', doc='requests that missed an objective'),
    Key('slo_allowed_misses', 'allowed misses', type='integer', kind='serve',
        doc="the misses LoadGen's rule allows at this request count"),
    Key('goodput_rate', 'goodput /s', unit='1/s', kind='serve', doc='requests per second that met every objective'),
    Key('tpot_p50_ms', 'TPOT p50 ms', unit='ms', kind='serve',
        doc='time per output token, (e2e - TTFT) / (tokens - 1), median'),
    Key('tpot_p99_ms', 'TPOT p99 ms', unit='ms', kind='serve', doc='time per output token, 99th percentile'),
    Key('tpot_mean_ms', 'TPOT mean ms', unit='ms', kind='serve', doc='time per output token, mean'),
    Key('client_lag_p99_ms', 'client lag p99 ms', unit='ms', kind='serve',
        doc="the load generator's lag: actual issue time against the planned arrival, 99th percentile"),
    Key('client_lag_max_ms', 'client lag max ms', unit='ms', kind='serve', doc="the load generator's largest lag"),
    Key('prepare_s', 'prepare s', unit='s', kind='serve', doc="the backend's preparation before the load"),
    Key('shapes_prepared', 'shapes prepared', type='integer', kind='serve', doc='shapes prepared within --prepare-budget'),
    Key('shapes_left', 'shapes left', type='integer', kind='serve', doc='shapes left to first use'),
    Key('shapes_prepared_under_load', 'shapes under load', type='integer', kind='serve',
        doc='shapes first met under load and prepared then'),
    Key('graphs_captured_under_load', 'graphs under load', type='integer', kind='serve',
        doc='CUDA graphs captured during the load (no kernel tuning: milliseconds each)'),
    Key('failed', 'failed', type='integer', kind='serve',
        doc='serve --url: requests refused, answered 4xx/5xx, dropped, malformed or timed out (counted in every figure)'),
    Key('error_rate', 'errors', fmt='pct', kind='serve', doc='serve --url: failed requests over all requests'),
    Key('offered_rate', 'offered /s', unit='1/s', kind='serve', doc='the planned arrival rate'),
    Key('achieved_rate', 'achieved /s', unit='1/s', kind='serve',
        doc='served requests over the arrival window (serve --url: from `rate_from_s` to the last answer)'),
    Key('rate_from_s', 'rate from s', unit='s', kind='serve',
        doc='serve --url: where the span of `achieved_rate`, `goodput_rate` and `tokens_per_s` opens, in seconds from '
            "the load's start: the warm-up's end for planned arrivals, a closed loop's first measured request (an "
            'endpoint that stalled before it is not counted against its rate)'),
    Key('latency_p999_ms', 'p99.9 ms', unit='ms', kind='serve', doc='99.9th percentile (empty under 1,000 requests)'),
    Key('goodput', 'goodput', unit='fraction', fmt='pct', kind='serve', doc='share of requests within `--slo-ms`'),
    Key('mean_batch', 'mean batch', kind='serve',
        doc='the batch the batcher formed, on average, over the batches that served a measured request; a batch '
            'that also held warm-up requests counts all its requests, a batch of warm-up requests alone none'),
    Key('service_p50_ms', 'service p50 ms', unit='ms', kind='serve',
        doc="each batch's service time ([serve](serve.md#what-is-measured)), median, over the batches of `mean_batch`"),
    Key('service_p99_ms', 'service p99 ms', unit='ms', kind='serve', doc="each batch's service time, 99th percentile"),
    Key('service_max_ms', 'service max ms', unit='ms', kind='serve', doc="each batch's service time, maximum"),
    # Settings and figures every cell of a kind writes, declared with the rest so that docs/records.md and the
    # record's schema list every key an export holds (tests/test_record_schema.py checks each kind's export).
    Key('host', 'host', type='string', doc='the host name of the machine the cell ran on'),
    Key('seed', 'seed', type='integer', doc='the seed of the random weights and inputs (`--seed`)'),
    Key('nproc', 'processes', type='integer', doc='data-parallel processes of an inference cell (`--nproc`)'),
    Key('flops_method', 'FLOPs from', type='string',
        doc='`analytic` (the formula of [measurement](measurement.md)) or `counted` (torch\'s FLOP counter, for '
            'families the formula does not cover)'),
    Key('new_tokens', 'new tokens', type='integer', kind='generation',
        doc='tokens generated per sequence (`--new-tokens`)'),
    Key('global_batch', 'global batch', type='integer', kind='training',
        doc='samples per optimizer step over every GPU: batch x accumulation x world size'),
    Key('lr', 'lr', kind='training', doc='the learning rate (`--lr`)'),
    Key('requests', 'requests', type='integer', kind='serve', doc='requests after the warm-up (as `n_requests`)'),
    Key('unserved', 'unserved', type='integer', kind='serve',
        doc='in-process: requests still queued when the load was abandoned past saturation'),
    Key('queue_mean_ms', 'queue mean ms', unit='ms', kind='serve', doc="in-process: a request's mean wait for a batch"),
    Key('real_tokens_mean', 'tokens mean', kind='serve',
        doc='in-process: the mean real length of a request, in tokens'),
    Key('lengths', 'lengths', type='string', kind='serve', doc='the request lengths (`--lengths`)'),
    Key('max_batch_size', 'max batch', type='integer', kind='serve', doc="the batcher's cap (`--max-batch-size`)"),
    Key('max_wait_ms', 'max wait ms', unit='ms', kind='serve',
        doc="the batcher's wait for a fuller batch (`--max-wait-ms`)"),
    Key('slo_ms', 'SLO ms', unit='ms', kind='serve', doc='the end-to-end target (`--slo-ms`, or `--slo e2e:`)'),
    Key('latency_mean_ms', 'mean ms', unit='ms', kind='serve',
        doc="the requests' mean latency (serve --url: empty where a request failed)"),
    Key('latency_p50_upper_ms', 'p50 upper ms', unit='ms', kind='serve',
        doc="MLPerf LoadGen's early-stopping estimate of the median (other `--percentile`s: `latency_pNN_upper_ms`)"),
    Key('latency_p999_upper_ms', 'p99.9 upper ms', unit='ms', kind='serve',
        doc="MLPerf LoadGen's early-stopping estimate of the 99.9th percentile"),
    Key('api', 'API', type='string', kind='serve', doc='serve --url: the API the requests spoke (`--api`)'),
    Key('url', 'URL', type='string', kind='serve', doc="serve --url: the endpoint's root"),
    Key('served_model', 'served model', type='string', kind='serve',
        doc='serve --url: the model name every request sent (`--served-model`, or the endpoint\'s listing)'),
    Key('reference', 'reference', type='string', kind='serve',
        doc='serve --url: the checkpoint folder the answers were checked against (`--reference-model`)'),
    Key('reference_checked', 'checked', type='integer', kind='serve',
        doc='serve --url: answered requests whose outputs were checked against the reference'),
    Key('reference_cosine_min', 'cosine min', kind='serve',
        doc="serve --url, embeddings: the lowest cosine of a checked answer with the fp32 reference's"),
    Key('prompt_tokens_mean', 'prompt tokens', kind='serve',
        doc='serve --url: mean prompt tokens (`usage`, else counted)'),
    Key('completion_tokens_mean', 'completion tokens', kind='serve',
        doc='serve --url: mean completion tokens of the answered streams (`usage`, else their events)'),
    Key('reasoning_tokens_mean', 'reasoning tokens', kind='serve',
        doc="serve --url, chat: mean reasoning tokens of the answered streams, part of `completion_tokens_mean` "
            "(`usage`'s `completion_tokens_details.reasoning_tokens`, else their events of reasoning); absent where "
            "none reasoned"),
    Key('client_lag_p50_ms', 'client lag p50 ms', unit='ms', kind='serve',
        doc="serve --url: the load generator's send lag, median"),
    Key('shape', 'shape', type='string', kind='micro',
        doc='micro gemm: `square`, or the model projection it stands for'),
    Key('m', 'M', type='integer', kind='micro', doc='micro gemm: rows of A'),
    Key('n', 'N', type='integer', kind='micro', doc='micro gemm: columns of B'),
    Key('k', 'K', type='integer', kind='micro', doc='micro gemm: the shared dimension'),
    Key('flops', 'FLOPs', kind='micro', doc='micro: floating-point operations of one call (2 per multiply-add)'),
    Key('bytes', 'bytes', kind='micro', doc="micro: the bytes one call must move at least (its operands and result)"),
    Key('intensity', 'FLOP/byte', kind='micro', doc='micro: flops over bytes, where the roofline places the point'),
    Key('gbps', 'GB/s', unit='GB/s', kind='micro', doc='micro: bytes over the median time'),
    Key('peak_tflops', 'peak TFLOPS', unit='TFLOPS', kind='micro',
        doc="micro: the compute ceiling the point is judged against (`ceiling_source`)"),
    Key('peak_gbs', 'peak GB/s', unit='GB/s', kind='micro',
        doc='micro: the memory ceiling the point is judged against'),
    Key('pct_of_peak', '% of peak', unit='%', kind='micro', doc="micro: TFLOPS (or GB/s) against the datasheet's peak"),
    Key('ceiling_source', 'ceilings', type='string', kind='micro',
        doc='micro breakdown: `measured` (micro gemm and bandwidth on this machine) or `datasheet`'),
    Key('part', 'part', type='string', kind='micro', doc='micro breakdown: the part of the layer (`qkv`, `ffn`, ...)'),
    Key('share', 'share', unit='fraction', fmt='pct', kind='micro',
        doc="micro breakdown: the part's time over the whole layer's (parts overlap: shares do not add up)"),
    Key('bound', 'bound', type='string', kind='micro',
        doc='micro breakdown: `compute` or `memory`, by the intensity against the ridge point (empty: no ceiling)'),
    Key('pct_of_roofline', '% of roofline', unit='%', kind='micro',
        doc='micro breakdown: TFLOPS against the roofline at the part\'s intensity'),
    Key('attn_ffn_flop_ratio', 'attn/FFN FLOPs', kind='micro',
        doc="micro breakdown: attention's matrix-product FLOPs over the FFN's"),
    Key('op', 'op', type='string', kind='micro', doc="micro bandwidth: `copy`, `scale` or `add` (STREAM's kernels)"),
    Key('elements', 'elements', type='integer', kind='micro', doc='micro bandwidth: elements of the buffer'),
    Key('pass', 'pass', type='string', kind='micro', doc='micro layer: `fwd` or `fwd+bwd`'),
)
KEYS = {k.name: k for k in CATALOGUE}


def record_keys(kind: str = "", always: bool = False) -> tuple[str, ...]:
    """The keys of every record (kind ""), or those that `kind` adds (`always`: that its every record has), in
    their declared order."""
    return tuple(k.name for k in CATALOGUE if k.kind == kind and (k.always or not always or not kind))


def percent(p: float) -> str:
    """A percentage with one decimal, two significant digits below 0.1%, and more decimals where one would round
    onto 100%: a GPU's MFU of 0.04% (a tiny model) printed "0.0%", as if nothing ran, and a goodput of 99.96%
    printed "100.0%", as if no request missed the SLO."""
    if p in (0.0, 100.0):
        return f"{p:.1f}%"
    if abs(p) < 0.1:  # two significant digits: 0.00085% is not 0.001%
        return f"{p:.2g}%"
    for decimals in range(1, 7):
        text = f"{p:.{decimals}f}"
        if float(text) not in (0.0, 100.0):
            return text + "%"
    return f"{p:.12g}%"


def fmt(value, spec: str = ".4g") -> str:
    """A value in the options' own words: `-` for none, on/off for a switch, figures to 4 significant digits
    (12346 reads better than 1.235e+04, and is narrower)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:.0f}" if spec == ".4g" and 1e4 <= abs(value) < 1e12 else format(value, spec)
    return str(value)


def flag(name: str, value: bool) -> str:
    """A true/false key as every table (terminal, report, training) prints it: a switch the user set in the options'
    words (on/off), a verdict or a fact about the result as yes/no: `tail valid on` read as a setting that was
    turned on, and the report printed Python's True/False."""
    how = KEYS[name].fmt if name in KEYS else "onoff"
    return ("yes" if value else "no") if how == "yesno" else ("on" if value else "off")


def show(name: str, value) -> str:
    """A record's value as every table prints it, by the key's declared format."""
    how = KEYS[name].fmt if name in KEYS else "number"
    if isinstance(value, bool):
        return flag(name, value)
    if value is None or not isinstance(value, (int, float)):
        return fmt(value)
    if how == "pct":
        return percent(value * 100)  # a tiny MFU is not "0.0%"
    if how == "signed":
        return f"{value:+.1f}"
    if how == "sci":
        return f"{value:.2e}"
    return fmt(value)


JSON_TYPES = {"number": ["number", "null"], "integer": ["integer", "null"], "string": ["string", "null"],
              "boolean": ["boolean", "null"], "array": ["array", "null"]}


def schema_properties() -> dict:
    """The JSON Schema properties of a record, from the catalogue: a key may be null where it does not apply."""
    return {k.name: {"type": JSON_TYPES[k.type], "description": k.doc} for k in CATALOGUE}
