"""The backend registry: each backend lives in its own module and exposes BACKEND (or a list)."""

from __future__ import annotations

import importlib

from ..boundary import env_text
from ..errors import SpecError
from .base import Backend, Prepared

# Module names, in the order tables show them.
_MODULES = ("eager", "sdpa", "flash_attn2", "compile", "cudagraph", "onnxruntime", "fused")


def _load() -> dict[str, Backend]:
    found: dict[str, Backend] = {}
    names = [f"{__name__}.{m}" for m in _MODULES]
    # Test-only backends (a broken one, a hanging one, ...) come in through this variable.
    extra = env_text("TRANSBENCH_EXTRA_BACKENDS")
    extras = [n.strip() for n in extra.split(",")] if extra else []
    for name in names + extras:
        if name in extras and not all(part.isidentifier() for part in name.split(".")):
            raise SpecError(f"environment variable TRANSBENCH_EXTRA_BACKENDS names {name!r}, which is not a module "
                            "name: fix or unset it")
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name and name.startswith(__name__):
                continue  # that backend module is not written yet
            if name not in extras:
                raise
            raise SpecError(f"environment variable TRANSBENCH_EXTRA_BACKENDS names {name!r}, a module that cannot be "
                            "imported: fix or unset it") from None
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - an extra module's own import failing (ImportError:
            # win32 only); a module that calls sys.exit() when imported ended the command there, exit 0, nothing run
            if name not in extras:
                raise
            raise SpecError(f"environment variable TRANSBENCH_EXTRA_BACKENDS names {name!r}, whose import fails "
                            f"({type(exc).__name__}): fix or unset it") from None
        forced = getattr(mod, "FORCED", [])
        given = [getattr(mod, "BACKEND", None), *(forced if isinstance(forced, (list, tuple)) else [forced])]
        if name in extras and not all(b is None or isinstance(b, Backend) for b in given):
            # Any module's BACKEND was taken for one (mpmath.libmp.backend's is the text 'python'): a traceback
            raise SpecError(f"environment variable TRANSBENCH_EXTRA_BACKENDS names {name!r}, whose BACKEND or FORCED "
                            "is not a transbench Backend (transbench.backends.base.Backend): fix or unset it")
        for b in given:
            if b is not None:
                found[b.name] = b
    return found


_REGISTRY: dict[str, Backend] | None = None


def registry() -> dict[str, Backend]:
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = _load()
    return _REGISTRY


def get(name: str) -> Backend:
    reg = registry()
    if name not in reg:
        raise SpecError(f"unknown backend '{name}': choose from {', '.join(reg)}")
    if reg[name].check_environment is not None:
        reg[name].check_environment()
    return reg[name]


def family_reason(backend: Backend, family: str) -> str | None:
    """Why `backend` cannot run models of `family` (a transformers model_type), or None when it can: the
    attention implementation the backend times must exist for the family unless it may fall back, and
    the fused engine runs the families it has loaders for."""
    if backend.name == "fused":
        from ..engine.compiled import BERT_LIKE

        return None if family in (*BERT_LIKE, "gpt2") else f"the fused engine runs {', '.join(BERT_LIKE)} and gpt2"
    if backend.attn == "eager" or backend.attn_fallback:
        return None
    from ..models import build

    return build.missing_attention(family, "base", backend.attn)


__all__ = ["Backend", "Prepared", "family_reason", "get", "registry"]
