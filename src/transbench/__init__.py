"""transbench: honest inference and training benchmarks for BERT and GPT-2 families, plus a fused engine."""

import logging as _logging

__version__ = "0.1.0"


def _cpu_build() -> bool:
    import torch

    return torch.version.cuda is None


# Import-time warnings of torchao (`run --quant`) that a user cannot act on. Once torchao is installed, transformers
# imports it whenever it loads a checkpoint, so they came before every checkpoint's bad-input line (one line, by
# rule) and before its run's table: one per CUDA kernel library of torchao, which a CPU build of torch cannot load
# (on a CUDA build the warning says something is wrong, and stays), and torch's deprecation of how torchao registers
# its enums. logger -> (the message's start, when to drop it).
_QUIET = {"torchao": ("Failed to load", _cpu_build),
          "torch.utils._pytree": ("%s is an Enum subclass and is now natively supported", lambda: True)}


def _quiet(start: str, when):
    return lambda record: not (str(record.msg).startswith(start) and when())


for _name, (_start, _when) in _QUIET.items():
    _logging.getLogger(_name).addFilter(_quiet(_start, _when))
