"""Named model shapes, as published with the original checkpoints (random weights: nothing is downloaded).

A preset is the shape the benchmark reasons with (layers, hidden, heads, ...) plus the rest of the
checkpoint's config.json (`config`): `build.hf_config` hands both to transformers' own config class of
the family (`AutoConfig.for_model`), so a preset is a transformers config, never a model of our own.
`tests/test_families.py` checks that the config transformers builds has exactly the shape declared here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Preset:
    name: str
    family: str  # transformers' model_type: "bert", "gpt2", "roberta", "llama", ...
    layers: int
    hidden: int
    heads: int
    intermediate: int  # FFN width (of each of the two input matrices in a gated MLP)
    vocab: int
    max_positions: int
    kv_heads: int | None = None  # grouped-query attention; None: one key/value head per query head
    head_dim: int | None = None  # None: hidden // heads
    decoder: bool = False  # causal LM (generation, causal attention) rather than a bidirectional encoder
    # The rest of config.json, as transformers names it (not part of equality: the shape is).
    config: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden // self.heads

    def as_dict(self) -> dict:
        return asdict(self)


def _p(name, family, layers, hidden, heads, intermediate, vocab, max_positions, **kw) -> Preset:
    shape = {k: kw.pop(k) for k in ("kv_heads", "head_dim", "decoder") if k in kw}
    return Preset(name, family, layers, hidden, heads, intermediate, vocab, max_positions, **shape, config=kw)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        # google-bert/bert-base-uncased, bert-large-uncased config.json
        _p("bert-base-uncased", "bert", 12, 768, 12, 3072, 30522, 512),
        _p("bert-large-uncased", "bert", 24, 1024, 16, 4096, 30522, 512),
        # openai-community/gpt2, gpt2-medium, gpt2-large, gpt2-xl config.json
        _p("gpt2", "gpt2", 12, 768, 12, 3072, 50257, 1024, decoder=True),
        _p("gpt2-medium", "gpt2", 24, 1024, 16, 4096, 50257, 1024, decoder=True),
        _p("gpt2-large", "gpt2", 36, 1280, 20, 5120, 50257, 1024, decoder=True),
        _p("gpt2-xl", "gpt2", 48, 1600, 25, 6400, 50257, 1024, decoder=True),
        # FacebookAI/roberta-base config.json: 514 position embeddings, numbered from pad id 1 + 1, so 512
        # tokens (build.position_offset); one token type
        _p("roberta-base", "roberta", 12, 768, 12, 3072, 50265, 512, type_vocab_size=1, pad_token_id=1,
           bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5),
        # distilbert/distilbert-base-uncased config.json (dim 768, n_layers 6, n_heads 12, hidden_dim 3072)
        _p("distilbert-base-uncased", "distilbert", 6, 768, 12, 3072, 30522, 512, pad_token_id=0),
        # microsoft/deberta-v3-base config.json (model_type deberta-v2)
        _p("deberta-v3-base", "deberta-v2", 12, 768, 12, 3072, 128100, 512, relative_attention=True,
           position_buckets=256, norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"],
           layer_norm_eps=1e-7, max_relative_positions=-1, position_biased_input=False, type_vocab_size=0,
           pad_token_id=0),
        # answerdotai/ModernBERT-base config.json: a global-attention layer every 3, the others a 128-token window
        _p("modernbert-base", "modernbert", 22, 768, 12, 1152, 50368, 8192, global_attn_every_n_layers=3,
           local_attention=128, global_rope_theta=160000.0, local_rope_theta=10000.0, norm_eps=1e-5,
           pad_token_id=50283, bos_token_id=50281, eos_token_id=50282, cls_token_id=50281, sep_token_id=50282),
        # HuggingFaceTB/SmolLM2-135M config.json (llama: 9 heads, 3 kv heads, tied embeddings)
        _p("smollm2-135m", "llama", 30, 576, 9, 1536, 49152, 8192, kv_heads=3, decoder=True, rope_theta=100000.0,
           rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0),
        # Qwen/Qwen2.5-0.5B config.json (14 heads, 2 kv heads, tied embeddings)
        _p("qwen2.5-0.5b", "qwen2", 24, 896, 14, 4864, 151936, 32768, kv_heads=2, decoder=True,
           rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=151643,
           eos_token_id=151643),
        # meta-llama/Llama-3.2-1B config.json (32 heads of 64, 8 kv heads, llama3 rope scaling, tied embeddings)
        _p("llama-3.2-1b", "llama", 16, 2048, 32, 8192, 128256, 131072, kv_heads=8, decoder=True,
           rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=128000,
           eos_token_id=128001, rope_scaling={"rope_type": "llama3", "factor": 32.0, "high_freq_factor": 4.0,
                                              "low_freq_factor": 1.0, "original_max_position_embeddings": 8192}),
        # Tiny shapes for tests: odd enough (3 heads of 16) to catch layout bugs; every special token id
        # inside the 1000-token vocabulary.
        _p("bert-tiny", "bert", 2, 48, 3, 96, 1000, 128),
        _p("gpt2-tiny", "gpt2", 2, 48, 3, 96, 1000, 128, decoder=True, bos_token_id=999, eos_token_id=999),
        _p("roberta-tiny", "roberta", 2, 48, 3, 96, 1000, 128, type_vocab_size=1, pad_token_id=1, bos_token_id=0,
           eos_token_id=2, layer_norm_eps=1e-5),
        _p("distilbert-tiny", "distilbert", 2, 48, 3, 96, 1000, 128, pad_token_id=0),
        _p("deberta-tiny", "deberta-v2", 2, 48, 3, 96, 1000, 128, relative_attention=True, position_buckets=32,
           norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"], layer_norm_eps=1e-7,
           max_relative_positions=-1, position_biased_input=False, type_vocab_size=0, pad_token_id=0),
        # 3 layers: two local (8-token window) and one global, as ModernBERT alternates them
        _p("modernbert-tiny", "modernbert", 3, 48, 3, 96, 1000, 128, global_attn_every_n_layers=3,
           local_attention=8, pad_token_id=0, bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3),
        # Llama-style: grouped-query attention (4 heads, 2 kv heads), RMSNorm, rotary positions, gated MLP
        _p("llama-tiny", "llama", 2, 48, 4, 96, 1000, 128, kv_heads=2, decoder=True, bos_token_id=1,
           eos_token_id=2, tie_word_embeddings=False),
        _p("qwen2-tiny", "qwen2", 2, 48, 4, 96, 1000, 128, kv_heads=2, decoder=True, bos_token_id=1,
           eos_token_id=2, tie_word_embeddings=True),
    ]
}
