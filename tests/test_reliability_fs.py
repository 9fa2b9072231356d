"""Local filesystems only (reliability rule 9, T9.2). LMDB's locks (fcntl on -lock, the
reader table and writer mutex in its shared map) and the coherence of its memory map with
other processes' writes do not hold on network or FUSE filesystems: engramdb opened a store
on NFS, SMB or sshfs without a word. It reads the file's mount from /proc/self/mountinfo
(mocked here) and refuses those, with an opt-out; local filesystems, Docker's overlay root
and rootless podman's fuse-overlayfs are not refused."""
from __future__ import annotations

import os
import select
import signal
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import PASSPHRASE, TEST_KDF

import engramdb.engram as engram
import engramdb.store as store_mod
from engramdb.cli import cli as cli_main
from engramdb.errors import UnsafeFilesystemError, ValidationError

REFUSED = ["nfs", "nfs4", "cifs", "smb3", "9p", "virtiofs", "fuse", "fuse.sshfs", "fuse.s3fs", "fuse.gcsfuse",
           "fuse.rclone"]
ALLOWED = ["ext4", "xfs", "tmpfs", "btrfs", "zfs", "overlay", "fuse.fuse-overlayfs", "fuseblk"]


def _escape(point: str) -> str:
    # as the kernel writes a mount point into mountinfo (show_path: space, tab, newline, backslash)
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in point)


def _line(n: int, point: str, fstype: str, root: str = "/") -> str:
    return f"{n} 1 0:{n} {root} {_escape(point)} rw,relatime shared:{n} master:1 - {fstype} src{n} rw,vers=4.2"


@pytest.fixture
def mounts(tmp_path, monkeypatch):
    """Set the mount table engramdb reads: mounts(("/", "ext4"), (dir, "nfs4"), ...)."""
    monkeypatch.delenv(store_mod.ALLOW_UNSAFE_FS_ENV, raising=False)
    written = []

    def write(*entries: tuple[str, str] | tuple[str, str, str]) -> None:
        # a new file each time: the table is cached until a poll of the open file says it
        # changed, which a regular file never does
        table = tmp_path / f"mountinfo-{len(written)}"
        lines = [_line(25 + i, str(entry[0]), entry[1], *entry[2:]) for i, entry in enumerate(entries)]
        table.write_text("\n".join(lines) + "\n")
        written.append(table)
        monkeypatch.setattr(store_mod, "MOUNTINFO", str(table))

    return write


@pytest.mark.parametrize("fstype", REFUSED)
def test_a_store_on_a_network_or_fuse_filesystem_is_refused(tmp_path, mounts, fstype):
    share = tmp_path / "share"
    share.mkdir()
    mounts(("/", "ext4"), (share, fstype))
    with pytest.raises(UnsafeFilesystemError) as err:  # a new file: nothing is created there
        engram.open(share / "new.engram", passphrase=PASSPHRASE, kdf=TEST_KDF)
    assert fstype in err.value.message and f"mounted at {share}" in err.value.message
    assert "locks" in err.value.message and "memory map" in err.value.message
    assert "allow_unsafe_fs=True" in err.value.hint and "ENGRAM_ALLOW_UNSAFE_FS=1" in err.value.hint
    assert os.listdir(share) == []
    with engram.open(share / "s.engram", passphrase=PASSPHRASE, kdf=TEST_KDF, allow_unsafe_fs=True) as db:
        db.add("kept", id="kept")
    for readonly in (False, True):  # an existing file, read-only opens too (they use -lock's shared map)
        with pytest.raises(UnsafeFilesystemError):
            engram.open(share / "s.engram", passphrase=PASSPHRASE, readonly=readonly)


@pytest.mark.parametrize("fstype", ALLOWED)
def test_a_store_on_a_local_filesystem_is_not_refused(tmp_path, mounts, fstype):
    local = tmp_path / "local"
    local.mkdir()
    mounts(("/", "nfs4"), (local, fstype))  # the file's own mount decides, not the root's
    with engram.open(local / "s.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("kept", id="kept")
    with engram.open(local / "s.engram", passphrase=PASSPHRASE, readonly=True) as db:
        assert db.get("kept").content == "kept"


def test_the_longest_mount_point_prefix_decides(tmp_path, mounts):
    share, inner, sibling = tmp_path / "share", tmp_path / "share" / "local", tmp_path / "share-local"
    for d in (share, inner, sibling):
        d.mkdir()
    # listed out of order; "share-local" starts with "share" but is not under it (whole components)
    mounts((inner, "ext4"), ("/", "ext4"), (share, "nfs4"), (sibling, "xfs"))
    engram.open(inner / "a.engram", passphrase=PASSPHRASE, kdf=TEST_KDF).close()
    engram.open(sibling / "b.engram", passphrase=PASSPHRASE, kdf=TEST_KDF).close()
    with pytest.raises(UnsafeFilesystemError, match="nfs4"):
        engram.open(share / "c.engram", passphrase=PASSPHRASE, kdf=TEST_KDF)


def test_of_two_mounts_on_one_point_the_last_listed_is_on_top(tmp_path, mounts):
    mounts(("/", "ext4"), (tmp_path, "ext4"), (tmp_path, "nfs4"))
    with pytest.raises(UnsafeFilesystemError):
        engram.open(tmp_path / "a.engram", passphrase=PASSPHRASE, kdf=TEST_KDF)
    mounts(("/", "ext4"), (tmp_path, "nfs4"), (tmp_path, "tmpfs"))
    engram.open(tmp_path / "a.engram", passphrase=PASSPHRASE, kdf=TEST_KDF).close()


@pytest.mark.parametrize("name", ["my share", "tab\there", "back\\slash", "new\nline"])
def test_escaped_mount_points_are_matched(tmp_path, mounts, name):
    share = tmp_path / name
    share.mkdir()
    similar = tmp_path / (name + "x")
    similar.mkdir()
    mounts(("/", "ext4"), (share, "cifs"))
    assert name not in Path(store_mod.MOUNTINFO).read_text()  # the table holds the escaped form
    with pytest.raises(UnsafeFilesystemError, match="cifs"):
        engram.open(share / "s.engram", passphrase=PASSPHRASE, kdf=TEST_KDF)
    engram.open(similar / "s.engram", passphrase=PASSPHRASE, kdf=TEST_KDF).close()


def test_a_bind_mount_is_judged_by_the_type_it_exposes(tmp_path, mounts):
    """A bind of an NFS directory is listed as nfs4 with the directory as its root."""
    bound = tmp_path / "bound"
    bound.mkdir()
    mounts(("/", "ext4"), (bound, "nfs4", "/export/home/alice"))
    with pytest.raises(UnsafeFilesystemError):
        engram.open(bound / "s.engram", passphrase=PASSPHRASE, kdf=TEST_KDF)


def test_symlinks_are_resolved_before_the_mount_is_looked_up(tmp_path, mounts):
    share, local = tmp_path / "share", tmp_path / "local"
    share.mkdir()
    local.mkdir()
    (local / "to-share").symlink_to(share)  # a local path leading onto the share
    (share / "to-local").symlink_to(local)  # and one on the share leading to a local disk
    mounts(("/", "ext4"), (share, "nfs4"))
    with pytest.raises(UnsafeFilesystemError):
        engram.open(local / "to-share" / "s.engram", passphrase=PASSPHRASE, kdf=TEST_KDF)
    engram.open(share / "to-local" / "s.engram", passphrase=PASSPHRASE, kdf=TEST_KDF).close()
    os.symlink(local / "s.engram", local / "link.engram")  # a symlink to the file itself
    mounts(("/", "ext4"), (local, "fuse.sshfs"))
    with pytest.raises(UnsafeFilesystemError):
        engram.open(local / "link.engram", passphrase=PASSPHRASE)


def test_the_environment_variable_allows_every_open(tmp_path, mounts, monkeypatch):
    mounts(("/", "ext4"), (tmp_path, "nfs4"))
    for value in ("0", "", "no"):
        monkeypatch.setenv(store_mod.ALLOW_UNSAFE_FS_ENV, value)
        with pytest.raises(UnsafeFilesystemError):
            engram.open(tmp_path / "s.engram", passphrase=PASSPHRASE, kdf=TEST_KDF)
    monkeypatch.setenv(store_mod.ALLOW_UNSAFE_FS_ENV, "1")
    with engram.open(tmp_path / "s.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("kept")


def test_the_command_line_says_why_and_takes_the_environment_variable(tmp_path, mounts, monkeypatch):
    mounts(("/", "ext4"), (tmp_path, "fuse.sshfs"))
    path = str(tmp_path / "s.engram")
    runner = CliRunner()
    result = runner.invoke(cli_main, ["init", path, "--plaintext"])
    assert result.exit_code == 1 and "fuse.sshfs" in result.output and "ENGRAM_ALLOW_UNSAFE_FS=1" in result.output
    assert not os.path.exists(path)
    monkeypatch.setenv(store_mod.ALLOW_UNSAFE_FS_ENV, "1")
    result = runner.invoke(cli_main, ["init", path, "--plaintext"])
    assert result.exit_code == 0, result.output
    assert os.path.exists(path)


@pytest.mark.parametrize("table", ["missing", "empty", "garbage"])
def test_an_unreadable_or_unknown_mount_table_refuses_nothing(tmp_path, mounts, monkeypatch, table):
    """Not Linux, or a sandbox without /proc: nothing to go by, so nothing is refused."""
    source = tmp_path / f"mountinfo-{table}"
    if table != "missing":
        source.write_text("" if table == "empty" else "not a mount table\nnfs4 - nfs4\n")
    monkeypatch.setattr(store_mod, "MOUNTINFO", str(source))
    with engram.open(tmp_path / "s.engram", passphrase=PASSPHRASE, kdf=TEST_KDF) as db:
        db.add("kept")


def test_allow_unsafe_fs_must_be_a_bool(tmp_path):
    with pytest.raises(ValidationError, match="allow_unsafe_fs"):
        engram.open(tmp_path / "s.engram", passphrase=PASSPHRASE, kdf=TEST_KDF, allow_unsafe_fs="yes")


def test_mount_of_reads_the_kernels_format():
    table = "\n".join([
        "22 27 0:21 / /proc rw,relatime - proc proc rw",
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw",
        r"40 27 0:50 /export /mnt/my\040nfs rw,relatime shared:7 master:2 - nfs4 srv:/export rw,vers=4.2",
        r"41 27 0:51 / /mnt/back\134slash rw - cifs //srv/x rw",
        "truncated line without separator",
    ])
    table = store_mod.parse_mountinfo(table)
    assert store_mod.mount_of("/mnt/my nfs/a.engram", table) == ("/mnt/my nfs", "nfs4")
    assert store_mod.mount_of("/mnt/my nfs", table) == ("/mnt/my nfs", "nfs4")
    assert store_mod.mount_of("/mnt/my nfsx/a.engram", table) == ("/", "ext4")
    assert store_mod.mount_of("/mnt/back\\slash/a", table) == ("/mnt/back\\slash", "cifs")
    assert store_mod.mount_of("/home/a.engram", table) == ("/", "ext4")
    assert store_mod.mount_of("/a", {}) is None and store_mod.mount_of("/a", {"/proc": "proc"}) is None


def test_the_mount_table_is_read_again_when_the_kernel_says_it_changed(tmp_path, mounts):
    """The table is cached (a read costs as much as a fifth of an open) until a poll of the
    open mountinfo reports a change, as the kernel does after each mount or unmount."""
    mounts(("/", "ext4"), (tmp_path, "nfs4"))
    with pytest.raises(UnsafeFilesystemError):
        engram.open(tmp_path / "s.engram", passphrase=PASSPHRASE, kdf=TEST_KDF)
    # the share is unmounted: the same open file now reads a table without it
    with open(store_mod.MOUNTINFO, "w") as fh:
        fh.write(_line(25, "/", "ext4") + "\n")
    with pytest.raises(UnsafeFilesystemError):  # no change reported: the cached table holds
        engram.open(tmp_path / "s.engram", passphrase=PASSPHRASE, kdf=TEST_KDF)

    class Changed:  # what poll() of /proc/self/mountinfo returns once after a mount or unmount
        def __init__(self) -> None:
            self.reported = False

        def poll(self, timeout: int) -> list[tuple[int, int]]:
            if self.reported:
                return []
            self.reported = True
            return [(0, select.POLLPRI | select.POLLERR)]

    source, pid, fd, _, table = store_mod._mounts
    store_mod._mounts = (source, pid, fd, Changed(), table)
    engram.open(tmp_path / "s.engram", passphrase=PASSPHRASE, kdf=TEST_KDF).close()
    assert store_mod._mounts[4] == {"/": "ext4"}


def test_a_forked_child_reads_its_own_mount_table_even_if_a_thread_held_the_lock(tmp_path, mounts):
    """The child has only the forking thread: a lock held by another thread of the parent
    at fork() would never be released (open() would hang), and the inherited descriptor's
    change notice is shared with the parent, so the child opens its own."""
    mounts(("/", "ext4"), (tmp_path, "nfs4"))
    with pytest.raises(UnsafeFilesystemError):
        engram.open(tmp_path / "s.engram", passphrase=PASSPHRASE, kdf=TEST_KDF)
    parent_fd = store_mod._mounts[2]
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store_mod._mounts_lock:
            held.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(10)
    try:
        pid = os.fork()
        if pid == 0:
            signal.alarm(10)  # a hang becomes a SIGALRM death instead of a stuck test
            try:
                engram.open(tmp_path / "s.engram", passphrase=PASSPHRASE, kdf=TEST_KDF)
                os._exit(2)
            except UnsafeFilesystemError:
                own = store_mod._mounts
                os._exit(0 if own[1] == os.getpid() and own[2] != parent_fd else 4)
            except BaseException:
                os._exit(3)
    finally:
        release.set()
        thread.join()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert store_mod._mounts[2] == parent_fd  # the parent's cache is untouched


def test_the_command_line_takes_allow_unsafe_fs_and_names_it(tmp_path, mounts, monkeypatch):
    # rel2 (session 9): the opt-out had no command-line spelling (only the environment variable)
    mounts(("/", "ext4"), (tmp_path, "nfs4"))
    path = str(tmp_path / "s.engram")
    runner = CliRunner()
    result = runner.invoke(cli_main, ["init", path, "--plaintext"])
    assert result.exit_code == 1 and "--allow-unsafe-fs" in result.output and "ENGRAM_ALLOW_UNSAFE_FS=1" in result.output
    assert "allow_unsafe_fs=True" not in result.output  # a Python spelling means nothing on the command line
    assert runner.invoke(cli_main, ["--allow-unsafe-fs", "init", path, "--plaintext"]).exit_code == 0
    result = runner.invoke(cli_main, ["add", path, "kept on the share", "--id", "kept", "--plaintext"])
    assert result.exit_code == 1 and "--allow-unsafe-fs" in result.output
    for args in (["add", path, "kept on the share", "--id", "kept", "--plaintext", "--allow-unsafe-fs"],
                 ["--allow-unsafe-fs", "dump", path, "-o", str(tmp_path / "d.aaak"), "--plaintext"],
                 ["--allow-unsafe-fs", "restore", str(tmp_path / "d.aaak"), str(tmp_path / "r.engram"),
                  "--plaintext"]):
        result = runner.invoke(cli_main, args)
        assert result.exit_code == 0, (args, result.output)
    with engram.open(tmp_path / "r.engram", encrypted=False, allow_unsafe_fs=True) as db:
        assert db.get("kept").content == "kept on the share"
    assert "ENGRAM_ALLOW_UNSAFE_FS=1" in runner.invoke(cli_main, ["add", "--help"]).output


def test_import_key_takes_allow_unsafe_fs(tmp_path, mounts):
    mounts(("/", "ext4"), (tmp_path, "cifs"))
    path = tmp_path / "s.engram"
    with engram.open(path, passphrase=PASSPHRASE, kdf=TEST_KDF, allow_unsafe_fs=True) as db:
        db.export_key(tmp_path / "s.key")
    with pytest.raises(UnsafeFilesystemError):
        engram.import_key(path, tmp_path / "s.key", passphrase=PASSPHRASE)
    engram.import_key(path, tmp_path / "s.key", passphrase=PASSPHRASE, allow_unsafe_fs=True)
