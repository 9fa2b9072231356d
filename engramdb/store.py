"""The LMDB boundary: the only module that imports lmdb.

It owns the environment (one per path per process), the named tables, sealed
transactions, automatic map growth, the per-table state digests, the maintenance lock
and the compacting copy. Everything above it sees plaintext bytes in and out of
``Txn.get/put``; every value on disk is an envelope from :class:`crypto.Sealer`.

Files of a store ``NAME.engram`` (spec/file-format.md):

* ``NAME.engram``: the LMDB data file (``subdir=False``), mode 0600.
* ``NAME.engram-lock``: LMDB's reader table. It holds no data; it may be deleted only
  while no process has the store open, and is rebuilt by the next opener.
* ``NAME.engram-maint``: engramdb's maintenance lock. Every opener holds a shared
  ``flock`` on it; ``compact`` (which replaces the data file) needs it exclusively. It
  also records whether the last session closed cleanly.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import mmap
import operator
import os
import re
import resource
import select
import stat
import struct
import threading
import time
import weakref
from dataclasses import dataclass, field
from threading import get_ident
from typing import IO, Any, NoReturn, Protocol, TypedDict, TypeVar
from collections.abc import Callable, Iterable, Iterator

import lmdb
import numpy as np

from . import codec
from .crypto import EPOCH_LIMIT, Sealer
from .errors import (
    AlreadyOpenError, BusyError, ClosedError, CorruptFileError, EngramError, FileMissingError, ForeignFileError,
    ForkError, ReadOnlyError, StorageFullError, StoreError, ValidationError, WriteConflictError, WrongThreadError,
    UnsafeFilesystemError,
)

T = TypeVar("T")

# Generic one-byte sub-database names: the names of LMDB's tables are stored in the clear
# in the main database, so they must leak nothing. Append only; never reorder.
_first = operator.itemgetter(0)
TABLES = ("meta", "nodes", "ids", "postings", "segments", "vectors", "edges", "archive", "procedures", "sources")
_DB_NAMES = {name: b"t%d" % i for i, name in enumerate(TABLES)}
MAX_DBS = 32
# Map size is only address space; start generously and double on demand.
INITIAL_MAP_SIZE = 64 * 1024 * 1024
GROW_AT = 0.75
MAX_READERS = 512
HEADER_KEYS = (b"header", b"header.bak", b"header.sha256")  # the only plaintext values in a file
STATE_KEY = b"state"
_INSERT_CHUNK = 1024  # records sealed, written and digested together by Txn.insert_many
# The change log (spec/file-format.md, "Change log"): every commit records, under
# meta/changes.<u64be seq>, the docnos whose node record or edges it changed, so that a
# process's caches of decoded records drop only those after another process's commit.
CHANGES_PREFIX = b"changes."
CHANGES_KEEP = 1024  # entries kept; a cache further behind than this starts over
CHANGES_MAX = 4096  # a commit touching more existing docnos is logged as "anything may have changed"
_EDGE_KEY = struct.Struct(">cQBQ")  # b"f"|b"r", docno, kind, docno (engramdb/index/graph.py)
# A write transaction keeps its bulk writes for a replay after map growth up to this many
# bytes; past it, map growth re-runs the transaction instead (WriteConflictError, which
# Store.write retries), so a large ingest does not hold every envelope it wrote in memory.
# (16 MiB: at 64 MiB the log was ~30 MB of a 200k-memory add_many's peak; add_many grows
# the map up front, so a growth mid-transaction, and with it a re-run, is rare)
_REPLAY_LOG_LIMIT = 16 << 20
# The map's pages a process touches stay in its resident set (page cache: shared, clean,
# reclaimable, but counted), and each touch maps its neighbours too (the kernel's
# fault-around, 64 KiB): at 1M documents 400 queries left ~80 MB of the map resident for
# ~15 MB of postings read, and a bulk import's inserts into the ids B-tree (random keys)
# faulted in most of the file. So every RELEASE_CHECK_EVERY uses of the map (a value read
# or looked for, a record written or scanned), a transaction looks at the file pages the
# process holds (/proc/self/statm); when they grew by RELEASE_MAP_ABOVE since the last
# look that released, it asks the kernel to take back the map's pages
# (release_mapped_pages): what was read is decoded and cached by then.
RELEASE_CHECK_EVERY = 64
RELEASE_MAP_ABOVE = 8 << 20
# Txn._rewrite_table (repack, rekey) copies a table through a scratch table that lives only
# inside its transaction, this many bytes of entries at a time.
_REWRITE_CHUNK_BYTES = 8 << 20
_SCRATCH_TABLE = b"scratch"
_MADV_DONTNEED = getattr(mmap, "MADV_DONTNEED", 4)
# How long a new read of a deferred handle waits for a pending reopen (Store.read) before it
# goes ahead anyway: long beside a read, so a stream of short reads lets the reopen through,
# and bounded, because a read open now may itself wait for the new one (a thread handing work
# to a pool inside its read): the reopen waits for that read, and unbounded this never ended.
_READ_WAITS_FOR_REOPEN = 5.0
# How long a map growth (or the adoption of another process's) waits for this process's
# reads to end. It never remaps under them: py-lmdb ends every open transaction of the
# environment when the map changes, so a read in another thread (a dump) would fail midway.
_RESIZE_WAITS_FOR_READS = 30.0
_libc: Any = None
# (magic, what it is, what to do); the key file's magic must come before Terronex's "ENGRAM".
_SNIFF = (
    (b"ENGRAMDB-KEY", "an engramdb key file (from export-key)",
     "give the store's path; a key file goes back with `engramdb import-key STORE KEYFILE`"),
    (b"ENGRAM", "a Terronex .engram file", "convert it with `engramdb import FILE NEW.engram`"),
    (b"SQLite format 3\x00", "an SQLite database", None),
    (b"FILE:", "AAAK text (a dump or an export)",
     "rebuild a store from a dump with `engramdb restore DUMP NEW.engram`; AAAK v1/v2 text goes in with "
     "`engramdb import FILE NEW.engram`"),
    (b"AAAK-ENC", "an encrypted AAAK dump", "rebuild a store from it with `engramdb restore DUMP NEW.engram`"),
)


class EnvInfo(TypedDict):
    """:meth:`Store.env_info`: LMDB's environment info, its page size and the file's size (bytes)."""

    map_addr: int
    map_size: int
    last_pgno: int
    last_txnid: int
    max_readers: int
    num_readers: int
    psize: int
    file_size: int


@dataclass
class State:
    """The per-store counters, sealed in ``meta/state`` and updated in every write transaction."""

    seq: int = 0
    next_docno: int = 1
    epoch: int = 0
    sealed: int = 0
    # table name -> [entry count, additive digest mod 2**256] (reliability rule 38)
    digests: dict[str, list[int]] = field(default_factory=dict)
    # LMDB's txnid of the commit that wrote this record (0: not recorded). Binds the sealed
    # state to the meta page LMDB chose, so a damaged meta that selects another root is seen.
    txnid: int = 0

    def to_bytes(self) -> bytes:
        return codec.pack([1, self.seq, self.next_docno, self.epoch, self.sealed,
                           {t: [c, d.to_bytes(32, "big")] for t, (c, d) in sorted(self.digests.items())},
                           self.txnid])

    @classmethod
    def from_bytes(cls, data: bytes) -> State:
        fields = codec.unpack(data)
        try:
            version, seq, next_docno, epoch, sealed, digests, *rest = fields
            txnid = rest[0] if rest else 0  # appended field: absent in the first files
            if version != 1 or not isinstance(txnid, int):
                raise ValueError
            return cls(seq, next_docno, epoch, sealed,
                       {t: [c, int.from_bytes(d, "big")] for t, (c, d) in digests.items()}, txnid)
        except (TypeError, ValueError, AttributeError):
            raise CorruptFileError("the store's state record is malformed") from None


@dataclass(frozen=True)
class Changes:
    """What one or more commits changed, from the change log: the docnos whose node record
    changed (updated or deleted) and those with an edge added, changed or removed. None
    means anything may have changed (a large commit, or a log that does not reach back).
    Records of docnos the commits allocated are not listed: they did not exist before."""

    nodes: frozenset[int] | None
    edges: frozenset[int] | None

    @property
    def everything(self) -> bool:
        return self.nodes is None or self.edges is None


EVERYTHING = Changes(None, None)


def encode_changes(changes: Changes) -> bytes:
    """A change-log entry's plaintext: msgpack ``[1, nodes, edges]`` (sorted docnos), or
    ``[1, nil, nil]`` for :data:`EVERYTHING`."""
    if changes.nodes is None or changes.edges is None:
        return codec.pack([1, None, None])
    return codec.pack([1, sorted(changes.nodes), sorted(changes.edges)])


def decode_changes(data: bytes) -> Changes:
    """:func:`encode_changes` reversed.

    Raises:
        CorruptFileError: not a change-log entry of version 1.
    """
    fields = codec.unpack(data)
    try:
        version, nodes, edges = fields
        if version != 1 or isinstance(version, bool):
            raise ValueError
        if nodes is None and edges is None:
            return EVERYTHING
        if not (isinstance(nodes, list) and isinstance(edges, list)) or not all(
                type(d) is int and 0 <= d < 2**64 for d in nodes + edges):
            raise ValueError
        return Changes(frozenset(nodes), frozenset(edges))
    except (TypeError, ValueError):
        raise CorruptFileError("a change-log entry is malformed",
                               hint="run `engramdb verify FILE`; restore from a dump or backup") from None


class CommitListener(Protocol):
    """A cache of decoded records told about each commit made through this process:
    what it changed, and the committed state's ``seq``, ``next_docno`` and snapshot id."""

    def purge(self, changes: Changes, state: tuple[int, int, int] | None = None) -> None: ...


def _docnos_of(table: str, keys: Iterable[bytes], first_new: int, out: set[int]) -> None:
    """Add to ``out`` the docnos below ``first_new`` that keys of ``nodes`` or ``edges`` name."""
    if table == "nodes":
        for key in keys:
            if len(key) == 8:
                docno = int.from_bytes(key, "big")
                if docno < first_new:
                    out.add(docno)
        return
    for key in keys:
        if len(key) == _EDGE_KEY.size:
            _, a, _, b = _EDGE_KEY.unpack(key)
            out.update(d for d in (a, b) if d < first_new)


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + max(0.0, timeout)


def _flock_until(fd: int, op: int, deadline: float | None, busy: str) -> None:
    """``flock(fd, op)``, waiting until ``deadline`` (None: as long as it takes).

    Raises:
        BusyError: the lock was still held by someone else at the deadline.
    """
    if deadline is None:
        fcntl.flock(fd, op)
        return
    pause = 0.001
    while True:
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BusyError(busy) from None
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.05)


# The writer lock's turnstile: an open-file-description lock (fcntl F_OFD_SETLK, Linux; it
# does not interact with flock, and belongs to the fd as flock does) on the first byte of
# -maint. A writer takes it before the writer lock and drops it once it has that lock, so a
# writer that waits for the writer lock holds the turnstile meanwhile, and the holder, once
# done, must pass the turnstile to write again: it cannot take the writer lock back at once,
# ahead of the waiter, commit after commit (flock is not fair: a process committing in a
# tight loop starved a maintenance pass into BusyError). Older versions and systems without
# such locks skip the turnstile (and are not fair).
_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", None)
_OFD_SETLKW = getattr(fcntl, "F_OFD_SETLKW", None)


def _turnstile_lock(kind: int) -> bytes:
    return struct.pack("hhqqi4x", kind, os.SEEK_SET, 0, 1, 0)  # struct flock: the first byte; l_pid 0 (OFD)


def _enter_turnstile(fd: int, deadline: float | None, busy: str) -> bool:
    """Take the turnstile of the writer lock (on ``-maint``'s ``fd``), waiting until
    ``deadline``; False when this system has no such lock (nothing to release then).

    Raises:
        BusyError: other writers kept it past the deadline.
    """
    if _OFD_SETLK is None or _OFD_SETLKW is None:
        return False
    lock = _turnstile_lock(fcntl.F_WRLCK)
    pause = 0.001
    while True:
        try:
            fcntl.fcntl(fd, _OFD_SETLK if deadline is not None else _OFD_SETLKW, lock)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):  # EINVAL, ENOLCK: no such locks here
                return False
        assert deadline is not None  # F_OFD_SETLKW waits; only a lock held by another description says EAGAIN
        left = deadline - time.monotonic()
        if left <= 0:
            raise BusyError(busy) from None
        time.sleep(min(pause, left))
        pause = min(pause * 2, 0.05)


def _leave_turnstile(fd: int) -> None:
    if _OFD_SETLK is not None:
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, _OFD_SETLK, _turnstile_lock(fcntl.F_UNLCK))


def _same_file(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file open on ``fd`` (not unlinked or replaced)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _refuse_hard_links(fd: int, path: str, then: str = "") -> None:
    """Refuse to write a data file that has another name (a hard link).

    Every lock lives beside a name (``-lock``'s writer mutex and reader table, ``-maint``'s
    writer lock), so a writer through another name would not wait for this one: two
    commits at once corrupt the file, and a reader through one name does not keep a writer
    through the other from reusing the pages it reads.
    """
    links = os.fstat(fd).st_nlink
    if links > 1:
        raise StoreError(f"{path} has {links} names (hard links){then}: engramdb's locks are kept beside one "
                         "name, so writers through two names could corrupt it",
                         hint=f"remove the other names (find / -xdev -samefile {path}), or write to a copy (cp); "
                              "a read-only open is allowed")


# -- local filesystems only (reliability rule 9; spec/file-format.md "Local filesystems only") --
MOUNTINFO = "/proc/self/mountinfo"
ALLOW_UNSAFE_FS_ENV = "ENGRAM_ALLOW_UNSAFE_FS"
# Filesystems shared between machines (or between a VM and its host): LMDB's fcntl locks and
# the reader table and writer mutex in -lock's shared map are not shared across machines, and
# the memory map is not kept coherent with another machine's writes. "fuse" is FUSE without a
# subtype (unknown). Any "nfs*" and "fuse.*" type is refused too, except LOCAL_FUSE_TYPES.
UNSAFE_FS_TYPES = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "virtiofs", "ncpfs", "afs", "coda", "ceph", "glusterfs", "lustre",
    "gpfs", "beegfs", "orangefs", "ocfs2", "gfs2", "davfs", "fuse",
})
# FUSE filesystems known to be local and to go through the kernel's page cache, which the
# memory map shares: rootless podman's root filesystem. (overlay, Docker's, is a kernel
# filesystem and not refused at all; nor is fuseblk, FUSE over a local block device.)
LOCAL_FUSE_TYPES = frozenset({"fuse.fuse-overlayfs"})
_OCTAL = re.compile(r"\\([0-7]{3})")


def unsafe_fs_type(fstype: str) -> bool:
    """Whether engramdb refuses a store on a filesystem of this type (as /proc/self/mountinfo names it)."""
    if fstype in LOCAL_FUSE_TYPES:
        return False
    return fstype in UNSAFE_FS_TYPES or fstype.startswith(("nfs", "fuse."))


def parse_mountinfo(text: str) -> dict[str, str]:
    """The filesystem type of each mount point in the text of a ``/proc/PID/mountinfo``;
    of several mounts on one point, the last listed (the one on top). A bind mount is
    listed with the type it exposes, so a bind of an NFS directory is NFS here. Mount
    points escape space, tab, newline and backslash as octal (``\\040``)."""
    mounts: dict[str, str] = {}
    for line in text.splitlines():
        # id parent major:minor root MOUNT-POINT options [optional fields...] - TYPE source super-options
        head, sep, tail = line.partition(" - ")
        fields = head.split(" ", 5)
        if not sep or len(fields) < 6 or not tail:
            continue
        point = fields[4]
        if "\\" in point:
            point = _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), point)
        mounts[point] = tail.split(" ", 1)[0]
    return mounts


def mount_of(path: str, mounts: dict[str, str]) -> tuple[str, str] | None:
    """``(mount point, filesystem type)`` of the mount holding ``path`` (absolute, symlinks
    resolved): the longest mount point that is ``path`` or one of its directories."""
    while True:
        fstype = mounts.get(path)
        if fstype is not None:
            return path, fstype
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


# The mount table, read again only when the kernel says it changed: a poll of an open
# /proc/self/mountinfo reports POLLPRI once after each mount or unmount (a read costs
# ~0.2 ms, as much as a fifth of a plaintext store's open; the poll ~3 us). Per process:
# a child after fork() never polls the inherited descriptor, whose state it shares.
_mounts_lock = threading.Lock()
_mounts: tuple[str, int, int, Any, dict[str, str]] | None = None  # source, pid, fd, poll object, table


def _read_all(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "surrogateescape")  # as os.fsdecode decodes paths


def mount_table() -> dict[str, str] | None:
    """:func:`parse_mountinfo` of :data:`MOUNTINFO`, cached until the mount table changes;
    None when it cannot be read (not Linux, a sandbox without /proc)."""
    global _mounts
    source, pid = MOUNTINFO, os.getpid()
    with _mounts_lock:
        cached = _mounts
        if cached is not None and cached[:2] == (source, pid):
            fd, poller, table = cached[2:]
            if not poller.poll(0):
                return table
        else:
            if cached is not None and cached[1] == pid:
                os.close(cached[2])
            _mounts = None
            try:
                fd = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
            poller = select.poll()
            poller.register(fd, select.POLLPRI | select.POLLERR)
        try:
            table = parse_mountinfo(_read_all(fd))
        except OSError:
            os.close(fd)
            _mounts = None
            return None
        _mounts = (source, pid, fd, poller, table)
        return table


def check_filesystem(path: str, *, allow_unsafe: bool = False) -> None:
    """Refuse a store (``path`` absolute and resolved; a new file's name in its directory) on
    a network or FUSE filesystem (:func:`unsafe_fs_type`), unless ``allow_unsafe`` or the
    environment variable ``ENGRAM_ALLOW_UNSAFE_FS=1`` says to go ahead. Nothing is refused
    when the mount table cannot be read (not Linux, a sandbox without /proc).

    Raises:
        UnsafeFilesystemError: the file's mount is of a refused type.
    """
    if allow_unsafe or os.environ.get(ALLOW_UNSAFE_FS_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        return
    mounts = mount_table()
    found = None if mounts is None else mount_of(path, mounts)
    if found is None or not unsafe_fs_type(found[1]):
        return
    point, fstype = found
    raise UnsafeFilesystemError(
        f"{path} is on a {fstype} filesystem (mounted at {point}), a network or FUSE filesystem: LMDB's locks "
        "and the coherence of its memory map with other processes' writes do not hold there, so two processes "
        "(or machines) using the file could corrupt it")


def open_sidecar(path: str, flags: int) -> int:
    """Open a sidecar (``-maint``, ``-lock``, a temporary file) without following a symlink,
    and check that it is a regular file owned by this user.

    Raises:
        StoreError: a symlink, another kind of file, or another user's file is in its place.
        OSError: the file cannot be opened (missing, permissions, read-only medium).
    """
    try:
        # O_NONBLOCK: a FIFO planted in its place must not hang the open (no effect on a regular file)
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StoreError(f"{path} is a symbolic link; engramdb refuses to write through it",
                             hint=f"remove the link (rm {path}); engramdb creates the file again") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise StoreError(f"{path} is not a regular file owned by you; engramdb refuses to use it",
                         hint=f"remove it (rm {path}) if no engramdb process has the store open")
    return fd


def create_private(path: str) -> int:
    """Create ``path`` new (O_EXCL), mode 0600 from the start, never through a symlink; a write fd."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)  # O_CREAT's mode is already 0600 under any umask; this documents it
    return fd


PARTIAL_SUFFIX = ".partial"


@contextlib.contextmanager
def atomic_file(path: str, mode: str = "wb", **kwargs: Any) -> Iterator[IO[Any]]:
    """A new file at ``path``, written through ``path + ".partial"`` and renamed into place
    after an fsync; on any error the partial file is removed and ``path`` is untouched.

    The partial file is created mode 0600 (dumps and exports hold the store's plaintext) and
    flock-ed until its rename, so a leftover of a killed run (unlocked) is removed by the next
    run, while another run's file in progress is not: that run raises AlreadyOpenError.
    A full disk is a StorageFullError.
    """
    tmp = path + PARTIAL_SUFFIX
    fd = _create_partial(tmp)
    try:
        with os.fdopen(fd, mode, **kwargs) as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise StorageFullError(f"cannot write {path}: the disk or file-size limit is full",
                                   hint=f"free disk space and run it again; {path} was left as it was") from None
        raise


def _create_partial(tmp: str) -> int:
    while True:
        remove_if_abandoned(tmp)
        try:
            fd = create_private(tmp)
        except FileExistsError:
            raise AlreadyOpenError(f"{tmp} is being written by another engramdb command",
                                   hint="wait for it to finish, or write to another path") from None
        fcntl.flock(fd, fcntl.LOCK_EX)
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.fstat(fd), os.stat(tmp)):
                return fd
        os.close(fd)  # removed as abandoned between its creation and our lock: start again


def remove_if_abandoned(path: str, sidecars: tuple[str, ...] = ()) -> bool:
    """Delete ``path`` (and ``path + suffix`` for each sidecar) when no process holds a lock on it.

    Every engramdb writer of a temporary file (a compacting copy, a restore's new store,
    ``dump -o``'s ``.partial``) holds a ``flock`` on it from its creation to its rename, so a
    file nobody has locked is a leftover of a killed process. Returns True when removed.
    """
    try:
        fd = open_sidecar(path, os.O_RDONLY)
    except (OSError, StoreError):
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # in use: somebody's work in progress
        if not _same_file(fd, path):
            return False  # renamed into place (or removed) meanwhile
        for suffix in sidecars:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path + suffix)
        os.unlink(path)
        return True
    finally:
        os.close(fd)


def _fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _meta_txnid(path: str) -> int:
    """The last commit id in the file's meta pages (plain I/O; 0 when they cannot be read)."""
    try:
        with open(path, "rb") as fh:
            first = fh.read(4096)
            if len(first) < _META_TXNID + 8:
                return 0
            psize = struct.unpack_from("<I", first, _META_PSIZE)[0]
            fh.seek(psize if psize in (4096, 8192, 16384, 32768, 65536) else 4096)
            second = fh.read(_META_TXNID + 8)
    except OSError:
        return 0
    pages = [page for page in (first, second) if len(page) >= _META_TXNID + 8]
    txnids: list[int] = [struct.unpack_from("<Q", page, _META_TXNID)[0] for page in pages]
    return max(txnids)


def _stat_key(fd: int) -> tuple[int, ...]:
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _written_key(fd: int) -> tuple[int, ...]:
    """What a write to the data file changes: (device, inode, size, mtime). Not the ctime,
    which a chmod, a new hard link or a change of owner move as well, with nothing written."""
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def file_fingerprint(path: str, fd: int) -> bytes:
    """What a clean close records of the data file: device, inode, size, change and modification
    times, and the last commit id. Any write to the file outside engramdb changes the ctime
    (which no unprivileged process can set back), so a different fingerprint at the next open
    means the file may have changed outside engramdb."""
    st = os.fstat(fd)
    fields = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, _meta_txnid(path))
    return b"clean v2 " + b" ".join(b"%d" % f for f in fields) + b"\n"


def replace_store(tmp: str, path: str) -> None:
    """Rename the closed store ``tmp`` over ``path`` (restore --force), only while no process
    has ``path`` open: the exclusive lock on the data file itself is taken first.

    Raises:
        AlreadyOpenError: a process has ``path`` open.
    """
    try:
        fd: int | None = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = None
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise AlreadyOpenError(f"{path} is open in another process; it cannot be replaced",
                                       hint="close the other processes, then run the command again") from None
            if not _same_file(fd, path):
                raise AlreadyOpenError(f"{path} was replaced by another process meanwhile",
                                       hint="run the command again")
        os.replace(tmp, path)
        _fsync_dir(path)
        # The sidecars described the old file: LMDB rebuilds -lock at the next open; the
        # clean-shutdown record is written for the new file.
        with contextlib.suppress(OSError, StoreError):
            maint = open_sidecar(path + "-maint", os.O_RDWR | os.O_CREAT)
            try:
                new = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    record = file_fingerprint(path, new)
                finally:
                    os.close(new)
                os.pwrite(maint, record, 0)
                os.ftruncate(maint, len(record))
            finally:
                os.close(maint)
    finally:
        if fd is not None:
            os.close(fd)  # openers that waited on the old file find it replaced and start again


# Leftovers a killed process can leave beside NAME.engram, removed by the next opener (when
# nobody holds a lock on them). LMDB's -lock and engramdb's -maint of a store go with it.
STORE_SIDECARS = ("-lock", "-maint")
COMPACT_SUFFIX = ".compact-tmp"
RESTORE_SUFFIX = ".restore-tmp"
DEFAULT_TIMEOUT = 30.0


def release_mapped_pages(path: str) -> int:
    """Drop this process's page-table entries for ``path``'s memory maps
    (``madvise(MADV_DONTNEED)``, Linux); returns the bytes of mappings advised (0 where
    unsupported).

    Nothing is lost: LMDB's map is a read-only shared mapping of the file, so the pages stay
    in the page cache, and a page read again is mapped back (a minor fault, no disk read).
    The caller must keep the map from moving meanwhile (a growth or a compaction remaps it,
    and MADV_DONTNEED on whatever took its place would zero that memory): ``_Env.used_map``
    calls it inside a transaction of this process (an active reader, which growth and
    compaction wait for, or the writer, whose lock they need), holding the resize lock.
    (MADV_PAGEOUT would be safe without that, but it also evicts the pages from the page
    cache: the next reads of the B-tree went to the disk, 2-3x slower here.)
    """
    global _libc
    if not os.path.exists("/proc/self/maps"):
        return 0
    try:
        if _libc is None:
            import ctypes

            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        real = os.path.realpath(path)
        advised = 0
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            ranges = [row.split(None, 1)[0] for row in fh if row.rstrip("\n").endswith(" " + real)]
        for span in ranges:
            start, end = (int(x, 16) for x in span.split("-"))
            if _libc.madvise(start, end - start, _MADV_DONTNEED) == 0:
                advised += end - start
        return advised
    except (OSError, AttributeError, ValueError):  # no libc to load, no madvise: nothing released
        return 0


def resident_file_bytes() -> int | None:
    """The file-backed memory this process has resident (RssFile + RssShmem, from
    /proc/self/statm), or None where there is no such file."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[2]) * mmap.PAGESIZE
    except (OSError, ValueError, IndexError):
        return None


class _Env:
    """One LMDB environment shared by every handle of a path in this process.

    Locks (spec/file-format.md, "Files and locks"):

    * ``lock_fd``, an fd of the data file itself: every opener holds a shared ``flock``;
      compact and ``restore --force`` need it exclusively to replace the file. Locking the
      data file (not a sidecar that can be deleted) ties the lock to the file's identity;
      after every acquisition the path is checked to still name the locked file.
    * ``maint_fd`` (``NAME.engram-maint``): the clean-shutdown record, and the writer lock
      (an exclusive ``flock`` for the length of each write transaction, taken with a timeout
      before LMDB's own writer mutex, which has none).
    """

    def __init__(self, path: str, *, readonly: bool, create: bool, map_size: int | None, verify: bool,
                 timeout: float | None = DEFAULT_TIMEOUT) -> None:
        self.path = path
        self.readonly = readonly
        self.timeout = timeout
        self.pid = os.getpid()
        self.refs = 0
        self.resize_lock = threading.Condition()
        self.write_mutex = threading.Lock()
        self.writer_thread = 0  # the thread holding write_mutex (0: none)
        self.active_readers = 0
        self.thread_reads: dict[int, int] = {}  # open reads per thread (in active_readers too)
        # a deferred environment's reopen is waiting for the reads open now to end: a new read
        # (of a thread with none open) waits for the reopen, or a steady stream of overlapping
        # reads of other threads would hold it off until its timeout
        self.upgrading = False
        self.active_writers = 0
        self.map_uses = 0  # uses of the map since the last look at the resident file pages
        self.file_base = resident_file_bytes()  # those pages after the last release (None: no /proc)
        self.unclean = False
        self.changed = False
        self.checked = False
        self.meta_problem: str | None = None
        self.maint_fd: int | None = None
        self.maint_writable = False
        self.lock_fd: int | None = None
        self.made_file = False  # this open created the data file
        self.alone = False  # no other process had the file open when this one opened it
        self.lockless = False  # a read-only open without LMDB's lock file (_check_lock_sidecar)
        self.deferred = False  # read-write, but LMDB's environment read-only until the first write
        self.map_size = map_size
        self.lockless_key: tuple[int, ...] | None = None  # the data file's _written_key at a lockless open
        # The data file's (dev, inode, size, mtime, ctime) as this process last knew it (at open,
        # after each of its commits): a clean close records the file as clean only if it still
        # is that, so a change made by anyone else while the file was open is checked next time.
        self.expected: tuple[int, ...] | None = None
        # caches of decoded records of this process's handles, purged after each local commit
        self.listeners: weakref.WeakSet[CommitListener] = weakref.WeakSet()
        deadline = _deadline(timeout)
        try:
            created = self.created = self._lock_file(readonly, create, deadline)
            if self.meta_problem and (verify or self.unclean or self.changed):  # verify-then-trust
                raise CorruptFileError(f"{path}: {self.meta_problem}",
                                       hint="restore from a dump or backup")
            if not created and (verify or self.unclean or self.changed):
                structural_verify(path)
                self.checked = True
            self._check_lock_sidecar(readonly)
            # py-lmdb opens a read-write environment's tables in a write transaction, which
            # waits for LMDB's writer mutex (a read transaction's table handles end with it).
            # While another process is writing (a maintenance pass, an import), an existing
            # file's environment opens read-only instead and becomes read-write at this
            # process's first write (upgrade_to_write), which waits for that writer as every
            # write does: the open and the reads meanwhile do not.
            # (only for a file this process may write: one it may not is refused at open, as without a writer)
            self.deferred = not readonly and not created and os.access(path, os.W_OK) and self._writer_busy()
            self.env = self._open(path, readonly=readonly or self.deferred, create=create, map_size=map_size,
                                  lock=not self.lockless)
            self._check_not_truncated()  # before any page beyond the meta pages is touched
            if self.deferred and not self._has_tables():  # made by an older version: create them now
                self.env.close()
                self.deferred = False
                self.env = self._open(path, readonly=False, create=create, map_size=map_size)
            self.dbs = self._open_dbs(create=not readonly, new_file=created)
            if self.expected is not None:  # LMDB initialised a new file and created its tables
                self.expected = _stat_key(self.lock_fd)
        except BaseException:
            if getattr(self, "env", None) is not None:
                self.env.close()
            if self.made_file:
                self._remove_made_file()
            self._unlock(clean=False)
            raise

    def _remove_made_file(self) -> None:
        """Remove the data file this open created but could not set up (a full disk): it
        holds no data yet, and left behind it would make the next open refuse it as empty
        or truncated instead of creating it again."""
        fd = self.lock_fd
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody else has opened it meanwhile
        except OSError:
            return
        if _same_file(fd, self.path):
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    # -- locks -----------------------------------------------------------------------
    def _lock_file(self, readonly: bool, create: bool, deadline: float | None) -> bool:
        """Take the shared lock on the data file (creating it when asked); returns True when
        this call created it. The first opener (alone with the file) also reads the
        clean-shutdown record, checks the meta pages and removes abandoned temporary files."""
        path = self.path
        busy = f"{path} is being compacted or replaced by another process"
        while True:
            created = False
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                if readonly or not create:
                    raise FileMissingError(f"{path} does not exist") from None
                try:
                    fd = create_private(path)
                    created = True
                except FileExistsError:
                    continue  # another process created it this instant: open theirs
                except OSError as exc:  # a read-only or full disk, a directory we may not write
                    raise _create_error(exc, path) from None
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    alone = True
                except BlockingIOError:
                    _flock_until(fd, fcntl.LOCK_SH, deadline, busy)
                    alone = False
                if not _same_file(fd, path):  # replaced (compact, restore) or removed meanwhile
                    os.close(fd)
                    continue
                if not readonly:
                    _refuse_hard_links(fd, path)
            except BaseException:
                os.close(fd)
                raise
            self.lock_fd = fd
            self.made_file = created
            self.alone = alone
            self._open_maint(readonly)
            if alone:
                self._first_opener(readonly, created)
                self.expected = _stat_key(fd)
                fcntl.flock(fd, fcntl.LOCK_SH)  # a downgrade: atomic, no one can slip in
            return created

    def _open_maint(self, readonly: bool) -> None:
        # A reader creates a missing -maint too when it can (it records the clean shutdown).
        attempts = (os.O_RDWR, os.O_RDONLY, os.O_RDWR | os.O_CREAT) if readonly else (os.O_RDWR | os.O_CREAT,)
        for flags in attempts:
            try:
                self.maint_fd = open_sidecar(self.path + "-maint", flags)
                self.maint_writable = bool(flags & os.O_RDWR)
                return
            except OSError:
                continue
        if not readonly:
            raise StoreError(f"cannot create {self.path}-maint beside the store",
                             hint="make the store's directory writable, or open the file read-only")

    def _first_opener(self, readonly: bool, created: bool) -> None:
        """Alone with the file: nobody can be committing, compacting or restoring it."""
        record = b""
        if self.maint_fd is not None:
            record = os.pread(self.maint_fd, 256, 0)
        self.unclean = record.startswith(b"open")
        if not created:
            assert self.lock_fd is not None  # taken before the first opener runs
            self.changed = not self.unclean and record != file_fingerprint(self.path, self.lock_fd)
            self.meta_problem = meta_problem(self.path)
        # A compacting copy is only written under the exclusive lock: any copy is abandoned.
        remove_if_abandoned(self.path + COMPACT_SUFFIX)
        remove_if_abandoned(self.path + RESTORE_SUFFIX, STORE_SIDECARS)
        if not readonly and self.maint_writable and self.maint_fd is not None:
            try:
                os.pwrite(self.maint_fd, b"open ", 0)
            except OSError as exc:  # a full disk
                raise _os_error(exc, f"cannot write {self.path}-maint") from None

    def check_unwritten(self) -> None:
        """For a lockless read-only open: refuse what a read found once the file was written
        since the open (a writer does not see a lockless reader and reuses the pages it reads).

        Raises:
            ReadOnlyError: another process wrote the file while this handle read it without locks.
        """
        if self.lockless and self.lock_fd is not None and _written_key(self.lock_fd) != self.lockless_key:
            raise ReadOnlyError(
                f"{self.path} changed on disk (its size or modification time) since this handle opened it without "
                "LMDB's locks (its lock file is not writable here): another process may have written it, reusing "
                "the pages this read came from, so what was read is not returned",
                hint="open the file again to read it as it is now; to read while another process writes it, open "
                     "it where its lock file is writable, or read a copy (cp) taken while no process writes it")

    def _check_lock_sidecar(self, readonly: bool) -> None:
        """LMDB opens ``-lock`` itself (following links): check what is there, or create it
        ourselves, mode 0600 and never through a link, before LMDB does.

        A reader writes its slot into ``-lock`` too (LMDB opens it read-write), so a
        read-only copy in a directory or on a medium this user may not write (a backup)
        could not be read. Such a reader opens without LMDB's locks (``lock=False``) when no
        other process has the file open: there is no writer whose page reuse it must hold
        off. Otherwise it is refused: a writer would not see it, and could overwrite the
        pages it reads.

        Raises:
            ReadOnlyError: a read-only open that cannot write ``-lock`` while another
                process has the file open.
        """
        lock = self.path + "-lock"
        try:
            fd = open_sidecar(lock, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            if not readonly or exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                return  # LMDB reports what it needs
            if not self.alone:
                raise ReadOnlyError(
                    f"cannot read {self.path} while another process has it open: this user cannot write its "
                    f"lock file {lock} ({exc.strerror}), where readers register so that writers keep the pages "
                    "they read",
                    hint="open it where its directory is writable (a read-only open writes nothing to the data "
                         "file), or read a copy (cp) taken while no process writes it") from None
            self.lockless = True
            # what the file is now: a writer that comes later cannot see this reader (no slot
            # in -lock) and reuses the pages it reads, so each read checks the file is unchanged
            self.lockless_key = None if self.lock_fd is None else _written_key(self.lock_fd)
            return
        os.close(fd)

    def _unlock(self, *, clean: bool) -> None:
        """Release the locks; the last closer of a writable session records a clean shutdown."""
        maint, self.maint_fd = self.maint_fd, None
        lock, self.lock_fd = self.lock_fd, None
        try:
            if clean and lock is not None and maint is not None and self.maint_writable:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    pass  # others still have it open: the last of them records it
                else:
                    # Clean only if the file is still what this process last saw: otherwise
                    # someone else changed it meanwhile, and the next open checks it.
                    unchanged = self.expected is not None and self.expected == _stat_key(lock)
                    record = file_fingerprint(self.path, lock) if unchanged else b"changed\n"
                    os.pwrite(maint, record, 0)
                    os.ftruncate(maint, len(record))
        except OSError:
            pass
        finally:
            for fd in (maint, lock):
                if fd is not None:
                    os.close(fd)

    def release_inherited(self) -> None:
        """In a forked child: drop the parent's environment so this process can open the file.

        py-lmdb refuses a second environment on the same file while the inherited one
        exists, so it must be closed; that is safe only when no transaction was open at
        fork time (aborting an inherited read transaction clears the parent's reader slot
        in the shared lock file). The inherited fds share the parent's flocks: only close them.

        Raises:
            ForkError: the process forked while a transaction of this file was open.
        """
        if self.active_readers or self.active_writers:
            raise ForkError("this process was forked while a transaction on the file was open; it cannot "
                            "open the file", hint="fork while no transaction is open, or use the 'spawn' start method")
        self.env.close()
        for name in ("maint_fd", "lock_fd"):
            fd = getattr(self, name)
            setattr(self, name, None)
            if fd is not None:
                os.close(fd)

    def try_exclusive(self) -> bool:
        if self.lock_fd is None:
            return False
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            # A failed shared-to-exclusive upgrade drops the shared lock (flock(2)): take it
            # back, or another process's compact could replace the file under this handle.
            fcntl.flock(self.lock_fd, fcntl.LOCK_SH)
            return False

    def release_exclusive(self) -> None:
        if self.lock_fd is not None:
            fcntl.flock(self.lock_fd, fcntl.LOCK_SH)

    def acquire_writer(self, timeout: float | None) -> None:
        """The writer lock, within ``timeout`` seconds (LMDB's own mutex waits forever).

        Raises:
            BusyError: another thread or process kept writing past the timeout.
        """
        if self.writer_thread == get_ident():
            # Another handle of this file (the handles of one path share this _Env) has a write
            # transaction open in this very thread: waiting for it would wait for ever (or blame
            # "another writer" after the timeout). Writes of the same handle join instead.
            raise ValidationError(f"{self.path}: this thread has a write transaction of the file open through "
                                  "another handle; a second one would wait for it for ever",
                                  hint="write through the handle whose `with db.transaction()` block is open "
                                       "(its writes join the transaction), or after the block")
        if self.deferred and self.thread_reads.get(get_ident()):
            # Its reopen waits for every read of this process to end, this thread's too: it
            # would wait for itself until the timeout (for ever with None). Race-free: while
            # this read is open, no other thread's reopen can complete either.
            raise BusyError(f"{self.path}: this thread has a read of the file open, and the first write of this "
                            "process must reopen the file read-write once no read of it is open (it was opened "
                            "while another process was writing); this write would wait for its own read",
                            hint="write after the read's block has ended, or begin the write first (reads inside "
                                 "a `with db.transaction()` block join it)")
        busy = f"{self.path}: another writer held the file for longer than the timeout ({timeout} s)"
        deadline = _deadline(timeout)
        if not self.write_mutex.acquire(timeout=-1 if deadline is None else max(0.0, deadline - time.monotonic())):
            raise BusyError(busy)
        try:
            if self.maint_fd is not None and self.maint_writable:
                turn = _enter_turnstile(self.maint_fd, deadline, busy)  # see _OFD_SETLK
                try:
                    _flock_until(self.maint_fd, fcntl.LOCK_EX, deadline, busy)
                finally:
                    if turn:
                        _leave_turnstile(self.maint_fd)
        except BaseException:
            self.write_mutex.release()
            raise
        if self.deferred:
            try:
                self._upgrade_to_write(deadline)
            except BaseException:
                if self.maint_fd is not None and self.maint_writable:
                    fcntl.flock(self.maint_fd, fcntl.LOCK_UN)
                self.write_mutex.release()
                raise
        self.writer_thread = get_ident()

    def release_writer(self) -> None:
        self.writer_thread = 0
        try:
            if self.maint_fd is not None and self.maint_writable:
                fcntl.flock(self.maint_fd, fcntl.LOCK_UN)
        finally:
            self.write_mutex.release()

    def unchanged(self) -> bool:
        """Whether the data file is still what this process last saw (see ``expected``)."""
        return self.lock_fd is not None and self.expected is not None and self.expected == _stat_key(self.lock_fd)

    def committed(self, changes: Changes, state: tuple[int, int, int] | None = None) -> None:
        """Tell this process's caches what a commit of this process changed, and the state it
        committed: ``(seq, next_docno, snapshot id)``."""
        # list(WeakSet) runs WeakSet.__iter__, a Python generator: a thread switch inside lets
        # another thread's on_commit (a query creating its handle's node cache) grow the set
        # ("Set changed size during iteration", raised here, after the commit). Copy its set of
        # weak references (``data``, in every CPython; not in typeshed) in C instead (no
        # bytecode runs) and dereference the copy.
        for ref in list(self.listeners.data):  # type: ignore[attr-defined]
            listener = ref()
            if listener is not None:
                listener.purge(changes, state)

    def note_commit(self, unchanged_before: bool) -> None:
        """After a commit of this process: the file as it now is, if it was as expected just
        before; once someone else changed it, this session vouches for it no more."""
        self.expected = _stat_key(self.lock_fd) if unchanged_before and self.lock_fd is not None else None

    def used_map(self, n: int = 1) -> None:
        """Count ``n`` uses of the map; every :data:`RELEASE_CHECK_EVERY`, release its
        resident pages when the process's file pages grew by :data:`RELEASE_MAP_ABOVE` since
        the last release. Called inside a transaction of this process (an active reader or
        the writer), so the map cannot move meanwhile; the resize lock keeps another
        thread's growth (or adoption of another process's) out for the moment it takes."""
        self.map_uses += n
        if self.map_uses < RELEASE_CHECK_EVERY or self.file_base is None:
            return
        self.map_uses = 0
        now = resident_file_bytes()
        if now is None:
            return
        if now - self.file_base < RELEASE_MAP_ABOVE:
            self.file_base = min(self.file_base, now)
            return
        with self.resize_lock:
            release_mapped_pages(self.path)
        self.file_base = resident_file_bytes() or now

    def check_identity(self) -> None:
        """Refuse to commit into a file that is no longer the one at the path.

        Raises:
            StoreError: the data file was replaced or removed while this handle had it open.
        """
        if self.lock_fd is not None and not _same_file(self.lock_fd, self.path):
            raise StoreError(f"{self.path} was replaced or removed while this handle had it open; "
                             "the transaction was rolled back",
                             hint="close this handle and open the file again")
        if self.lock_fd is not None:
            _refuse_hard_links(self.lock_fd, self.path, "; the transaction was rolled back")

    # -- environment -----------------------------------------------------------------
    @staticmethod
    def _open(path: str, *, readonly: bool, create: bool, map_size: int | None, lock: bool = True) -> lmdb.Environment:
        try:
            env = lmdb.open(
                path, subdir=False, readonly=readonly, create=create and not readonly,
                map_size=map_size or INITIAL_MAP_SIZE, max_dbs=MAX_DBS, max_readers=MAX_READERS,
                mode=0o600, sync=True, metasync=True, map_async=False, writemap=False, meminit=True,
                lock=lock, readahead=True, max_spare_txns=0,
            )
            # Free the reader slots of processes that died holding a read transaction (killed):
            # LMDB never does it by itself, and only the first opener resets the table, so
            # while any process keeps the file open they pile up until no reader can begin.
            env.reader_check()
            return env
        except lmdb.InvalidError:
            raise ForeignFileError(f"{path} is not an engramdb file (not an LMDB data file)") from None
        except lmdb.VersionMismatchError:
            raise ForeignFileError(f"{path} was written by an incompatible LMDB version") from None
        except lmdb.Error as exc:
            raise _map_lmdb_error(exc, f"cannot open {path}") from None

    def _check_not_truncated(self) -> None:
        # A page past the end of the file is a hole in the mapping: touching it is SIGBUS. But
        # a file may validly end before its last page number: pages a commit allocated and
        # freed again are never written (check_file_end). The common case, a file that
        # reaches its last page, needs nothing more (the size is read after the meta, and a
        # committed meta's written pages are in the file before the meta is).
        info = self.env.info()
        psize = self.env.stat()["psize"]
        if (info["last_pgno"] + 1) * psize <= os.stat(self.path).st_size:
            return
        # The read transaction pins the snapshot (and every later one): LMDB reuses only pages
        # freed before the oldest reader, so no commit by another process rewrites the free
        # tree pages check_file_end reads while it reads them.
        try:
            txn = self.env.begin()
        except lmdb.Error as exc:
            raise _map_lmdb_error(exc, f"cannot open {self.path}") from None
        try:
            check_file_end(self.path, pinned=txn.id())
        finally:
            txn.abort()

    def _open_dbs(self, *, create: bool, new_file: bool, writer_held: bool = False) -> dict[str, lmdb._Database]:
        try:
            with self.env.begin() as txn:
                present = [txn.get(_DB_NAMES[name]) is not None for name in TABLES]
                empty = txn.stat()["entries"] == 0
            if all(present):
                return self._open_tables(create=False, writer_held=writer_held)
            # Never create our tables inside somebody else's LMDB file: only in a file this open
            # created, one where engramdb created some of its tables and was stopped, or one
            # nobody ever committed to. An empty file with commits held somebody else's tables.
            foreign = not any(present) and (not empty or (not new_file and self.env.info()["last_txnid"] > 0))
            if foreign or not create:
                raise ForeignFileError(f"{self.path} is an LMDB file, but not an engramdb file",
                                       hint="check the path; engramdb adds its tables only to its own files")
            return self._open_tables(create=True, writer_held=writer_held)
        except lmdb.Error as exc:  # the main B-tree is damaged (an unverified open)
            raise _map_lmdb_error(exc, f"cannot open the tables of {self.path}") from None

    def _writer_busy(self) -> bool:
        """Whether another process holds engramdb's writer lock at this moment."""
        if self.maint_fd is None or not self.maint_writable:
            return False
        try:
            fcntl.flock(self.maint_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False
        fcntl.flock(self.maint_fd, fcntl.LOCK_UN)
        return False

    def _has_tables(self) -> bool:
        try:
            with self.env.begin() as txn:
                return all(txn.get(_DB_NAMES[name]) is not None for name in TABLES)
        except lmdb.Error as exc:  # the main B-tree is damaged (an unverified open)
            raise _map_lmdb_error(exc, f"cannot open the tables of {self.path}") from None

    def _upgrade_to_write(self, deadline: float | None) -> None:
        """Make a deferred environment (opened read-only while another process wrote)
        read-write, holding the writer lock: once no read of this process is open, close it
        and open it again read-write, with its tables.

        Raises:
            BusyError: other threads' reads through this file did not end within the timeout.
        """
        with self.resize_lock:  # no read begins meanwhile: Store.read counts itself under it
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self.upgrading = True  # new reads wait (Store.read): only the reads open now are waited for
            try:
                ended = self.resize_lock.wait_for(lambda: self.active_readers == 0, timeout=left)
            finally:
                self.upgrading = False
                self.resize_lock.notify_all()
            if not ended:
                raise BusyError(f"{self.path}: other threads kept reading through this file for longer than the "
                                "timeout, and its first write must reopen it read-write once they are done",
                                hint="retry the write once those reads are done, or open with a longer timeout")
            self.env.close()
            try:
                self.env = self._open(self.path, readonly=False, create=False, map_size=self.map_size)
                self.dbs = self._open_tables(create=False, writer_held=True)
            except BaseException:
                # put the read-only environment back, so that this handle still reads
                self.env = self._open(self.path, readonly=True, create=False, map_size=self.map_size)
                self.dbs = self._open_tables(create=False, writer_held=True)
                raise
            self.deferred = False

    def _open_tables(self, *, create: bool, writer_held: bool) -> dict[str, lmdb._Database]:
        if self.readonly or self.deferred or writer_held:
            return {name: self.env.open_db(_DB_NAMES[name], create=False) for name in TABLES}
        # py-lmdb opens a read-write environment's tables in a write transaction, which waits
        # for LMDB's writer mutex without a timeout: take engramdb's writer lock first.
        self.acquire_writer(self.timeout)
        try:
            return {name: self.env.open_db(_DB_NAMES[name], create=create) for name in TABLES}
        finally:
            self.release_writer()

    def grow(self, *, to_at_least: int = 0) -> None:
        """Double the map (or more), once no read transaction of this process is open.

        Raises:
            BusyError: this thread has a read open (it would wait for itself), or other
                threads' reads did not end within ``_RESIZE_WAITS_FOR_READS`` (remapping
                under them would end them midway).
        """
        with self.resize_lock:
            self._wait_for_reads(0, "grow for this write")
            size = self.env.info()["map_size"]
            new = max(size * 2, to_at_least)
            self.env.set_mapsize(new)

    def adopt_size(self, *, own_readers: int = 0) -> None:
        """Another process grew the map: adopt its size (MapResizedError).

        ``own_readers`` is the caller's own slot in ``active_readers`` (a read transaction
        that failed to begin): waiting for it would stall until the timeout.

        Raises:
            BusyError: other threads' reads did not end within ``_RESIZE_WAITS_FOR_READS``.
        """
        with self.resize_lock:
            self._wait_for_reads(own_readers, "adopt the larger map another process gave it")
            self.env.set_mapsize(0)

    def _wait_for_reads(self, own: int, what: str) -> None:
        """Wait (under ``resize_lock``) until only ``own`` reads of this process are open:
        at once a BusyError when this thread has more open (it would wait for itself)."""
        if self.thread_reads.get(get_ident(), 0) > own:
            raise BusyError(f"{self.path}: the file must {what}, which waits for every read of this process to "
                            "end, and this thread has a read of the file open",
                            hint="write after the read's block has ended, or begin the write first (reads inside "
                                 "a write transaction see its changes)")
        if not self.resize_lock.wait_for(lambda: self.active_readers <= own, timeout=_RESIZE_WAITS_FOR_READS):
            raise BusyError(f"{self.path}: the file must {what}, and other threads' reads of it stayed open for "
                            f"{_RESIZE_WAITS_FOR_READS:g} s (a change of the map would end them midway)",
                            hint="retry once those reads (a long dump, export or iteration) are done")

    def headroom_check(self, reserve: int = 0) -> None:
        """Grow the map before a write transaction when it is nearly full, or would be
        after ``reserve`` more bytes (growing mid-transaction replays every write so far)."""
        info = self.env.info()
        used = (info["last_pgno"] + 1) * self.env.stat()["psize"]
        if used + reserve > GROW_AT * info["map_size"]:
            self.grow(to_at_least=int((used + reserve) / GROW_AT) + 1)


_registry: dict[str, _Env] = {}
_registry_lock = threading.Lock()


def _reset_registry_lock() -> None:
    # A thread of the parent may have held the lock at fork(); the child has only the forking
    # thread, so the lock would never be released there and open() would hang.
    global _registry_lock, _mounts_lock
    _registry_lock = threading.Lock()
    _mounts_lock = threading.Lock()  # the same for the mount table's


os.register_at_fork(after_in_child=_reset_registry_lock)


def _space_exhausted(path: str) -> bool:
    """Whether the file-size limit or the disk is full at ``path``.

    LMDB reports a short ``pwrite`` as EIO ("Input/output error"); a write is cut short
    when the file reaches RLIMIT_FSIZE or the disk fills up, so look at both.
    """
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
        if soft != resource.RLIM_INFINITY and os.stat(path).st_size >= soft:
            return True
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize < 1024 * 1024
    except OSError:
        return False


def _map_lmdb_error(exc: lmdb.Error, what: str, *, path: str | None = None) -> EngramError:
    text = str(exc)
    short_write = "Input/output error" in text and path is not None and _space_exhausted(path)
    if isinstance(exc, lmdb.DiskError) or "File too large" in text or "No space left" in text or short_write \
            or getattr(exc, "errno", None) in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        return StorageFullError(f"{what}: the disk or file-size limit is full ({text})")
    if isinstance(exc, (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.InvalidError)):
        return CorruptFileError(f"{what}: the file structure is damaged ({text})")
    if isinstance(exc, lmdb.ReadonlyError) or getattr(exc, "errno", None) == errno.EROFS \
            or "Read-only file system" in text:
        # the file's permissions or its medium, not the handle: say how to get write access
        return ReadOnlyError(f"{what}: the file or its directory is read-only ({text})",
                             hint="make the file and its directory writable (chmod u+w), or copy the file "
                                  "somewhere writable; commands that only read it still work")
    if isinstance(exc, lmdb.ReadersFullError):
        return BusyError(f"{what}: every reader slot of the file is in use ({text})",
                         hint="too many processes or threads are reading the file at once; close some, "
                              "or retry when their reads are done")
    if isinstance(exc, lmdb.BadValsizeError):
        return StoreError(f"{what}: a key or value is too large for the store ({text})",
                          hint="keys are at most 511 bytes; this is a bug in engramdb, please report it")
    return StoreError(f"{what}: {text}")


def _os_error(exc: OSError, what: str) -> EngramError:
    if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        return StorageFullError(f"{what}: the disk or file-size limit is full")
    return StoreError(f"{what}: {exc.strerror or exc}")


def _create_error(exc: OSError, path: str) -> EngramError:
    """The error for a new store's data file that cannot be created."""
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ReadOnlyError(f"cannot create {path}: {exc.strerror}",
                             hint="create the store in a directory you may write to, on a disk not mounted "
                                  "read-only")
    return _os_error(exc, f"cannot create {path}")


def sniff(path: str) -> None:
    """Refuse foreign and truncated files before LMDB maps them (a mapped hole is a SIGBUS).

    Raises:
        ForeignFileError: a Terronex .engram file, an SQLite file, too short to be LMDB, or
            not a regular file (a directory, a device, a pipe).
        CorruptFileError: an empty file, or one cut inside its second meta page.
    """
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # opening a FIFO to read it would wait for a writer
            raise ForeignFileError(f"{path} is not a regular file (a directory, device or pipe), so not an "
                                   "engramdb file", hint="check the path")
        with open(path, "rb") as fh:
            head = fh.read(4096)
            size = os.fstat(fh.fileno()).st_size
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc.strerror}") from None
    for magic, what, hint in _SNIFF:
        if head.startswith(magic):
            raise ForeignFileError(f"{path} is {what}, not an engramdb file", hint=hint)
    if not head:
        raise CorruptFileError(f"{path} is empty (0 bytes): it was truncated or is not an engramdb file",
                               hint="restore it from a dump or backup; an empty file that never held data can be "
                                    "deleted and created again with `engramdb init FILE`")
    if len(head) < 4096:
        raise ForeignFileError(f"{path} is too short to be an engramdb file ({len(head)} bytes)")
    if not is_lmdb_head(head):
        raise ForeignFileError(f"{path} is not an engramdb file (not an LMDB data file)")
    psize = struct.unpack_from("<I", head, _META_PSIZE)[0]
    if psize in _PAGE_SIZES and size < 2 * psize:  # LMDB would call it "not an LMDB file"
        raise CorruptFileError(f"{path} is truncated: its second meta page is missing ({size} bytes)",
                               hint="restore the file from a dump or backup")


_META_MAGIC = 0xBEEFC0DE


def is_lmdb_head(head: bytes) -> bool:
    """Whether ``head``, the first bytes of a file (20 or more), are an LMDB data file's
    first meta page: an engramdb store (or another LMDB file), never a dump or a source."""
    return len(head) >= 20 and struct.unpack_from("<I", head, 16)[0] == _META_MAGIC
# Offsets in an LMDB 0.9 meta page: a 16-byte page header, then MDB_meta (magic, version,
# address, mapsize, two 48-byte MDB_db records whose first holds the page size, last_pg, txnid).
_META_PSIZE, _META_TXNID = 40, 144


# LMDB 0.9 page and node layout, for scrub_unused_bytes.
_PAGE_HEADER = 16  # pgno (8), pad (2), flags (2), lower/upper (2+2) or overflow page count (4)
_P_BRANCH, _P_LEAF, _P_OVERFLOW, _P_LEAF2 = 0x01, 0x02, 0x04, 0x20
_F_BIGDATA = 0x01  # a leaf node whose value lives in overflow pages
_META_LAST_PG = 136


def scrub_unused_bytes(fd: int) -> int:
    """Zero every byte of a compacting copy that no record uses; the number zeroed.

    LMDB reuses the buffers of freed pages without clearing them, so the unused tail of an
    overflow page (a large value's last page) and the gap between a page's pointers and its
    nodes can hold bytes of a deleted record, and the compacting copy keeps those pages as they
    are. Zeroing them is what makes a deleted memory's ciphertext (or plaintext, in an
    unencrypted file) leave the file at ``compact()``. Only for a closed file nobody maps.
    """
    size = os.fstat(fd).st_size
    if size < 2 * 4096:
        return 0
    zeroed = 0
    with mmap.mmap(fd, size) as mm:
        psize = struct.unpack_from("<I", mm, _META_PSIZE)[0]
        if psize not in (4096, 8192, 16384, 32768, 65536):
            return 0
        metas = [struct.unpack_from("<QQ", mm, n * psize + _META_LAST_PG) for n in (0, 1)]
        last_pg = max(metas, key=lambda meta: meta[1])[0]  # the meta page with the larger txnid
        pages = min(size // psize, last_pg + 1)
        pgno = 2
        while pgno < pages:
            base = pgno * psize
            flags, lower, upper = struct.unpack_from("<HHH", mm, base + 10)
            if flags & _P_OVERFLOW:  # reached through its leaf node below
                pgno += max(lower | upper << 16, 1)
                continue
            pgno += 1
            if not flags & (_P_BRANCH | _P_LEAF) or flags & _P_LEAF2 or not _PAGE_HEADER <= lower <= upper <= psize:
                continue
            mm[base + lower:base + upper] = bytes(upper - lower)
            zeroed += upper - lower
            if not flags & _P_LEAF:
                continue
            for ptr in range(base + _PAGE_HEADER, base + lower, 2):
                node = base + struct.unpack_from("<H", mm, ptr)[0]
                lo, hi, node_flags, key_size = struct.unpack_from("<HHHH", mm, node)
                if not node_flags & _F_BIGDATA:
                    continue
                value_size = lo | hi << 16
                first = struct.unpack_from("<Q", mm, node + 8 + key_size)[0]
                start = first * psize + _PAGE_HEADER + value_size
                need = -(-(_PAGE_HEADER + value_size) // psize)
                # a run can be longer than its value needs: LMDB overwrites a value in place,
                # keeping the run, when it was written earlier in the same transaction, and the
                # run's tail then holds the bytes of that earlier version
                run = struct.unpack_from("<I", mm, first * psize + 12)[0] if first < pages else 0
                end = first * psize + (run if need <= run <= pages - first else need) * psize
                if first < pages and end <= size:
                    mm[start:end] = bytes(end - start)
                    zeroed += end - start
        mm.flush()
    return zeroed


# More of LMDB 0.9's layout (64-bit build), for check_file_end: MDB_meta's mm_dbs[FREE_DBI]
# starts at _META_PSIZE (its md_pad is the page size); an MDB_db record holds md_pad (4),
# md_flags (2), md_depth (2), four page/entry counts (8 each), md_root (8).
_META_FREE_ROOT = _META_PSIZE + 40
_P_INVALID = (1 << 64) - 1  # the root of an empty tree
_NODE_HEADER = 8  # mn_lo, mn_hi (the value's size; a branch node: the child's page number
# with mn_flags as its high 16 bits), mn_flags, mn_ksize; then the key, then the value
_MAX_DEPTH = 32  # CURSOR_STACK: no LMDB tree is deeper
_PAGE_SIZES = (4096, 8192, 16384, 32768, 65536)


class _Truncated(Exception):
    pass


class _Damaged(Exception):
    pass


_P_META = 0x08
_MDB_DATA_VERSION = 1  # mm_version of LMDB 0.9 (mdb_env_read_header refuses any other)
_META_LEN = _META_TXNID + 8  # the page header and MDB_meta up to mm_txnid
_META_READS = 5  # a commit rewrites one meta page: five tries outlast a few commits in a row


class _BadMeta(_Damaged):
    pass


def _meta_bytes(fd: int) -> bytes:
    """The first _META_LEN bytes of meta page 0, then of meta page 1 (at the page size page 0
    gives), read with pread, never through the map; shorter when they are not in the file."""
    first = os.pread(fd, _META_LEN, 0)
    psize = struct.unpack_from("<I", first, _META_PSIZE)[0] if len(first) == _META_LEN else 0
    return first + os.pread(fd, _META_LEN, psize) if psize in _PAGE_SIZES else first


def _parse_metas(data: bytes) -> tuple[int, int, int, int]:
    if len(data) < _META_LEN:
        raise _BadMeta("meta page 0 is not an LMDB meta page")
    psize = struct.unpack_from("<I", data, _META_PSIZE)[0]
    if psize not in _PAGE_SIZES:
        raise _BadMeta(f"meta page 0 gives the page size {psize}")
    if len(data) < 2 * _META_LEN:
        raise _Truncated("meta page 1 is missing")
    pages = (data[:_META_LEN], data[_META_LEN:])
    for n, page in enumerate(pages):  # what mdb_env_read_header checks of both
        magic, version = struct.unpack_from("<II", page, 16)
        if magic != _META_MAGIC or not struct.unpack_from("<H", page, 10)[0] & _P_META:
            raise _BadMeta(f"meta page {n} is not an LMDB meta page")
        if version != _MDB_DATA_VERSION:
            raise _BadMeta(f"meta page {n} has the LMDB data version {version}")
    metas = [(struct.unpack_from("<Q", page, _META_TXNID)[0], page) for page in pages]
    txnid, page = metas[metas[0][0] < metas[1][0]]  # mdb_env_pick_meta
    return psize, txnid, struct.unpack_from("<Q", page, _META_LAST_PG)[0], \
        struct.unpack_from("<Q", page, _META_FREE_ROOT)[0]


def _committed_meta(fd: int, pinned: int) -> tuple[int, int, int, int]:
    """(page size, txnid, last page number, free tree root) of the meta page LMDB picks
    (the larger txnid), no older than the read transaction ``pinned``.

    Another process's commit rewrites the older meta page while this reads it (one pwrite,
    or field by field with MDB_WRITEMAP): a read can be half old, half new (an old free
    root under a new txnid). Two reads in a row that agree were not torn by one write; a
    txnid older than the pinned snapshot's cannot be the committed meta, and only a meta
    at least as new as the pin has a free tree no commit may reuse while the pin holds.
    """
    for _ in range(_META_READS):
        data = _meta_bytes(fd)
        if data != _meta_bytes(fd):  # a write in between: read again
            continue
        meta = _parse_metas(data)
        if meta[1] >= pinned:
            return meta
    raise BusyError("cannot check the end of the file: its meta pages kept changing while they were read",
                    hint="another process is committing to the file; open it again")


def _free_pages_past(fd: int, psize: int, last_pg: int, root: int, have: int) -> set[int]:
    """The page numbers >= ``have`` listed in the free tree (LMDB's FREE_DBI: key a txnid,
    value an IDL, a count then that many 8-byte page numbers, in overflow pages when large).

    Raises:
        _Truncated: a page of the free tree itself is not in the file (its first ``have`` pages).
        _Damaged: the free tree is not a sound LMDB 0.9 B-tree of IDLs.
    """
    free: set[int] = set()
    if root == _P_INVALID:
        return free
    seen: set[int] = set()

    def read(pgno: int, npages: int, what: str) -> bytes:
        if not 2 <= pgno <= last_pg - npages + 1 or pgno in seen:
            raise _Damaged(f"{what} points to page {pgno}")
        if pgno + npages > have:
            raise _Truncated(f"page {pgno + npages - 1} of the free-page list is missing")
        seen.add(pgno)
        data = os.pread(fd, npages * psize, pgno * psize)
        if len(data) < npages * psize:
            raise _Truncated(f"page {pgno} of the free-page list is missing")
        if struct.unpack_from("<Q", data, 0)[0] != pgno:
            raise _Damaged(f"page {pgno} of the free-page list stores another page number")
        return data

    stack = [(root, 1, "the meta page")]
    while stack:
        pgno, depth, parent = stack.pop()
        if depth > _MAX_DEPTH:
            raise _Damaged("the free-page list is deeper than any LMDB tree")
        page = read(pgno, 1, parent)
        flags, lower, upper = struct.unpack_from("<HHH", page, 10)
        kind = flags & (_P_BRANCH | _P_LEAF | _P_OVERFLOW | _P_LEAF2)
        if kind not in (_P_BRANCH, _P_LEAF) or not _PAGE_HEADER <= lower <= upper <= psize or lower % 2:
            raise _Damaged(f"page {pgno} of the free-page list has a bad header")
        for ptr in range(_PAGE_HEADER, lower, 2):
            node = struct.unpack_from("<H", page, ptr)[0]
            if not upper <= node <= psize - _NODE_HEADER:
                raise _Damaged(f"page {pgno} of the free-page list has a node outside it")
            lo, hi, node_flags, key_size = struct.unpack_from("<HHHH", page, node)
            if kind == _P_BRANCH:
                stack.append((lo | hi << 16 | node_flags << 32, depth + 1, f"branch page {pgno}"))
                continue
            size = lo | hi << 16
            start = node + _NODE_HEADER + key_size
            if key_size != 8 or size < 8 or size % 8 or node_flags & ~_F_BIGDATA:
                raise _Damaged(f"page {pgno} of the free-page list has a malformed record")
            if node_flags & _F_BIGDATA:
                if start + 8 > psize:
                    raise _Damaged(f"page {pgno} of the free-page list has a node outside it")
                # The largest record LMDB writes (mdb_freelist_save): an IDL of distinct pages
                # in [2, last_pg], or a record reserved for part of me_pghead (at most
                # last_pg - 1 pages) plus a page's worth of room (psize / 8 - 3 entries), plus
                # the count. A larger size (up to 4 GiB) is damage: reading it would allocate it.
                if size > (last_pg + 1) * 8 + psize:
                    raise _Damaged(f"a record of the free-page list on page {pgno} is {size} bytes long")
                first = struct.unpack_from("<Q", page, start)[0]
                pages = -(-(_PAGE_HEADER + size) // psize)
                data = read(first, pages, f"leaf page {pgno}")
                if not struct.unpack_from("<H", data, 10)[0] & _P_OVERFLOW \
                        or struct.unpack_from("<I", data, 12)[0] < pages:
                    raise _Damaged(f"overflow page {first} of the free-page list has a bad header")
                value = memoryview(data)[_PAGE_HEADER:_PAGE_HEADER + size]
            else:
                if start + size > psize:
                    raise _Damaged(f"page {pgno} of the free-page list has a record outside it")
                value = memoryview(page)[start:start + size]
            # MDB_IDs: a count, then the page numbers (little-endian, as all of the file is read)
            count = struct.unpack_from("<Q", value)[0]
            if count >= len(value) // 8:
                raise _Damaged(f"a record of the free-page list on page {pgno} claims {count} pages")
            if count > 64:  # numpy's per-call cost pays only on a long list (most are short)
                ids = np.frombuffer(value, "<u8", count, 8)
                low, high, past = int(ids.min()), int(ids.max()), ids[ids >= have].tolist()
            else:
                listed = struct.unpack_from(f"<{count}Q", value, 8)
                low, high, past = min(listed, default=2), max(listed, default=2), [p for p in listed if p >= have]
            if not 2 <= low <= high <= last_pg:
                raise _Damaged(f"a record of the free-page list on page {pgno} lists a page out of range")
            free.update(past)
    return free


def check_file_end(path: str, *, pinned: int = 0) -> None:
    """Refuse a file that ends before a page in use; accept one whose missing last pages are
    all free.

    LMDB does not keep the file as long as its last page number (``mm_last_pg``): pages a
    write transaction allocates and frees again before it commits (the overflow pages of a
    value stored and deleted in one transaction, a page split then merged away) advance the
    last page number, go to the free list (FREE_DBI) at the commit, and are never written
    (``mdb_ovpage_free`` hands dirty pages back to ``me_pghead``, loose pages are skipped by
    ``mdb_page_flush``; ``mdb_freelist_save`` saves both). LMDB never reads a free page, and
    reuses one by writing it, so such a file is sound. What must be in the file is every
    page in use, and the free list says which are not: this walks it with pread (a page
    past the end of the file read through the map is a SIGBUS) and checks that every page
    from the end of the file to the last page is listed free, and that the free tree's own
    pages are in the file. The walk reads only the free tree (a few pages).

    The file is left as it is, not extended with zero pages to its last page: a read-only
    opener must accept it anyway, the next commit that reuses those pages writes them, and
    extending it would need the writer lock (another process's commit may be writing pages
    past the current end: an ``ftruncate`` from a stale size would cut them off) and would
    change the file's size and ctime, the clean-close fingerprint.

    ``pinned`` is the id of a read transaction the caller holds on the file (0: the file is
    closed): a commit by another process reuses only pages freed before the oldest reader's
    snapshot, so the free tree of a meta at least as new as the pin stays as it is while
    this reads it. Without a pin, a walk the meta changed under is read again.

    Raises:
        CorruptFileError: a page in use is missing (the file was truncated), or the free
            list or a meta page is damaged.
        BusyError: other processes' commits kept changing the file while it was read.
    """
    hint = "restore the file from a dump or backup"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise _os_error(exc, f"cannot read {path}") from None
    try:
        for _ in range(3):  # a commit by another process between the reads: read again
            psize, txnid, last_pg, root = _committed_meta(fd, pinned)
            size = os.fstat(fd).st_size  # after the meta: a committed meta's pages are written first
            have = size // psize  # a partial last page counts as missing
            if last_pg < have:
                return
            try:
                free = _free_pages_past(fd, psize, last_pg, root, have)
            except (_Truncated, _Damaged):
                if pinned or _committed_meta(fd, pinned)[1] == txnid:
                    raise
                continue  # unpinned: a later commit may have reused the pages read
            if _committed_meta(fd, pinned)[1] == txnid:
                break
        else:
            if not pinned:  # the last walk's pages may have been reused under it
                raise BusyError(f"cannot check the end of {path}: other processes kept committing while it "
                                "was read", hint="open it again")
        missing = last_pg + 1 - have
        if len(free) == missing:
            return
        # a missing page not listed free: among the first len(free) + 1 missing pages
        used = next(p for p in range(have, have + len(free) + 1) if p not in free)
        raise CorruptFileError(f"{path} is truncated: its last pages are missing (the file ends at page "
                               f"{have}, {missing} page(s) before its last page {last_pg}, and page {used} "
                               "is in use)", hint=hint)
    except _BadMeta as exc:
        raise CorruptFileError(f"{path} is damaged: {exc}", hint=hint) from None
    except _Truncated as exc:
        raise CorruptFileError(f"{path} is truncated: its last pages are missing ({exc})", hint=hint) from None
    except _Damaged as exc:
        raise CorruptFileError(f"{path}: the file's free-page list is damaged ({exc})",
                               hint=hint) from None
    except OSError as exc:
        raise _os_error(exc, f"cannot read {path}") from None
    finally:
        os.close(fd)


def meta_problem(path: str) -> str | None:
    """Check LMDB's two meta pages against each other (they carry no checksum).

    Each commit writes the meta page of its txnid's parity, and LMDB trusts the page with
    the larger txnid. So in a sound file page 0 holds an even txnid, page 1 an odd one,
    and they differ by one. A damaged txnid breaks this and would silently select an
    older root. Only meaningful while nobody commits (the caller holds the maintenance
    lock exclusively). Returns a description of the problem, or None.
    """
    try:
        with open(path, "rb") as fh:
            first = fh.read(4096)
            if len(first) < 4096 or struct.unpack_from("<I", first, 16)[0] != _META_MAGIC:
                return None  # not LMDB, or too short: sniff and LMDB report it
            psize = struct.unpack_from("<I", first, _META_PSIZE)[0]
            if psize not in (4096, 8192, 16384, 32768, 65536):
                return f"meta page 0 is damaged (page size {psize})"
            fh.seek(psize)
            second = fh.read(_META_TXNID + 8)
    except FileNotFoundError:
        return None  # a new file
    except OSError as exc:
        return f"cannot read the meta pages: {exc.strerror}"
    if len(second) < _META_TXNID + 8:
        return None
    txnids = [struct.unpack_from("<Q", page, _META_TXNID)[0] for page in (first, second)]
    if max(txnids) <= 1:
        return None  # a new file, or a compacting copy
    if txnids[0] % 2 or not txnids[1] % 2 or abs(txnids[0] - txnids[1]) != 1:
        return f"the meta pages are damaged (commit ids {txnids[0]} and {txnids[1]})"
    return None


def structural_problems(path: str) -> list[str]:
    """LMDB's offline structural check (lmdb.verify): the problems found, empty when sound.

    It reads the file with plain I/O, never through a mapping, so a damaged file cannot crash it.
    """
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            return list(_verifier_class()(fh, size).verify())
    except Exception as exc:  # VerifyError and anything the offline walker trips on
        return [f"cannot walk the file: {exc}"]


def _verifier_class() -> Any:
    """lmdb.verify's walker, accepting an overflow run longer than its value needs.

    LMDB overwrites a large value in place when its overflow pages were written earlier in
    the same transaction and the new value fits (mdb_cursor_put: "we don't bother to try
    shrinking"); the run keeps its page count in its first page's header, and LMDB frees it
    by that count (mdb_ovpage_free). lmdb.verify (py-lmdb 3.0) wants the exact count, so a
    record rewritten smaller in one transaction (an update made twice, or the archive groups
    a forget or compact rewrites) made a sound file fail the check, and open refused it.
    """
    from lmdb import verify as lmdb_verify

    base: Any = lmdb_verify._Verifier  # the verifier is untyped: the library boundary
    u64 = lmdb_verify._U64

    class Verifier(base):  # type: ignore[misc]
        def _bigdata(self, ctx: dict[str, Any], pgno: int, i: int, buf: Any, doff: int, dsize: int,
                     want_bytes: bool) -> Any:
            seen = len(self.errors)
            out = base._bigdata(self, ctx, pgno, i, buf, doff, dsize, want_bytes)
            if self.eng["has_txnid"] or len(self.errors) == seen or doff + 8 > self.psize:
                return out
            op_pgno = u64.unpack_from(buf, doff)[0]
            need = (self.hdrsz - 1 + dsize) // self.psize + 1
            first = self.read_page(op_pgno) if op_pgno < self.next_pgno else None
            if first is None:
                return out
            run = self._pg_pages(first, 0)
            longer = f"{ctx['name']} DB: overflow page {op_pgno} header mp_pages {run} != OVPAGES({dsize})={need}"
            if run > need and op_pgno + run <= self.next_pgno and longer in self.errors[seen:]:
                self.errors.remove(longer)
                for k in range(need, run):  # the run's tail is the value's too: LMDB frees it with the run
                    self._mark_live(op_pgno + k, f"{ctx['name']} DB overflow")
                ctx["overflow"] += run - need
            return out

    return Verifier


def page_owners(path: str) -> dict[int, str]:
    """The pages in use in a closed or quiescent file, each with its owner: a table name
    (``postings``, ...), ``free-list`` or ``tables`` (LMDB's catalogue). A diagnostic for
    tests and benchmarks: a page written by a commit is a page number not in use before it
    (LMDB copies a page on write), so comparing two calls counts the pages a commit wrote,
    per table. Walks the whole file (LMDB's offline verifier).

    Raises:
        CorruptFileError: the file does not pass the structural check.
    """

    names = {b"t%d" % i: name for i, name in enumerate(TABLES)}
    owners: dict[int, str] = {}

    def owner(what: str) -> str:
        tree = what.split(" ", 1)[0]  # "main/t3 DB", "main/t3 DB overflow", "freeDB DB", "main DB"
        if tree.startswith("main/"):
            return names.get(tree[5:].encode(), tree[5:])
        return "free-list" if tree == "freeDB" else "tables"

    base: Any = _verifier_class()

    class _Walker(base):  # type: ignore[misc]
        def _mark_live(self, pgno: int, what: str) -> bool:
            ok = bool(base._mark_live(self, pgno, what))
            if ok:
                owners[pgno] = owner(what)
            return ok

    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        problems: list[str] = _Walker(fh, size).verify()
    if problems:
        raise CorruptFileError(f"{path} failed the structural check: {'; '.join(problems[:3])}", hint=_STRUCTURE_HINT)
    return owners


# verify reports this too: its hint must not send the user back to verify, and a salvage dump
# (`dump --skip-damaged`) reads through the same B-trees, so it cannot help either.
_STRUCTURE_HINT = ("the file's page structure is damaged, so it cannot be opened, verified or dumped: restore "
                   "from a backup or an earlier dump (`engramdb restore DUMP NEW.engram`), and keep this file aside")


def pages_written(before: dict[int, str], after: dict[int, str]) -> dict[str, int]:
    """Per owner, the pages of ``after`` that were not in use in ``before`` (two
    :func:`page_owners` of one file around a commit): the pages the commit wrote."""
    out: dict[str, int] = {}
    for pgno, name in after.items():
        if pgno not in before:
            out[name] = out.get(name, 0) + 1
    return out


def structural_verify(path: str) -> None:
    """LMDB's offline structural check (lmdb.verify), run before the file is mapped.

    Raises:
        CorruptFileError: the B-tree or meta pages are damaged.
    """
    problems = structural_problems(path)
    if problems:
        raise CorruptFileError(f"{path} failed the structural check: {'; '.join(problems[:3])}", hint=_STRUCTURE_HINT)


def _table_chunks(ltxn: lmdb.Transaction[bytes], db: lmdb._Database) -> Iterator[list[tuple[bytes, bytes]]]:
    """Every ``(key, value)`` of ``db`` in key order, in lists of about
    :data:`_REWRITE_CHUNK_BYTES` (the cursor re-seeks for each, so writes to other tables
    in between are safe)."""
    last: bytes | None = None
    while True:
        chunk: list[tuple[bytes, bytes]] = []
        size = 0
        with ltxn.cursor(db=db) as cur:
            more = cur.first() if last is None else cur.set_range(last)
            if more and last is not None and cur.key() == last:
                more = cur.next()
            while more:
                key, value = cur.key(), cur.value()
                chunk.append((key, value))
                size += len(key) + len(value)
                if size >= _REWRITE_CHUNK_BYTES:
                    break
                more = cur.next()
        if not chunk:
            return
        yield chunk
        last = chunk[-1][0]


class Txn:
    """A transaction over the sealed tables.

    Values passed to :meth:`put` are sealed with AAD bound to (table, key); values from
    :meth:`get` are opened and authenticated. Write transactions keep the per-table
    digests and counters in the sealed state record up to date.
    """

    def __init__(self, store: Store, write: bool) -> None:
        self.store = store
        self.write = write
        self._ltxn: lmdb.Transaction[bytes] | None = None
        self._state: State | None = None
        # what a replay after map growth redoes: a put (envelope), a delete (None) or a putmulti batch
        self._log: list[tuple[str, bytes, bytes | None] | tuple[str, None, list[tuple[bytes, bytes]]]] = []
        self._log_bytes = 0  # of the insert batches in _log
        self._unlogged = False  # a bulk write went unlogged (_REPLAY_LOG_LIMIT): no replay possible
        self._begin_seq: int | None = None
        self._begin_next_docno = 0  # the snapshot's next_docno: docnos from here on are new
        self._after_commit: list[Callable[[int], None]] = []
        # LMDB binds a write transaction to its thread (its writer mutex, and engramdb's
        # per-thread joining of nested writes): every use checks this, so a transaction handed
        # to another thread is refused before it touches the file or the counters. 0 for
        # reads: no read snapshot outlives the engramdb call that took it, and a snapshot may
        # move between threads (MDB_NOTLS), so there is nothing to check.
        self._owner = threading.get_ident() if write else 0

    @property
    def _lt(self) -> lmdb.Transaction[bytes]:
        """The LMDB transaction; only between begin and commit/abort, on the owner's thread."""
        if self._ltxn is None:
            raise StoreError("this transaction has ended", hint="use the transaction inside its `with` block")
        if self._owner and self._owner != get_ident():
            self._wrong_thread()
        return self._ltxn

    def _wrong_thread(self) -> NoReturn:
        raise WrongThreadError("a write transaction can only be used in the thread that opened it; "
                               "this call wrote nothing")

    def after_commit(self, fn: Callable[[int], None]) -> None:
        """Have ``fn(snapshot_id)`` called once this write transaction has committed, with
        the :attr:`snapshot_id` read transactions of the committed state report; never called
        when it rolls back. Lets a cache adopt what the transaction wrote (``fn`` must not
        raise: the commit has happened)."""
        if self._owner and self._owner != get_ident():
            self._wrong_thread()
        self._after_commit.append(fn)

    # -- lifecycle (used by Store) -----------------------------------------------------
    def _begin(self) -> None:
        env = self.store._env
        for _ in range(3):
            try:
                self._ltxn = env.env.begin(write=self.write, buffers=False)
                return
            except lmdb.MapResizedError:
                env.adopt_size(own_readers=0 if self.write else 1)  # Store.read counted us already
            except lmdb.ReadersFullError as exc:
                if not env.env.reader_check():  # no slot of a dead process to free: all are in use
                    raise _map_lmdb_error(exc, "cannot begin a transaction") from None
            except lmdb.Error as exc:
                raise _map_lmdb_error(exc, "cannot begin a transaction") from None
        raise StoreError("cannot begin a transaction: the map keeps being resized by another process")

    def _abort(self) -> None:
        if self._ltxn is not None:
            self._ltxn.abort()
            self._ltxn = None

    def _commit(self) -> None:
        while True:
            try:
                if self._state is None and (self._log or self._unlogged):
                    self.state  # every commit that changes the file rewrites the state  # noqa: B018
                changes = None
                if self._state is not None:
                    self._state.seq += 1
                    self._state.txnid = self._lt.id()
                    changes = self._log_changes(self._state.seq)
                    self._put_envelope("meta", STATE_KEY, self._seal("meta", STATE_KEY, self._state.to_bytes()),
                                       digest=False)
                unchanged = False
                changed = bool(self._log) or self._unlogged
                if changed:
                    self.store._env.check_identity()  # never commit into a file replaced under us
                    unchanged = self.store._env.unchanged()
                snapshot = self._lt.id()  # what read transactions of the committed state report
                self._lt.commit()
                self._ltxn = None
                if changed:
                    self.store._env.note_commit(unchanged)
                if changes is not None and self._state is not None:
                    self.store._env.committed(changes, (self._state.seq, self._state.next_docno, snapshot))
                for fn in self._after_commit:
                    fn(snapshot)
                return
            except lmdb.MapFullError:
                if self._state is not None:
                    self._state.seq -= 1
                self._log = [op for op in self._log if not (op[0] == "meta" and op[1] is not None and (
                    op[1] == STATE_KEY or op[1].startswith(CHANGES_PREFIX)))]
                self._regrow_and_replay()
            except lmdb.Error as exc:
                self._abort()
                raise _map_lmdb_error(exc, "commit failed; the transaction was rolled back",
                                      path=self.store.path) from None
            except BaseException:
                self._abort()
                raise

    def _regrow_and_replay(self) -> None:
        """MapFullError aborted the LMDB transaction: grow the map, re-begin, replay our raw writes.

        The writer lock is released for a moment; if another writer committed in between,
        our reads may be stale, so we refuse to replay (the caller re-runs or retries).
        A transaction whose bulk writes outgrew the replay log is not replayed: the map
        grows and :class:`WriteConflictError` asks for a re-run (Store.write does it).
        """
        self._abort()
        self.store._env.grow()
        if self._unlogged:
            raise WriteConflictError("the transaction outgrew the file's map, which has now grown",
                                     hint="run the transaction again")
        self._begin()
        state = self._load_state() if self._begin_seq is not None else None
        if state is not None and state.seq != self._begin_seq:
            raise WriteConflictError("another writer committed while the map was growing")
        for op in self._log:
            db = self.store._env.dbs[op[0]]
            if op[1] is None:  # an insert_many batch: the third item holds its (key, envelope) pairs
                with self._lt.cursor(db=db) as cur:
                    cur.putmulti(op[2])
            elif op[2] is None:
                self._lt.delete(op[1], db=db)
            else:
                self._lt.put(op[1], op[2], db=db)

    # -- state -------------------------------------------------------------------------
    def _load_state(self) -> State:
        raw = self._lt.get(STATE_KEY, db=self.store._env.dbs["meta"])
        if raw is None:
            # Only a new file has no state yet. Without it the counters would restart and the
            # next write would reuse document numbers of stored memories.
            if not self.store.repair and (self.count("meta") > len(HEADER_KEYS)
                                          or any(self.count(t) for t in TABLES if t != "meta")):
                raise CorruptFileError("the store's sealed state record is missing, but the file holds data",
                                       hint="run `engramdb verify --fix FILE` to rebuild it from the records, or "
                                            "restore from a dump or backup")
            return State()
        return State.from_bytes(self.store.sealer.open(b"meta", STATE_KEY, raw))

    def binding_problem(self) -> str | None:
        """Whether the sealed state was written by the commit this snapshot shows.

        Every engramdb commit records its LMDB txnid in the state; a mismatch means the
        file was committed to outside engramdb, or a damaged meta page made LMDB pick
        another (older) root. For verify: raising at open would also lock out repair.
        """
        state = self.state
        committed = self._lt.id() - (1 if self.write else 0)
        # A compacting copy restarts LMDB's txnids at 1; compact() re-binds the state at once.
        if state.txnid and committed != 1 and state.txnid != committed:
            return (f"the sealed state was written by commit {state.txnid}, but the file shows commit "
                    f"{committed}: it was changed outside engramdb, or a meta page is damaged")
        return None

    @property
    def state(self) -> State:
        """The sealed counters (loaded on first use; written back on commit)."""
        if self._owner and self._owner != get_ident():  # allocate_docno changes them without _lt
            self._wrong_thread()
        if self._state is None:
            self._state = self._load_state()
            self._begin_seq = self._state.seq
            self._begin_next_docno = self._state.next_docno
        return self._state

    # -- the change log (spec/file-format.md, "Change log") -------------------------------
    def _touched(self) -> Changes:
        """The docnos, existing before this transaction, whose node record or edges it wrote."""
        if self._unlogged:  # bulk writes past the replay log were not kept: assume anything changed
            return EVERYTHING
        first_new = self._begin_next_docno
        found: dict[str, set[int]] = {"nodes": set(), "edges": set()}
        for table, key, value in self._log:
            out = found.get(table)
            if out is None:
                continue
            if key is not None:
                _docnos_of(table, (key,), first_new, out)
            elif isinstance(value, list):  # an insert_many batch: usually new docnos only
                if table == "nodes" and value and min(map(_first, value)) >= first_new.to_bytes(8, "big"):
                    continue
                _docnos_of(table, [k for k, _ in value], first_new, out)
            if len(out) > CHANGES_MAX:
                return EVERYTHING
        return Changes(frozenset(found["nodes"]), frozenset(found["edges"]))

    def _log_changes(self, seq: int) -> Changes:
        """Write the change-log entry of commit ``seq`` and drop entries older than
        ``CHANGES_KEEP`` commits; returns what the entry says."""
        changes = self._touched()
        key = CHANGES_PREFIX + seq.to_bytes(8, "big")
        self._put_envelope("meta", key, self._seal("meta", key, encode_changes(changes)), digest=False)
        oldest = CHANGES_PREFIX + max(0, seq - CHANGES_KEEP + 1).to_bytes(8, "big")
        stale = []
        for old in self.keys("meta", CHANGES_PREFIX):
            if old >= oldest:
                break
            stale.append(old)
        for old in stale:
            self._put_envelope("meta", old, None, digest=False)
        return changes

    def changes_since(self, seq: int) -> Changes:
        """What the commits after ``seq`` up to this snapshot changed (:data:`EVERYTHING`
        when the change log does not reach back to ``seq``, e.g. a cache more than
        ``CHANGES_KEEP`` commits behind, or commits by a version without the log).

        Raises:
            CorruptFileError: an entry is malformed.
        """
        target = self.state.seq
        nodes: set[int] = set()
        edges: set[int] = set()
        expected = seq + 1
        for key, value in self.items("meta", CHANGES_PREFIX, start=CHANGES_PREFIX + expected.to_bytes(8, "big")):
            number = int.from_bytes(key[len(CHANGES_PREFIX):], "big")
            if number > target:
                break
            if number != expected:
                return EVERYTHING
            expected += 1
            entry = decode_changes(value)
            if entry.nodes is None or entry.edges is None:
                return EVERYTHING
            nodes.update(entry.nodes)
            edges.update(entry.edges)
        if expected != target + 1:
            return EVERYTHING
        return Changes(frozenset(nodes), frozenset(edges))

    def allocate_docno(self) -> int:
        """A new document number; never reused, even after deletes."""
        state = self.state
        docno = state.next_docno
        state.next_docno += 1
        return docno

    def allocate_docnos(self, n: int) -> range:
        """``n`` new document numbers (consecutive), as :meth:`allocate_docno` ``n`` times."""
        state = self.state
        first = state.next_docno
        state.next_docno += n
        return range(first, first + n)

    def release_docnos(self, docnos: range) -> None:
        """Give back the last :meth:`allocate_docnos` (nothing was written under them), so
        a failed write leaves the counters as they were."""
        state = self.state
        if docnos.stop == state.next_docno:
            state.next_docno = docnos.start

    def _seal(self, table: str, key: bytes, value: bytes) -> bytes:
        state = self.state  # the one-record case of _seal_many, without its batch set-up
        if state.sealed >= self.store.epoch_limit:
            state.epoch += 1
            state.sealed = 0
        state.sealed += 1
        return self.store.sealer.seal(table.encode(), key, value, state.epoch)

    def _seal_many(self, table: str, items: list[tuple[bytes, bytes]]) -> list[bytes]:
        """Envelopes of ``items``, counting each seal against the epoch's limit."""
        state = self.state
        limit = self.store.epoch_limit
        seal_many = self.store.sealer.seal_many
        out: list[bytes] = []
        pos = 0
        while pos < len(items):
            if state.sealed >= limit:
                state.epoch += 1
                state.sealed = 0
            take = min(len(items) - pos, limit - state.sealed)
            out += seal_many(table.encode(), items[pos:pos + take], state.epoch)
            state.sealed += take
            pos += take
        return out

    def _put_envelope(self, table: str, key: bytes, envelope: bytes | None, *, digest: bool = True) -> bool:
        if envelope is not None and not digest:  # header and meta values: no digest, no old value
            self._log.append((table, key, envelope))
            while True:
                try:
                    self._lt.put(key, envelope, db=self.store._env.dbs[table])
                    return True
                except lmdb.MapFullError:
                    self._log.pop()
                    self._regrow_and_replay()
                    self._log.append((table, key, envelope))
                except lmdb.BadValsizeError as exc:
                    self._log.pop()
                    raise _map_lmdb_error(exc, "write failed") from None
        if envelope is not None:
            self._put_envelopes(table, [(key, envelope)], digest=digest)
            return True
        return self._delete_envelope(table, key, self._lt.get(key, db=self.store._env.dbs[table]), digest=digest)

    def _delete_envelope(self, table: str, key: bytes, old: bytes | None, *, digest: bool = True) -> bool:
        """Delete (table, key) whose stored envelope is ``old`` (None: absent, nothing to do)."""
        if old is None:
            return False
        db = self.store._env.dbs[table]
        if digest:
            self._digest_update(table, [], [(key, old)])
        self._log.append((table, key, None))
        while True:
            try:
                return self._lt.delete(key, db=db)
            except lmdb.MapFullError:
                self._log.pop()
                self._regrow_and_replay()
                self._log.append((table, key, None))

    def _put_envelopes(self, table: str, pairs: list[tuple[bytes, bytes]], *, digest: bool = True) -> None:
        """Store ``(key, envelope)`` pairs in order, keeping the table's state digest.

        A key that is new (the bulk case) is written by one insert that refuses to
        overwrite; only a key that exists is read back, for its old digest term.
        """
        db = self.store._env.dbs[table]
        log = self._log
        replaced: list[tuple[bytes, bytes]] = []
        done = 0
        try:
            while done < len(pairs):
                ltxn = self._lt  # a new LMDB transaction after a map growth
                put, get = ltxn.put, ltxn.get
                try:
                    for key, envelope in pairs[done:] if done else pairs:
                        log.append((table, key, envelope))
                        if digest and not put(key, envelope, db=db, overwrite=False):
                            old = get(key, db=db)
                            put(key, envelope, db=db)
                            if old is not None:  # it is: the put above found the key taken
                                replaced.append((key, old))
                        elif not digest:
                            put(key, envelope, db=db)
                        done += 1
                except lmdb.MapFullError:
                    log.pop()
                    self._regrow_and_replay()
                except lmdb.BadValsizeError as exc:
                    log.pop()
                    raise _map_lmdb_error(exc, "write failed") from None
        finally:
            if digest:  # exactly the writes that happened
                self._digest_update(table, pairs[:done], replaced)

    def _digest_update(self, table: str, added: list[tuple[bytes, bytes]], removed: list[tuple[bytes, bytes]]) -> None:
        """Add the state-digest terms of ``added`` and remove those of ``removed`` (key, envelope) pairs."""
        if not added and not removed:
            return
        entry = self.state.digests.setdefault(table, [0, 0])
        terms = self.store.sealer.state_terms
        if len(added) == 1 and not removed:  # a single put: skip the batch set-up
            entry[0] += 1
            entry[1] = (entry[1] + self.store.sealer.state_term(table.encode(), *added[0])) % 2**256
            return
        tname = table.encode()
        entry[0] += len(added) - len(removed)
        entry[1] = (entry[1] + (terms(tname, added) if added else 0) - (terms(tname, removed) if removed else 0)) % 2**256

    def _require_write(self) -> None:
        if not self.write:
            raise ReadOnlyError("this is a read transaction", hint="write inside Engram.transaction() or a write call")

    @property
    def snapshot_id(self) -> int:
        """LMDB's id of the committed state this transaction reads (for labelling caches)."""
        return int(self._lt.id())

    # -- the table API -------------------------------------------------------------------
    def get(self, table: str, key: bytes) -> bytes | None:
        """The plaintext stored under (table, key), or None.

        Raises:
            DecryptionError: the stored value does not authenticate.
        """
        env = self.store._env
        raw = self._lt.get(key, db=env.dbs[table])
        env.map_uses += 1
        if env.map_uses >= RELEASE_CHECK_EVERY:
            env.used_map(0)
        if raw is None:
            return None
        return self.store.sealer.open(table.encode(), key, raw)

    def get_present(self, table: str, key: bytes) -> bytes:
        """:meth:`get` of a key that must be there: one this snapshot listed, or one that an
        index or another record points at.

        Raises:
            CorruptFileError: it is missing (the file is damaged).
            DecryptionError: the stored value does not authenticate.
        """
        value = self.get(table, key)
        if value is None:
            raise CorruptFileError(f"a record of table {table} that the file refers to is missing")
        return value

    def put(self, table: str, key: bytes, value: bytes) -> None:
        """Seal ``value`` and store it under (table, key)."""
        self._require_write()
        if table == "meta" and (key in HEADER_KEYS or key == STATE_KEY or key.startswith(CHANGES_PREFIX)):
            raise StoreError(f"meta key {key!r} is reserved", hint="this is a bug in engramdb, please report it")
        self._put_envelope(table, key, self._seal(table, key, value), digest=table != "meta")

    def put_many(self, table: str, items: list[tuple[bytes, bytes]]) -> None:
        """:meth:`put` for many ``(key, plaintext)`` pairs, in order (the bulk-write path)."""
        self._require_write()
        meta = table == "meta"
        if meta and any(key in HEADER_KEYS or key == STATE_KEY for key, _ in items):
            raise StoreError("a reserved meta key in put_many", hint="this is a bug in engramdb, please report it")
        envelopes = self._seal_many(table, items)
        # meta values carry no state digest (the change log writes one per deleted memory)
        self._put_envelopes(table, [(key, env) for (key, _), env in zip(items, envelopes)], digest=not meta)

    def insert_many(self, table: str, items: list[tuple[bytes, bytes]], *, append: bool = False) -> None:
        """Seal and store ``(key, plaintext)`` pairs whose keys are new: absent from the
        table and distinct (a freshly allocated docno or segment number, or ids the caller
        has just checked with :meth:`contains`). One LMDB call writes them all, and no old
        value needs reading for the state digest.

        ``append``: the keys are ascending and sort after every key of the table (LMDB's
        append mode: it fills each page before it starts the next and never touches an
        older page).

        Raises:
            CorruptFileError: a key exists after all (the file's counters are behind its
                records); the transaction must be abandoned.
        """
        taken = self._insert(table, items, append=append, undo=False)
        if taken:
            raise CorruptFileError(f"{len(taken)} new records of table {table} collide with existing keys",
                                   hint="run `engramdb verify FILE`; restore from a dump or backup if it fails")

    def insert_new(self, table: str, items: list[tuple[bytes, bytes]]) -> list[bytes]:
        """:meth:`insert_many` of distinct keys that may be stored already: the check and
        the insert in one pass over the B-tree (for ids, instead of a lookup of every key
        before the insert). Returns keys found stored (those of the first chunk of
        :data:`_INSERT_CHUNK` that has any; empty: every key was new and is written); when
        there are any, nothing of ``items`` stays written (the table and its state digest are
        as before the call)."""
        return self._insert(table, items, append=False, undo=True)

    def _insert(self, table: str, items: list[tuple[bytes, bytes]], *, append: bool, undo: bool) -> list[bytes]:
        """Insert ``items`` a chunk at a time, never overwriting; on keys found stored, stop,
        undo this call's inserts (with ``undo``) and return those keys."""
        self._require_write()
        if table == "meta":
            raise StoreError("insert_many does not write meta", hint="this is a bug in engramdb, please report it")
        db = self.store._env.dbs[table]
        done: list[tuple[bytes, bytes]] = []  # what this call inserted, for an undo
        # In chunks, so each envelope is still in the CPU caches when it is hashed for the digest.
        for start in range(0, len(items), _INSERT_CHUNK):
            chunk = items[start:start + _INSERT_CHUNK]
            pairs = list(zip([key for key, _ in chunk], self._seal_many(table, chunk)))
            while True:
                try:
                    with self._lt.cursor(db=db) as cur:
                        _, added = cur.putmulti(pairs, overwrite=False, append=append)
                    break
                except lmdb.MapFullError:
                    self._regrow_and_replay()
                except lmdb.BadValsizeError as exc:
                    raise _map_lmdb_error(exc, "write failed") from None
            taken: list[bytes] = []
            if added != len(pairs):  # the envelope under a key is ours exactly when we wrote it (fresh nonce)
                get = self._lt.get
                ours = [(key, env) for key, env in pairs if get(key, db=db) == env]
                mine = {key for key, _ in ours}
                taken = [key for key, _ in pairs if key not in mine]
                pairs = ours
            self._log_batch(table, pairs)
            self._digest_update(table, pairs, [])
            self.store._env.used_map(len(pairs))
            if undo:
                done += pairs
            if taken:
                for key, env in done:
                    self._delete_envelope(table, key, env)
                return taken
        return []

    def rekey(self, table: str, new_key: Callable[[bytes], bytes]) -> int:
        """Move every entry of ``table`` from ``key`` to ``new_key(key)`` (a layout change);
        returns how many moved. Each value is opened and sealed again, since its envelope is
        bound to its key, and the table ends up written in the new key order (LMDB's append
        mode: the fewest pages); the state digest is updated for both. Streams in bounded
        chunks through a scratch table (:meth:`_rewrite_table`): memory holds one chunk, not
        the table.

        Raises:
            DecryptionError: a stored value does not authenticate (the transaction must be
                abandoned).
            CorruptFileError: two keys map to the same new key.
        """
        self._require_write()
        if table == "meta":
            raise StoreError("rekey does not move meta", hint="this is a bug in engramdb, please report it")
        tname, open_ = table.encode(), self.store.sealer.open

        def moved(chunk: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
            items = [(new_key(key), open_(tname, key, raw)) for key, raw in chunk]
            pairs = list(zip([key for key, _ in items], self._seal_many(table, items)))
            self._digest_update(table, pairs, chunk)
            return pairs

        return self._rewrite_table(table, moved)

    def _rewrite_table(self, table: str, moved: Callable[[list[tuple[bytes, bytes]]], list[tuple[bytes, bytes]]] | None
                       ) -> int:
        """Rewrite every entry of ``table`` in key order into fresh, full pages, each
        ``(key, envelope)`` chunk passed through ``moved`` first when given (new keys and
        envelopes); returns the number of entries.

        The entries are copied chunk by chunk (at most :data:`_REWRITE_CHUNK_BYTES`) into a
        scratch table that exists only inside this transaction (LMDB keeps it sorted by the
        new keys), the table is emptied, then the scratch table is copied back in key order
        with LMDB's append mode and dropped: memory holds one chunk, never the table. The
        writes are not kept for a replay: if the map must grow meanwhile, the transaction
        is re-run (:class:`WriteConflictError`, which :meth:`Store.write` handles).

        Raises:
            CorruptFileError: two entries map to one key.
        """
        db = self.store._env.dbs[table]
        self._unlogged = True  # too large to replay: a map growth re-runs the transaction
        self._log = [op for op in self._log if op[1] is not None]
        try:
            scratch = self.store._env.env.open_db(_SCRATCH_TABLE, txn=self._lt, create=True)
            self._lt.drop(scratch, delete=False)  # (never left behind: dropped below, in this transaction)
            count = 0
            for chunk in _table_chunks(self._lt, db):
                pairs = moved(chunk) if moved is not None else chunk
                with self._lt.cursor(db=scratch) as cur:
                    _, added = cur.putmulti(pairs, overwrite=False, append=moved is None)
                if added != len(pairs):
                    raise CorruptFileError(f"two records of table {table} map to one key",
                                           hint="this is a bug in engramdb, please report it")
                count += added
                self.store._env.used_map(len(chunk))  # the map's pages read: released as they pile up
            self._lt.drop(db, delete=False)
            for chunk in _table_chunks(self._lt, scratch):
                with self._lt.cursor(db=db) as cur:
                    cur.putmulti(chunk, append=True)
                self.store._env.used_map(len(chunk))
            self._lt.drop(scratch, delete=True)
        except lmdb.MapFullError:
            self._regrow_and_replay()  # raises WriteConflictError: the caller runs it again
            raise StoreError("the map could not grow for a table rewrite",
                             hint="this is a bug in engramdb, please report it") from None
        return count

    def _log_batch(self, table: str, pairs: list[tuple[bytes, bytes]]) -> None:
        """Keep an insert batch for a replay after map growth, up to :data:`_REPLAY_LOG_LIMIT`
        bytes of them; past it, drop the batches (a growth then re-runs the transaction)."""
        if self._unlogged:
            return
        self._log_bytes += sum(map(len, itertools.chain.from_iterable(pairs)))
        if self._log_bytes > _REPLAY_LOG_LIMIT:
            self._unlogged = True
            self._log = [op for op in self._log if op[1] is not None]
            return
        self._log.append((table, None, pairs))

    def contains(self, table: str, key: bytes) -> bool:
        """Whether (table, key) exists (no decryption)."""
        env = self.store._env
        env.map_uses += 1
        if env.map_uses >= RELEASE_CHECK_EVERY:
            env.used_map(0)
        return self._lt.get(key, db=env.dbs[table]) is not None

    def stored_keys(self, table: str, keys: Iterable[bytes]) -> set[bytes]:
        """Those of ``keys`` that exist in ``table`` (no decryption), looked up in key order
        (keys that share a B-tree page read it once), a batch per LMDB call."""
        env = self.store._env
        ordered = sorted(keys)
        found: set[bytes] = set()
        with self._lt.cursor(db=env.dbs[table]) as cur:
            for start in range(0, len(ordered), _INSERT_CHUNK):
                batch = ordered[start:start + _INSERT_CHUNK]
                found.update(key for key, _ in cur.getmulti(batch))
                env.used_map(len(batch))
        return found

    def delete(self, table: str, key: bytes) -> bool:
        """Remove (table, key); True when it existed."""
        self._require_write()
        return self._put_envelope(table, key, None, digest=table != "meta")

    def pop_many(self, table: str, keys: list[bytes]) -> list[bytes | None]:
        """:meth:`pop` for many keys: their plaintexts (None where absent), in order.

        Raises:
            DecryptionError: a stored value does not authenticate (nothing is removed).
        """
        self._require_write()
        db = self.store._env.dbs[table]
        get, open_, tname = self._lt.get, self.store.sealer.open, table.encode()
        raws = [get(key, db=db) for key in keys]
        plaintexts = [None if raw is None else open_(tname, key, raw) for key, raw in zip(keys, raws)]
        removed = list({key: raw for key, raw in zip(keys, raws) if raw is not None}.items())  # a repeat once
        for key, raw in removed:
            self._delete_envelope(table, key, raw, digest=False)
        if table != "meta":
            self._digest_update(table, [], removed)
        return plaintexts

    def delete_many(self, table: str, keys: list[bytes]) -> int:
        """:meth:`delete` for many keys, with one state-digest update; returns how many existed."""
        self._require_write()
        get, db = self._lt.get, self.store._env.dbs[table]
        removed = list({key: raw for key in keys if (raw := get(key, db=db)) is not None}.items())
        for key, raw in removed:
            self._delete_envelope(table, key, raw, digest=False)
        if table != "meta":
            self._digest_update(table, [], removed)
        return len(removed)

    def pop(self, table: str, key: bytes) -> bytes | None:
        """Remove (table, key) and return its plaintext; None when it did not exist.

        Raises:
            DecryptionError: the stored value does not authenticate (nothing is removed).
        """
        self._require_write()
        raw = self._lt.get(key, db=self.store._env.dbs[table])
        if raw is None:
            return None
        plaintext = self.store.sealer.open(table.encode(), key, raw)
        self._delete_envelope(table, key, raw, digest=table != "meta")
        return plaintext

    def items(self, table: str, prefix: bytes = b"", *, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """(key, plaintext) pairs in key order, restricted to ``prefix``, from ``start`` on."""
        sealer = self.store.sealer
        tname = table.encode()
        env = self.store._env
        with self._lt.cursor(db=env.dbs[table]) as cur:
            if not cur.set_range(start if start is not None and start > prefix else prefix):
                return
            for key, raw in cur:
                if not key.startswith(prefix):
                    return
                if table == "meta" and key in HEADER_KEYS:
                    continue
                env.used_map()
                yield key, sealer.open(tname, key, raw)

    def keys(self, table: str, prefix: bytes = b"") -> Iterator[bytes]:
        """Keys in order (no decryption)."""
        with self._lt.cursor(db=self.store._env.dbs[table]) as cur:
            if not cur.set_range(prefix):
                return
            for key in cur.iternext(keys=True, values=False):
                if not key.startswith(prefix):
                    return
                yield key

    def raw_items(self, table: str) -> Iterator[tuple[bytes, bytes]]:
        """(key, envelope) pairs as stored, for verify."""
        with self._lt.cursor(db=self.store._env.dbs[table]) as cur:
            yield from cur

    def count(self, table: str) -> int:
        """Number of entries in a table (LMDB keeps this in the B-tree; O(1))."""
        return self._lt.stat(self.store._env.dbs[table])["entries"]

    def repack(self, table: str, *, below: float | None = None) -> bool:
        """Rewrite ``table``'s entries (the same envelopes, in key order) into full pages;
        with ``below``, only when that would leave less than that fraction of its leaf pages
        (:meth:`packed_fraction`). Returns whether it rewrote the table.

        LMDB's compacting copy keeps every page as it is, so pages whose values shrank
        (archived memories' stubs, truncated text) stay part empty in the copy, and the
        file does not get smaller. Emptied and refilled in key order (LMDB's append mode
        fills each page before it starts the next), the table takes the fewest pages; the
        old ones are freed, and the next compaction drops them. The envelopes, and so the
        state digest, do not change. Streams in bounded chunks (:meth:`_rewrite_table`).
        """
        self._require_write()
        if below is not None and self.packed_fraction(table) >= below:
            return False
        self._rewrite_table(table, None)
        return True

    def packed_fraction(self, table: str) -> float:
        """The leaf pages ``table`` would take after :meth:`repack` over those it takes now
        (1.0 for an empty table): its entries' nodes (headers, keys, values not in overflow
        pages, pointers) packed in key order as LMDB's append mode fills pages. Reads every
        key and value (no decryption)."""
        st = self._lt.stat(self.store._env.dbs[table])
        if not st["leaf_pages"]:
            return 1.0
        room = st["psize"] - _PAGE_HEADER
        node_max = ((room // 2) & -2) - 2  # LMDB's largest node kept in a leaf page
        pages, used = 1, 0
        env = self.store._env
        with self._lt.cursor(db=env.dbs[table]) as cur:
            for key, value in cur:
                # the map's pages read: released as they pile up, as the other scans do (a
                # whole table at compact would otherwise stay resident until the next release)
                env.map_uses += 1
                if env.map_uses >= RELEASE_CHECK_EVERY:
                    env.used_map(0)
                size = 8 + len(key) + len(value)
                size = 2 + (size if size <= node_max else 8 + len(key) + 8)
                if used + size > room:
                    pages, used = pages + 1, 0
                used += size
        return pages / st["leaf_pages"]

    def table_bytes(self, table: str) -> int:
        """Bytes of the pages a table occupies (branch, leaf and overflow pages; O(1))."""
        st = self._lt.stat(self.store._env.dbs[table])
        return st["psize"] * (st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"])

    # -- plaintext header (read before the key is known) --------------------------------
    def get_header(self, key: bytes) -> bytes | None:
        return self._lt.get(key, db=self.store._env.dbs["meta"])

    def put_header(self, key: bytes, value: bytes) -> None:
        self._require_write()
        if key not in HEADER_KEYS:
            raise StoreError(f"{key!r} is not a header key")
        self._put_envelope("meta", key, value, digest=False)


class Store:
    """A handle on one .engram file's LMDB environment, with sealing.

    Create with :meth:`open`; attach the :class:`Sealer` once the header is unlocked.
    """

    def __init__(self, env: _Env, readonly: bool) -> None:
        self._env = env
        self.readonly = readonly
        self._sealer: Sealer | None = None
        self.epoch_limit = EPOCH_LIMIT
        self.timeout: float | None = DEFAULT_TIMEOUT
        self.repair = False  # verify --fix: the sealed state may be missing or unbound
        self._local = threading.local()
        self._closed = False

    @property
    def sealer(self) -> Sealer:
        """The record sealer, attached once the header is unlocked."""
        if self._sealer is None:
            raise StoreError("the store is not unlocked yet", hint="open the file through engramdb.open()")
        return self._sealer

    @sealer.setter
    def sealer(self, sealer: Sealer) -> None:
        self._sealer = sealer

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, readonly: bool = False, create: bool = True,
             map_size: int | None = None, verify: bool = False,
             timeout: float | None = DEFAULT_TIMEOUT, allow_unsafe_fs: bool = False) -> Store:
        """Open (or share) the environment of ``path``.

        ``timeout`` bounds every wait of this handle for another process or thread: for a
        compaction or restore to finish at open, and for the writer lock in each write
        transaction (None: wait as long as it takes). A file on a network or FUSE
        filesystem is refused unless ``allow_unsafe_fs`` (:func:`check_filesystem`).

        Raises:
            FileMissingError: the file does not exist and ``create`` is false.
            ForeignFileError, CorruptFileError: not an engramdb/LMDB file, or damaged.
            AlreadyOpenError: the path is open in this process with a different read-only mode.
            BusyError: the wait took longer than ``timeout``.
            UnsafeFilesystemError: the file (a new file's directory) is on a network or FUSE filesystem.
        """
        if not isinstance(allow_unsafe_fs, bool):
            raise ValidationError(f"allow_unsafe_fs must be True or False, got {allow_unsafe_fs!r}")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not timeout >= 0):
            raise ValidationError(f"timeout must be a number of seconds >= 0 or None, got {timeout!r}")
        if timeout is not None and timeout >= threading.TIMEOUT_MAX:
            # inf (the CLI's `--timeout inf`) or a wait past what the locks take: their waits
            # raised OverflowError; as long as it takes is what such a timeout asks for
            timeout = None
        path = os.path.realpath(os.fspath(path))
        check_filesystem(path, allow_unsafe=allow_unsafe_fs)  # before anything is created there
        with _registry_lock:
            env = _registry.get(path)
            if env is not None and env.pid != os.getpid():
                env.release_inherited()  # inherited from a parent across fork(): never use it
                _registry.pop(path)
                env = None
            if env is None:
                exists = os.path.exists(path)
                if not exists and (readonly or not create):
                    raise FileMissingError(f"{path} does not exist",
                                           hint="create it with `engramdb init FILE` or open(..., create=True)")
                sniff(path)
                sidecars = [p for p in (path + "-lock", path + "-maint") if not os.path.exists(p)]
                try:
                    env = _Env(path, readonly=readonly, create=create, map_size=map_size, verify=verify,
                               timeout=timeout)
                except BaseException:
                    for sidecar in sidecars:  # leave no litter beside a file we refused
                        with contextlib.suppress(OSError):
                            os.unlink(sidecar)
                    raise
                _registry[path] = env
            elif env.readonly != readonly:
                raise AlreadyOpenError(
                    f"{path} is already open in this process {'read-only' if env.readonly else 'read-write'}")
            elif verify:
                structural_verify(path)
            env.refs += 1
        store = cls(env, readonly)
        store.timeout = timeout
        return store

    # -- guards ------------------------------------------------------------------------
    def _check(self) -> None:
        if self._closed:
            raise ClosedError("this handle is closed")
        if self._env.pid != os.getpid():
            raise ForkError("this handle was opened in a parent process and cannot be used after fork()")

    @property
    def path(self) -> str:
        return self._env.path

    @property
    def created(self) -> bool:
        """True when the open that made this handle's environment created the file."""
        return self._env.created

    @property
    def unclean_shutdown(self) -> bool:
        """True when the previous session of this file did not close cleanly."""
        return self._env.unclean

    def last_txnid(self) -> int:
        """LMDB's last committed transaction id: it moves whenever any process commits."""
        self._check()
        env = self._env
        with env.resize_lock:  # not while a deferred reopen or a compact has the environment closed
            return env.env.info()["last_txnid"]

    def on_commit(self, listener: CommitListener) -> None:
        """Have ``listener.purge(changes)`` called after every commit through this process's
        handles of the file (held weakly: a listener that is no longer used drops out)."""
        self._env.listeners.add(listener)

    def blind(self, purpose: bytes, value: bytes) -> bytes:
        """The blind-index key of ``value`` (16 bytes)."""
        return self.sealer.blind(purpose, value)

    def blind_many(self, purpose: bytes, values: list[bytes]) -> list[bytes]:
        """:meth:`blind` of each value."""
        return self.sealer.blind_many(purpose, values)

    # -- transactions ----------------------------------------------------------------------
    @contextlib.contextmanager
    def read(self) -> Iterator[Txn]:
        """A read snapshot. Inside a write transaction of this thread, that transaction is reused."""
        self._check()
        current = getattr(self._local, "txn", None)
        if current is not None:
            yield current
            return
        env = self._env
        ident = get_ident()
        with env.resize_lock:
            own = env.thread_reads.get(ident, 0)
            if env.upgrading and not own:  # a thread with a read open goes on: the reopen waits for it
                env.resize_lock.wait_for(lambda: not env.upgrading, timeout=_READ_WAITS_FOR_REOPEN)
            env.active_readers += 1
            env.thread_reads[ident] = own + 1
        txn = Txn(self, write=False)
        try:
            txn._begin()
            yield txn
            env.check_unwritten()  # before the caller returns what it read
        except lmdb.Error as exc:  # a damaged page met while reading: never a library exception
            env.check_unwritten()
            raise _map_lmdb_error(exc, "read failed") from None
        except EngramError:  # a reused page fails authentication or parsing: say why
            env.check_unwritten()
            raise
        finally:
            txn._abort()
            with env.resize_lock:
                env.active_readers -= 1
                left = env.thread_reads.pop(ident) - 1
                if left:
                    env.thread_reads[ident] = left
                env.resize_lock.notify_all()

    def outside_transaction(self, what: str) -> None:
        """Refuse an operation that commits on its own (in steps, or after taking the file
        for itself) while this thread has a write transaction of this handle open: joined to
        it, its steps would not commit one by one, and compact() would wait for that very
        transaction for ever.

        Raises:
            ValidationError: a write transaction of this thread is open.
        """
        if getattr(self._local, "txn", None) is not None:
            raise ValidationError(f"{what} cannot run inside a transaction: it commits by itself",
                                  hint=f"call {what} after the `with db.transaction()` block")

    @contextlib.contextmanager
    def transaction(self, *, reserve: int = 0) -> Iterator[Txn]:
        """One write transaction for a block of code; commits on success, rolls back on error.

        Nested use on the same thread joins the outer transaction. If the map must grow
        mid-transaction, the raw writes are replayed into a new transaction; if another
        writer committed in that instant, :class:`WriteConflictError` is raised and nothing
        is written. ``reserve`` (bytes the block will add, roughly) grows the map up front
        instead.
        """
        self._check()
        if self.readonly:
            raise ReadOnlyError("the file is open read-only")
        current = getattr(self._local, "txn", None)
        if current is not None:
            yield current
            return
        env = self._env
        env.acquire_writer(self.timeout)  # engramdb's writer lock, with a timeout; then LMDB's
        try:
            env.headroom_check(reserve)
            txn = Txn(self, write=True)
            txn._begin()
        except BaseException:
            env.release_writer()
            raise
        self._local.txn = txn
        env.active_writers += 1  # under the writer locks: one writer at a time
        try:
            yield txn
            txn._commit()
        except lmdb.Error as exc:  # from a read or write inside the block (commit maps its own)
            txn._abort()
            raise _map_lmdb_error(exc, "the transaction failed and was rolled back", path=self.path) from None
        except BaseException:
            txn._abort()
            raise
        finally:
            env.active_writers -= 1
            self._local.txn = None
            env.release_writer()

    def write(self, fn: Callable[[Txn], T], *, retries: int = 5, reserve: int = 0) -> T:
        """Run ``fn(txn)`` in one write transaction and commit; re-run it on a write conflict.

        ``fn`` must have no effects outside the transaction, since it may run more than once.
        """
        for attempt in range(retries):
            try:
                with self.transaction(reserve=reserve) as txn:
                    return fn(txn)
            except WriteConflictError:
                if attempt == retries - 1 or getattr(self._local, "txn", None) is not None:
                    raise
        raise AssertionError("unreachable")

    # -- whole-file operations --------------------------------------------------------
    def env_info(self) -> EnvInfo:
        self._check()
        env = self._env
        with env.resize_lock:  # not while a deferred reopen or a compact has the environment closed
            return EnvInfo(**env.env.info(), psize=env.env.stat()["psize"], file_size=os.stat(self.path).st_size)

    def compact(self) -> None:
        """Replace the file by a compacting copy of itself: freed pages (and the ciphertext
        they held) leave the file.

        The copy (``NAME.engram.compact-tmp``) is created new with mode 0600 and locked
        while it is written; one left by a killed process is removed by the next opener.
        Reads of other threads through this handle are waited for (up to the timeout).

        Raises:
            AlreadyOpenError: another handle in this process, another process, or another
                thread's read that did not end within the timeout, has the file open.
            BusyError: another thread's write did not end within the timeout.
            StorageFullError: not enough space for the copy (the original is untouched).
        """
        self._check()
        self.outside_transaction("compact()")
        if self.readonly:
            raise ReadOnlyError("compact needs a writable handle")
        env = self._env
        with _registry_lock:
            if env.refs != 1:
                raise AlreadyOpenError("compact needs the only open handle of this file in this process",
                                       hint="close the other handles first")
            env.acquire_writer(self.timeout)  # no write of another thread runs meanwhile
            try:
                with env.resize_lock:  # and no read begins: Store.read waits for this lock
                    if not env.resize_lock.wait_for(lambda: env.active_readers == 0, timeout=self.timeout):
                        raise AlreadyOpenError("other threads are reading through this handle; compact waited "
                                               f"{self.timeout} s for their reads to end",
                                               hint="retry once the other threads' reads are done")
                    if not env.try_exclusive():
                        raise AlreadyOpenError("another process has this file open; compact needs exclusive access",
                                               hint="close the other processes using the file, then retry")
                    try:
                        self._replace_by_copy()
                    finally:
                        env.release_exclusive()
            finally:
                env.release_writer()
        with self.transaction() as txn:  # the copy restarted LMDB's txnids: re-bind the state
            txn.state  # noqa: B018

    def _replace_by_copy(self) -> None:
        env = self._env
        tmp = env.path + COMPACT_SUFFIX
        remove_if_abandoned(tmp)
        try:
            fd = create_private(tmp)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise ReadOnlyError(f"cannot create the compacting copy {tmp}: {exc.strerror}; the original is "
                                    "untouched",
                                    hint="compact writes a copy beside the file and renames it over the file: make "
                                         "the directory writable (chmod u+w), or copy the store to a writable "
                                         "directory and compact it there") from None
            raise _os_error(exc, "cannot create the compacting copy; the original is untouched") from None
        replaced = False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # ours while it is written
            try:
                env.env.copyfd(fd, compact=True)
                scrub_unused_bytes(fd)
                os.fsync(fd)
            except lmdb.Error as exc:
                raise _map_lmdb_error(exc, "compacting copy failed; the original is untouched", path=tmp) from None
            except OSError as exc:
                raise _os_error(exc, "compacting copy failed; the original is untouched") from None
            env.env.close()
            try:
                os.replace(tmp, env.path)
                replaced = True
            finally:
                if not replaced:  # put the original back in service before reporting
                    env.env = _Env._open(env.path, readonly=False, create=False, map_size=None)
                    env.dbs = env._open_dbs(create=False, new_file=False, writer_held=True)
            # The copy is now the data file, and its exclusive lock this handle's (downgraded to
            # shared by release_exclusive). Closing the old fd releases the replaced file's lock:
            # openers waiting on it find that the path names another file and start again.
            old, env.lock_fd = env.lock_fd, fd
            if old is not None:
                os.close(old)
            _fsync_dir(env.path)
            env.env = _Env._open(env.path, readonly=False, create=False, map_size=None)
            env._check_not_truncated()
            env.dbs = env._open_dbs(create=False, new_file=False, writer_held=True)
        finally:
            if not replaced:
                os.close(fd)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)

    def close(self) -> None:
        """Release this handle; the environment closes with its last handle."""
        if self._closed:
            return
        self._closed = True
        if self._env.pid != os.getpid():
            return  # never close a parent's environment from a forked child
        with _registry_lock:
            env = self._env
            env.refs -= 1
            if env.refs == 0:
                _registry.pop(env.path, None)
                env.env.close()
                env._unlock(clean=True)
