"""transbench.engine: fused inference for BERT and GPT-2 checkpoints (see compile_model)."""
from .compiled import CompiledModel, compile_model
from .config import EngineOptions, EngineUnsupported
from .gpt2 import Generator

__all__ = ["compile_model", "CompiledModel", "EngineOptions", "EngineUnsupported", "Generator"]
