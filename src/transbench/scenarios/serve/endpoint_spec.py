"""`serve --url`: what an endpoint run is asked for, checked before any load. The endpoint serves its own model, so
the in-process settings (--model, --task, --backend, --dtype, the batcher) are refused there, and the request's
`model` is --served-model or the first the endpoint lists."""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import re
from types import SimpleNamespace
from urllib.parse import urlsplit

from ...boundary import link_nowhere, user_path
from ...errors import SpecError
from .http_client import APIS, MODEL_CHARS, is_model_name, served_models, shown

# An endpoint with no local folder to say how long its model's inputs may be: lengths are not capped by positions.
NO_POSITIONS = 1 << 20
TASK = {"openai-embeddings": "embed", "openai-completions": "generate", "openai-chat": "generate"}


def _is_root(url: str) -> bool:
    """An endpoint's root, http(s)://HOST[:PORT][/], with a host a client can resolve: a name of letters, digits,
    `-` and `_` (a container's), an IPv4 address or a bracketed IPv6 one. `http://[::1` and
    `http://999.999.999.999` ended in tracebacks of urlsplit and of httpx, and `http://a b:1` ran a load whose every
    request failed."""
    try:
        parts = urlsplit(url)
        port, host = parts.port, parts.hostname
    except ValueError:  # an unclosed bracket, a port that is not a number below 65536
        return False
    if parts.scheme not in ("http", "https") or not host or parts.path not in ("", "/") or parts.query \
            or parts.fragment or parts.username is not None or (port is not None and port < 1):
        return False
    try:
        ipaddress.ip_address(host)
    except ValueError:
        try:
            name = host.encode("idna").decode("ascii")  # an internationalised name, as the client sends it
        except UnicodeError:
            return False
        labels = name.removesuffix(".").split(".")
        if len(name) > 253 or all(label.isdigit() for label in labels) \
                or not all(re.fullmatch(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)", label) for label in labels):
            return False  # dotted numbers: a bad IPv4 address; other characters: no host name
    # An address is read by the client too: urlsplit finds the host ::1 in `http://x[::1]:1` and `http://[::1]]:1`,
    # which were taken and stored as the cell's URL
    import httpx  # the client (check() has made sure it is installed): its IDNA rules are stricter than Python's

    try:
        httpx.URL(url)
    except httpx.InvalidURL:  # `http://¡` passed Python's idna codec, and failed in the client
        return False
    return True


def check(spec):
    import importlib.util

    ServeSpec = type(spec)  # its defaults: what the CLI passes where an option is not given
    missing = [m for m in ("h11", "httpx") if importlib.util.find_spec(m) is None]
    if missing:
        raise SpecError(f"serve --url needs {' and '.join(missing)}: pip install 'transbench[http]'")

    if "@" in spec.url:  # the refusal below printed the password in clear, and this client sends no credentials
        raise SpecError(f"--url {shown(spec.url)}: credentials in the URL are not supported (this client sends no "
                        "Authorization header): give the endpoint's root, http://HOST:PORT")
    if not _is_root(spec.url):
        raise SpecError(f"--url {spec.url}: give the endpoint's root, http://HOST:PORT (its API paths are added: "
                        "/v1/completions, /v1/chat/completions, /v1/embeddings)")
    # The root without a trailing `/` (or an empty `?` or `#`): the URL is part of a cell's identity, and a resume
    # with `http://h:p/` was refused as another grid than the run made with `http://h:p`.
    parts = urlsplit(spec.url)
    spec = dataclasses.replace(spec, url=f"{parts.scheme}://{parts.netloc}")
    if spec.api not in APIS:
        raise SpecError(f"--url needs --api: choose from {', '.join(APIS)}" if spec.api is None else
                        f"unknown --api '{spec.api}': choose from {', '.join(APIS)}")
    ignored = [flag for flag, name in (("--model", "model"), ("--task", "task"), ("--backend", "backends"),
                                       ("--dtype", "dtype"), ("--device", "device"),
                                       ("--max-batch-size", "max_batch_size"), ("--max-wait-ms", "max_wait_ms"),
                                       ("--activation", "activation"), ("--prepare-budget", "prepare_budget"))
               if getattr(spec, name) != _default(ServeSpec, name)]
    if ignored:
        raise SpecError(f"{', '.join(ignored)} set what runs in this process; the endpoint serves its own model: "
                        "leave them out with --url (name the model with --served-model)")
    if spec.reference_model is not None and spec.api == "openai-chat":
        # the reference continues the prompt as sent, and a chat endpoint answers it wrapped in its chat template: a
        # right answer to another input made the cell `wrong`, its speed never reported
        raise SpecError("--reference-model checks a completion of the prompt as sent, and a chat endpoint answers it "
                        "inside its chat template: check the endpoint with --api openai-completions")
    if not (math.isfinite(spec.request_timeout) and spec.request_timeout > 0):
        raise SpecError(f"--request-timeout must be a positive number of seconds, got {spec.request_timeout:g}")
    for flag, folder in (("--tokenizer", spec.tokenizer), ("--reference-model", spec.reference_model)):
        if folder is not None:
            from pathlib import Path

            try:
                is_dir = user_path(folder, f"{flag} {folder}").is_dir()
            except OSError as exc:  # a name too long: pathlib before Python 3.13 raises (lengths.py _from_file too)
                raise SpecError(f"{flag} {folder}: cannot be read ({exc.strerror or exc})") from None
            if not is_dir:
                why = link_nowhere(user_path(folder, flag)) or "no such folder"  # a loop of links named as one
                raise SpecError(f"{flag} {folder}: {why} (give a local checkpoint or tokenizer folder)")
    from .prompts import has_tokenizer, local_tokenizer, prompt_ids

    if spec.tokenizer is not None and not has_tokenizer(spec.tokenizer):
        raise SpecError(f"--tokenizer {spec.tokenizer}: the folder holds no tokenizer files")
    if spec.reference_model is not None:  # its config and weights read at the input boundary, as `run --model`'s
        from ...models import build

        build.resolve(spec.reference_model)
    # The tokenizer the cell will use (local_tokenizer), loaded here: a broken one failed the cell after the whole
    # load had run (`KeyError: 'added_tokens'`).
    try:
        tokenizer = local_tokenizer(spec.tokenizer, spec.reference_model)
    except SpecError:  # the boundary's own line (prompts.HFTokenizer)
        raise
    except Exception as exc:  # noqa: BLE001 - a corrupt file: transformers and tokenizers raise many kinds
        flag, folder = (("--tokenizer", spec.tokenizer) if spec.tokenizer else
                        ("--reference-model", spec.reference_model))
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise SpecError(f"{flag} {folder}: its tokenizer files cannot be read ({type(exc).__name__}: "
                        f"{first})") from None
    if tokenizer is not None:
        prompt_ids(tokenizer)  # a vocabulary of special tokens alone, refused before the load
    if spec.served_model is not None and not is_model_name(spec.served_model):
        raise SpecError(f"--served-model {spec.served_model!r}: give the name the endpoint serves, 1 to "
                        f"{MODEL_CHARS} printable characters, not all blank (GET /v1/models lists them)")
    served = spec.served_model if spec.served_model is not None else served_models(spec.url)[0]
    task = TASK[spec.api]
    return dataclasses.replace(spec, served_model=served, model=served, task=task, backends=["http"], dtype="-",
                               device="cpu")


def shape_ref(spec):
    """What caps a request's length: the reference or tokenizer folder's positions, else nothing."""
    for folder in (spec.reference_model, spec.tokenizer):
        if folder is None:
            continue
        try:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(folder)
            positions = getattr(config, "max_position_embeddings", None)
        except (OSError, ValueError):
            config = positions = None
        if positions is not None and (isinstance(positions, bool) or not isinstance(positions, int) or positions < 1):
            # a tokenizer folder's config is read only here (a --reference-model's was checked by build.resolve):
            # -5 advised `--new-tokens -6 or less`
            raise SpecError(f"{folder}: its config.json sets max_position_embeddings to {positions!r}, and it must be "
                            "a positive integer: fix config.json")
        if positions:
            # RoBERTa's families number positions from pad_token_id + 1 (build.position_offset), as run counts them:
            # a roberta folder's 514 let 514-token requests through, of which the model holds 512
            from ...models.build import built_pad_token_id, position_offset

            positions -= position_offset(config.model_type, built_pad_token_id(config))
            return SimpleNamespace(name=folder, path=folder, shape=SimpleNamespace(max_positions=positions))
    return SimpleNamespace(name=spec.served_model, path=None, shape=SimpleNamespace(max_positions=NO_POSITIONS))


def _default(cls, name):
    f = cls.__dataclass_fields__[name]
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
