"""transbench: honest inference and training benchmarks for BERT and GPT-2 families, plus a fused engine."""

__version__ = "0.1.0"
