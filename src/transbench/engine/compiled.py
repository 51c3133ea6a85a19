"""compile_model: the engine in place of a transformers backbone, with the model's own head on top."""
from __future__ import annotations

import copy
import inspect

import torch
from torch import nn
from transformers.modeling_outputs import (BaseModelOutputWithPastAndCrossAttentions,
                                           BaseModelOutputWithPoolingAndCrossAttentions)

from .bert import BertEngine
from .config import EngineConfig, EngineOptions, EngineUnsupported
from .gpt2 import Generator, GPT2Engine


# model_type -> the transformers backbone class BertEngine reads (RoBERTa's code is BERT's with offset positions).
BERT_LIKE = {"bert": "BertModel", "roberta": "RobertaModel", "xlm-roberta": "XLMRobertaModel",
             "camembert": "CamembertModel", "distilbert": "DistilBertModel"}
# Heads that read each sequence's first token off the backbone's output (RoBERTa's and DistilBERT's classifiers do
# without a pooler): the engine refuses to pad that token (BertEngine.packing).
FIRST_TOKEN_HEADS = ("ForSequenceClassification", "ForMultipleChoice", "ForNextSentencePrediction", "ForPreTraining")
# Heads whose loss reads the logits at each position its `labels` name (transformers' CrossEntropyLoss skips -100),
# the causal ones at the position before each label (ForCausalLMLoss shifts them); question answering's softmaxes
# every position of a row. At a padding position the engine's logits are the head's on zeros (EngineBase.unpack),
# transformers' on what it computes there: a loss over a padded batch read rel_err 3e-2 (gpt2, labels=input_ids),
# 1.4e-2 (BertForQuestionAnswering), silently.
TOKEN_LOSS_HEADS = ("ForMaskedLM", "ForTokenClassification", "ForPreTraining")
CAUSAL_LOSS_HEADS = ("LMHeadModel", "ForCausalLM")
IGNORE_INDEX = -100  # transformers' losses' default ignore_index


def reads_padding(head: nn.Module) -> bool:
    """Whether `head` may read padding positions, depending on its call's arguments (padding_read)."""
    name = type(head).__name__
    return name == "GPT2ForSequenceClassification" or name.endswith(
        (*TOKEN_LOSS_HEADS, *CAUSAL_LOSS_HEADS, "ForQuestionAnswering"))


def padding_read(head: nn.Module, a: dict) -> str | None:
    """Why `head` (a transformers model) would read a padding position when called with the arguments `a` (its
    forward's, by name), or None. The engine computes real tokens only; padding positions come back as zeros."""
    mask = a.get("attention_mask")
    if not isinstance(mask, torch.Tensor) or mask.dim() not in (2, 3) or mask.numel() == 0:
        return None  # no padding (a 4-D mask the engine refuses itself, a wrong one it names)
    mask = mask.reshape(-1, mask.shape[-1])
    if type(head).__name__ == "GPT2ForSequenceClassification":
        return _last_token_read(head, a, mask)
    if all(a.get(k) is None for k in ("labels", "start_positions", "end_positions")):
        return None  # no loss: nothing read off the mask (on a GPU each read waits for it)
    mask = mask.bool()
    return None if mask.all() else _loss_read(type(head).__name__, a, mask)


def _last_token_read(head: nn.Module, a: dict, mask: torch.Tensor) -> str | None:
    # GPT2ForSequenceClassification classifies each sequence by its last token whose id is not pad_token_id, by the
    # last position from inputs_embeds or without a pad_token_id (transformers' GPT2ForSequenceClassification.forward):
    # padding in a padded batch, or wherever the padding ids are not pad_token_id (a checkpoint's pad id outside its
    # vocabulary). Its logits read rel_err 0.76 to 0.93 on right padding, silently.
    mask = mask.bool()
    (B, S), pad, ids = mask.shape, head.config.pad_token_id, a.get("input_ids")
    if pad is None:
        last, how = torch.full((B,), S - 1, device=mask.device), "last position (the config has no pad_token_id)"
    elif a.get("inputs_embeds") is not None or not isinstance(ids, torch.Tensor):
        last = torch.full((B,), S - 1, device=mask.device)
        how = "last position (from inputs_embeds it finds no padding)"
    elif tuple(ids.shape) != (B, S):
        return None  # the engine names the wrong shape
    else:
        last = (torch.arange(S, device=mask.device) * (ids.to(mask.device) != pad)).argmax(-1)
        how = f"last token whose id is not pad_token_id {pad} (the padding ids are not {pad})"
    if bool(mask.gather(1, last[:, None]).all()):
        return None
    return f"GPT-2's classification head reads each sequence's {how}: padding here, which the engine does not compute"


def _loss_read(name: str, a: dict, mask: torch.Tensor) -> str | None:
    B, S = mask.shape
    if name.endswith("ForQuestionAnswering"):
        rows = torch.zeros(B, dtype=torch.bool, device=mask.device)
        for t in (a.get("start_positions"), a.get("end_positions")):
            if isinstance(t, torch.Tensor) and t.numel() == B:  # transformers ignores a target of S or more
                rows |= t.reshape(B).to(mask.device).clamp(0, S) < S
        if bool((rows & ~mask.all(1)).any()):
            return (f"{name}'s loss softmaxes every position of a row, and the attention_mask pads some: the engine "
                    "does not compute padding positions (pass no start_positions / end_positions, or no padding)")
        return None
    causal, labels = name.endswith(CAUSAL_LOSS_HEADS), a.get("labels")
    if not isinstance(labels, torch.Tensor):
        return None
    kw = a.get("kwargs") or {}  # what the head's **kwargs hand its loss_function
    ignore, shifted = kw.get("ignore_index", IGNORE_INDEX), kw.get("shift_labels") if causal else None
    if isinstance(shifted, torch.Tensor):  # ForCausalLMLoss takes these as given, not shifted
        labels, causal = shifted, False
    if labels.numel() != B * S:
        return None
    read = labels.reshape(B, S).to(mask.device) != ignore
    if causal:  # the logits at t are scored against labels[t + 1]
        read = torch.cat((read[:, 1:], read.new_zeros(B, 1)), 1)
    if bool((read & ~mask).any()):
        return (f"{name}'s loss reads the logits at padding positions (their labels are not {ignore}), which the "
                f"engine does not compute: set the labels {'after' if causal else 'at'} padding to {ignore}")
    return None


class EngineBackbone(nn.Module):
    """Stands where `model.bert` / `model.transformer` stood, with the same call signature and outputs."""

    def __init__(self, engine, signature: inspect.Signature, return_dict: bool = True, outputs: tuple = (False, False)):
        super().__init__()
        self.engine = engine
        # What output_attentions / output_hidden_states=None mean: the config's, as transformers reads them. A
        # checkpoint whose config.json sets output_hidden_states got its ModelOutput without hidden_states (and a
        # tuple one element short), where the same request as an argument is refused.
        self.outputs = outputs
        # What return_dict=None means: the config's return_dict, as transformers' models read it (a bare BertModel
        # of return_dict=False returns a tuple; the ModelOutput returned instead unpacked into its keys' names).
        self.return_dict = return_dict
        # The replaced backbone's forward signature: positional arguments are read in its order, which is not one
        # order (GPT2Model takes `cache` second, DistilBertModel `inputs_embeds` third). Read in BertModel's order,
        # GPT2Model(ids, None, mask) took the mask as token types: rel_err 0.58, silently.
        self.signature = signature
        self.var_keyword = next((n for n, p in signature.parameters.items() if p.kind is p.VAR_KEYWORD), None)
        # Encoders-only timing (BERT): the embedding block's output, computed once; calls then run the
        # encoder layers on it, as the benchmark does to transformers by replacing embeddings.forward.
        self.fixed_embeddings: torch.Tensor | None = None

    def forward(self, *args, **kwargs):
        if len(args) > 1:  # every backbone takes input_ids first
            a = self.signature.bind(*args, **kwargs).arguments
            kwargs = {**{k: v for k, v in a.items() if k != self.var_keyword}, **a.get(self.var_keyword, {})}
            args = ()
        return self._forward(*args, **kwargs)

    def _forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                 inputs_embeds=None, past_key_values=None, cache=None, output_attentions=None,
                 output_hidden_states=None, encoder_hidden_states=None, return_dict=None, **unused):
        asked = [name for name, given, config in zip(("output_attentions", "output_hidden_states"),
                                                      (output_attentions, output_hidden_states), self.outputs)
                 if (config if given is None else given)]
        if asked:
            by = "" if output_attentions or output_hidden_states else " (the model's config sets it: pass False)"
            raise EngineUnsupported(f"{' / '.join(asked)}{by}: the engine produces no attentions or hidden states")
        if past_key_values is not None or cache is not None or encoder_hidden_states is not None:
            # (`cache` is transformers 5.24's name for past_key_values)
            raise EngineUnsupported("past_key_values / cache / cross-attention inputs: use compiled.generator() "
                                    "instead")
        if self.fixed_embeddings is not None:
            h = self.engine.encode(self.fixed_embeddings, attention_mask)
        else:
            h = self.engine.forward(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        if isinstance(self.engine, BertEngine):
            h, pooled = h
            out = BaseModelOutputWithPoolingAndCrossAttentions(last_hidden_state=h, pooler_output=pooled)
        else:
            out = BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=h)
        return out if (self.return_dict if return_dict is None else return_dict) else out.to_tuple()


def _engine_for(hf_model: nn.Module, opts: EngineConfig):
    cfg = getattr(hf_model, "config", None)
    kind = getattr(cfg, "model_type", None)
    backbone = getattr(hf_model, "base_model", None)
    if BERT_LIKE.get(kind) == type(backbone).__name__:
        engine = BertEngine(backbone, opts)
        if engine.first_reader is None and type(hf_model).__name__.endswith(FIRST_TOKEN_HEADS):
            engine.first_reader = f"{type(hf_model).__name__}'s head"
        return backbone, engine
    if type(hf_model).__name__ == "GPT2DoubleHeadsModel":
        # Its multiple-choice head reads each sequence's last position by default, padding in a padded batch, which
        # the engine never computes (it returns zeros there); its (batch, choices, seq) ids crashed the engine.
        raise EngineUnsupported("GPT2DoubleHeadsModel is not supported (its multiple-choice head may read padding "
                                "positions, which the engine does not compute)")
    if kind == "gpt2" and type(backbone).__name__ == "GPT2Model":
        head = getattr(hf_model, "lm_head", None)
        return backbone, GPT2Engine(backbone, opts, head.weight if isinstance(head, nn.Linear) else None)
    raise EngineUnsupported(f"{type(hf_model).__name__} (model_type={kind!r}): the engine runs {', '.join(BERT_LIKE)} and gpt2 only")


class CompiledModel:
    """Callable like the transformers model it was built from; returns the same ModelOutput type."""

    def __init__(self, hf_model: nn.Module, opts: EngineConfig):
        self.opts = opts
        backbone, self.engine = _engine_for(hf_model, opts)
        # A bare model answers return_dict=None by its config; under a head, a ModelOutput: GPT-2's heads call their
        # backbone without return_dict and read its output's attributes (transformers' own crash on a tuple there).
        bare = backbone is hf_model
        self.backbone = EngineBackbone(self.engine, inspect.signature(backbone.forward),
                                       not bare or getattr(backbone.config, "return_dict", True) is not False,
                                       tuple(getattr(backbone.config, n, False) is True
                                             for n in ("output_attentions", "output_hidden_states")))
        self.module = self.backbone if bare else self._shell(hf_model, backbone)
        # Heads that may read padding positions, checked on each call's arguments (padding_read); others skip it.
        self._signature = inspect.signature(hf_model.forward) if reads_padding(hf_model) else None

    def _convert(self, module: nn.Module, memo: dict) -> nn.Module:
        return copy.deepcopy(module, memo).to(self.opts.device, self.opts.dtype).eval()

    def _shell(self, hf_model: nn.Module, backbone: nn.Module) -> nn.Module:
        # A shallow copy of the head model whose children are the engine backbone and converted copies of
        # the head modules: the user's model is left untouched and the HF head code runs unchanged.
        shell = copy.copy(hf_model)
        memo = {}
        emb = backbone.get_input_embeddings().weight
        if isinstance(self.engine, GPT2Engine):  # keep lm_head tied to the engine's own embedding copy
            memo[id(emb)] = nn.Parameter(self.engine.wte, requires_grad=False)
        elif isinstance(self.engine, BertEngine):
            memo[id(emb)] = nn.Parameter(self.engine.word, requires_grad=False)
        shell._modules = {n: (self.backbone if m is backbone else self._convert(m, memo) if m is not None else None)
                          for n, m in hf_model._modules.items()}
        shell._parameters = {n: self._convert_t(p) for n, p in hf_model._parameters.items()}
        shell._buffers = {n: self._convert_t(b) for n, b in hf_model._buffers.items()}
        shell.training = False
        return shell

    def _convert_t(self, t):
        if t is None:
            return None
        return t.detach().to(self.opts.device, self.opts.dtype if t.is_floating_point() else t.dtype)

    @torch.inference_mode()
    def __call__(self, *args, **kwargs):
        self._check_padding_read(args, kwargs)
        return self.module(*args, **kwargs)

    def fixed_call(self, *args, **kwargs):
        """A function of no arguments that calls the model on these arguments, checked once here: for a loop that
        calls it on the same inputs (a benchmark's timed calls). The check of a head that may read padding
        (padding_read) waits for the GPU; made on every call, it added a host sync to each of a GPT-2 classifier's
        timed calls, beside packing's one (engine/packing.py make_packing)."""
        self._check_padding_read(args, kwargs)
        module = self.module

        @torch.inference_mode()
        def call():
            return module(*args, **kwargs)
        return call

    def _check_padding_read(self, args, kwargs) -> None:
        if self._signature is None:
            return
        try:
            a = self._signature.bind(*args, **kwargs).arguments
        except TypeError:
            a = None  # arguments the head itself refuses, with its own message
        reason = a and padding_read(self.module, a)
        if reason:
            raise EngineUnsupported(reason)

    @torch.inference_mode()
    def encode(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """BERT only: the encoder layers on already-embedded (B, S, hidden) states."""
        if not isinstance(self.engine, BertEngine):
            raise EngineUnsupported("encode() is for BERT; pass inputs_embeds to a GPT-2 model instead")
        return self.engine.encode(hidden_states, attention_mask)[0]

    @property
    def token_bucket(self) -> int:
        """A call whose attention_mask leaves padding runs only the real tokens, their count rounded up to a
        multiple of this (at most batch x seq; a mask of no padding runs dense); with CUDA graphs each such count
        of a (batch, seq) shape is a graph of its own, captured (and its routes tuned) at its first call."""
        return self.engine.bucket

    def token_sizes(self, batch: int, seq: int) -> list[int]:
        """The packed token counts a padded call of (batch, seq) can run, each a graph of its own: the token_growth
        ladder, or every multiple of token_bucket (capped at batch x seq)."""
        sizes = self.engine.token_sizes(batch, seq)
        if sizes is not None:
            return list(sizes)
        b, top = self.engine.bucket, batch * seq
        return sorted({min(top, m) for m in range(b, top + b, b)})

    def set_reuse_captured(self, on: bool) -> None:
        """From now on a padded call runs the smallest captured packed size that holds it, if any, instead of
        capturing its own (a server under load: packing.reuse_sizes)."""
        self.engine.reuse_captured = bool(on)

    def set_tune_budget(self, seconds: float | None) -> None:
        """Tuning seconds a new shape's first call may take from now on (0: its untuned ops take borrowed routes,
        the nearest tuned shape's or the shape rule's, and nothing is timed: a capture only, for a server's graphs
        first met under load)."""
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                    or not 0 <= seconds < float("inf")):
            raise ValueError(f"seconds must be None or a finite number >= 0, got {seconds!r}")
        self.engine.graphs.tune_budget_s = seconds

    @property
    def graph_captures(self) -> int:
        """Graphs captured so far (0 without CUDA graphs), ones since evicted or released included."""
        return self.engine.graphs.captures

    def tuning(self) -> dict[str, dict]:
        """Per captured shape: the kernel route each op runs and the whole-forward races that chose them
        (empty without CUDA graphs)."""
        return self.engine.graphs.tuning()

    def release(self) -> None:
        """Free what calls allocated: every captured graph (forward, prefill, decode) with its activations, and the
        generators' KV caches. The model stays usable; a later call of a shape captures its graph again."""
        self.engine.release()

    def generator(self, batch_size: int, max_total_len: int) -> Generator:
        """GPT-2 only: greedy-decoding state with a static KV cache (see Generator.prefill / decode); its prefill and
        decode graphs run on compile_model's options (EngineOptions), as the model's calls do."""
        if not isinstance(self.engine, GPT2Engine):
            raise EngineUnsupported("generation needs a GPT-2 model")
        return Generator(self.engine, batch_size, max_total_len)


def compile_model(hf_model: nn.Module, dtype: torch.dtype | str = torch.float16, max_batch: int = 256,
                  max_seq: int | None = None, cuda_graphs: bool = True, fp8: bool = False,
                  device: torch.device | str | None = None,
                  tune_budget_s: float | None = EngineConfig.tune_budget_s,
                  options: EngineOptions | None = None, token_growth: float | None = None) -> CompiledModel:
    """Build the fused engine from a transformers BERT/GPT-2 model (bare or with a task head).

    tune_budget_s: wall seconds the first call at a new shape may spend tuning kernel routes (None: no limit,
    what `transbench tune` uses to fill the on-disk table ahead of time). Within a budget an op not yet tuned runs
    the route of the nearest tuned shape (else a shape rule's) and the call tunes the ops that cost most, saving what
    it learns for the next call or process that meets them; see engine/tuning.py TUNE_BUDGET_S.

    token_growth: a server's bound on its graphs: a padded call's packed size rounds up to a geometric ladder
    (packing.token_ladder; CompiledModel.token_sizes lists it) instead of every multiple of token_bucket.

    dtype="fp8": fp16 activations and residual stream, every linear layer's GEMM in e4m3 where the tuner finds
    it faster (weights quantized once, one scale per output channel; activations per token, quantized by the
    kernels that produce them), fp16 elsewhere; the same as dtype=torch.float16, fp8=True. A call of fewer than
    ops.FP8_MIN_ROWS tokens (1,024) runs the fp16 forward: fp8 GEMMs lose to fp16 at such sizes.

    options: how the engine launches and tunes its kernels (EngineOptions: programmatic dependent launch, the tuner
    and its table, whole-forward races, ...); None: the defaults, the engine as shipped.

    Raises EngineUnsupported(reason) for models or options the engine cannot run, ValueError for an argument of the
    wrong type or range."""
    if not isinstance(hf_model, nn.Module):  # None, a preset name: an AttributeError ('no attribute parameters')
        raise ValueError(f"hf_model must be a transformers model (a torch.nn.Module), got {type(hf_model).__name__}")
    if not isinstance(dtype, (torch.dtype, str)):  # dtype=None is a wrong argument, not a dtype the engine lacks
        raise ValueError(f"dtype must be a torch dtype (torch.float16, torch.bfloat16, torch.float32) or 'fp8', "
                         f"got {dtype!r}")
    if isinstance(dtype, str):
        if dtype != "fp8":
            raise EngineUnsupported(f"dtype {dtype!r} is not supported (a torch dtype, or 'fp8')")
        dtype, fp8 = torch.float16, True
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise EngineUnsupported(f"dtype {dtype} is not supported (fp16, bf16, fp32)")
    if device is None:
        p = next(hf_model.parameters(), None)
        device = p.device if p is not None else torch.device("cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device {device!r} is not a torch device") from e
    if device.type == "cuda" and not torch.cuda.is_available():  # else an AssertionError from deep in weight loading
        raise ValueError(f"device {str(device)!r}: no CUDA GPU is visible (use device='cpu', or a GPU)")
    cfg = getattr(hf_model, "config", None)
    max_pos = getattr(cfg, "max_position_embeddings", None) or 1 << 30
    if isinstance(max_seq, int) and not isinstance(max_seq, bool) and max_seq >= 1:
        max_seq = min(max_seq, max_pos)
    elif max_seq is None:
        max_seq = max_pos
    if options is not None and not isinstance(options, EngineOptions):
        raise ValueError(f"options must be an EngineOptions, got {options!r}")
    opts = EngineConfig(dtype=dtype, device=device, max_batch=max_batch, max_seq=max_seq, cuda_graphs=cuda_graphs,
                        fp8=fp8, tune_budget_s=tune_budget_s, options=options or EngineOptions(),
                        token_growth=token_growth)
    with torch.no_grad():
        return CompiledModel(hf_model, opts)
