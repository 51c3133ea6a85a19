"""The input boundary: every file, header, store row and environment variable transbench reads from outside
passes through these readers, which bound what a hostile or broken input can cost before any parser or model
builder sees it (bytes, nesting depth, node and item counts, YAML alias expansion, key types) and turn every
refusal into one SpecError line naming the input and the fix (the CLI prints it and exits 2).

It sits in the ground layer beside errors.py, not in core, because the store (ground) reads its rows through it.
The engine depends on nothing of the benchmark and keeps its own two-line bounded reader (engine/tuning.py)."""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
import struct
from itertools import accumulate
from pathlib import Path

from .errors import SpecError

# Limits. Each is far above any legitimate input of its kind and far below what costs seconds or a stack.
SPEC_BYTES = 1 * 2**20  # a sweep file: a few hundred bytes in practice
CONFIG_BYTES = 8 * 2**20  # config.json: kilobytes (per-layer lists included)
TOKENIZER_BYTES = 256 * 2**20  # tokenizer.json of a 256k-word vocabulary is ~35 MB
INDEX_BYTES = 64 * 2**20  # model.safetensors.index.json: one line per tensor
HEADER_BYTES = 100 * 2**20  # the safetensors library's own limit on a header
TABLE_BYTES = 64 * 2**20  # any other JSON document we read whole
DEPTH = 64  # nesting: specs nest 2 deep, config.json 4, a tokenizer.json 5, stored rows 4
NODES = 200_000  # YAML nodes after alias expansion (a spec file has tens)
ENV_CHARS = 4096

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)  # a JSON string, escapes included (unrolled: linear)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
# TOML's strings (multi-line first) and comments, which may hold brackets that open nothing.
_TOML_TEXT = re.compile(r'"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\'|"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'|#[^\n]*')


class BadInput(SpecError):
    """An input refused at the boundary."""


def _fail(where: str, problem: str, fix: str):
    raise BadInput(f"{where}: {problem}: {fix}" if fix else f"{where}: {problem}")


# --- files --------------------------------------------------------------------------------------------

def read_bytes(path: str | Path, where: str, *, limit: int, fix: str = "check the path") -> bytes:
    """The whole file, refused before opening when it is not a regular file (a FIFO would block for ever, a
    device never end) or larger than `limit`; a read error (permissions, a name too long) is one line."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        _fail(where, link_nowhere(p) or "no such file", fix)
    except OSError as exc:
        _fail(where, link_nowhere(p) or f"cannot be read ({exc.strerror or exc})", fix)
    if stat.S_ISDIR(st.st_mode):
        _fail(where, "is a folder, not a file", fix)
    if not stat.S_ISREG(st.st_mode):
        _fail(where, "is not a regular file (a pipe, a device or a socket)", "give a plain file")
    if st.st_size > limit:
        _fail(where, f"{st.st_size:,} bytes is above the {limit:,} bytes read for it", fix)
    try:
        # Non-blocking, and checked again once open: a FIFO put in the file's place after the stat above (a file
        # changed while it is read) held a blocking open() for ever. O_NONBLOCK leaves a regular file's reads as
        # they are.
        with os.fdopen(os.open(p, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                _fail(where, "is not a regular file (a pipe, a device or a socket)", "give a plain file")
            data = f.read(limit + 1)
    except OSError as exc:
        _fail(where, f"cannot be read ({exc.strerror or exc})", "check its permissions")
    if len(data) > limit:  # grew while it was read
        _fail(where, f"is above the {limit:,} bytes read for it", fix)
    return data


def read_text(path: str | Path, where: str, *, limit: int, fix: str = "check the path") -> str:
    data = read_bytes(path, where, limit=limit, fix=fix)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        _fail(where, f"is not UTF-8 text (byte {exc.start})", "save it as UTF-8")


# --- JSON ---------------------------------------------------------------------------------------------

def json_depth(text: str) -> int:
    """How deep the brackets of a JSON text nest, strings skipped: a cheap scan before json.loads, whose
    recursion ends in a RecursionError long before the text's size would."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if not brackets:
        return 0
    return max(0, max(accumulate(1 if c in "[{" else -1 for c in brackets)))


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def loads_json(text: str | bytes, where: str, *, depth: int = DEPTH, fix: str = "fix or replace it",
               pairs_hook=None, finite: bool = False):
    """json.loads with its nesting bounded first; a syntax error names the line and column. finite: NaN, Infinity
    and -Infinity (which Python's json reads, and standard JSON has not) are refused: a config.json's NaN epsilon
    built a model of NaN outputs."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            _fail(where, f"is not UTF-8 text (byte {exc.start})", fix)
    if not isinstance(text, str):
        _fail(where, f"holds {type(text).__name__}, not JSON text", fix)
    if json_depth(text) > depth:
        _fail(where, f"nests deeper than {depth} levels", fix)
    try:
        return json.loads(text, object_pairs_hook=pairs_hook, **({"parse_constant": _no_constant} if finite else {}))
    except json.JSONDecodeError as exc:
        _fail(where, f"invalid JSON at line {exc.lineno}, column {exc.colno} ({exc.msg})", fix)
    except RecursionError:  # the scan is a bound, the parser's own recursion the backstop
        _fail(where, f"nests deeper than {depth} levels", fix)
    except SpecError:  # the pairs hook's own line (a key given twice), not wrapped in a second one
        raise
    except ValueError as exc:  # an integer of over 4,300 digits
        _fail(where, f"a value cannot be read ({str(exc).split(';')[0]})", fix)


def load_json_file(path: str | Path, where: str, *, limit: int = TABLE_BYTES, depth: int = DEPTH,
                   fix: str = "fix or replace it", pairs_hook=None, finite: bool = False):
    return loads_json(read_text(path, where, limit=limit, fix=fix), where, depth=depth, fix=fix,
                      pairs_hook=pairs_hook, finite=finite)


# --- YAML and TOML ------------------------------------------------------------------------------------

def loads_yaml(text: str, where: str, *, loader=None, depth: int = DEPTH, nodes: int = NODES,
               fix: str = "fix it"):
    """YAML through a SafeLoader (or `loader`, a subclass), composed first and walked before anything is
    constructed: the walk counts nodes with every alias expanded (a few hundred bytes of nested aliases
    stand for billions), bounds the depth, and refuses mapping keys that are not text (`1: 2`, `null:`, a
    date), which YAML reads as numbers, None or dates."""
    import yaml

    cls = loader or yaml.SafeLoader
    try:
        ldr = cls(text)
    except yaml.YAMLError as exc:  # its reader refuses control characters as it is made, even in a comment
        _fail(where, f"invalid YAML: {str(exc).splitlines()[0]}", fix)
    try:
        try:
            _yaml_depth_bound(text, cls, where, depth, fix)
            node = ldr.get_single_node()
        except RecursionError:
            _fail(where, f"nests deeper than {depth} levels", fix)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
            what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            _fail(where, f"invalid YAML{at}: {what}", fix)
        if node is None:
            return None
        _walk_yaml(node, where, depth, nodes, fix)
        try:
            return ldr.construct_document(node)
        except RecursionError:
            _fail(where, f"nests deeper than {depth} levels", fix)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            _fail(where, f"invalid YAML{at}: {getattr(exc, 'problem', None) or exc}", fix)
    finally:
        ldr.dispose()


_TEXT_KEYS = ("tag:yaml.org,2002:str", "tag:yaml.org,2002:merge")


def _yaml_depth_bound(text: str, cls, where: str, depth: int, fix: str) -> None:
    """Refuse a document whose collections open deeper than `depth`, from PyYAML's tokens (its scanner does not
    recurse), before its composer recurses into them. A RecursionError caught there is not clean: deep in the stack,
    finalizers that raise print "Exception ignored in sys.unraisablehook" around the error line, and a few thousand
    levels took a second or more each (tests/test_input_boundary.py found both). The walk after composing stays
    the exact bound; indentless sequences, uncounted here, at most double the composer's depth."""
    import yaml

    opens = (yaml.BlockMappingStartToken, yaml.BlockSequenceStartToken, yaml.FlowMappingStartToken,
             yaml.FlowSequenceStartToken)
    closes = (yaml.BlockEndToken, yaml.FlowMappingEndToken, yaml.FlowSequenceEndToken)
    level = 0
    for token in yaml.scan(text, Loader=cls):
        if isinstance(token, opens):
            level += 1
            if level > depth:
                _fail(where, f"nests deeper than {depth} levels", fix)
        elif isinstance(token, closes):
            level -= 1


def _walk_yaml(root, where: str, depth: int, nodes: int, fix: str) -> None:
    import yaml

    stack, seen = [(root, 1)], 0
    while stack:
        node, level = stack.pop()
        seen += 1
        if seen > nodes:
            _fail(where, f"holds more than {nodes:,} values once its aliases are expanded", "write the values out, "
                  "or use fewer aliases")
        if level > depth:
            _fail(where, f"nests deeper than {depth} levels", fix)
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if not (isinstance(key, yaml.ScalarNode) and key.tag in _TEXT_KEYS):
                    shown = key.value if isinstance(key, yaml.ScalarNode) else "a list or mapping"
                    _fail(where, f"key {shown!r} at line {key.start_mark.line + 1} is not text",
                          f"quote it (\"{shown}\") or rename it" if isinstance(key, yaml.ScalarNode) else
                          "keys must be names")
                stack.append((value, level + 1))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, level + 1) for item in node.value)


def loads_toml(text: str, where: str, *, depth: int = DEPTH, fix: str = "fix it"):
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    # Brackets counted first, as json_depth does: tomllib recurses into nested arrays and inline tables, and a
    # RecursionError caught from deep in the stack is not clean (_yaml_depth_bound says why). The document is a
    # table, one level above its brackets; check_tree stays the exact bound.
    brackets = _NOT_BRACKET.sub("", _TOML_TEXT.sub("", text))
    if brackets and 1 + max(accumulate(1 if c in "[{" else -1 for c in brackets)) > depth:
        _fail(where, f"nests deeper than {depth} levels", fix)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:  # its message already ends "(at line L, column C)"
        _fail(where, f"invalid TOML: {str(exc).splitlines()[0]}", fix)
    except RecursionError:
        _fail(where, f"nests deeper than {depth} levels", fix)
    check_tree(data, where, depth=depth, fix=fix)
    return data


def check_tree(value, where: str, *, depth: int = DEPTH, items: int = 10 * NODES, fix: str = "fix it") -> None:
    """A parsed document's nesting and size bounded, without recursion (so any depth is refused cleanly)."""
    stack, seen = [(value, 1)], 0
    while stack:
        v, level = stack.pop()
        seen += 1
        if seen > items:
            _fail(where, f"holds more than {items:,} values", fix)
        if level > depth:
            _fail(where, f"nests deeper than {depth} levels", fix)
        if isinstance(v, dict):
            stack.extend((x, level + 1) for x in v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend((x, level + 1) for x in v)


# --- safetensors --------------------------------------------------------------------------------------

def safetensors_shapes(path: str | Path, where: str, fix: str = "re-download or re-save the weights"
                       ) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape, from the header read here with limits (8 bytes of little-endian length, then that
    many bytes of JSON) before transformers or safetensors opens the file; offsets checked against its size."""
    return {name: shape for name, (_, shape) in safetensors_tensors(path, where, fix).items()}


def safetensors_tensors(path: str | Path, where: str, fix: str = "re-download or re-save the weights"
                        ) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each tensor's (dtype as the header names it, shape), read and checked as `safetensors_shapes` says."""
    p = Path(path)
    try:
        st = os.stat(p)
        if not stat.S_ISREG(st.st_mode):
            _fail(where, "is not a regular file", fix)
        with os.fdopen(os.open(p, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:  # as read_bytes: never blocks
            st = os.fstat(f.fileno())  # the file opened, which a FIFO may have replaced since the stat above
            if not stat.S_ISREG(st.st_mode):
                _fail(where, "is not a regular file", fix)
            size = st.st_size
            raw = f.read(8)
            if len(raw) < 8:
                _fail(where, "is shorter than a safetensors header", fix)
            (n,) = struct.unpack("<Q", raw)
            if n <= 0 or 8 + n > size:
                _fail(where, "its header length runs past the end of the file", fix)
            if n > HEADER_BYTES:
                _fail(where, f"its header of {n:,} bytes is above the {HEADER_BYTES:,} bytes safetensors reads", fix)
            text = f.read(n)
    except OSError as exc:
        _fail(where, f"cannot be read ({exc.strerror or exc})", fix)
    header = loads_json(text, where, depth=8, fix=fix)
    if not isinstance(header, dict):
        _fail(where, "its header is not a JSON object", fix)
    tensors, spans = {}, []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shape = entry.get("shape") if isinstance(entry, dict) else None
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        dtype = entry.get("dtype") if isinstance(entry, dict) else None
        if not (isinstance(shape, list) and len(shape) <= 8 and all(_count(d) for d in shape)
                and isinstance(offsets, list) and len(offsets) == 2 and all(_count(o) for o in offsets)
                and offsets[0] <= offsets[1]):
            _fail(where, f"tensor {name[:80]!r} has no valid shape and data offsets in the header", fix)
        if dtype not in SAFETENSORS_BITS:
            _fail(where, f"tensor {name[:80]!r} has the dtype {str(dtype)[:20]!r}, which safetensors does not know",
                  fix)
        bits = math.prod(shape) * SAFETENSORS_BITS[dtype]
        if bits % 8 == 0 and offsets[1] - offsets[0] != bits // 8:
            _fail(where, f"tensor {name[:80]!r} ({dtype} {shape}) needs {bits // 8:,} bytes, its offsets give "
                  f"{offsets[1] - offsets[0]:,}", fix)
        tensors[name] = (dtype, tuple(shape))
        spans.append((offsets[0], offsets[1], name))
    # As safetensors reads them: the tensors' bytes follow each other from the header's end, no gap or overlap, and
    # end where the file ends. A header that lies here passed this check and failed every cell in the library.
    end = 0
    for begin, stop, name in sorted(spans):
        if begin != end:
            _fail(where, f"tensor {name[:80]!r} starts at byte {begin:,} of the data, not at {end:,} where the one "
                  "before it ends", fix)
        end = stop
    if 8 + n + end > size:
        _fail(where, f"truncated: {size:,} bytes, the header describes {8 + n + end:,}", fix)
    if 8 + n + end < size:
        _fail(where, f"{size - 8 - n - end:,} bytes past the last tensor's end, which safetensors refuses", fix)
    return tensors


# Bits of one element of each dtype safetensors writes (its Dtype enum); the sub-byte ones are packed.
SAFETENSORS_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16,
                    "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64,
                    "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63


# --- values -------------------------------------------------------------------------------------------

def is_number(v) -> bool:
    """A finite JSON number (not a bool, which Python counts as an int). JSON, YAML and TOML read an integer of 400
    digits as an int that no float holds: math.isfinite raised OverflowError on it (a spec's `timeout: 1000...0`
    was a traceback), and no figure or setting of ours is that large."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def is_utf8(text: str) -> bool:
    """Text UTF-8 can hold. Bytes given that are not UTF-8 (a name typed in a Latin-1 terminal, a folder named so)
    reach Python as lone surrogates, which SQLite cannot store and safetensors cannot open as a path."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def ascii_int(text: str) -> int:
    """int() of ASCII digits only: int('٣') is 3, and a counts file or an option is written in ASCII."""
    if not text.isascii():
        raise ValueError(f"not an ASCII number: {text!r}")
    return int(text)


def one_line(text: str, limit: int | None = None) -> str:
    """Outside words (an endpoint's message, an environment variable's value) as one printable line: runs of
    whitespace (newlines) as one space, other characters that do not print (an escape sequence, NUL) escaped, and
    past `limit` characters cut, saying how long the whole was. An error message's "\\x1b[2J" cleared the terminal
    it was printed to, its newlines split one warning over lines, and a 100 kB value echoed whole made a 100 kB
    line."""
    parts = [c if c.isprintable() else ascii(c)[1:-1] for c in " ".join(str(text).split())]
    if limit is None or sum(map(len, parts)) <= limit:
        return "".join(parts)
    kept = list(accumulate(map(len, parts)))
    cut = sum(1 for n in kept if n <= limit)  # whole escapes only: half of "\\x1b" would read as other text
    return f"{''.join(parts[:cut])}... ({len(text):,} characters)"


def exception_line(exc: BaseException) -> str:
    """An exception's message on one line: transformers' and torch's span several (and carry ANSI bold). torch's
    C++ errors append where they were raised and a stack of frames ("Exception raised from THPUtils_unpackLong at
    ...python_numbers.h:90 (most recent call first): frame #0: c10::Error::Error(...)"): cut, the cause kept."""
    text = re.split(r"\n?Exception raised from \S+ at ", str(exc), maxsplit=1)[0]
    text = one_line(re.sub(r"\x1b\[[0-9;]*m", "", text)) or type(exc).__name__
    # Both ends: transformers may open its message with a module's repr and say why only at its end ("BertLayer(
    # (attention): ...) should be used as a decoder model if cross attention is added"), which a cut kept out.
    return text if len(text) <= 300 else f"{text[:150]} ... {text[-145:]}"


# A refusal's line shows a run of characters with no space in it (a value typed or pointed at) whole up to WORD
# characters, as db.SHOWN a stored text, and the whole line up to LINE: `run --model` of 100,000 characters echoed
# the value whole in "unknown model '...'", a line of 100 KB, and so did 30 other options. A path, a key list or a
# preset list reads in well under these.
WORD, LINE = 300, 2_000


def shortened(text: str) -> str:
    """A message with each run of over WORD characters with no space cut to its start and its end, saying how long
    it was, and the message, past LINE characters, cut in its middle: its start says what is wrong, its end the fix
    (a value of 100,000 words has no long run)."""
    def cut(m) -> str:
        word = m.group()
        return f"{word[:WORD - 40]}...({len(word):,} characters)...{word[-20:]}"

    text = re.sub(rf"\S{{{WORD + 1},}}", cut, str(text))
    if len(text) <= LINE:
        return text
    return f"{text[:LINE // 2]} ...({len(text):,} characters)... {text[-(LINE // 2 - 100):]}"


def visible_text(text: str) -> bool:
    """Text that shows something: not only spaces and invisible format characters (U+200B, U+2060, U+FEFF,
    soft hyphens, variation selectors, ...)."""
    import unicodedata

    return any(not c.isspace() and unicodedata.category(c) not in ("Cf", "Mn", "Me", "Zs", "Zl", "Zp", "Cc", "Co",
                                                                    "Cn", "Cs")
               and not ("\ufe00" <= c <= "\ufe0f") for c in text)


# The largest integer torch's sizes and seeds and SQLite's INTEGER hold (spec.INT_MAX, check_int).
INT_MAX = 2**63 - 1
BYTE_UNITS = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "kb": 2**10, "m": 2**20, "mib": 2**20, "mb": 2**20,
              "g": 2**30, "gib": 2**30, "gb": 2**30}


def parse_size(text: str) -> int:
    """'4096', '2^20' or '2**20' -> an int (at most what a 64-bit integer holds; a power is checked before it
    is computed: 2^99999999 would take minutes). The one reader of a size, for an option and a spec file alike
    (declare.setting's `read`, which spec.coerce applies to a file's text): a file refused `sizes: "2^6"`."""
    # [0-9], not \d: \d takes another script's digits too (spec.py read_number)
    m = re.fullmatch(r"\s*([0-9]+)\s*(?:(?:\^|\*\*)\s*([0-9]+)\s*)?", str(text))
    if not m:
        raise SpecError(f"cannot read size '{text}': write an integer or a power like 2^20")
    try:
        base, power = int(m.group(1)), int(m.group(2) or 1)
    except ValueError:  # int() refuses text of over 4,300 digits: `--sizes 999...9` was a traceback
        raise SpecError(f"size '{text.strip()}' is larger than a 64-bit integer holds ({INT_MAX:,})") from None
    if base > 1 and power * math.log2(base) > 63 or base**power > INT_MAX:
        raise SpecError(f"size '{text.strip()}' is larger than a 64-bit integer holds ({INT_MAX:,})")
    return base**power


def parse_bytes(text: str) -> int:
    """'1KiB', '64M', '1GiB', '4096' or '2^20' -> bytes (KiB, MiB and GiB are powers of 1024, as nccl-tests' sizes)."""
    m = re.fullmatch(r"\s*([0-9^*]+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).lower() not in BYTE_UNITS:
        raise SpecError(f"cannot read size '{str(text).strip()}': write bytes as 4096, 2^20, 64KiB, 16MiB or 1GiB")
    return parse_size(m.group(1)) * BYTE_UNITS[m.group(2).lower()]

# --- paths --------------------------------------------------------------------------------------------

def user_path(name: str | Path, where: str) -> Path:
    """`name` with a leading `~` or `~user` expanded, as Path.expanduser does: it raises RuntimeError where the user
    does not exist (or HOME is unset and the password database has no entry), and `serve --trace ~nosuchuser/t.jsonl`,
    `--lengths counts:~x/c.txt` and `--model ~x/ckpt` were tracebacks. SpecError names the input."""
    try:
        return Path(name).expanduser()
    except RuntimeError:
        user = str(name)[1:].split("/", 1)[0]
        raise SpecError(f"{where}: cannot expand '~{user}' (no such user, or no home folder): give the path "
                        "in full") from None


def link_nowhere(path: str | Path) -> str | None:
    """Why `path` is not there where it is a symbolic link: to a missing file, or a loop of links (SQLite said only
    "unable to open database file", the spec reader "not found"); None where it is no such link."""
    try:
        if not os.path.islink(path) or os.path.exists(path):
            return None
        os.stat(path)
    except FileNotFoundError:  # the file at the chain's end: a link to a link names the one that is missing
        return f"is a symbolic link to {os.path.realpath(path)}, which is missing"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "is a loop of symbolic links"
        return None
    return None


def file_above(path: str | Path) -> Path | None:
    """The nearest part of `path` that is there (itself or a folder above it) where it is a file, not a folder: a
    path inside a file (notes.txt/sub/x.json), whose "create the folder" advice the file there refuses."""
    path = Path(path)
    there = next((f for f in (path, *path.parents) if f.exists()), None)
    return there if there is not None and not there.is_dir() else None

# --- environment --------------------------------------------------------------------------------------

def env_text(name: str, default: str | None = None) -> str | None:
    """A variable's value (unset or empty: `default`), refused when absurdly long (a NUL cannot reach a process's
    environment)."""
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    if len(value) > ENV_CHARS:
        raise BadInput(f"environment variable {name} is {len(value):,} characters long: set it to a short value "
                       "or unset it")
    return value


def env_folder(name: str) -> Path | None:
    """The folder a variable names (unset or empty: None), refused in one line when absurdly long (env_text), when it
    holds a character that does not print or is not UTF-8 (a newline, an escape sequence: the folder was made under
    that name, and each line that named it broke or rewrote the terminal), or when it opens with a `~` no shell
    expanded (a quoted `~/cache` made a folder named `~` in the working folder)."""
    value = env_text(name)
    if value is None:
        return None
    if not (value.isprintable() and is_utf8(value)):
        raise BadInput(f"environment variable {name}={one_line(value, 80)} holds a character that does not print or "
                       "is not UTF-8: set it to a folder's path, or unset it")
    if value.startswith("~"):
        raise BadInput(f"environment variable {name}={one_line(value, 80)} opens with a '~' no shell expanded: "
                       "give the path in full, or unset it")
    return Path(value)


def env_int(name: str, default: int | None, lo: int, hi: int, *, strict: bool = False) -> int | None:
    """A whole-number variable clamped to [lo, hi] (a terminal width of 0 or 99,999,999 means nothing useful);
    text that is not ASCII digits is `default`, or refused with `strict`."""
    value = env_text(name)
    if value is None:
        return default
    text = value.strip()
    if not (text.lstrip("+-").isdigit() and text.isascii() and len(text) <= 30):
        if strict:
            raise BadInput(f"environment variable {name}={value[:40]!r} is not a whole number: fix or unset it")
        return default
    return min(hi, max(lo, int(text)))
