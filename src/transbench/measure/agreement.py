"""Task agreement: whether a reduced-precision or quantized model gives the answers its fp32 self gives.

rel_err says how far the numbers moved; a user judges a quantized model by its answers. A head's answers are its
argmax predictions (a token, a class, a span's start and end): `argmax_agreement` is the share equal to fp32's. A
bare encoder's sentence embeddings are used to compare sentences: `similarity_spearman` is the Spearman correlation
of every pair's cosine similarity with fp32's, and `neighbour_agreement` the share of sentences whose nearest
neighbour (by cosine, the sentence itself left out) is fp32's. The headline `task_agreement` is the share of answers
unchanged: argmax_agreement for a head, neighbour_agreement for an encoder. TARGETS are the levels a
reduced-precision model is held to.

Pure functions of tensors; the statistics in float64 on the host."""

from __future__ import annotations

TARGETS = {"argmax_agreement": 0.99, "similarity_spearman": 0.99, "neighbour_agreement": 0.98}
# With two sentences each one's nearest neighbour is the other and there is one similarity to rank: nothing to
# agree on. From three on both measures can fail.
MIN_SENTENCES = 3


def labels(logits):
    """The argmax over the last dimension, as int64 on the host (already integer: taken as the labels)."""
    import torch

    if not torch.is_floating_point(logits):
        return logits.long().cpu()
    return logits.argmax(-1).cpu()


def argmax_agreement(out, ref) -> float | None:
    """Share of predictions equal to fp32's; `out` and `ref` are logits (..., classes) or their labels. None when
    there is no prediction."""
    got, want = labels(out), labels(ref)
    if got.shape != want.shape:
        raise ValueError(f"predictions of shape {tuple(got.shape)} against fp32's {tuple(want.shape)}")
    if want.numel() == 0:
        return None
    return float((got == want).double().mean())


def sentence_embeddings(hidden, keep=None):
    """Mean of each sequence's hidden states (batch, tokens, width) over its real tokens (`keep`: (batch, tokens),
    true or 1 where the token is real; None: all), as all-MiniLM and sentence-transformers pool; float64, host.
    The sum is one batched product in the hidden states' own dtype (fp32 accumulation on a GPU): a float64 copy of a
    large batch's hidden states would add its size to the cell's memory peak."""
    import torch

    h = hidden.detach()
    k = torch.ones(h.shape[:2], device=h.device) if keep is None else keep.to(h.device)
    k = k.to(h.dtype)
    sums = torch.bmm(k[:, None, :], h)[:, 0].double()
    return (sums / k.double().sum(1, keepdim=True).clamp_min(1)).cpu()


def _cosines(emb):
    import torch

    e = torch.nn.functional.normalize(emb.detach().double().cpu(), dim=-1)
    return e @ e.T


def _ranks(x):
    """1-based ranks of a 1-D tensor, ties given the mean of the ranks they share (Spearman's convention)."""
    import torch

    _, inverse, counts = torch.unique(x, sorted=True, return_inverse=True, return_counts=True)
    end = counts.cumsum(0).double()
    return ((end - counts + 1 + end) / 2)[inverse]


def _usable(emb, ref) -> bool:
    if emb.shape != ref.shape or emb.dim() != 2:
        raise ValueError(f"embeddings of shape {tuple(emb.shape)} against fp32's {tuple(ref.shape)}")
    return emb.shape[0] >= MIN_SENTENCES


def similarity_spearman(emb, ref) -> float | None:
    """Spearman correlation of the pairwise cosine similarities of `emb` (sentences, width) with those of fp32's
    `ref`. None under MIN_SENTENCES or where fp32's similarities are all equal (no order to keep); 0.0 where
    `emb` is not finite or its similarities are all equal (the order is lost)."""
    import torch

    if not _usable(emb, ref):
        return None
    i, j = torch.triu_indices(len(ref), len(ref), 1)
    want = _ranks(_cosines(ref)[i, j])
    if not torch.isfinite(emb).all():
        return 0.0
    got = _ranks(_cosines(emb)[i, j])
    want, got = want - want.mean(), got - got.mean()
    if not want.abs().sum():
        return None
    if not got.abs().sum():
        return 0.0
    return float((want * got).sum() / (want.norm() * got.norm()))


def neighbour_agreement(emb, ref) -> float | None:
    """Share of sentences whose nearest neighbour by cosine, itself left out, is fp32's. Where fp32 has several
    nearest at the same similarity (a sentence given twice), any of them counts. None under MIN_SENTENCES."""
    import torch

    if not _usable(emb, ref):
        return None
    want, got = _cosines(ref), _cosines(emb)
    eye = torch.eye(len(ref), dtype=torch.bool)
    want = want.masked_fill(eye, -torch.inf)
    chosen = got.nan_to_num(nan=-torch.inf).masked_fill(eye, -torch.inf).argmax(1)
    same = want.gather(1, chosen[:, None])[:, 0] >= want.max(1).values
    return float(same.double().mean()) if torch.isfinite(emb).all() else 0.0


def of_labels(out, ref) -> dict:
    """The measures of a head: its argmax predictions against fp32's."""
    share = argmax_agreement(out, ref)
    return {"argmax_agreement": share, "task_agreement": share}


def of_embeddings(emb, ref) -> dict:
    """The measures of a bare encoder: its sentence embeddings against fp32's."""
    share = neighbour_agreement(emb, ref)
    return {"similarity_spearman": similarity_spearman(emb, ref), "neighbour_agreement": share,
            "task_agreement": share}


def shortfall(measures: dict) -> str | None:
    """The first measure under its target, in words; None when every measure taken meets its target."""
    for name, target in TARGETS.items():
        value = measures.get(name)
        if value is None:
            continue
        if not value >= target:  # NaN falls short too
            shown = f"{value:.4f}" if name == "similarity_spearman" else f"{value:.1%}"
            goal = f"{target:g}" if name == "similarity_spearman" else f"{target:.0%}"
            return f"{name} {shown} under its target {goal}"
    return None
