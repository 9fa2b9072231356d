"""The `engramdb` command line: parse arguments, call the library, map errors to exit codes.

Exit codes: 0 success; 1 an EngramError (its message and hint go to stderr); 2 a usage
error. Passphrases come from ENGRAM_PASSPHRASE, --passphrase-file or a prompt, never argv.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import stat
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO, TextIO, cast
from collections.abc import Callable, Iterator

import click

from . import __version__
from . import engram as engram_mod
from .crypto import KDFParams
from .errors import (
    AAAKParseError, DecryptionError, DuplicateIdError, EngramError, FileMissingError, IndexMismatchError,
    ModeMismatchError, UnsafeFilesystemError, ValidationError, WrongPassphraseError, shown,
)
from .records import ALL_FLAGS, EDGE_KINDS, TIERS, Node
from .store import DEFAULT_TIMEOUT, atomic_file, is_lmdb_head
from .tokens import estimate_tokens

if TYPE_CHECKING:  # annotations only: recall loads with the first command that needs it
    from .recall import Hit
    from .importers import ImportReport

PASSPHRASE_ENV = "ENGRAM_PASSPHRASE"
KEY_FILE_ENV = "ENGRAM_KEY_FILE"
PLAINTEXT_ENV = "ENGRAM_PLAINTEXT"
NEW_PASSPHRASE_ENV = "ENGRAM_NEW_PASSPHRASE"
DUMP_PASSPHRASE_ENV = "ENGRAM_DUMP_PASSPHRASE"

# -- global options -------------------------------------------------------------------------
# Every command accepts the global options before or after its name (`engramdb
# --plaintext info F` and `engramdb info F --plaintext` alike): _Group gives each command
# (and each nested group) its own copy of GLOBAL_OPTIONS, and their callbacks record what
# was given in one _Settings per invocation. A new command gets them by being declared with
# ``@cli.command()``; it opens its store with ``_open(ctx, path)``, and shows progress with
# ``_progress(ctx, ...)``, which --quiet hides.


@dataclass
class _Settings:
    """The global options of one invocation, wherever on the command line they were given."""

    values: dict[str, Any] = field(default_factory=dict)
    # where each came from: "commandline" beats "environment"
    sources: dict[str, str] = field(default_factory=dict)

    def get(self, name: str) -> Any:
        return self.values.get(name)


def _settings(ctx: click.Context) -> _Settings:
    root = ctx.find_root()
    settings = root.meta.get("engramdb.settings")
    if settings is None:
        settings = root.meta["engramdb.settings"] = _Settings()
    return settings


def _record_option(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Callback of every global option: remember a value that was given (on the command line
    or in the environment); a later one on the command line wins over the environment."""
    if value is None or value is False or param.name is None:
        return value
    source = ctx.get_parameter_source(param.name)
    where = "environment" if source is click.core.ParameterSource.ENVIRONMENT else "commandline"
    settings = _settings(ctx)
    if settings.sources.get(param.name) == "commandline" and where == "environment":
        return value  # given on the command line before the subcommand; the variable is weaker
    settings.values[param.name] = value
    settings.sources[param.name] = where
    return value


def _global_options() -> list[click.Option]:
    """Fresh copies of the options every command accepts (click needs one object per command)."""
    path = click.Path(dir_okay=False)
    return [
        click.Option(["--passphrase-file"], type=path, callback=_record_option, expose_value=False,
                     help=f"Read the passphrase from this file (else ${PASSPHRASE_ENV}, else a prompt): UTF-8 "
                          "text; line breaks at its end are dropped, spaces kept."),
        click.Option(["--key-file"], type=path, envvar=KEY_FILE_ENV, show_envvar=True, callback=_record_option,
                     expose_value=False,
                     help="Read a raw key or recovery key (ERK1-...) from this file instead of a passphrase."),
        click.Option(["--plaintext"], is_flag=True, default=None, envvar=PLAINTEXT_ENV, show_envvar=True,
                     callback=_record_option, expose_value=False,
                     help="The file is (or will be) unencrypted."),
        click.Option(["-q", "--quiet"], is_flag=True, default=None, callback=_record_option, expose_value=False,
                     help="No progress bars or notes on stderr (errors are still printed)."),
        click.Option(["--timeout"], type=click.FloatRange(min=0), default=None, metavar="SECONDS",
                     callback=_record_option, expose_value=False,
                     help=f"How long to wait for another process writing to, compacting or replacing the file "
                          f"(default {DEFAULT_TIMEOUT:g}; inf waits as long as it takes)."),
        click.Option(["--allow-unsafe-fs"], is_flag=True, default=None, callback=_record_option, expose_value=False,
                     help="Open a file on a network or FUSE filesystem (NFS, SMB, sshfs, ...), refused otherwise: "
                          "only when no other process or machine uses it meanwhile (same as "
                          "ENGRAM_ALLOW_UNSAFE_FS=1)."),
    ]


def _add_global_options(command: click.Command) -> None:
    taken = {opt for param in command.params for opt in getattr(param, "opts", ())}
    command.params.extend(opt for opt in _global_options() if not taken & set(opt.opts))


class _Command(click.Command):
    """A command that also accepts the global options (see GLOBAL OPTIONS above)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _add_global_options(self)


class _Group(click.Group):
    """Turns an EngramError into exit code 1 with its message and hint, never a traceback.

    Its commands (and nested groups) accept the global options too.
    """

    command_class = _Command
    group_class = type  # nested groups are _Groups as well

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _add_global_options(self)

    def invoke(self, ctx: click.Context) -> Any:
        if ctx.parent is not None:  # a nested group: the root maps the errors
            return super().invoke(ctx)
        try:
            return super().invoke(ctx)
        except EngramError as exc:
            _report(exc, ctx.invoked_subcommand)
            ctx.exit(1)
        except (KeyboardInterrupt, click.exceptions.Abort):  # Ctrl-C, or EOF at a prompt
            click.echo("error: interrupted; the transaction in progress was not committed", err=True)
            click.echo("hint: run the command again (work committed before the interruption is kept)", err=True)
            ctx.exit(1)
        except BrokenPipeError:  # `engramdb dump | head`
            sys.stderr.close()
            ctx.exit(0)
        except OSError as exc:  # an input or output path the library never saw
            where = f": {exc.filename}" if exc.filename else ""
            click.echo(f"error: {exc.strerror or exc}{where}", err=True)
            click.echo("hint: check the path and its permissions", err=True)
            ctx.exit(1)


# The library's default hints speak Python (db.update(...)); on the command line, say the
# command instead (issue 12, bug 11). Only default hints are replaced: a specific one stays.
_CLI_HINTS: dict[type[EngramError], str] = {
    DuplicateIdError: "pick another --id, or change the memory with `engramdb update FILE ID`",
    ValidationError: "check the values against `engramdb {command} --help`",
    IndexMismatchError: "run `engramdb verify --fix FILE` to rebuild the indexes from the records",
    UnsafeFilesystemError: "keep the store on a local disk (copy it there while no process writes to it); if no "
                           "other process or machine uses the file at the same time, pass --allow-unsafe-fs (or set "
                           "ENGRAM_ALLOW_UNSAFE_FS=1)",
}


def _report(exc: EngramError, command: str | None, where: str = "") -> None:
    """An EngramError on stderr: its message (after ``where``), then the hint (the command line's own, if any)."""
    click.echo(f"error: {where}{exc.message}", err=True)
    hint = _cli_hint(exc, command)
    if hint:
        click.echo(f"hint: {hint}", err=True)


def _cli_hint(exc: EngramError, command: str | None) -> str:
    for cls in type(exc).__mro__:
        if cls in _CLI_HINTS and exc.hint == getattr(cls, "default_hint", None):
            return _CLI_HINTS[cls].replace("{command}", command or "COMMAND")
    return exc.hint


def _quiet(ctx: click.Context) -> bool:
    return bool(_settings(ctx).get("quiet"))


def _note(ctx: click.Context, text: str) -> None:
    """An informational line on stderr (stdout stays clean for scripts); --quiet hides it."""
    if not _quiet(ctx):
        click.echo(text, err=True)


def _show_progress(stream: Any) -> bool:
    """Bars go to a terminal only (a seam for tests)."""
    return bool(getattr(stream, "isatty", lambda: False)())


def _progress(ctx: click.Context, *, desc: str, unit: str, total: float | None = None,
              unit_scale: bool = False) -> Any:
    """A tqdm bar on stderr with a total where one is known; hidden by --quiet and off a terminal.

    Use it as a context manager; ``bar.update(n)`` advances it.
    """
    from tqdm import tqdm

    stream = sys.stderr
    return tqdm(desc=desc, unit=unit, total=total, unit_scale=unit_scale, file=stream, leave=False,
                disable=_quiet(ctx) or not _show_progress(stream), dynamic_ncols=True)


def _emit(data: Any, as_json: bool, text: Callable[[Any], str]) -> None:
    if as_json:
        click.echo(json.dumps(data, ensure_ascii=False, sort_keys=True, indent=None, default=_json_default))
    else:
        click.echo(text(data))


def _json_loads(text: str) -> Any:
    """json.loads, with JSON nested past the interpreter's recursion limit a JSONDecodeError
    (a raw RecursionError traceback otherwise) for the caller's usual message."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("JSON nests too deeply", text, 0) from None


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(type(value).__name__)


def _read_secret_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().rstrip("\r\n")
    except OSError as exc:
        raise ValidationError(f"cannot read {path}: {exc.strerror}",
                              hint="check the path and its permissions") from None
    except UnicodeDecodeError:
        raise ValidationError(f"{path} is not UTF-8 text", hint="a passphrase file holds the passphrase as text") \
            from None


def _secret(what: str, file: str | None, env: str, file_option: str, *, confirm: bool) -> str:
    """A passphrase from a file, else an environment variable, else a terminal prompt; never argv."""
    if file:
        return _read_secret_file(file)
    if os.environ.get(env):
        return os.environ[env]
    if not sys.stdin.isatty():
        # a file made with `init --plaintext` needs --plaintext every time: say so, it is the
        # one key source a user of such a file would not think of as "a passphrase"
        unencrypted = " (an unencrypted file: --plaintext or ENGRAM_PLAINTEXT=1)" if what == "passphrase" else ""
        raise ValidationError(f"no {what} given",
                              hint=f"set {env}, pass {file_option} FILE, or run in a terminal{unencrypted}")
    return click.prompt(what.capitalize(), hide_input=True, confirmation_prompt=confirm)


def _passphrase(ctx: click.Context, *, confirm: bool = False) -> str:
    return _secret("passphrase", _settings(ctx).get("passphrase_file"), PASSPHRASE_ENV,
                   "--passphrase-file", confirm=confirm)


_KEY_OPTIONS = (("key_file", "--key-file", KEY_FILE_ENV), ("plaintext", "--plaintext", PLAINTEXT_ENV),
                ("passphrase_file", "--passphrase-file", None))


def _key_source(ctx: click.Context) -> str:
    """Which key source the invocation names: "key_file", "plaintext" or "passphrase".

    A command-line option beats an environment variable; two options on the command line
    (or ENGRAM_KEY_FILE with ENGRAM_PLAINTEXT) contradict each other and are refused. With
    none of them, the passphrase comes from $ENGRAM_PASSPHRASE or a prompt.
    """
    settings = _settings(ctx)
    given = [(name, flag, env) for name, flag, env in _KEY_OPTIONS if settings.get(name)]
    for where in ("commandline", "environment"):
        chosen = [(name, flag, env) for name, flag, env in given if settings.sources.get(name) == where]
        if len(chosen) > 1:
            names = " and ".join(flag if where == "commandline" else f"${env}" for _, flag, env in chosen)
            raise click.UsageError(f"{names} name different keys; give one")
        if chosen:
            return "passphrase" if chosen[0][0] == "passphrase_file" else chosen[0][0]
    return "passphrase"


# A key source named for one file only (diff's --a-key-file ...): (kind, value), kind one
# of "key_file", "plaintext", "passphrase_file".
KeyOverride = tuple[str, Any]


def _key_kwargs(ctx: click.Context, *, confirm: bool = False, override: KeyOverride | None = None) -> dict[str, Any]:
    """The key arguments of ``engramdb.open`` (or ``restore``) for this invocation.

    ``confirm``: a new file, so a typed passphrase is asked twice. ``override``: a key
    source for this one file, instead of the global options.
    """
    source, value = override if override is not None else (_key_source(ctx), None)
    if source == "key_file":
        return {"key": engram_mod.read_key_file(value or _settings(ctx).get("key_file"))}
    if source == "plaintext":
        return {"encrypted": False}
    if source == "passphrase_file":
        # only an override names this source (_key_source reads its own file as "passphrase")
        assert isinstance(value, str)
        return {"passphrase": _read_secret_file(value)}
    return {"passphrase": _passphrase(ctx, confirm=confirm)}


def _timeout(ctx: click.Context) -> float | None:
    """--timeout in seconds (default DEFAULT_TIMEOUT); `inf` waits as long as it takes."""
    value = _settings(ctx).get("timeout")
    return DEFAULT_TIMEOUT if value is None else None if value == float("inf") else value


def _allow_unsafe_fs(ctx: click.Context) -> bool:
    """--allow-unsafe-fs (ENGRAM_ALLOW_UNSAFE_FS=1 is read by every open anyway)."""
    return bool(_settings(ctx).get("allow_unsafe_fs"))


def _open(ctx: click.Context, path: str, *, readonly: bool = False, create: bool = False,
          override: KeyOverride | None = None, **kwargs: Any) -> engram_mod.Engram:
    """Open a store with the key source the command line names (--key-file, --plaintext, or a
    passphrase). Only `init` (and `restore`, `import --create`) may create one: a mistyped
    path is an error, not a new empty store. The library's hints speak of keyword
    arguments, so say which option to use.
    """
    shared = _shell_handle(path)
    if shared is not None:  # inside `engramdb shell`: the file is open and unlocked already
        return shared
    source = override[0] if override is not None else _key_source(ctx)
    if not create and not os.path.exists(path):
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise FileMissingError(f"{path}: the directory {parent} does not exist",
                                   hint="check the path (create the directory first for a new store)")
        raise FileMissingError(f"{path} does not exist",
                               hint=f"check the path, or create the store with `engramdb init {path}`")
    kwargs.setdefault("timeout", _timeout(ctx))
    kwargs.setdefault("allow_unsafe_fs", _allow_unsafe_fs(ctx))
    try:
        keys = _key_kwargs(ctx, confirm=create and not os.path.exists(path), override=override)
        return engram_mod.open(path, create=create, readonly=readonly, **keys, **kwargs)
    except ModeMismatchError as exc:
        hint = ("it is encrypted: leave out --plaintext (and $ENGRAM_PLAINTEXT) and give its passphrase or "
                "--key-file" if source == "plaintext"
                else "it is a plaintext file: pass --plaintext, e.g. `engramdb info FILE --plaintext`")
        raise ModeMismatchError(exc.message, hint=hint) from None
    except WrongPassphraseError as exc:
        if source == "key_file":
            hint = "the key in --key-file belongs to another file, or its recovery slot was replaced"
        else:
            hint = (f"check ${PASSPHRASE_ENV} or --passphrase-file; if the passphrase is lost, save the recovery "
                    "key (ERK1-...) in a file and pass --key-file FILE")
        raise WrongPassphraseError(exc.message, hint=hint) from None


STORE_SIDECARS = ("", "-lock", "-maint")


@contextlib.contextmanager
def _removed_on_failure(path: str, create: bool) -> Iterator[None]:
    """A command that creates a store and then fails leaves nothing behind (issue 12, bug 9)."""
    existed = os.path.exists(path)
    try:
        yield
    except BaseException:
        if create and not existed:
            for suffix in STORE_SIDECARS:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path + suffix)
        raise


def _kdf_for(ctx: click.Context, text: str | None) -> KDFParams | None:
    """--kdf, which sets a passphrase's argon2id cost: refused when the key is not a
    passphrase (a plaintext file or a key file has none), rather than ignored."""
    if text is not None and _key_source(ctx) != "passphrase":
        raise click.UsageError("--kdf sets a passphrase's argon2id cost; with --plaintext or a key file there is none")
    return _parse_kdf(text)


def _parse_kdf(text: str | None) -> KDFParams | None:
    if not text:
        return None
    try:
        pairs = [item.split("=", 1) for item in text.split(",")]
        parts = dict((name.strip(), value) for name, value in pairs)
        if len(parts) != len(pairs) or set(parts) != {"t", "m", "p"}:  # a typo is not a default
            raise KeyError
        return KDFParams(t=int(parts["t"]), m_kib=int(parts["m"]), p=int(parts["p"]))
    except (KeyError, ValueError):
        raise click.BadParameter("expected t=N,m=KIB,p=N (each once, nothing else), e.g. t=3,m=65536,p=4",
                                 param_hint="--kdf") from None


def _refuse_same_file(target: str | None, store: str, what: str) -> None:
    """Refuse to write ``target`` when it is ``store`` or one of its sidecars: the atomic
    rename would replace the store by what was read from it."""
    if target is None or target == "-":
        return
    real = os.path.realpath(store)
    if os.path.realpath(target) in (real, real + "-lock", real + "-maint"):
        raise ValidationError(f"{target} is {store} itself; {what} would replace it",
                              hint="write to another path")


@contextlib.contextmanager
def _output(path: str | None, mode: str, **kwargs: Any) -> Iterator[Any]:
    """stdout, or ``path`` replaced atomically through ``path + ".partial"``
    (store.atomic_file: created readable by its owner only, as dumps and exports hold the
    store's plaintext).

    The temporary name is fixed and visible, not click's hidden random one: an interrupted
    run leaves one file the user can see, and the next run removes it first. A device or
    pipe (/dev/null, a FIFO) is written in place: a rename would put a regular file in its
    stead. A symlink's target is replaced, not the link. ``-`` is stdout, as ``-`` is stdin
    for `add` and `restore`.
    """
    if path is None or path == "-":
        with click.open_file("-", mode, **kwargs) as out:
            yield out
        return
    path = os.path.realpath(path)
    if os.path.exists(path) and not stat.S_ISREG(os.stat(path).st_mode):
        with open(path, mode, **kwargs) as out:
            yield out
        return
    _refuse_a_store(path)
    with atomic_file(path, mode, **kwargs) as out:
        yield out


def _refuse_a_store(path: str) -> None:
    """Refuse to replace an engramdb store (an LMDB data file) by a dump or export: `dump
    a.engram -o b.engram` is a completion slip away. An older dump or export is replaced."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(20)
    except OSError:
        return  # missing or unreadable: the write itself says what is wrong
    if is_lmdb_head(head):
        raise ValidationError(f"{path} is an engramdb store; writing there would destroy it",
                              hint="write to a new path, e.g. NAME.aaak or NAME.jsonl; delete the store first "
                                   "if that is what you mean")
def _check_time(_ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An --after/--before value the library's date parser accepts, or a usage error."""
    from .filters import parse_time

    try:
        parse_time(value, param.name or "date")
    except ValidationError:
        raise click.BadParameter(f"{value!r} is not a date; use ISO 8601, e.g. 2023-05-01, 2023-05 or "
                                 "2023-05-01T12:00:00") from None
    return value


_FILTER_NAMES = ("after", "before", "tiers", "tags", "any_tags", "flags", "any_flags", "source")


def _filter_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The filter options of `list`, `recall` and `context`, with one meaning everywhere
    (engramdb.filters); the command receives them as ``filters``, a dict of the given ones."""
    import functools

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        given = {name: kwargs.pop(name) for name in _FILTER_NAMES}
        filters = {k: (list(v) if isinstance(v, tuple) else v) for k, v in given.items() if v not in (None, ())}
        return func(*args, filters=filters, **kwargs)

    options = [
        click.option("--after", callback=_check_time,
                     help="Only memories dated at or after this ISO date/time: by the resolved date when a memory "
                          "has one, else by its creation time."),
        click.option("--before", callback=_check_time,
                     help="Only memories dated before this ISO date/time: by the resolved date when a memory has "
                          "one (that date itself included), else by its creation time (strictly before)."),
        click.option("--tier", "tiers", multiple=True, type=click.Choice(TIERS),
                     help="Only memories in this tier (repeatable: any of them)."),
        click.option("--tag", "tags", multiple=True, help="Only memories with this tag (repeatable: all of them)."),
        click.option("--any-tag", "any_tags", multiple=True,
                     help="Only memories with at least one of these tags (repeatable)."),
        click.option("--flag", "flags", multiple=True, type=click.Choice(ALL_FLAGS),
                     help="Only memories with this flag, e.g. DECISION (repeatable: all of them)."),
        click.option("--any-flag", "any_flags", multiple=True, type=click.Choice(ALL_FLAGS),
                     help="Only memories with at least one of these flags (repeatable)."),
        click.option("--source", help="Only memories of this source."),
    ]
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


@contextlib.contextmanager
def _whole_file_progress(ctx: click.Context, path: str, desc: str) -> Iterator[None]:
    """A bar over the file's bytes for a library call that reports no progress (LMDB's
    compacting copy, verify): the total shows what is being worked through; it completes
    when the call returns."""
    size = os.stat(path).st_size if os.path.exists(path) else None
    with _progress(ctx, desc=desc, unit="B", unit_scale=True, total=size) as bar:
        yield
        if size:
            bar.update(size)


def _text_arg(text: str) -> str:
    """TEXT, or stdin for "-" without the newline(s) that end it: `echo hi | engramdb add F -`
    stores "hi", as the shell's $(...) would (issue 12, bug 8)."""
    if text != "-":
        return text
    if _SHELL.get("script"):
        # `engramdb shell F < script`: stdin is the shell's own lines; reading it took the rest
        # of the script (past what input() had buffered) as the memory's text
        raise click.UsageError("in a shell reading its commands from stdin, - cannot read the text: "
                               "give it on the line, in quotes")
    data = sys.stdin.buffer.read()  # bytes: the stream's own decoding raised, or smuggled surrogates in
    try:
        decoded = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationError(f"stdin is not UTF-8 text (byte {exc.start} cannot be decoded)",
                              hint="convert it to UTF-8 first, e.g. with `iconv -f latin1 -t utf-8`") from None
    return decoded.rstrip("\r\n")  # the text's own CR/CRLF kept, as sys.stdin.read() kept them (POSIX)


_TIME_FIELDS = ("created_at", "last_accessed", "valid_from", "valid_to")


def _iso(ts: float) -> str | float:
    """A Unix timestamp as ISO 8601 in UTC (``2023-11-14T22:13:20Z``; fractions when present),
    or the number itself outside the years 1-9999 (a raw ValueError crashed `list`/`get`)."""
    import datetime

    try:
        return datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc).isoformat().replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):
        return ts


def _readable(data: dict[str, Any]) -> dict[str, Any]:
    """A node's (or hit's) dict with its timestamps as ISO 8601 (dumps keep the exact floats)."""
    out = dict(data)
    for key in _TIME_FIELDS:
        if isinstance(out.get(key), (int, float)) and not isinstance(out[key], bool):
            out[key] = _iso(out[key])
    if isinstance(out.get("node"), dict):
        out["node"] = _readable(out["node"])
    return out


# C0/C1 controls and the Unicode line and paragraph separators: each would end, rewind or
# restyle a terminal line (CRLF text put the cursor back over the id).
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escaped(name: str) -> str:
    """An id or tag on one line: its control characters as Python escapes (``\\n``), so the
    line still tells what to type."""
    return _CONTROLS.sub(lambda m: repr(m.group())[1:-1], name)


def _node_line(node: Any) -> str:
    """One line per memory: the text's runs of control characters (newlines too) shown as one space."""
    tags = f"  [{', '.join(map(_escaped, node.tags))}]" if node.tags else ""
    text = re.sub(f"(?:{_CONTROLS.pattern})+", " ", node.content)
    return f"{_escaped(node.id)}  {node.tier:<7} {text[:80]}{'…' if len(text) > 80 else ''}{tags}"


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=__version__, prog_name="engramdb", message="%(prog)s %(version)s")
def cli() -> None:
    """engramdb: an encrypted, single-file memory store for LLM apps.

    The key comes from --key-file ($ENGRAM_KEY_FILE), --plaintext ($ENGRAM_PLAINTEXT=1) or a
    passphrase: --passphrase-file, else $ENGRAM_PASSPHRASE, else a prompt; never argv. The
    options go before or after the command's name.

    Example:

        ENGRAM_PASSPHRASE=secret engramdb init notes.engram
    """
    try:  # no core dumps: they would hold keys and plaintext
        import resource

        # the soft limit is what the kernel checks; the hard one is kept, so a process that
        # runs the CLI in-process (tests, a notebook) can still let its own children dump
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    except (ImportError, ValueError, OSError):
        pass


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--kdf", "kdf_text", metavar="t=N,m=KIB,p=N", help="argon2id cost (default t=3,m=65536,p=4).")
@click.option("--recovery-key", is_flag=True, help="Also create a recovery key and print it once.")
@click.pass_context
def init(ctx: click.Context, file: str, kdf_text: str | None, recovery_key: bool) -> None:
    """Create a new .engram file.

    Example:

        ENGRAM_PASSPHRASE=secret engramdb init notes.engram --recovery-key
    """
    if os.path.exists(file):
        raise ValidationError(f"{file} exists already", hint="choose a new path, or delete the old file first")
    kdf = _kdf_for(ctx, kdf_text)
    if recovery_key and _key_source(ctx) == "plaintext":
        raise click.UsageError("--recovery-key needs an encrypted file; a plaintext file has no keys")
    keys = _key_kwargs(ctx, confirm=True)
    if "passphrase" in keys:
        keys["kdf"] = kdf
    with _removed_on_failure(file, True), \
            engram_mod.open(file, create=True, allow_unsafe_fs=_allow_unsafe_fs(ctx), **keys) as db:
        click.echo(f"created {file} ({'encrypted' if db.encrypted else 'PLAINTEXT'})")
        if recovery_key:
            click.echo(f"recovery key (store it safely; it is shown once): {db.add_recovery_key()}")


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def info(ctx: click.Context, file: str, as_json: bool) -> None:
    """Show the format, encryption, key slots, counts and sizes of a file.

    Example:

        engramdb info notes.engram --json
    """
    with _open(ctx, file, readonly=True) as db:
        data = db.info()
        # what EmbeddingError's hint sends the user here for: each space's model and dims
        data["spaces"] = {name: {"model": sp.model, "dims": sp.dims, "normalize": sp.normalize, "auto": sp.auto}
                          for name, sp in sorted(db.spaces().items())}

    def text(d: dict[str, Any]) -> str:
        lines = [f"{k:<17}{v}" for k, v in d.items() if k not in ("tables", "key_slots", "spaces")]
        lines.append(f"{'key_slots':<17}{', '.join(s['label'] or s['kind'] for s in d['key_slots']) or '-'}")
        lines.append(f"{'tables':<17}" + ", ".join(f"{k}={v}" for k, v in d["tables"].items() if v))
        lines += [f"{'space ' + name:<16} " + ", ".join(f"{k}={v}" for k, v in sp.items())
                  for name, sp in d["spaces"].items()]
        return "\n".join(lines)

    _emit(data, as_json, text)


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("text")
@click.option("--id", "id_", help="The memory's id (default: random).")
@click.option("--tag", "tags", multiple=True, help="A tag (repeatable).")
@click.option("--importance", type=click.FloatRange(0, 1), help="0..1; slows decay.")
@click.option("--tier", type=click.Choice(TIERS), help="Initial tier.")
@click.option("--source", help="Where the memory came from.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def add(ctx: click.Context, file: str, text: str, id_: str | None, tags: tuple[str, ...],
        importance: float | None, tier: str | None, source: str | None, as_json: bool) -> None:
    """Add one memory (TEXT, or - to read it from stdin, without its final newline) and print its id.

    Example:

        engramdb add notes.engram "Alice moved to Berlin in 2023" --tag people
    """
    text = _text_arg(text)
    if not text.strip():  # an empty memory can never be recalled
        raise ValidationError("nothing to add: the text is empty", hint="pass the memory's text, or - to read it "
                                                                       "from stdin")
    fields: dict[str, Any] = {k: v for k, v in (("id", id_), ("importance", importance), ("tier", tier),
                                                ("source", source)) if v is not None}
    with _open(ctx, file) as db:
        new_id = db.add(text, tags=list(tags), **fields)
    _emit({"id": new_id}, as_json, lambda d: d["id"])


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("id_", metavar="ID")
@click.option("--full", is_flag=True, help="An archived memory as it was before archiving (its full text).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def get(ctx: click.Context, file: str, id_: str, full: bool, as_json: bool) -> None:
    """Print one memory. An archived memory shows its preview and `archived True`; --full
    shows it as it was before it was archived.

    Example:

        engramdb get notes.engram 3f2a... --full --json
    """
    with _open(ctx, file, readonly=True) as db:
        node = db.get(id_, full=full)
    _emit(_node_dict(node), as_json, lambda d: "\n".join(
        f"{k:<14}{v}" for k, v in d.items() if v not in ((), [], {}, "", None)))


def _node_dict(node: Any) -> dict[str, Any]:
    """A node's fields for printing (timestamps in ISO 8601), plus ``archived`` (whether it
    is an archived memory's stub)."""
    data = _readable(node.to_dict())
    data["archived"] = node.archived
    return data


@cli.command(name="list")
@click.argument("file", type=click.Path(dir_okay=False))
@_filter_options
@click.option("--limit", type=click.IntRange(min=0), help="At most this many.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines, one memory a line.")
@click.pass_context
def list_(ctx: click.Context, file: str, filters: dict[str, Any], limit: int | None, as_json: bool) -> None:
    """List memories in insertion order (timestamps in ISO 8601).

    Example:

        engramdb list notes.engram --tag people --after 2024-01 --limit 20
    """
    with _open(ctx, file, readonly=True) as db:
        for n, node in enumerate(db.scan(**filters)):
            if limit is not None and n >= limit:
                break
            def text(_d: Any, node: Node = node) -> str:
                return _node_line(node)

            _emit(_node_dict(node), as_json, text)


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("ids", metavar="ID...", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def delete(ctx: click.Context, file: str, ids: tuple[str, ...], as_json: bool) -> None:
    """Delete memories by id (in one transaction).

    Example:

        engramdb delete notes.engram 3f2a...
    """
    ids = tuple(dict.fromkeys(ids))  # `delete F a a` (ids from a pipe) deletes a: the second one found it gone
    with _open(ctx, file) as db, db.transaction() as tx:
        for id_ in ids:
            tx.delete(id_)
    _emit({"deleted": list(ids)}, as_json, lambda d: f"deleted {len(d['deleted'])}")


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("id_", metavar="ID")
@click.option("--content", help="New text (- to read it from stdin, without its final newline).")
@click.option("--importance", type=click.FloatRange(0, 1), help="0..1; slows decay.")
@click.option("--tier", type=click.Choice(TIERS), help="Move to this tier.")
@click.option("--source", help="Where the memory came from.")
@click.option("--metadata", "metadata_json", metavar="JSON", help="Replace the metadata by this JSON object.")
@click.option("--json", "as_json", is_flag=True, help="Print the updated memory as JSON.")
@click.pass_context
def update(ctx: click.Context, file: str, id_: str, content: str | None, importance: float | None,
           tier: str | None, source: str | None, metadata_json: str | None, as_json: bool) -> None:
    """Change fields of one memory (in one transaction), as db.update(ID, ...) does.

    Tags have their own commands: `engramdb tag` and `engramdb untag`.

    Example:

        engramdb update notes.engram 3f2a... --importance 0.9 --tier hot
    """
    changes: dict[str, Any] = {k: v for k, v in (("importance", importance), ("tier", tier), ("source", source))
                               if v is not None}
    if content is not None:
        changes["content"] = _text_arg(content)
        if not changes["content"].strip():  # as add: `failing-cmd | engramdb update F ID --content -` wiped the text
            raise ValidationError("nothing to store: the new content is empty",
                                  hint="pass the memory's new text, or - to read it from stdin; to remove the "
                                       "memory, `engramdb delete`")
    if metadata_json is not None:
        try:
            changes["metadata"] = _json_loads(metadata_json)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"not JSON ({exc.msg})", param_hint="--metadata") from None
        if not isinstance(changes["metadata"], dict):
            raise click.BadParameter("give a JSON object, e.g. '{\"project\": \"x\"}'", param_hint="--metadata")
    if not changes:
        raise click.UsageError("nothing to change: give --content, --importance, --tier, --source or --metadata")
    with _open(ctx, file) as db:
        node = db.update(id_, **changes)
    _emit(_node_dict(node), as_json, lambda _d: f"updated {node.id}")


def _retag(ctx: click.Context, file: str, id_: str, tags: tuple[str, ...], add: bool, as_json: bool) -> None:
    with _open(ctx, file) as db, db.transaction() as tx:
        old = tx.get(id_).tags
        new = tuple(dict.fromkeys(old + tags)) if add else tuple(t for t in old if t not in tags)
        if new != old:
            tx.update(id_, tags=new)
    _emit({"id": id_, "tags": list(new)}, as_json, lambda d: f"{_escaped(id_)}: {', '.join(map(_escaped, d['tags'])) or '(no tags)'}")


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("id_", metavar="ID")
@click.argument("tags", metavar="TAG...", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def tag(ctx: click.Context, file: str, id_: str, tags: tuple[str, ...], as_json: bool) -> None:
    """Add tags to a memory (those it has stay; prints its tags).

    Example:

        engramdb tag notes.engram 3f2a... people berlin
    """
    _retag(ctx, file, id_, tags, True, as_json)


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("id_", metavar="ID")
@click.argument("tags", metavar="TAG...", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def untag(ctx: click.Context, file: str, id_: str, tags: tuple[str, ...], as_json: bool) -> None:
    """Remove tags from a memory (tags it does not have are ignored; prints its tags).

    Example:

        engramdb untag notes.engram 3f2a... berlin
    """
    _retag(ctx, file, id_, tags, False, as_json)


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("src", metavar="SRC")
@click.argument("dst", metavar="DST")
@click.option("--kind", type=click.Choice(EDGE_KINDS), default="related", show_default=True,
              help="The edge's kind (supersedes ranks DST lower in recall).")
@click.option("--weight", type=click.FloatRange(min=0), default=1.0, show_default=True, help="The edge's weight.")
@click.option("--label", default="", help="A label for the edge.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def link(ctx: click.Context, file: str, src: str, dst: str, kind: str, weight: float, label: str,
         as_json: bool) -> None:
    """Add (or replace) a typed edge SRC -> DST, as db.link() does.

    Example:

        engramdb link notes.engram new-plan old-plan --kind supersedes
    """
    with _open(ctx, file) as db:
        db.link(src, dst, kind, weight=weight, label=label)
    _emit({"src": src, "dst": dst, "kind": kind, "linked": True}, as_json,
          lambda _d: f"linked {src} -[{kind}]-> {dst}")


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("src", metavar="SRC")
@click.argument("dst", metavar="DST")
@click.option("--kind", type=click.Choice(EDGE_KINDS), default="related", show_default=True,
              help="The kind of the edge to remove.")
@click.option("--missing-ok", is_flag=True, help="No error when there is no such edge.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def unlink(ctx: click.Context, file: str, src: str, dst: str, kind: str, missing_ok: bool, as_json: bool) -> None:
    """Remove the edge SRC -> DST of --kind, as db.unlink() does.

    Example:

        engramdb unlink notes.engram new-plan old-plan --kind supersedes
    """
    from .errors import NotFoundError

    with _open(ctx, file) as db:
        try:
            found = db.unlink(src, dst, kind, missing_ok=missing_ok)
        except NotFoundError as exc:
            if src in db and dst in db:  # the edge is missing, not a memory
                raise NotFoundError(exc.message, hint=f"list the edges with `engramdb edges {file} {src}`") from None
            raise
    _emit({"src": src, "dst": dst, "kind": kind, "removed": found}, as_json,
          lambda _d: f"unlinked {src} -[{kind}]-> {dst}" if found else f"no {kind} edge from {src} to {dst}")


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("id_", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines, one edge a line.")
@click.pass_context
def edges(ctx: click.Context, file: str, id_: str, as_json: bool) -> None:
    """List the edges leaving a memory (links and tunnels), as db.edges() does.

    Example:

        engramdb edges notes.engram new-plan
    """
    with _open(ctx, file, readonly=True) as db:
        found = db.edges(id_)
    for edge in found:
        data = _readable({"src": edge.src, "dst": edge.dst, "kind": edge.kind, "weight": edge.weight,
                          "label": edge.label, "created_at": edge.created_at, "valid_from": edge.valid_from,
                          "valid_to": edge.valid_to})
        _emit(data, as_json, lambda d: f"{_escaped(d['src'])} -[{d['kind']}]-> {_escaped(d['dst'])}  "
                                        f"weight={d['weight']:g}" + (f"  {_escaped(d['label'])}" if d["label"] else ""))


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--fix", is_flag=True, help="Rebuild derived data (id map, indexes, digests) from the records.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def verify(ctx: click.Context, file: str, fix: bool, as_json: bool) -> None:
    """Check structure, header, every value's authentication and the cross-table invariants.

    Exit code 0 when clean, 1 when problems were found.

    Example:

        engramdb verify notes.engram
    """
    # verify reports what an open refuses; the bar is by the file's bytes, done at the end
    # (the checks report no progress of their own)
    with _open(ctx, file, readonly=not fix, repair=True) as db, _whole_file_progress(ctx, file, "verifying"):
        try:
            problems = db.verify(fix=fix)
        except DecryptionError as exc:  # only --fix raises: it rebuilds from the records, and one does not open
            raise DecryptionError(f"verify --fix rebuilds the derived data from the records, and a damaged record "
                                  f"cannot be rebuilt: {exc.message}",
                                  hint=f"salvage the intact memories: `engramdb dump --skip-damaged {file} -o S.aaak`, "
                                       "then `engramdb restore S.aaak NEW.engram`") from None
    _emit([{"kind": p.kind, "detail": p.detail} for p in problems], as_json,
          lambda ps: "\n".join(f"{p['kind']}: {p['detail']}" for p in ps) if ps else "ok")
    if problems and not fix:
        ctx.exit(1)


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def compact(ctx: click.Context, file: str, as_json: bool) -> None:
    """Rewrite the file without free pages; deleted data leaves the file. Needs exclusive access.

    Example:

        engramdb compact notes.engram
    """
    before = os.stat(file).st_size if os.path.exists(file) else 0
    with _open(ctx, file) as db, _whole_file_progress(ctx, file, "compacting"):
        db.compact()
    _emit({"file": file, "before": before, "after": os.stat(file).st_size}, as_json,
          lambda d: f"compacted {file}: {d['before']} -> {d['after']} bytes")


def _command_summarizer(command: str) -> tuple[Callable[[list[str]], str], list[str]]:
    """A summarizer that runs ``command`` with the texts on stdin as a JSON list of strings
    and takes its standard output (stripped) as the summary; failures are collected."""
    import shlex
    import shutil
    import subprocess

    from .maintenance.lifecycle import MIN_SUMMARY_CHARS

    try:
        argv = shlex.split(command)
    except ValueError as exc:  # an unclosed quote or a trailing backslash
        raise click.UsageError(f"--summarizer-cmd: {exc} in {command!r}") from None
    if not argv or shutil.which(argv[0]) is None:
        raise click.UsageError(f"--summarizer-cmd: cannot find the program {argv[0] if argv else command!r}")
    failures: list[str] = []

    def summarize(texts: list[str]) -> str:
        try:
            done = subprocess.run(argv, input=json.dumps(texts, ensure_ascii=False), capture_output=True,
                                  text=True, encoding="utf-8", check=False)
        except OSError as exc:
            failures.append(str(exc))
            raise
        except (UnicodeEncodeError, UnicodeDecodeError) as exc:  # the pass leaves the cluster alone on any exception: say why
            failures.append(f"the texts or the summary are not UTF-8 ({exc.reason})")
            raise
        if done.returncode != 0:
            failures.append(f"exit status {done.returncode}: {done.stderr.strip()[:200]}")
            raise RuntimeError(failures[-1])
        summary = done.stdout.strip()
        if len(summary) < MIN_SUMMARY_CHARS:  # the pass leaves the cluster alone: say so
            failures.append(f"a summary under {MIN_SUMMARY_CHARS} characters: {summary!r}")
        return summary

    return summarize, failures


def _maintenance_text(d: dict[str, Any]) -> str:
    tiers = ", ".join(f"{t} {n}" for t, n in d["after_by_tier"].items())
    head = "would change" if d["plan"] else "maintained"
    return (f"{head}: {d['decayed']} decayed, {d['deduplicated']} deduplicated, {d['clusters_found']} clusters "
            f"({d['summarized']} memories summarized), {d['archived']} archived"
            + (f" ({d['bytes_dropped']} bytes of text dropped)" if d["bytes_dropped"] else "")
            + f"; {d['after_total']} memories ({tiers}); compared {d['compared']}"
            + (" (full pass)" if d["full"] else "") + ("; nothing written" if d["plan"] else ""))


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--plan", is_flag=True, help="Report what would change; write nothing.")
@click.option("--now", "now_text", metavar="ISO", help="The pass's clock, an ISO 8601 time (default: now).")
@click.option("--summarizer-cmd", metavar="CMD",
              help="Summarize clusters with CMD: it gets the texts on stdin as a JSON list of strings "
                   "and prints the summary.")
@click.option("--full", is_flag=True, help="Compare every memory, not only those changed since the last pass.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def maintain(ctx: click.Context, file: str, plan: bool, now_text: str | None, summarizer_cmd: str | None,
             full: bool, as_json: bool) -> None:
    """Run the maintenance pass: tier decay, dedupe, clusters with summaries, archive.

    Incremental (only memories changed since the last pass are compared), in small write
    batches, and resumable: a pass that was killed is finished by the next run. Clusters
    are summarized only with --summarizer-cmd; the summaries become new memories and their
    sources are archived. See spec/maintenance.md.

    Example:

    \b
        engramdb maintain notes.engram --plan
        engramdb maintain notes.engram --summarizer-cmd "python summarize.py" --json
    """
    from .maintenance.lifecycle import MaintenanceConfig, parse_iso

    now = parse_iso(now_text) if now_text is not None else None
    summarizer, failures = _command_summarizer(summarizer_cmd) if summarizer_cmd else (None, [])
    config = MaintenanceConfig(incremental=not full)
    with _open(ctx, file, readonly=plan) as db, _progress(ctx, desc="maintaining", unit=" steps") as bar:
        stages: list[str] = []

        def progress(stage: str, done: int, total: int) -> None:
            if not stages or stages[-1] != stage:
                stages.append(stage)
                bar.set_description(stage)
                bar.reset(total=total)
            bar.update(done - bar.n)

        report = db.maintain(config, summarizer, now=now, plan=plan, progress=progress)
    if failures:
        click.echo(f"warning: the summarizer failed for {len(failures)} cluster(s): {failures[0]}", err=True)
    _emit(report.to_dict(), as_json, _maintenance_text)


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--new-passphrase-file", type=click.Path(dir_okay=False),
              help="Read the new passphrase from here: UTF-8 text; line breaks at its end are dropped, spaces kept.")
@click.option("--kdf", "kdf_text", metavar="t=N,m=KIB,p=N", help="argon2id cost for the new passphrase.")
@click.option("--no-compact", is_flag=True, help="Skip compacting (the old wrapped key stays in free pages).")
@click.pass_context
def rekey(ctx: click.Context, file: str, new_passphrase_file: str | None, kdf_text: str | None,
          no_compact: bool) -> None:
    """Change the passphrase. Re-wraps the data key; no data is re-encrypted.

    The new passphrase comes from $ENGRAM_NEW_PASSPHRASE, --new-passphrase-file or a prompt.

    Example:

        ENGRAM_PASSPHRASE=old ENGRAM_NEW_PASSPHRASE=new engramdb rekey notes.engram
    """
    kdf = _parse_kdf(kdf_text)
    if kdf is not None:
        kdf.check()  # before the unlock and the prompts, not after the new passphrase was typed twice
    with _open(ctx, file) as db:
        _require_encrypted(db, file)
        new = _secret("new passphrase", new_passphrase_file, NEW_PASSPHRASE_ENV, "--new-passphrase-file",
                      confirm=True)
        db.rekey(new, kdf=kdf)
        if not no_compact:
            try:
                db.compact()
            except EngramError as exc:  # the rekey is committed: never let it look like it failed
                raise type(exc)(f"the passphrase was changed, but the file was not compacted: {exc.message}",
                                hint=f"use the new passphrase from now on; run `engramdb compact {file}` later "
                                     "so the old wrapped key leaves the file") from None
    click.echo("passphrase changed")


def _require_encrypted(db: engram_mod.Engram, file: str) -> None:
    """Refuse a key command on a plaintext file with the way to an encrypted one."""
    if not db.encrypted:
        raise ModeMismatchError(f"{file} is a plaintext file; it has no passphrase or keys",
                                hint=f"to encrypt it, dump it and restore the dump into a new file with a "
                                     f"passphrase: `engramdb dump {file} -o F.aaak`, then "
                                     f"`ENGRAM_PASSPHRASE=... engramdb restore F.aaak NEW.engram`")


@cli.command(name="recovery-key")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--no-compact", is_flag=True,
              help="Skip compacting after replacing a recovery key (the old one's wrapped key stays in free pages).")
@click.pass_context
def recovery_key(ctx: click.Context, file: str, as_json: bool, no_compact: bool) -> None:
    """Create (or replace) the recovery key and print it once.

    Replacing one compacts the file, as rekey does, so the old key's slot leaves it.

    Example:

        engramdb recovery-key notes.engram > recovery.txt
    """
    with _open(ctx, file) as db:
        _require_encrypted(db, file)
        replaced = any(slot["label"] == "recovery" for slot in db.info()["key_slots"])
        _emit({"recovery_key": db.add_recovery_key()}, as_json, lambda d: d["recovery_key"])
        if replaced and not no_compact:
            sys.stdout.flush()  # the new key is out before anything else can fail
            try:
                db.compact()
            except EngramError as exc:  # the new key is committed and printed: never let it look lost
                raise type(exc)(f"the recovery key was replaced (the new one is printed above), but the file was "
                                f"not compacted: {exc.message}",
                                hint=f"run `engramdb compact {file}` when no other process has it open: until then "
                                     "the old recovery key's slot stays in the file's free pages") from None


@cli.command(name="export-key")
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@click.pass_context
def export_key(ctx: click.Context, file: str, out: str, force: bool) -> None:
    """Save the key header (salt, KDF settings, wrapped keys; no secrets) to OUT.

    Keep it apart from the data; `engramdb import-key` puts it back if the file's header is damaged.

    Example:

        engramdb export-key notes.engram notes.key
    """
    if os.path.exists(out) and not force:  # it may be the only key backup of another store
        raise ValidationError(f"{out} exists; export-key does not overwrite it",
                              hint="choose a new path, or pass --force to replace it")
    with _open(ctx, file, readonly=True) as db:
        db.export_key(out)
    click.echo(f"wrote {out}")


@cli.command(name="import-key")
@click.argument("file", type=click.Path(dir_okay=False, exists=True))
@click.argument("keyfile", type=click.Path(dir_okay=False, exists=True))
@click.option("--force", is_flag=True,
              help="Replace an intact header that holds other keys (a passphrase or recovery key made since the "
                   "export then stops working).")
@click.pass_context
def import_key(ctx: click.Context, file: str, keyfile: str, force: bool) -> None:
    """Restore a damaged header from a key file written by export-key.

    A file whose header is intact but holds other keys than KEYFILE is left alone without --force.

    Example:

        engramdb import-key notes.engram notes.key
    """
    keys = _key_kwargs(ctx)
    if "encrypted" in keys:
        raise click.UsageError("a plaintext file has no key header to import")
    engram_mod.import_key(file, keyfile, allow_unsafe_fs=_allow_unsafe_fs(ctx), force=force, **keys)
    click.echo(f"restored the header of {file}")


def _dump_passphrase(passphrase_file: str | None, *, confirm: bool) -> str:
    return _secret("dump passphrase", passphrase_file, DUMP_PASSPHRASE_ENV, "--dump-passphrase-file",
                   confirm=confirm)


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write here instead of stdout.")
@click.option("--encrypt", is_flag=True,
              help=f"Encrypt the dump (argon2id + AES-256-GCM); passphrase from ${DUMP_PASSPHRASE_ENV}.")
@click.option("--dump-passphrase-file", type=click.Path(dir_okay=False), help="The dump passphrase, from a file.")
@click.option("--skip-damaged", is_flag=True,
              help="Salvage: leave out values that fail authentication (listed on stderr) instead of failing.")
@click.option("--format", "fmt", type=click.Choice(["v3", "v2"]), default="v3", show_default=True,
              help="v3: the whole store, lossless. v2: only the zettel view (memories, tunnels, entity table) "
                   "as zettel-compress writes it, for zettel-compress users (not a backup).")
@click.pass_context
def dump(ctx: click.Context, file: str, output: str | None, encrypt: bool, dump_passphrase_file: str | None,
         skip_damaged: bool, fmt: str) -> None:
    """Write the whole store as canonical AAAK v3 text (plaintext unless --encrypt).

    To salvage a damaged file: dump it with --skip-damaged, then restore the dump into a new file.
    With --format v2, write what zettel-compress can read instead (see spec/aaak.md 6.1).

    Example:

        engramdb dump notes.engram -o notes.aaak
    """
    from .aaak import open_encrypted_writer

    if fmt == "v2":
        if encrypt or skip_damaged:
            raise click.UsageError("--format v2 writes plain zettel-compress text; it takes no --encrypt "
                                   "or --skip-damaged")
        _refuse_same_file(output, file, "the dump")
        with _open(ctx, file, readonly=True) as db, _output(output, "wb") as raw:
            renumbered = db.dump_v2(raw)
        if renumbered:
            click.echo("note: AAAK v2 ids must be digits; memories were numbered 001, 002, ... in id order",
                       err=True)
        return

    if encrypt and output in (None, "-") and sys.stdout.isatty():
        raise ValidationError("an encrypted dump is binary", hint="write it to a file with -o OUT")
    _refuse_same_file(output, file, "the dump")
    dump_pw = _dump_passphrase(dump_passphrase_file, confirm=True) if encrypt else None
    with _open(ctx, file, readonly=True) as db, \
            _progress(ctx, desc="dumping", unit=" memories", total=len(db)) as bar:
        def progress(n: int) -> None:
            bar.update(n - bar.n)

        damaged: list[str] = []
        on_damaged = damaged.append if skip_damaged else None
        with _output(output, "wb") as raw:
            if dump_pw is not None:
                with open_encrypted_writer(raw, dump_pw) as text:
                    db.dump(text, progress=progress, on_damaged=on_damaged)
            else:
                db.dump(raw, progress=progress, on_damaged=on_damaged)
    for line in damaged:
        click.echo(f"warning: left out damaged {line}", err=True)
    if damaged:
        click.echo(f"salvaged: {len(damaged)} damaged value(s) left out; restore this dump into a new file",
                   err=True)


def _dump_node_count(path: str) -> int | None:
    """How many memories (``@n`` lines) a plaintext dump file holds: the total of the restore
    bar (one quick pass over the file). None for stdin or an encrypted dump."""
    from .aaak import is_encrypted_dump

    if path == "-" or not os.path.isfile(path):
        return None
    with open(path, "rb") as fh:
        if is_encrypted_dump(fh.read(16)):
            return None
        fh.seek(0)
        return sum(1 for line in fh if line.startswith(b"@n "))


@contextlib.contextmanager
def _warnings_to_stderr(ctx: click.Context) -> Iterator[None]:
    """The library's UserWarnings (e.g. what --allow-edited let through) as `warning:` lines."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        try:
            yield
        finally:
            for w in caught:
                click.echo(f"warning: {w.message}", err=True)


def _read_dump_source(source: str, dump_passphrase_file: str | None) -> TextIO | BinaryIO:
    """A stream of the dump at ``source`` ("-" for stdin): the file's bytes, or the text an
    encrypted dump decrypts to."""
    from .aaak import decrypt_dump, is_encrypted_dump

    from .importers import detect_format

    raw = cast(BinaryIO, click.open_file(source, "rb"))  # click types it IO[Any]; "rb" opens bytes
    head = raw.peek(64)[:64] if hasattr(raw, "peek") else b""
    # a store or an import source given as the dump failed as "not UTF-8 text ... look for a hand edit"
    if is_lmdb_head(head):
        raise ValidationError(f"{source} is an engramdb store, not a dump",
                              hint=f"to copy a store, dump it first (`engramdb dump {source} -o COPY.aaak`) and "
                                   "restore that")
    try:
        kind = detect_format(head)
    except EngramError:
        kind = ""
    if kind in ("terronex", "jsonl"):
        raise ValidationError(f"{source} is a {'Terronex .engram' if kind == 'terronex' else 'JSONL'} file, "
                              "not a dump", hint=f"bring it in with `engramdb import {source} FILE --create`")
    if is_encrypted_dump(head[:16]):
        try:
            return decrypt_dump(raw, _dump_passphrase(dump_passphrase_file, confirm=False))
        except WrongPassphraseError as exc:  # its default hint names the store's passphrase
            raise WrongPassphraseError(exc.message, hint=f"check the dump passphrase (${DUMP_PASSPHRASE_ENV} or "
                                                         "--dump-passphrase-file): the one given to "
                                                         "`dump --encrypt`") from None
    return raw


@cli.command()
@click.argument("dump_file", metavar="DUMP", type=click.Path(dir_okay=False, allow_dash=True, exists=True))
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--force", is_flag=True, help="Replace FILE if it exists.")
@click.option("--allow-edited", is_flag=True,
              help="Accept a hand-edited dump: a trailer whose SHA-256 or record count no longer matches, and a "
                   "missing final newline, each with a warning. The grammar, record order and the trailer line "
                   "itself are still enforced.")
@click.option("--kdf", "kdf_text", metavar="t=N,m=KIB,p=N", help="argon2id cost for the new file.")
@click.option("--dump-passphrase-file", type=click.Path(dir_okay=False), help="The passphrase of an encrypted dump.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def restore(ctx: click.Context, dump_file: str, file: str, force: bool, allow_edited: bool, kdf_text: str | None,
            dump_passphrase_file: str | None, as_json: bool) -> None:
    """Rebuild a store from a dump. FILE is replaced only once the new store is complete and verified.

    Memories are added in id order, so recall may rank memories with exactly equal scores in
    another order than in the original store (spec/aaak.md section 4.2).

    Example:

        engramdb restore notes.aaak restored.engram
    """
    from .backup import restore as restore_store

    _refuse_same_file(file, dump_file, "the restored store")
    if os.path.exists(file) and not force:
        raise ValidationError(f"{file} exists; restore does not overwrite it", hint="pass --force to replace it")
    kdf = _kdf_for(ctx, kdf_text)
    options = _key_kwargs(ctx, confirm=True)
    if "passphrase" in options:
        options["kdf"] = kdf
    if _allow_unsafe_fs(ctx):
        options["allow_unsafe_fs"] = True
    source = _read_dump_source(dump_file, dump_passphrase_file)
    with _progress(ctx, desc="restoring", unit=" memories", total=_dump_node_count(dump_file)) as bar, \
            _warnings_to_stderr(ctx):
        def progress(n: int) -> None:
            bar.update(n - bar.n)

        try:
            count = restore_store(source, file, force=force, allow_edited=allow_edited, progress=progress,
                                  **options)
        except DecryptionError as exc:  # raised while reading the dump, not the store: its hint names verify
            if isinstance(exc, WrongPassphraseError):
                raise
            raise DecryptionError(exc.message, hint=f"the encrypted dump {dump_file} is damaged or truncated; "
                                                    f"{file} was left as it was; use an intact copy of the dump") \
                from None
    _emit({"file": file, "memories": count}, as_json, lambda d: f"restored {count} memories into {file}")


def _side_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--a-*/--b-* key sources of `diff`, one set per side."""
    for side in ("b", "a"):
        for option in (
            click.option(f"--{side}-plaintext", is_flag=True, help=f"{side.upper()} is a plaintext store."),
            click.option(f"--{side}-key-file", type=click.Path(dir_okay=False),
                         help=f"The raw key or recovery key of store {side.upper()}."),
            click.option(f"--{side}-passphrase-file", type=click.Path(dir_okay=False),
                         help=f"The passphrase of {side.upper()} (a store, or an encrypted dump)."),
        ):
            func = option(func)
    return func


def _side_override(options: dict[str, Any], side: str) -> KeyOverride | None:
    given = [(kind, options[f"{side}_{kind}"]) for kind in ("key_file", "plaintext", "passphrase_file")
             if options[f"{side}_{kind}"]]
    if len(given) > 1:
        raise click.UsageError(f"--{side}-key-file, --{side}-plaintext and --{side}-passphrase-file name different "
                               "keys; give one")
    return given[0] if given else None


def _canonical_lines(ctx: click.Context, path: str, override: KeyOverride | None) -> list[str]:
    """The canonical dump of ``path`` (a store, or a dump file, plain or encrypted) as lines,
    without the trailer (its count and SHA-256 differ whenever anything does)."""
    import io

    from .aaak import DUMP_HEADER, is_encrypted_dump

    with open(path, "rb") as fh:
        head = fh.read(len(DUMP_HEADER))
    if is_encrypted_dump(head[:16]) or head == DUMP_HEADER.encode("ascii"):
        pw_file = override[1] if override is not None and override[0] == "passphrase_file" else None
        source = _read_dump_source(path, pw_file)
        try:
            raw = source.read()
        finally:
            source.close()
        text = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
    else:
        buf = io.StringIO()
        with _open(ctx, path, readonly=True, override=override) as db:
            db.dump(buf)
        text = buf.getvalue()
    return [line for line in text.splitlines(keepends=True) if not line.startswith("@end ")]


@cli.command()
@click.argument("a", type=click.Path(dir_okay=False, exists=True))
@click.argument("b", type=click.Path(dir_okay=False, exists=True))
@_side_options
@click.pass_context
def diff(ctx: click.Context, /, a: str, b: str, **side_options: Any) -> None:  # click passes ctx first
    """A unified diff of the contents of A and B, each a store or a dump (plain or encrypted).

    Both sides use the global key options unless --a-* or --b-* name one for that side; an
    encrypted dump takes --a/--b-passphrase-file, else $ENGRAM_DUMP_PASSPHRASE. Exit code
    0 when they hold the same content, 1 when they differ, 2 when a side cannot be read
    (as diff(1): a script's `engramdb diff a b || alert` must not take a wrong key for a change).

    Example:

        engramdb diff yesterday.aaak notes.engram --a-passphrase-file old.txt
    """
    import difflib

    texts = []
    for path, side in ((a, "a"), (b, "b")):
        try:
            texts.append(_canonical_lines(ctx, path, _side_override(side_options, side)))
        except (WrongPassphraseError, ModeMismatchError) as exc:
            # two files, maybe two keys: say which side failed and how to key that side alone
            exc.hint = (f"{exc.hint}; to key {side.upper()} alone: --{side}-passphrase-file, "
                        f"--{side}-key-file or --{side}-plaintext")
            _report(exc, "diff", where=f"{side.upper()} ({path}): ")
            ctx.exit(2)
        except EngramError as exc:
            _report(exc, "diff", where=f"{side.upper()} ({path}): ")
            ctx.exit(2)
    changed = False
    for line in difflib.unified_diff(texts[0], texts[1], fromfile=a, tofile=b):
        changed = True
        click.echo(line, nl=False)
    if changed:
        ctx.exit(1)


def _check_date(value: str | None) -> str | None:
    """A YYYY-MM-DD date, or a usage error (compress would silently ignore anything else)."""
    import datetime

    if value is None:
        return None
    try:
        datetime.date.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a date; use YYYY-MM-DD, e.g. 2024-05-02") from None
    return value


def _chat_messages(path: str, raw: str) -> list[dict[str, Any] | str]:
    """The messages of a JSON chat document: a list of messages, or ``{"messages": [...]}``."""
    hint = 'give a JSON list of messages (objects with speaker, text and date), or {"messages": [...]}'
    try:
        doc = _json_loads(raw)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"{path}, line {exc.lineno}: not JSON ({exc.msg})", hint=hint) from None
    messages = doc.get("messages") if isinstance(doc, dict) else doc
    if not isinstance(messages, list) or not all(isinstance(m, (dict, str)) for m in messages):
        raise ValidationError(f"{path} is not a chat: expected a list of messages", hint=hint)
    return messages


def _read_ingest_input(path: str, fmt: str, encoding: str = "utf-8") -> tuple[str | list[dict[str, Any] | str], str]:
    """(text or messages, default source name) of one ingest input.

    A byte-order mark at the start (Project Gutenberg texts have one) is not text: it is
    dropped (issue 12, bug 10).
    """
    import codecs

    try:
        codec = codecs.lookup(encoding).name
    except LookupError:
        raise click.BadParameter(f"unknown encoding {encoding!r}", param_hint="--encoding") from None
    try:
        with click.open_file(path, "rb") as fh:
            raw = fh.read().decode("utf-8-sig" if codec == "utf-8" else codec).removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        shown_name = "UTF-8" if codec == "utf-8" else encoding
        raise ValidationError(f"{path} is not {shown_name} text (byte {exc.start} cannot be decoded)",
                              hint="name its encoding, e.g. --encoding latin-1 (or cp1252)") from None
    if "\x00" in raw:
        # text never holds NUL: a binary file that happens to decode (zeros, UTF-16 without a
        # byte-order mark) was stored as memories no query finds
        at = raw.index("\x00")
        raise ValidationError(f"{path} is not text: it holds a NUL character (at character {at})",
                              hint="give a text file; for UTF-16 text, name it: --encoding utf-16")
    name = "stdin" if path == "-" else os.path.basename(path)
    if fmt == "auto":
        fmt = {".jsonl": "jsonl", ".json": "chat", ".md": "markdown", ".markdown": "markdown"}.get(
            os.path.splitext(path)[1].lower(), "text")
    if fmt == "chat":
        return _checked_messages(path, _chat_messages(path, raw)), name
    if fmt != "jsonl":
        return raw, name
    messages = []
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = _json_loads(line)
        except json.JSONDecodeError as exc:
            raise ValidationError(f"{path}, line {n}: not JSON ({exc.msg})",
                                  hint="each line must be a JSON object with a content or text field") from None
        if not isinstance(item, (dict, str)):
            raise ValidationError(f"{path}, line {n}: a JSON {type(item).__name__}, not a message",
                                  hint="each line must be a JSON object with a content or text field")
        messages.append(item)
    return _checked_messages(path, messages), name


def _checked_messages(path: str, messages: list[dict[str, Any] | str]) -> list[dict[str, Any] | str]:
    """``messages``, once each has been read as ingest will (its text, its date): a bad one
    found by ingest itself failed that input after the inputs before it were stored."""
    from .ingest import messages_to_text

    try:
        messages_to_text(messages)
    except ValidationError as exc:
        raise ValidationError(f"{path}: {exc.message}", hint=exc.hint) from None
    return messages


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("inputs", metavar="INPUT...", nargs=-1, required=True,
                type=click.Path(dir_okay=False, allow_dash=True, exists=True))
@click.option("--format", "fmt", type=click.Choice(["auto", "text", "markdown", "jsonl", "chat"]), default="auto",
              show_default=True, help="How to read the inputs (jsonl: one chat message per line; chat: a JSON "
                                      "list of messages; auto: by extension, .jsonl/.json/.md, else text).")
@click.option("--title", help="Title for the compressed document (also its source name).")
@click.option("--date", callback=lambda _ctx, _param, value: _check_date(value),
              help="Date of the input (YYYY-MM-DD), for dates relative to it.")
@click.option("--tag", "tags", multiple=True, help="Tag every memory (repeatable).")
@click.option("--chunk-size", type=click.IntRange(min=50), default=800, show_default=True,
              help="Characters per chunk: chunks are whole paragraphs (blank-line separated); a longer "
                   "paragraph is a chunk of its own, except a chat pasted without blank lines (cut between "
                   "messages) and a paragraph over 20 chunk sizes (cut).")
@click.option("--encoding", default="utf-8", show_default=True,
              help="Text encoding of the inputs, e.g. latin-1 or cp1252 (a leading byte-order mark is dropped).")
@click.option("--now", "now_text", metavar="ISO",
              help="The new memories' creation time, an ISO 8601 time (default: now): the same inputs and --now "
                   "store the same content.")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON: each input's memory ids (those stored before included).")
@click.pass_context
def ingest(ctx: click.Context, file: str, inputs: tuple[str, ...], fmt: str, title: str | None, date: str | None,
           tags: tuple[str, ...], chunk_size: int, encoding: str, now_text: str | None, as_json: bool) -> None:
    """Compress documents or conversations into memories (zettels) and store them.

    Ingesting the same text again stores nothing new. Every input is read and checked
    before the store is touched: an input that cannot be read changes nothing.

    Example:

        engramdb ingest notes.engram meeting.md chat.jsonl --date 2024-05-02
    """
    from .maintenance.lifecycle import parse_iso

    options: dict[str, Any] = {"chunk_size": chunk_size}
    if now_text is not None:
        options["now"] = parse_iso(now_text)
    if date:
        options["date"] = date
    if title:
        options["title"] = title
    result: dict[str, list[str]] = {}
    added: dict[str, int] = {}
    read = [(path, *_read_ingest_input(path, fmt, encoding)) for path in inputs]
    sizes = [len(source.encode("utf-8", "surrogatepass")) if isinstance(source, str)
             else len(json.dumps(source, default=str)) for _, source, _ in read]
    with _open(ctx, file) as db, _progress(ctx, desc="ingesting", unit="B", unit_scale=True,
                                           total=sum(sizes)) as bar:
        for (path, source, name), size in zip(read, sizes):
            before = len(db)
            result[path] = db.ingest(source, source_name=title or name, tags=list(tags), **options)
            added[path] = len(db) - before  # text ingested before is stored once: say how much is new
            bar.update(size)
    _emit(result, as_json, lambda d: "\n".join(f"{path}: {len(ids)} memories ({added[path]} new)"
                                               for path, ids in d.items()))


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--max-zettels", type=click.IntRange(min=1), default=10, show_default=True, help="At most this many.")
@click.option("--max-tokens", type=click.IntRange(min=1), help="Hard token budget of the output.")
@click.option("--format", "fmt", type=click.Choice(["markdown", "json", "aaak"]), default="markdown", show_default=True,
              help="markdown: one line per memory, names spelled out, who said it and when; "
                   "aaak: entity codes, denser.")
@click.option("--selection", type=click.Choice(["weight", "mmr"]), default="weight", show_default=True,
              help="weight: the heaviest memories; mmr: also as unlike each other as they can be (topics, entities).")
@click.option("--source", help="Only memories of this source.")
@click.option("--tag", "tags", multiple=True, help="Only memories with this tag (repeatable).")
@click.option("--include-archived", is_flag=True, help="Also consider archived memories.")
@click.option("--json", "as_json", is_flag=True, help='Print JSON: {"text": the rendered context}.')
@click.pass_context
def inject(ctx: click.Context, file: str, max_zettels: int, max_tokens: int | None, fmt: str, selection: str,
           source: str | None, tags: tuple[str, ...], include_archived: bool, as_json: bool) -> None:
    """Print the stored memories that matter most, as context for a model, within a token budget.

    When memories qualify but not even one fits --max-tokens, nothing is printed and the
    command fails (exit 1) saying how many tokens the most important memory needs. When no memory
    qualifies (an empty store, or filters that match nothing), it says so on stderr and
    prints nothing (exit 0; with --json, {"text": ""}), as `recall` does when nothing matches.

    Example:

        engramdb inject notes.engram --max-tokens 500
    """
    options: dict[str, Any] = dict(format=fmt, selection=selection, source=source, tags=tags or None,
                                   include_archived=include_archived)
    first = ""
    with _open(ctx, file, readonly=True) as db:
        text = db.inject_context(max_zettels=max_zettels, max_token_budget=max_tokens, **options)
        if not text:
            first = db.inject_context(max_zettels=1, **options)
    if not text:
        if not first:
            click.echo("no memories to inject" + (" (none match --source/--tag)" if source or tags else ""),
                       err=True)
            if as_json:  # a JSON reader gets a document, as from wakeup and context
                _emit({"text": ""}, True, str)
            return
        raise ValidationError(f"nothing fits in --max-tokens {max_tokens}: the most important memory alone needs "
                              f"{estimate_tokens(first)} tokens (--format {fmt})",
                              hint=f"raise --max-tokens to at least {estimate_tokens(first)}")
    _emit({"text": text}, as_json, lambda d: d["text"])


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--top-pct", type=click.FloatRange(0, 1, min_open=True), default=0.15, show_default=True,
              help="Share of the memories to consider.")
@click.option("--include-archived", is_flag=True, help="Also consider archived memories.")
@click.option("--json", "as_json", is_flag=True, help='Print JSON: {"text": the narrative}.')
@click.pass_context
def wakeup(ctx: click.Context, file: str, top_pct: float, include_archived: bool, as_json: bool) -> None:
    """Print a short narrative of the most important stored moments.

    With nothing to tell (no live memories), stdout stays empty and a note goes to stderr.

    Example:

        engramdb wakeup notes.engram
    """
    with _open(ctx, file, readonly=True) as db:
        text = db.wake_up(top_pct=top_pct, include_archived=include_archived)
    if not text and not as_json:  # say so on stderr; stdout stays empty for scripts
        why = "" if include_archived else " (archived memories are left out: --include-archived takes them)"
        click.echo(f"no memories to tell of{why}", err=True)
        return
    _emit({"text": text}, as_json, lambda d: d["text"])


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("query")
@click.option("--top-k", "top_k", type=click.IntRange(min=0), default=5, show_default=True, help="How many hits.")
@click.option("--explain", is_flag=True, help="Show each hit's score parts.")
@click.option("--no-hops", is_flag=True, help="Do not add memories one tunnel/edge hop away.")
@_filter_options
@click.option("--min-relevance", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Only hits at least this relevant (0-1, comparable across queries).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines, one hit a line.")
@click.pass_context
def recall(ctx: click.Context, file: str, query: str, top_k: int, explain: bool, no_hops: bool,
           filters: dict[str, Any], min_relevance: float, as_json: bool) -> None:
    """Find the memories that best answer QUERY (BM25, vectors, synonyms, one tunnel hop).

    Each line shows the hit's relevance (0-1, comparable across queries: use it to cut
    off weak hits) and its ranking score (only meaningful within one query).

    Example:

        engramdb recall notes.engram "where did Alice move?" --top-k 3 --explain
    """
    with _open(ctx, file, readonly=True) as db:
        hits = db.recall(query, top_k=top_k, explain=explain, hops=not no_hops, min_relevance=min_relevance,
                         **filters)
    if not hits and top_k and not as_json:  # say so on stderr; stdout stays empty for scripts
        floor = f" with relevance >= {min_relevance:.3f}" if min_relevance > 0 else ""
        click.echo(f"no memories match {query!r}{floor}", err=True)
    for rank, hit in enumerate(hits, start=1):
        def text(d: dict[str, Any], rank: int = rank, hit: Hit = hit) -> str:
            line = f"{rank:>3}. relevance {hit.relevance:.3f}  score {hit.score:.3f}  {_node_line(hit.node)}"
            if hit.parts is not None:
                line += "\n     " + "  ".join(f"{k}={v:.3f}" for k, v in hit.parts.items())
            return line

        _emit(_readable(hit.to_dict()), as_json, text)


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("query")
@click.option("--max-tokens", "max_tokens", type=click.IntRange(min=0), default=2000, show_default=True,
              help="Hard token budget of the context.")
@click.option("--top-k", "top_k", type=click.IntRange(min=0), default=10, show_default=True,
              help="How many memories to draw passages from.")
@_filter_options
@click.option("--source-text", "source_text_file", type=click.Path(dir_okay=False, exists=True),
              help="A UTF-8 file holding the text the memories' offsets point into (for memories imported "
                   "from AAAK, whose source text the store does not hold).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def context(ctx: click.Context, file: str, query: str, max_tokens: int, top_k: int, filters: dict[str, Any],
            source_text_file: str | None, as_json: bool) -> None:
    """Print the source passages of the memories that answer QUERY, within a token budget.

    Example:

        engramdb context notes.engram "Alice's move" --max-tokens 500
    """
    source_text = None
    if source_text_file is not None:
        try:
            with open(source_text_file, encoding="utf-8", newline="") as fh:
                source_text = fh.read()
        except UnicodeDecodeError as exc:
            raise ValidationError(f"{source_text_file} is not UTF-8 text ({exc.reason})",
                                  hint="give the source text as a UTF-8 file") from None
    with _open(ctx, file, readonly=True) as db:
        result = db.recall_context(query, top_k=top_k, max_tokens=max_tokens, source_text=source_text, **filters)
    data = {"tokens": result.tokens, "passages": [
        {"source": p.source, "start": p.start, "end": p.end, "date": p.date, "heading": p.heading,
         "ids": list(p.ids), "tokens": p.tokens, "text": p.text}
        for p in result.passages]}
    if not result.passages and not as_json:  # say why on stderr; stdout stays empty for scripts
        if not (top_k and max_tokens):
            why = "--top-k or --max-tokens is 0"
        elif result.hits:  # they matched, but not even the best one's heading and first word fit
            n = len(result.hits)
            why = (f"{n} {'memory matches' if n == 1 else 'memories match'}, but not even the best one's heading "
                   f"and first word fit in --max-tokens {max_tokens}; raise --max-tokens")
        else:
            why = "no memory matches"
        click.echo(f"no passages for {query!r}: {why}", err=True)
        return
    _emit(data, as_json, lambda _d: result.text)


@cli.command(name="import")
@click.argument("source", type=click.Path(dir_okay=False, exists=True, allow_dash=True))
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["auto", "aaak", "jsonl", "terronex"]), default="auto",
              show_default=True, help="The source format (auto: detected from its first bytes).")
@click.option("--source-passphrase-file", type=click.Path(dir_okay=False),
              help="Passphrase of an encrypted Terronex file (else $ENGRAM_SOURCE_PASSPHRASE).")
@click.option("--id-prefix", default="", help="Prepended to every imported id.")
@click.option("--create", is_flag=True, help="Create FILE if it does not exist (else a missing FILE is an error).")
@click.option("--space", default="default", show_default=True, help="Embedding space for imported vectors.")
@click.option("--skip-bad-embeddings", is_flag=True,
              help="Import Terronex memories whose embedding is damaged (wrong dimensions, not finite numbers) "
                   "without it, and count them, instead of stopping.")
@click.option("--resume", is_flag=True,
              help="Stream the source in chunks, each committed on its own, skipping memories whose id is "
                   "stored already or came earlier in the source: running it again completes an interrupted "
                   "import (not all or nothing).")
@click.option("--now", "now_text", metavar="ISO",
              help="The clock for memories the source gives no time (an ISO 8601 time; default: now), so two "
                   "imports of the same source give the same store.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def import_(ctx: click.Context, source: str, file: str, fmt: str, source_passphrase_file: str | None,
            id_prefix: str, create: bool, space: str, skip_bad_embeddings: bool, resume: bool, now_text: str | None,
            as_json: bool) -> None:
    """Import memories from AAAK v1/v2 text, JSONL (Trace-Lite memories) or a Terronex .engram 1.x/2.x file.

    By default the import is all or nothing: it refuses a source with an id that is stored
    already. With --resume it streams the source into FILE a chunk at a time (each chunk
    its own transaction) and skips ids that are stored already or repeat in the source
    (the first copy is kept), so re-running it completes an interrupted import; edges are
    written after the last memory, and one naming a memory that is not there is left out
    with a warning and exit status 1.

    Example:

        engramdb import memories.jsonl notes.engram

        engramdb import --resume big.jsonl notes.engram
    """
    from .backup import import_records
    from .importers import ImportReport, iter_import
    from .maintenance.lifecycle import parse_iso

    now = parse_iso(now_text) if now_text is not None else None
    source_pw: str | None
    if source_passphrase_file:
        source_pw = _read_secret_file(source_passphrase_file)
    else:
        source_pw = os.environ.get("ENGRAM_SOURCE_PASSPHRASE") or None
    if resume:
        _import_resumable(ctx, source, file, fmt=fmt, passphrase=source_pw, space=space, id_prefix=id_prefix,
                          create=create, skip_bad_embeddings=skip_bad_embeddings, now=now, as_json=as_json)
        return
    with click.open_file(source, "rb") as fh:
        data = io.BytesIO(fh.read())  # detection needs a seekable source
    from .records import Node

    report = ImportReport()
    with _removed_on_failure(file, create), _open(ctx, file, create=create) as db:
        # read with the target's spaces: an embedding of another length is refused naming its line
        dims = {name: sp.dims for name, sp in db.spaces().items()}
        items = list(iter_import(data, fmt=None if fmt == "auto" else fmt, passphrase=source_pw, space=space,
                                 now=now, id_prefix=id_prefix, skip_bad_embeddings=skip_bad_embeddings,
                                 report=report, dims=dims))
        total = sum(isinstance(item, Node) for item in items)
        with _progress(ctx, desc="importing", unit=" memories", total=total) as bar:
            nodes, edges = import_records(db, items, progress=lambda n: bar.update(n - bar.n))
    bad = report.bad_embeddings
    _report_source_warnings(source, report)

    def text(_d: Any) -> str:
        line = f"imported {nodes} memories and {edges} edges into {file}"
        line += f"; {len(bad)} bad embedding(s) left out" if bad else ""
        return line + _source_warnings_note(report)

    _emit({"file": file, "memories": nodes, "edges": edges, "bad_embeddings": len(bad),
           "warnings": len(report.warnings)}, as_json, text)


def _report_source_warnings(source: str, report: ImportReport) -> None:
    """The import's warnings on stderr: embeddings left out, and the lines of an AAAK source
    its lenient reader skipped (a memory the source holds but the store will not)."""
    for nid, why in report.bad_embeddings:
        click.echo(f"warning: memory {nid} imported without its embedding: {why}", err=True)
    for warning in report.warnings:
        click.echo(f"warning: {source}: {warning}", err=True)


def _source_warnings_note(report: ImportReport) -> str:
    return f"; {len(report.warnings)} warning(s) about the source (on stderr)" if report.warnings else ""


def _import_resumable(ctx: click.Context, source: str, file: str, *, fmt: str, passphrase: str | None, space: str,
                      id_prefix: str, create: bool, skip_bad_embeddings: bool, now: float | None,
                      as_json: bool) -> None:
    """`engramdb import --resume`: the source read as it is stored (backup.import_resumable).
    A failure keeps FILE, created or not: its committed chunks are what a re-run skips."""
    from .backup import import_resumable
    from .importers import ImportReport, detect_format, iter_import

    report = ImportReport()
    with click.open_file(source, "rb") as fh:
        if fmt == "auto":  # from the first bytes, without reading the rest (stdin cannot seek back)
            peeked = _Peeked(fh)
            fmt = detect_format(peeked.head)
            fh = io.BufferedReader(peeked)
        with _open(ctx, file, create=create) as db, _progress(ctx, desc="importing", unit=" memories") as bar:
            items = iter_import(cast(BinaryIO, fh), fmt=fmt, passphrase=passphrase, space=space, now=now,
                                id_prefix=id_prefix, skip_bad_embeddings=skip_bad_embeddings, report=report,
                                dims={name: sp.dims for name, sp in db.spaces().items()})
            done = import_resumable(db, items, progress=lambda a, s: bar.update(a + s - bar.n))
    bad = report.bad_embeddings
    _report_source_warnings(source, report)
    for edge in done.missing:
        click.echo(f"warning: edge {shown(edge.src)} -> {shown(edge.dst)} ({edge.kind}) not imported: it names a "
                   "memory that is neither in the source nor stored", err=True)

    def text(_d: Any) -> str:
        line = f"imported {done.added} memories and {done.edges} edges into {file}"
        skips = [f"{done.stored} stored already"] if done.stored else []
        skips += [f"{done.repeated} repeated in the source (first kept)"] if done.repeated else []
        line += f"; skipped {', '.join(skips)}" if skips else ""
        line += f"; {len(bad)} bad embedding(s) left out" if bad else ""
        line += f"; {len(done.missing)} edge(s) left out" if done.missing else ""
        return line + _source_warnings_note(report)

    _emit({"file": file, "memories": done.added, "skipped": done.stored, "repeated": done.repeated,
           "edges": done.edges, "missing_edges": len(done.missing), "bad_embeddings": len(bad),
           "warnings": len(report.warnings)}, as_json, text)
    if done.missing:
        # after the summary: the memories and the other edges are stored, a re-run adds nothing
        raise AAAKParseError(f"{len(done.missing)} edge(s) name a memory that is neither in the source nor stored "
                             "(listed above)",
                             hint="everything else is imported; fix those edges in the source, or add the memories "
                                  "they name and run the import again")


class _Peeked(io.RawIOBase):
    """A binary stream whose first bytes (``head``, up to 64) were read ahead to detect its
    format, and are read again from the start: a pipe cannot seek back."""

    def __init__(self, raw: Any) -> None:
        super().__init__()
        self._raw = raw
        head = b""
        while len(head) < 64 and (more := raw.read(64 - len(head))):
            head += more
        self.head = head
        self._pending = head

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._pending:
            n = min(len(view), len(self._pending))
            view[:n], self._pending = self._pending[:n], self._pending[n:]
            return n
        data = self._raw.read(len(view))
        view[:len(data)] = data
        return len(data)


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["jsonl"]), default="jsonl", show_default=True,
              help="The output format (JSON Lines, the only one).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write here instead of stdout.")
@click.option("--space", help="The embedding space written as `embedding` (default: the node's first).")
@click.pass_context
def export(ctx: click.Context, file: str, fmt: str, output: str | None, space: str | None) -> None:
    """Export memories as JSONL (Trace-Lite `Memory` objects, every memory field).

    An archived memory is written as it was before it was archived (its full text, tier and
    metadata), so importing the export gives it back unarchived. Edges (tunnels, links) and
    the source texts behind `context` stay behind: for a full backup (archived memories
    kept archived) use `engramdb dump` and `engramdb restore`.

    Example:

        engramdb export notes.engram -o memories.jsonl
    """
    from .importers import export_lines

    _refuse_same_file(output, file, "the export")
    with _open(ctx, file, readonly=True) as db:
        spaces = sorted(db.spaces())
        if space is not None and space not in spaces:  # a typo would write "embedding": null everywhere
            raise ValidationError(f"{file} has no embedding space {space!r}",
                                  hint=f"its spaces: {', '.join(map(repr, spaces))}" if spaces
                                  else "it has no embedding spaces; leave out --space")
        with _output(output, "w", encoding="utf-8") as out, \
                _progress(ctx, desc="exporting", unit=" memories", total=len(db)) as bar:
            def counted() -> Iterator[Any]:
                for node in db.scan():
                    # an archived memory as it was before (full text, tier, metadata): its stub
                    # would import as a memory whose archive row is missing, which verify reports
                    # as damage, and its text beyond the preview would be lost
                    yield db.get(node.id, full=True) if node.archived else node
                    bar.update(1)

            # streamed (export_jsonl would hold the lines of a pipe in memory): -o is replaced
            # atomically, and stdout is the user's to judge after an error
            for line in export_lines(counted(), space=space):
                out.write(line)


# -- lifecycle: archive, pin, forget, stats (engramdb/maintenance/) -----------------------

@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("id_", metavar="ID")
@click.option("--truncate", is_flag=True, help="Keep only the preview: the rest of the text is gone for good.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def archive(ctx: click.Context, file: str, id_: str, truncate: bool, as_json: bool) -> None:
    """Archive a memory: its full text moves to the archive table; it keeps a preview.

    Example:

        engramdb archive notes.engram 3f2a...
    """
    with _open(ctx, file) as db:
        was = db.get(id_).archived  # archiving an archived memory changes nothing: say so
        dropped = db.archive(id_, truncate=truncate)
    _emit({"id": id_, "bytes_dropped": dropped}, as_json,
          lambda d: f"{id_} is archived already: nothing changed" if was else
          f"archived {id_}" + (f" ({dropped} bytes of text dropped)" if dropped else ""))


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("id_", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the restored memory).")
@click.pass_context
def unarchive(ctx: click.Context, file: str, id_: str, as_json: bool) -> None:
    """Put an archived memory back as it was (full text, tier, metadata).

    Example:

        engramdb unarchive notes.engram 3f2a...
    """
    with _open(ctx, file) as db:
        was = db.get(id_).archived
        node = db.unarchive(id_)
    _emit(_node_dict(node), as_json, lambda d: f"unarchived {id_} (tier {node.tier})" if was else
          f"{id_} is not archived: nothing changed")


def _set_pinned(ctx: click.Context, file: str, id_: str, pinned: bool, as_json: bool) -> None:
    with _open(ctx, file) as db:
        node = db.pin(id_) if pinned else db.unpin(id_)
    _emit({"id": node.id, "pinned": node.pinned}, as_json,
          lambda d: f"{'pinned' if pinned else 'unpinned'} {id_}")


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("id_", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def pin(ctx: click.Context, file: str, id_: str, as_json: bool) -> None:
    """Pin a memory: maintenance never decays it or merges it away.

    Example:

        engramdb pin notes.engram 3f2a...
    """
    _set_pinned(ctx, file, id_, True, as_json)


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("id_", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def unpin(ctx: click.Context, file: str, id_: str, as_json: bool) -> None:
    """Unpin a memory.

    Example:

        engramdb unpin notes.engram 3f2a...
    """
    _set_pinned(ctx, file, id_, False, as_json)


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--id", "ids", multiple=True, metavar="ID", help="A memory to forget (repeatable).")
@click.option("--query", help="Forget every memory at least --threshold similar to this text, compared in the "
                               "file's text space (the first `engramdb maintain` adds the built-in one).")
@click.option("--threshold", type=click.FloatRange(-1, 1), default=0.7, show_default=True,
              help="Similarity (cosine) at or above which --query forgets a memory.")
@click.option("--space", help="Compare --query in this embedding space only.")
@click.option("--dry-run", is_flag=True, help="Only show what would be forgotten.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (needed when stdin is not a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Print the receipt as JSON.")
@click.pass_context
def forget(ctx: click.Context, file: str, ids: tuple[str, ...], query: str | None, threshold: float,
           space: str | None, dry_run: bool, yes: bool, as_json: bool) -> None:
    """Forget memories for good: they, their index entries, edges, archive rows and the
    source passages only they used leave the file, which is then compacted (no other
    process may have it open). Asks for confirmation unless --yes.

    Example:

    \b
        engramdb forget notes.engram --query "my old address" --threshold 0.8 --dry-run
    """
    if not ids and query is None:
        raise click.UsageError("give --id ID (repeatable) or --query TEXT")
    with _open(ctx, file) as db:
        plan = db.forget(ids=list(ids) or None, query=query, threshold=threshold, space=space, dry_run=True)
        if dry_run or not plan.ids:
            _emit(plan.to_dict(), as_json, _receipt_text)
            return
        if not yes:
            if not _interactive():
                raise ValidationError(f"forget would remove {len(plan.ids)} memories for good; not confirmed",
                                      hint="add --yes (check first with --dry-run)")
            click.echo(_receipt_text(plan.to_dict()), err=True)
            if not click.confirm(f"Forget these {len(plan.ids)} memories for good?", default=False, err=True):
                raise ValidationError("not confirmed; nothing was forgotten", hint="answer y, or pass --yes")
        receipt = db.forget(ids=list(plan.ids))  # exactly what was shown, even if a --query would now match more
    _emit(receipt.to_dict(), as_json, _receipt_text)


def _interactive() -> bool:
    """Whether a person can answer a confirmation prompt (stdin is a terminal)."""
    return sys.stdin.isatty()


def _receipt_text(d: dict[str, Any]) -> str:
    verb = "would forget" if d["dry_run"] else "forgot"
    lines = [f"{verb} {len(d['ids'])} memories" + (": " + ", ".join(d["ids"]) if d["ids"] else "")]
    if d["removed"]:
        lines.append("entries: " + ", ".join(f"{k}={v}" for k, v in d["removed"].items()))
    if d["summaries"]:
        lines.append("summaries built from them (kept): " + ", ".join(d["summaries"]))
    if not d["dry_run"] and d["ids"]:
        lines.append(f"file: {d['size_before']} -> {d['size_after']} bytes")
    return "\n".join(lines)


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def stats(ctx: click.Context, file: str, as_json: bool) -> None:
    """Show memories per tier, flag, tag and source, sizes per table, the index's
    segments, and the last maintenance pass.

    Example:

        engramdb stats notes.engram --json
    """
    with _open(ctx, file, readonly=True) as db:
        data = db.stats()
    _emit(data, as_json, _stats_text)


def _stats_text(d: dict[str, Any]) -> str:
    def counts(values: dict[str, int], limit: int = 10) -> str:
        items = list(values.items())
        shown = ", ".join(f"{_escaped(k)}={v}" for k, v in items[:limit])  # a tag's newline would end the line
        return (shown + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")) or "-"

    bm25 = d["index"]["bm25"]
    lines = [f"{'memories':<17}{d['memories']} ({d['archived']} archived, {d['pinned']} pinned)",
             f"{'tiers':<17}{counts(d['tiers'])}", f"{'flags':<17}{counts(d['flags'])}",
             f"{'tags':<17}{counts(d['tags'])}", f"{'sources':<17}{counts(d['sources'])}",
             f"{'file_size':<17}{d['file_size']}",
             f"{'tables':<17}" + ", ".join(f"{k}={v['entries']} ({v['bytes']} B)" for k, v in d["tables"].items()
                                            if v["entries"]),
             f"{'bm25':<17}{bm25['segments']} segments, {bm25['live_docs']} live, {bm25['dead_docs']} dead"]
    for name, v in d["index"]["vectors"].items():
        lines.append(f"{'space ' + name:<16} {v['blocks']} blocks, {v['rows']} rows, {v['dead_rows']} dead")
    last = d["last_maintenance"]
    lines.append(f"{'last_maintenance':<17}" + ("never" if not last else ", ".join(f"{k}={v}" for k, v in last.items())))
    return "\n".join(lines)


# --- agent memory (engramdb/agent, spec/agent.md) ------------------------------------------

@cli.group()
def agent() -> None:
    """Agent memory: before/after-task hooks, sleep consolidation, the procedural graph.

    Example:

        engramdb agent before notes.engram "build a CLI bookmark manager"
    """


def _read_transcript(path: str) -> Any:
    """A transcript file: a JSON list of messages, an object with ``messages``, or JSON Lines."""
    try:
        with open(path, encoding="utf-8-sig") as fh:  # -sig: Windows tools write a byte order mark
            text = fh.read()
    except OSError as exc:
        raise ValidationError(f"cannot read {path}: {exc.strerror}", hint="check the path and its permissions") \
            from None
    except UnicodeDecodeError:
        raise ValidationError(f"{path} is not UTF-8 text", hint="a transcript is JSON") from None
    try:
        data = _json_loads(text)
    except ValueError:
        try:
            data = [_json_loads(line) for line in text.splitlines() if line.strip()]
        except ValueError as exc:
            raise ValidationError(f"{path} is neither JSON nor JSON Lines: {exc}",
                                  hint="give a JSON list of OpenAI or Anthropic messages") from None
    if isinstance(data, dict) and isinstance(data.get("messages"), list):
        data = data["messages"]
    elif isinstance(data, dict) and "messages" not in data and len(text.strip().splitlines()) == 1:
        data = [data]  # JSON Lines of one message
    if not isinstance(data, list):
        raise ValidationError(f"{path} holds a JSON {type(data).__name__}, not a list of messages",
                              hint='give a JSON list of messages, or {"messages": [...]}')
    return data


@agent.command(name="before")
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("task")
@click.option("--top-k", type=click.IntRange(1, 100), default=5, show_default=True, help="At most this many memories.")
@click.option("--min-relevance", type=click.FloatRange(0, 1), help="Relevance floor (default: the library's).")
@click.option("--max-tokens", type=click.IntRange(min=0),
              help="Hard token budget of the block; memories that do not fit are left out whole, never cut.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def agent_before(ctx: click.Context, file: str, task: str, top_k: int, min_relevance: float | None,
                 max_tokens: int | None, as_json: bool) -> None:
    """Print the memories relevant to TASK as a prompt block (nothing when none is relevant,
    or when not even one fits --max-tokens: a note on stderr then says so).

    Example:

    \b
        engramdb agent before notes.engram "build a CLI bookmark manager with tags" --max-tokens 500
    """
    from .agent import MemoryHooks

    options: dict[str, Any] = {} if min_relevance is None else {"min_relevance": min_relevance}
    with _open(ctx, file, readonly=True) as db:
        hooks = MemoryHooks(db, top_k=top_k, **options)
        block = hooks.before_task(task, max_tokens=max_tokens)
        unbudgeted = hooks.before_task(task) if not block and max_tokens is not None else ""
    if unbudgeted:  # relevant memories, none within the budget: not the same as nothing relevant
        _note(ctx, f"nothing fits in --max-tokens {max_tokens}: without a budget the block has "
                   f"{estimate_tokens(unbudgeted)} tokens")
    if as_json:
        _emit({"block": block}, True, str)
    elif block:
        click.echo(block)


@agent.command(name="after")
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("transcript", type=click.Path(dir_okay=False))
@click.option("--outcome", type=click.Choice(["success", "failure"]), help="How the task ended.")
@click.option("--session", help="A session id for the facts' provenance (default: a hash of the transcript).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def agent_after(ctx: click.Context, file: str, transcript: str, outcome: str | None, session: str | None,
                as_json: bool) -> None:
    """Form 1 to 3 facts from a finished task's TRANSCRIPT (OpenAI or Anthropic messages, JSON).

    Example:

        engramdb agent after notes.engram session.json --outcome success
    """
    from .agent import MemoryHooks

    messages = _read_transcript(transcript)
    with _open(ctx, file) as db:
        hooks = MemoryHooks(db)
        ids = hooks.after_task(messages, outcome=outcome, session=session)
        facts = [{"id": i, "content": db.get(i).content} for i in ids]
    _emit(facts, as_json, lambda fs: "\n".join(f"{f['id']}\t{f['content']}" for f in fs) or "no new facts")


@agent.command(name="consolidate")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--threshold", type=click.IntRange(min=2), default=50, show_default=True,
              help="Run once this many unconsolidated memories exist.")
@click.option("--target", type=click.IntRange(min=1), default=5, show_default=True, help="About this many core memories.")
@click.option("--force", is_flag=True, help="Run whatever the number of memories.")
@click.option("--tag", "tags", multiple=True, metavar="TAG",
              help="Take only memories carrying this tag (repeatable: all of them; default: agent, the tag of "
                   "the facts `agent after` stores).")
@click.option("--all", "take_all", is_flag=True,
              help="Take every live memory of the file, the user's own too, not only the agent's.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def agent_consolidate(ctx: click.Context, file: str, threshold: int, target: int, force: bool, tags: tuple[str, ...],
                      take_all: bool, as_json: bool) -> None:
    """Sleep consolidation: turn the agent's unconsolidated memories into a few core memories
    (originals archived). Only memories tagged `agent` (the hooks' facts) by default, as the
    hooks do, so a store's other memories stay as they are; --tag chooses other tags, --all
    takes every live memory.

    Example:

        engramdb agent consolidate notes.engram --force
    """
    from .agent import consolidate_sleep

    if take_all and tags:
        raise click.UsageError("--all takes every memory; leave out --tag, or --all")
    with _open(ctx, file) as db:
        report = consolidate_sleep(db, threshold=threshold, target=target, force=force,
                                   tags=None if take_all else (list(tags) or ["agent"]))

    def text(r: dict[str, Any]) -> str:
        if r["skipped"]:
            return str(r["skipped"])
        return "\n".join([f"{c['id']}\t{len(c['derived_from'])} memories\t{c['content'][:80]}" for c in r["cores"]]
                         + [f"archived {r['archived']} memories"])

    _emit(report.to_dict(), as_json, text)


@agent.command(name="procedures")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--refine", is_flag=True, help="First refine the graph from the recorded trajectories.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def agent_procedures(ctx: click.Context, file: str, refine: bool, as_json: bool) -> None:
    """Show the procedural graph: nodes, edges with their counts, guidance and pitfalls.

    Example:

        engramdb agent procedures notes.engram --json
    """
    from .agent import ProceduralGraph

    with _open(ctx, file, readonly=not refine) as db:
        graph = ProceduralGraph(db)
        report = graph.refine().to_dict() if refine else None
        data = graph.to_dict()
    if report is not None:
        data["refine"] = report

    def text(d: dict[str, Any]) -> str:
        lines = [f"{d['trajectories']} trajectories " + " ".join(f"{k}={v}" for k, v in d["outcomes"].items())]
        for e in d["edges"]:
            line = f"{e['src']} -{e['relation']}-> {e['dst']}  success={e['success']} failure={e['failure']}"
            lines.append(line + (f"  guidance: {e['guidance']}" if e["guidance"] else ""))
            lines.extend(f"    pitfall: {p}" for p in e["pitfalls"])
        if "refine" in d:
            r = d["refine"]
            lines.append(r["skipped"] or f"refine: {len(r['applied'])} applied, {len(r['rejected'])} rejected, "
                                         f"{len(r['unvalidated'])} undecided")
        return "\n".join(lines)

    _emit(data, as_json, text)


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--readonly", is_flag=True,
              help="Open FILE read-only and offer only recall, recall_context, before_task and stats (for a file "
                   "on a read-only disk, or one the agent must not change).")
@click.pass_context
def mcp(ctx: click.Context, file: str, readonly: bool) -> None:
    """Serve FILE over stdio with the Model Context Protocol (needs `pip install 'engramdb[mcp]'`).

    Tools: remember, recall, recall_context, forget, before_task, after_task, stats. The
    passphrase comes from ENGRAM_PASSPHRASE, --passphrase-file or --key-file, never from a
    tool argument; stdout carries the protocol only.

    Example:

        ENGRAM_PASSPHRASE=... engramdb mcp notes.engram
    """
    from . import mcp_server

    mcp_server._sdk()  # a missing SDK is reported before the file is opened
    if _key_source(ctx) == "passphrase" and not _settings(ctx).get("passphrase_file") \
            and not os.environ.get(PASSPHRASE_ENV):  # never a prompt: stdin carries the protocol
        raise ValidationError("no passphrase given; the MCP server never prompts for one (its standard input "
                              "carries the protocol)",
                              hint=f"set {PASSPHRASE_ENV} in the server's environment (the MCP client's \"env\"), "
                                   "or pass --passphrase-file FILE or --key-file FILE before `mcp`")
    with _open(ctx, file, readonly=readonly) as db:
        mcp_server.serve(db)


def _fleet_key_source(ctx: click.Context, key_files_beside: bool) -> Any:
    """The fleet's key source: tasks get where the key is, not the key, where that is possible."""
    from . import fleet

    if key_files_beside:
        return fleet.KeyFileBeside()
    source = _key_source(ctx)
    if source == "plaintext":
        return fleet.Plaintext()
    if source == "key_file":
        return fleet.KeyFile(_settings(ctx).get("key_file"))
    passphrase_file = _settings(ctx).get("passphrase_file")
    if passphrase_file:
        return fleet.Passphrase(_read_secret_file(passphrase_file))
    if not os.environ.get(PASSPHRASE_ENV):
        raise click.UsageError(f"the fleet reads the passphrase from ${PASSPHRASE_ENV} on the workers; set it, "
                               "or pass --passphrase-file, --key-file, --key-files-beside or --plaintext")
    return fleet.PassphraseEnv(PASSPHRASE_ENV)


@cli.command(name="fleet")
@click.argument("job", type=click.Choice(["maintain", "verify", "compact", "dump", "stats"]))
@click.argument("pattern", metavar="GLOB")
@click.option("--scheduler", metavar="ADDRESS",
              help="Run on this Dask scheduler (tcp://host:8786); default: a local cluster of processes.")
@click.option("--workers", type=click.IntRange(min=1), help="Worker processes of the local cluster (default: cores).")
@click.option("--out", metavar="FOLDER|URL", help="Where `dump` writes NAME.aaak (a folder or an fsspec URL).")
@click.option("--now", "now_text", metavar="ISO", help="The maintenance clock, an ISO 8601 time (default: now).")
@click.option("--retries", type=click.IntRange(min=0), default=2, show_default=True,
              help="Retries of a task whose file is busy or whose worker died.")
@click.option("--key-files-beside", is_flag=True,
              help="Each store's key is in NAME.engram.key beside it (its recovery key, ERK1-..., or 32 raw key "
                   "bytes).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def fleet_command(ctx: click.Context, job: str, pattern: str, scheduler: str | None, workers: int | None,
                  out: str | None, now_text: str | None, retries: int, key_files_beside: bool, as_json: bool) -> None:
    """Run JOB over every store GLOB matches, one Dask task per file (needs `pip install 'engramdb[fleet]'`).

    Each task opens, works on and closes its own file under the file's own locks. A bad
    file (damaged, wrong key) fails its task only; a busy one is retried, then reported.
    Exit status 1 when any file did not succeed. See spec/scale-out.md.

    Example:

    \b
        ENGRAM_PASSPHRASE=... engramdb fleet maintain 'tenants/*.engram'
        engramdb fleet dump 'tenants/*.engram' --key-files-beside --out backups/ --json
    """
    from . import fleet
    from .maintenance.lifecycle import parse_iso

    key_source = _fleet_key_source(ctx, key_files_beside)
    now = parse_iso(now_text) if now_text is not None else None
    client = None
    if scheduler:
        client = fleet._connect(scheduler)
    try:
        report = fleet.run(pattern, job, client=client, key_source=key_source, retries=retries,
                           progress=not _quiet(ctx) and _show_progress(sys.stderr), out=out, now=now,
                           workers=workers, timeout=_timeout(ctx), allow_unsafe_fs=_allow_unsafe_fs(ctx))
    finally:
        if client is not None:
            client.close()
    _emit(report.to_dict(), as_json, lambda d: report.table())
    if not report.ok:
        ctx.exit(1)


# -- engramdb shell --------------------------------------------------------------------------
# The shell opens the file once (one key derivation) and runs each line as the command of
# that name, through the same click commands; their `_open` of the same path gets the open
# handle (wrapped so that a command's `with` does not close it).
_SHELL: dict[str, Any] = {}


class _SharedHandle:
    """An open Engram that a command's ``with`` block does not close."""

    def __init__(self, db: engram_mod.Engram) -> None:
        self._db = db

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def __len__(self) -> int:
        return len(self._db)

    def __contains__(self, item: object) -> bool:
        return item in self._db

    def __iter__(self) -> Iterator[Any]:
        return iter(self._db)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def _shell_handle(path: str) -> engram_mod.Engram | None:
    db = _SHELL.get("db")
    if db is not None and os.path.realpath(path) == _SHELL["path"]:
        # a proxy with the whole interface of the shell's Engram, whose `with` does not close it
        return cast(engram_mod.Engram, _SharedHandle(db))
    return None


SHELL_COMMANDS = ("recall", "context", "add", "get", "list", "update", "tag", "untag", "link", "unlink", "edges",
                  "delete", "stats", "info", "inject", "wakeup")


def _shell_line(file: str, line: str) -> int:
    """Run one shell line; returns its exit code (errors are printed, never raised)."""
    import shlex

    if line.lstrip().startswith("#"):  # a comment line, as in a shell script (a "#" later in a line is text)
        return 0
    try:
        words = shlex.split(line)
    except ValueError as exc:
        click.echo(f"error: {exc}", err=True)
        return 2
    if not words:
        return 0
    name, rest = words[0], words[1:]
    if name in ("help", "?"):
        known = [c for c in SHELL_COMMANDS if c in cli.commands]
        click.echo("commands (FILE is implied): " + ", ".join(known) + "; `COMMAND --help`; exit or Ctrl-D")
        return 0
    if name not in SHELL_COMMANDS or name not in cli.commands:
        click.echo(f"error: {name!r} is not a shell command; type help", err=True)
        return 2
    args = [name, "--help"] if rest[:1] in (["--help"], ["-h"]) else [name, file, *rest]
    try:
        result = cli.main(args=args, prog_name="engramdb", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code or 0)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("error: interrupted", err=True)
        return 1
    return int(result) if isinstance(result, int) else 0


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.pass_context
def shell(ctx: click.Context, file: str) -> None:
    """Unlock FILE once, then run commands at a prompt (recall, add, get, list, stats, ...).

    Each line is a command without the file name, e.g. `recall "where did Alice move?"
    --top-k 3`; `help` lists them; `exit`, `quit` or Ctrl-D ends. The line history (arrow
    keys) lives in memory only: it is never written to disk, since lines hold memories.
    Lines can also come from stdin (`engramdb shell F < commands.txt`); the exit code is
    then that of the last failing line (0 if none failed), and `add -` is refused (stdin
    holds the lines). A line starting with # is a comment.

    Example:

        engramdb shell notes.engram
    """
    interactive = sys.stdin.isatty()
    if interactive:
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401  (input() gets line editing and history)
    worst = 0
    with _open(ctx, file) as db:
        _SHELL.update(db=db, path=os.path.realpath(file), script=not interactive)
        try:
            if interactive:
                _note(ctx, f"{file} unlocked; type help for the commands, exit to leave")
            while True:
                try:
                    line = input("engramdb> " if interactive else "")
                except EOFError:
                    break
                except KeyboardInterrupt:  # Ctrl-C drops the line, as in other shells
                    click.echo("", err=True)
                    continue
                if line.strip() in ("exit", "quit"):
                    break
                code = _shell_line(file, line)
                worst = code or worst
        finally:
            _SHELL.clear()
    if worst:
        ctx.exit(worst)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `engramdb` console script."""
    try:
        cli.main(args=argv, prog_name="engramdb", standalone_mode=True)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
