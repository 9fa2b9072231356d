"""Many ``.engram`` files as one fleet: one job run over every file, as Dask tasks.

The unit of scale is the file (spec/scale-out.md). A service keeps one file per user, agent
or tenant; the nightly work (maintenance, verification, backup dumps, statistics) is one
task per file, and each task opens, works on and closes its own file under that file's own
locks, so two fleets, or a fleet and an application, can share files safely.

Dask is an optional extra: ``pip install 'engramdb[fleet]'``. Without a ``client``,
:func:`run` starts a local cluster of worker processes sized to the machine; with one, it
runs on whatever cluster the client points at (``Client("tcp://scheduler:8786")``).

Keys never travel as task arguments where the source allows: tasks get a *key source*
(an environment variable's name, "the key file beside the store", a mapping of key-file
paths, or a callable) and resolve it on the worker.
"""
from __future__ import annotations

import dataclasses
import gc
import glob
import json
import logging
import os
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import engram, errors
from .errors import (
    AlreadyOpenError, ConfigMismatchError, EngramError, ModeMismatchError, ValidationError, WriteConflictError,
)
from .store import COMPACT_SUFFIX, DEFAULT_TIMEOUT, PARTIAL_SUFFIX, RESTORE_SUFFIX, atomic_file

if TYPE_CHECKING:  # annotations only
    from .maintenance.lifecycle import MaintenanceConfig

__all__ = [
    "JOBS", "INSTALL_HINT", "FileResult", "FleetReport", "run", "run_one",
    "Passphrase", "PassphraseEnv", "KeyFile", "KeyFileBeside", "KeyFiles", "Plaintext", "KeySource",
]

INSTALL_HINT = "install the fleet extra: pip install 'engramdb[fleet]'"
JOBS = ("maintain", "verify", "compact", "dump", "stats")
KEY_SUFFIX = ".key"
_NOT_STORES = ("-lock", "-maint", COMPACT_SUFFIX, RESTORE_SUFFIX, PARTIAL_SUFFIX)


# --- key sources ------------------------------------------------------------------------

@dataclass(frozen=True)
class Passphrase:
    """One passphrase for every file. It travels (pickled) inside each task, never in a
    task's key or repr; prefer :class:`PassphraseEnv` where the workers share an environment."""

    value: str = field(repr=False)

    def __repr__(self) -> str:
        return "Passphrase(<redacted>)"

    def resolve(self, path: str) -> dict[str, Any]:
        return {"passphrase": self.value}


@dataclass(frozen=True)
class PassphraseEnv:
    """One passphrase for every file, read on the worker from the environment variable ``name``."""

    name: str = "ENGRAM_PASSPHRASE"

    def resolve(self, path: str) -> dict[str, Any]:
        value = os.environ.get(self.name)
        if not value:
            raise ValidationError(f"${self.name} is not set on the worker that opened {path}",
                                  hint=f"set {self.name} in the workers' environment, or use key files")
        return {"passphrase": value}


@dataclass(frozen=True)
class KeyFileBeside:
    """A key file per store, beside it: ``NAME.engram.key`` (32 raw key bytes or a recovery key)."""

    suffix: str = KEY_SUFFIX

    def resolve(self, path: str) -> dict[str, Any]:
        return {"key": engram.read_key_file(path + self.suffix)}


@dataclass(frozen=True)
class KeyFile:
    """One key file (32 raw key bytes or a recovery key) for every store, read on the worker."""

    path: str

    def resolve(self, path: str) -> dict[str, Any]:
        return {"key": engram.read_key_file(self.path)}


@dataclass(frozen=True)
class KeyFiles:
    """A key file per store, by a mapping from store path to key-file path."""

    files: Mapping[str, str]

    def resolve(self, path: str) -> dict[str, Any]:
        keyfile = self.files.get(path) or self.files.get(os.path.abspath(path))
        if keyfile is None:
            raise ValidationError(f"no key file is mapped for {path}", hint="add the store to the key-file mapping")
        return {"key": engram.read_key_file(keyfile)}


@dataclass(frozen=True)
class Plaintext:
    """Plaintext files (created with ``encrypted=False``): no key."""

    def resolve(self, path: str) -> dict[str, Any]:
        return {"encrypted": False}


# A callable source maps a store path to its secret on the worker: a str is a passphrase,
# bytes a raw 32-byte key (a recovery key goes through KeyFileBeside/KeyFiles).
KeySource = (Passphrase | PassphraseEnv | KeyFile | KeyFileBeside | KeyFiles | Plaintext
             | Callable[[str], str | bytes])


def _open_kwargs(source: Any, path: str) -> dict[str, Any]:
    if source is None:
        source = PassphraseEnv()
    if hasattr(source, "resolve"):
        kwargs: dict[str, Any] = source.resolve(path)
        return kwargs
    if callable(source):
        secret = source(path)
        if isinstance(secret, bytes):
            return {"key": secret}
        if isinstance(secret, str):
            return {"passphrase": secret}
        raise ValidationError(f"the key callable returned {type(secret).__name__} for {path}",
                              hint="return the passphrase as str or the raw 32-byte key as bytes")
    raise ValidationError(f"unknown key source {type(source).__name__}",
                          hint="pass Passphrase, PassphraseEnv, KeyFile, KeyFileBeside, KeyFiles, Plaintext or a callable")


# --- one file ---------------------------------------------------------------------------

class BusyFileError(EngramError):
    """The file is held by another process (compaction, restore, another handle); the task
    is retried, and reported as busy once the retries are spent."""

    default_hint = "run the job again when the other process has finished with the file"


# Errors that say "someone else has the file right now", not "this file is bad".
_BUSY: tuple[type[EngramError], ...] = tuple(
    kind for kind in (AlreadyOpenError, WriteConflictError, getattr(errors, "BusyError", None)) if kind is not None)


def _dump_name(path: str) -> str:
    base = os.path.basename(path)
    return (base[:-len(".engram")] if base.endswith(".engram") else base) + ".aaak"


def _write_dump(db: Any, path: str, out: str) -> dict[str, Any]:
    """Dump ``db`` to ``out``/NAME.aaak: atomically (temporary file, fsync, rename) on a
    local folder, or through fsspec for a URL (``file://``, ``s3://``, ...)."""
    name = _dump_name(path)
    if "://" in out:
        try:
            import fsspec
        except ImportError:
            raise ConfigMismatchError("dumps to a URL need fsspec, which is not installed",
                                      hint=INSTALL_HINT) from None
        target = out.rstrip("/") + "/" + name
        # under a temporary name, moved over NAME.aaak once complete: writing NAME.aaak in place
        # cut the last good backup there when a dump failed half-way (an object store commits a
        # file on close, even after an error)
        fs, final = fsspec.core.url_to_fs(target)
        partial = final + ".partial"
        try:
            with fs.open(partial, "wb") as fh:
                records = db.dump(fh)
            fs.mv(partial, final)
        except BaseException:
            try:
                fs.rm(partial)
            except Exception:  # nothing written yet, or the store is unreachable: the error below says more
                pass
            raise
        return {"dump": target, "records": records}
    target = os.path.join(out, name)
    with atomic_file(target) as fh:
        records = db.dump(fh)
    return {"dump": target, "records": records, "bytes": os.path.getsize(target)}


def _do_job(db: Any, path: str, job: str | Callable[[engram.Engram], Mapping[str, Any]], options: Mapping[str, Any]) -> Any:
    if callable(job):
        result = job(db)
        if not isinstance(result, Mapping):
            raise ValidationError(f"the job function returned {type(result).__name__}, not a dict",
                                  hint="return a dict of JSON-friendly values")
        return dict(result)
    if job == "maintain":
        report = db.maintain(options.get("config"), options.get("summarizer"), now=options.get("now"),
                             plan=bool(options.get("plan", False)))
        return report.to_dict()
    if job == "verify":
        problems = db.verify()
        return {"problems": [str(p) for p in problems]}
    if job == "compact":
        before = os.path.getsize(path)
        db.compact()
        return {"bytes_before": before, "bytes_after": os.path.getsize(path)}
    if job == "dump":
        return _write_dump(db, path, options["out"])
    if job == "stats":
        return db.stats()
    raise ValidationError(f"unknown job {job!r}", hint=f"use one of {', '.join(JOBS)} or a function (Engram) -> dict")


def _open(path: str, readonly: bool, kwargs: dict[str, Any], timeout: float | None,
          allow_unsafe_fs: bool = False) -> engram.Engram:
    """``engram.open`` with a mode mismatch's hint in the fleet's words: the library's
    speaks of open()'s arguments (``encrypted=False``), which a fleet user does not pass.
    Plaintext and encrypted files take different key sources, so a mixed glob is run twice."""
    try:
        return engram.open(path, create=False, readonly=readonly, timeout=timeout, allow_unsafe_fs=allow_unsafe_fs,
                           **kwargs)
    except ModeMismatchError as exc:
        if kwargs.get("encrypted") is False:
            hint = ("it is encrypted: run the encrypted files in a fleet run of their own, with their "
                    "passphrase or key files, not Plaintext() (--plaintext)")
        else:
            hint = ("it is a plaintext file: run the plaintext files in a fleet run of their own, with "
                    "key_source=Plaintext() (--plaintext)")
        raise ModeMismatchError(exc.message, hint=hint) from None


def run_one(path: str, job: str | Callable[[engram.Engram], Mapping[str, Any]], key_source: KeySource | None = None,
            options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Run ``job`` on one file and return its result row (the body of every fleet task).

    A bad file (damaged, wrong key, full disk, any :class:`EngramError`) gives a row with
    ``status="error"``, its message and hint, and so does any other exception a job function
    raises (it is not retried: a retry would repeat what the job committed). A busy file
    raises :class:`BusyFileError`, so the scheduler retries the task.
    """
    options = dict(options or {})
    start = time.perf_counter()
    row: dict[str, Any] = {"path": path, "job": job if isinstance(job, str) else getattr(job, "__name__", "function")}
    readonly = job in ("verify", "stats", "dump") or (job == "maintain" and bool(options.get("plan")))
    try:
        kwargs = _open_kwargs(key_source, path)
        with _open(path, readonly, kwargs, options.get("timeout", DEFAULT_TIMEOUT),
                   bool(options.get("allow_unsafe_fs", False))) as db:
            row["result"] = _do_job(db, path, job, options)
        row["status"] = "ok"
        if job == "verify" and row["result"]["problems"]:
            row["status"] = "problems"
    except _BUSY as exc:
        raise BusyFileError(f"{path} is busy: {exc.message}") from None
    except EngramError as exc:
        row.update(status="error", error=type(exc).__name__, message=exc.message, hint=exc.hint)
    except OSError as exc:  # a vanished file or folder between listing and opening
        row.update(status="error", error=type(exc).__name__, message=str(exc),
                   hint="check that the file and the output folder exist and are writable")
    except Exception as exc:  # a bug in a job function or a key callable: raised, Dask would retry it
        # and repeat what the job committed before failing; only a busy file is worth a retry
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        row.update(status="error", error=type(exc).__name__,
                   message=f"{exc} (raised at {os.path.basename(frame.filename)}:{frame.lineno} in {frame.name})",
                   hint="fix the job (or key) function; it ran once on this file, not retried, and the file "
                        "keeps what the job committed before the error")
    row["seconds"] = time.perf_counter() - start
    return row


# --- the fleet --------------------------------------------------------------------------

@dataclass
class FileResult:
    """One file's outcome: ``status`` is ``ok``, ``problems`` (verify found some), ``error``
    (the job failed on this file) or ``busy`` (still busy after the retries)."""

    path: str
    status: str
    seconds: float = 0.0
    result: Any = None
    error: str = ""
    message: str = ""
    hint: str = ""


@dataclass
class FleetReport:
    """Per-file results (in the order the paths were given) and totals."""

    job: str
    files: list[FileResult]
    seconds: float = 0.0
    workers: int = 0

    @property
    def totals(self) -> dict[str, int]:
        counts = {"files": len(self.files), "ok": 0, "problems": 0, "error": 0, "busy": 0}
        for item in self.files:
            counts[item.status] = counts.get(item.status, 0) + 1
        return counts

    @property
    def ok(self) -> bool:
        """Whether the job succeeded on every file."""
        return all(item.status == "ok" for item in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "seconds": self.seconds, "workers": self.workers, "totals": self.totals,
                "files": [dataclasses.asdict(item) for item in self.files]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, default=str)

    def table(self) -> str:
        """A plain-text table: one line per file, then the totals."""
        width = max([len(item.path) for item in self.files] + [4])
        lines = [f"{'file':<{width}}  {'status':<8}  {'seconds':>8}  detail"]
        for item in self.files:
            detail = f"{item.error}: {item.message}" if item.error else _short(item.result)
            if item.hint:
                detail += f" (hint: {item.hint})"
            lines.append(f"{item.path:<{width}}  {item.status:<8}  {item.seconds:8.3f}  {detail}")
        totals = self.totals
        lines.append(f"{totals['files']} files: {totals['ok']} ok, {totals['problems']} with problems, "
                     f"{totals['error']} failed, {totals['busy']} busy, in {self.seconds:.1f} s "
                     f"on {self.workers} workers")
        return "\n".join(lines)


def _short(result: Any) -> str:
    if not isinstance(result, Mapping):
        return ""
    keep = ("records", "problems", "memories", "decayed", "deduplicated", "archived", "summarized",
            "bytes_before", "bytes_after")
    parts = []
    for k in keep:
        if k in result:
            value = result[k]
            parts.append(f"{k}={len(value) if isinstance(value, list) else value}")
    return " ".join(parts)


def expand_paths(paths_or_glob: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[str]:
    """The store paths named by a glob pattern or a list (sorted for a glob, as given for a list).
    A glob leaves out the stores' sidecars (``-lock``, ``-maint``), their key files beside
    them (``NAME.engram.key``) and engramdb's temporary files (``.compact-tmp``,
    ``.restore-tmp``, ``.partial``).

    Raises:
        ValidationError: nothing matches, or a file is named twice (under any spelling).
    """
    if isinstance(paths_or_glob, (str, os.PathLike)):
        pattern = os.fspath(paths_or_glob)
        # a store's sidecars, and engramdb's files in the making: a compacting copy, a restore's
        # new store (a task would write into it while the restore does), a dump's partial file
        matched = {p for p in glob.glob(pattern, recursive=True) if not p.endswith(_NOT_STORES)}
        # a store's key file beside it (KeyFileBeside) is no store: 'tenants/*' matches both
        paths = sorted(p for p in matched if not (p.endswith(KEY_SUFFIX) and p[:-len(KEY_SUFFIX)] in matched))
        if not paths:
            raise ValidationError(f"no file matches {pattern}", hint="check the pattern (quote it in the shell)")
    else:
        paths = [os.fspath(p) for p in paths_or_glob]
    # one file under two spellings (./a, a symlink) would be two tasks on it at once
    real = [os.path.realpath(p) for p in paths]
    if len(set(real)) != len(real):
        twice = next(p for i, p in enumerate(paths) if real[i] in real[:i])
        raise ValidationError(f"a file is named twice: {twice}", hint="give each store once")
    return paths


def _distributed() -> Any:  # Any: Dask (an optional extra) is untyped here, the library boundary
    try:
        import distributed
    except ImportError:
        raise ConfigMismatchError("the fleet needs Dask's distributed scheduler, which is not installed",
                                  hint=INSTALL_HINT) from None
    return distributed


def _connect(address: str) -> Any:  # Any: a distributed.Client (Dask is untyped here)
    """A Dask client of the scheduler at ``address`` (``tcp://HOST:8786``).

    Raises:
        ConfigMismatchError: Dask is not installed, the address is malformed, or no
            scheduler answers there.
    """
    distributed = _distributed()
    try:
        return distributed.Client(address)
    except (OSError, ValueError, TypeError) as exc:  # TimeoutError is an OSError
        message = f"cannot connect to the Dask scheduler at {address}: {exc}"
    # The half-made Client sits in a reference cycle. Left to a later garbage collection, its
    # __del__ may run inside another Client's start, which holds the class-wide LoopRunner
    # lock that __del__'s close() then waits for: the process hangs. Collect it now.
    gc.collect()
    raise ConfigMismatchError(message, hint="check --scheduler (tcp://HOST:8786) and that the scheduler is running "
                                            "there")


def run(paths_or_glob: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
        job: str | Callable[[engram.Engram], Mapping[str, Any]], *, client: Any = None, key_source: KeySource | None = None,
        retries: int = 2, progress: bool = True, out: str | None = None, now: float | None = None,
        config: MaintenanceConfig | None = None, workers: int | None = None,
        timeout: float | None = DEFAULT_TIMEOUT, allow_unsafe_fs: bool = False) -> FleetReport:
    """Run ``job`` over every file, one Dask task per file, and report per file.

    Args:
        paths_or_glob: a glob pattern (``"tenants/*.engram"``) or a list of paths.
        job: ``"maintain"``, ``"verify"``, ``"compact"``, ``"dump"``, ``"stats"``, or a
            function ``(Engram) -> dict`` (it must be importable on the workers).
        client: a ``distributed.Client``; without one, a local cluster of ``workers``
            processes (default: the machine's cores) is started and closed.
        key_source: how a task finds its file's key (see :data:`KeySource`); default
            :class:`PassphraseEnv` (``$ENGRAM_PASSPHRASE`` on the workers).
        retries: how often a task is retried when its file is busy (or its worker died).
        progress: show a progress bar on stderr.
        out: the folder or fsspec URL that ``dump`` writes ``NAME.aaak`` files into.
        now, config: passed to ``maintain``.
        timeout: seconds a task waits for another process writing to or compacting its
            file before the file counts as busy (``None``: as long as it takes).
        allow_unsafe_fs: open files on a network or FUSE filesystem too (each is refused
            otherwise, see ``engramdb.open``): only when no other process or machine uses
            any of them during the run (``ENGRAM_ALLOW_UNSAFE_FS=1`` on the workers does the same).

    Raises:
        ValidationError: a bad job, no files, or ``dump`` without ``out``.
        ConfigMismatchError: Dask is not installed.
    """
    paths = expand_paths(paths_or_glob)
    if isinstance(job, str) and job not in JOBS:
        raise ValidationError(f"unknown job {job!r}", hint=f"use one of {', '.join(JOBS)} or a function (Engram) -> dict")
    if not isinstance(job, str) and not callable(job):
        raise ValidationError("the job must be a name or a function (Engram) -> dict")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not timeout >= 0):
        raise ValidationError(f"timeout must be a number of seconds >= 0 or None, got {timeout!r}",
                              hint="pass timeout=SECONDS (--timeout), or None to wait as long as it takes")
    if not isinstance(allow_unsafe_fs, bool):
        raise ValidationError(f"allow_unsafe_fs must be True or False, got {allow_unsafe_fs!r}")
    options: dict[str, Any] = {"now": now, "config": config, "timeout": timeout}
    if allow_unsafe_fs:
        options["allow_unsafe_fs"] = True
    if job == "dump":
        if not out:
            raise ValidationError("the dump job needs an output folder or URL", hint="pass out=FOLDER (--out)")
        names = [_dump_name(p) for p in paths]
        if len(set(names)) != len(names):
            raise ValidationError("two stores would dump to the same NAME.aaak",
                                  hint="dump stores with distinct file names in separate runs")
        if "://" not in out:
            if os.path.exists(out) and not os.path.isdir(out):
                raise ValidationError(f"{out} is not a folder; the dump job writes NAME.aaak files into one",
                                      hint="pass a folder (it is created if missing) or an fsspec URL as --out")
            try:
                os.makedirs(out, exist_ok=True)
            except OSError as exc:
                raise ValidationError(f"cannot create the output folder {out}: {exc.strerror}",
                                      hint="pass a folder you can write to, or an fsspec URL, as --out") from None
        options["out"] = out
    if not isinstance(retries, int) or retries < 0:
        raise ValidationError(f"retries must be a whole number >= 0, got {retries!r}")
    distributed = _distributed()
    start = time.perf_counter()
    own_cluster = None
    if client is None:
        n = workers or os.cpu_count() or 1
        # silence_logs: a worker logs each failed attempt with a traceback ("Compute Failed"), a
        # busy file's too; this cluster's workers would print that to the terminal, and the report
        # already names each file and what happened to it
        own_cluster = distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                               dashboard_address=None, silence_logs=logging.CRITICAL)
        client = distributed.Client(own_cluster)
    try:
        report = _gather(distributed, client, paths, job, key_source, options, retries, progress)
    finally:
        if own_cluster is not None:
            client.close()
            own_cluster.close()
    report.seconds = time.perf_counter() - start
    return report


def _gather(distributed: Any, client: Any,  # Dask objects: the untyped library boundary
            paths: list[str], job: str | Callable[[engram.Engram], Mapping[str, Any]], key_source: KeySource | None,
            options: dict[str, Any], retries: int, progress: bool) -> FleetReport:
    name = job if isinstance(job, str) else getattr(job, "__name__", "function")
    futures = {client.submit(run_one, path, job, key_source, options, retries=retries, pure=False,
                             key=f"engramdb-{name}-{i}"): i for i, path in enumerate(paths)}
    results: list[FileResult | None] = [None] * len(paths)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(paths), desc=f"fleet {name}", unit=" files")
    try:
        for future in distributed.as_completed(futures):
            i = futures[future]
            results[i] = _result_of(future, paths[i])
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    workers = len(client.scheduler_info().get("workers", {}))
    return FleetReport(job=name, files=[r for r in results if r is not None], workers=workers)


def _result_of(future: Any, path: str) -> FileResult:
    if future.status == "finished":
        row = future.result()
        return FileResult(path=path, status=row["status"], seconds=row["seconds"], result=row.get("result"),
                          error=row.get("error", ""), message=row.get("message", ""), hint=row.get("hint", ""))
    exc = future.exception()
    if isinstance(exc, BusyFileError):
        return FileResult(path=path, status="busy", error=type(exc).__name__, message=exc.message, hint=exc.hint)
    # a worker that died more often than the scheduler allows (KilledWorker), or a bug in a user job
    return FileResult(path=path, status="error", error=type(exc).__name__, message=str(exc),
                      hint="see the worker logs; the file itself is left as its last commit left it")
