"""`StagedWorkspace`: a run's view of its workspace, where its writes land until a person applies them.

The view is a copy of the workspace made when the run starts (`StagedWorkspace.create`), kept under
`stages_dir()/RUN` outside the workspace. The file tools write there, and sandboxed Bash sees it
mounted at the workspace's own path, so tests the model runs see the staged files while the real
workspace is untouched. Dependency and VCS directories at the top (`PASSTHROUGH`: `.git`,
`.venv`, `node_modules` ...) are not copied: the tools read the real ones, and nothing in the run
can write them.

What changed is computed exactly (`changes()`): every file and link of the view against the
manifest taken while copying (content hashes; an entry whose inode and ctime are those of the copy
is unchanged, and ctime cannot be set by a command). `apply()` writes the chosen changes into the
workspace, each file written beside its target and renamed over it, after recording in a journal
what each replaced; `undo()` puts those back; a path changed in the workspace since the run started
is a conflict and is left alone. Changes that are code run later (`runs_later`) are applied only
when named.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import os
import shutil
import stat
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tether._errors import InvalidInput, NotFound, OperationFailed
from tether.staging._runs_later import runs_later
from tether.tools._beneath import Beneath

STAGE_FORMAT = 1
# Not copied into the view: read from the real workspace, never written by the run (code there runs later).
PASSTHROUGH = (".git", ".hg", ".svn", ".venv", "venv", "node_modules")
MAX_FILES = 100_000
MAX_BYTES = 2_000_000_000
_CHUNK = 1 << 20
Kind = Literal["added", "changed", "deleted"]


def stages_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where staged runs live: `$TETHER_HOME/stages`, else `$XDG_DATA_HOME/tether/stages`."""
    env = os.environ if env is None else env
    home = env.get("TETHER_HOME")
    base = Path(home) if home else Path(env.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "tether"
    return base / "stages"


@dataclass(frozen=True, slots=True)
class FileState:
    """One path's state: a regular file or a symbolic link, its size, permission bits and digest
    (sha256 of the content, or of the link's target)."""

    link: bool
    size: int
    mode: int
    digest: str

    def to_json(self) -> list[Any]:
        return [self.link, self.size, self.mode, self.digest]

    @classmethod
    def from_json(cls, data: list[Any]) -> FileState:
        return cls(bool(data[0]), int(data[1]), int(data[2]), str(data[3]))


@dataclass(frozen=True, slots=True)
class Change:
    """A path the run added, changed or deleted; `runs_later` says why it is code run later (None: data)."""

    path: str
    kind: Kind
    before: FileState | None
    after: FileState | None
    binary: bool = False
    runs_later: str | None = None

    @property
    def mode_changed(self) -> bool:
        return self.before is not None and self.after is not None and self.before.mode != self.after.mode

    def describe(self) -> str:
        """One line: `+ path (120 B)`, `~ path (1.2 KB -> 1.3 KB)`, `- path`."""
        sign = {"added": "+", "changed": "~", "deleted": "-"}[self.kind]
        size = ""
        if self.kind == "added" and self.after is not None:
            size = f" ({_size(self.after.size)})"
        elif self.kind == "changed" and self.before is not None and self.after is not None:
            size = f" ({_size(self.before.size)} -> {_size(self.after.size)})"
            if self.mode_changed:
                size += f", mode {self.before.mode:o} -> {self.after.mode:o}"
        extra = " [binary]" if self.binary else ""
        extra += " [symbolic link]" if self.after is not None and self.after.link else ""
        shown = self.path if self.path.isprintable() else ascii(self.path)  # no name can draw a fake line
        return f"{sign} {shown}{size}{extra}"


@dataclass(slots=True)
class ApplyReport:
    """What `apply` or `undo` did: the paths done, and those left alone with why."""

    done: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def _digest_file(path: Path) -> tuple[str, bytes]:
    """sha256 of a file and its first bytes (to tell binary files)."""
    h = hashlib.sha256()
    head = b""
    with open(path, "rb", buffering=0) as fh:
        while chunk := fh.read(_CHUNK):
            if not head:
                head = chunk[:8192]
            h.update(chunk)
    return h.hexdigest(), head


def entry_of(path: Path) -> FileState | None:
    """The state of `path` now (None: absent, a directory, or not a file or link)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None
    if stat.S_ISLNK(info.st_mode):
        target = os.readlink(path)
        return FileState(True, len(target), 0, hashlib.sha256(target.encode("utf-8", "surrogateescape")).hexdigest())
    if not stat.S_ISREG(info.st_mode):
        return None
    return FileState(False, info.st_size, stat.S_IMODE(info.st_mode), _digest_file(path)[0])


def _copy_file(src: Path, dst: Path, info: os.stat_result) -> str:
    """Copy `src` to the new file `dst` (mode without setuid/setgid, times kept); its sha256."""
    h = hashlib.sha256()
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with open(src, "rb", buffering=0) as fh:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
        os.fchmod(fd, stat.S_IMODE(info.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
        os.utime(fd, ns=(info.st_atime_ns, info.st_mtime_ns))
    finally:
        os.close(fd)
    return h.hexdigest()


class StageExists(InvalidInput):
    """A stage for this run id was made already (`StagedWorkspace.open` it)."""


class StagedWorkspace:
    """One run's staged view of a workspace (see the module docstring). Made by `StagedWorkspace.create`, found
    again by `StagedWorkspace.open(run_id)`; everything it knows is in its directory, so another process (the
    `tether apply` command) can review and apply it."""

    def __init__(self, directory: Path, meta: dict[str, Any]) -> None:
        self.dir = directory
        self._meta = meta
        self._lock = threading.Lock()
        self._base_cache: dict[str, list[Any]] | None = None

    # ---- making and finding stages --------------------------------------------------------------

    @classmethod
    def create(cls, workspace: str | os.PathLike[str], run_id: str | None = None, *,
               root: Path | None = None, lazy: bool = False) -> StagedWorkspace:
        """A new stage of `workspace` for `run_id` (a new id when None) under `root` (default
        `stages_dir()`), its copy made now, or with `lazy` at the first write (`make_view`): a run
        that only reads copies nothing. The copy refuses a workspace over MAX_FILES files or MAX_BYTES."""
        real = Path(os.path.abspath(os.fspath(workspace))).resolve()
        if not real.is_dir():
            raise InvalidInput(f"workspace {real} is not an existing directory")
        run_id = run_id or uuid.uuid4().hex[:12]
        if not run_id.replace("-", "").replace("_", "").isalnum():
            raise InvalidInput(f"run id {run_id!r} may hold only letters, digits, '-' and '_'")
        base = root or stages_dir()
        directory = base / run_id
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        base = base.resolve()
        if real == base or real.is_relative_to(base):
            raise InvalidInput(f"the workspace {real} is inside the stage directory {base}; choose another workspace")
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            raise StageExists(f"a stage for run {run_id} already exists ({directory})") from None
        meta = {"format": STAGE_FORMAT, "run_id": run_id, "workspace": str(real), "created": time.time(),
                "status": "staged", "passthrough": [p for p in PASSTHROUGH if os.path.lexists(real / p)],
                "stages": str(base), "journal": []}
        stage = cls(directory, meta)
        stage._save()
        if not lazy:
            try:
                stage.make_view()
            except BaseException:
                shutil.rmtree(directory, ignore_errors=True)
                raise
        return stage

    @property
    def ready(self) -> bool:
        """Whether the copy is made (a lazy stage's is made at its first write)."""
        return (self.dir / "made").is_dir()

    def make_view(self) -> Path:
        """Make the copy if it is not made yet (once, also across threads and processes: it is built
        aside and renamed into place); the view's path."""
        with self._lock:
            if not self.ready:
                aside = self.dir / f".making-{uuid.uuid4().hex[:8]}"
                aside.mkdir(mode=0o700)
                try:  # a stage directory inside the workspace (tether run in ~) is not part of it
                    manifest, skipped = _copy_tree(self.workspace, aside / "view", exclude=Path(self._meta["stages"]))
                    (aside / "base.json").write_text(json.dumps({"base": manifest, "skipped": skipped}))
                    os.rename(aside, self.dir / "made")
                    if self._meta["status"] == "discarded":  # a new copy after a discard: staged again
                        self._meta["status"] = "staged"
                        self._save()
                except OSError as exc:
                    shutil.rmtree(aside, ignore_errors=True)
                    if not self.ready:  # not made by another process meanwhile
                        raise OperationFailed(f"cannot stage {self.workspace}: {exc.strerror or exc}") from exc
                except BaseException:
                    shutil.rmtree(aside, ignore_errors=True)
                    raise
            return self.view

    @classmethod
    def open(cls, run_id: str, *, root: Path | None = None) -> StagedWorkspace:
        """The stage of `run_id` (NotFound when there is none)."""
        directory = (root or stages_dir()) / run_id
        try:
            meta = json.loads((directory / "stage.json").read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise NotFound(f"no staged changes for run {run_id!r} (looked in {directory.parent})") from None
        except (OSError, ValueError) as exc:
            raise OperationFailed(f"the stage of run {run_id} cannot be read: {exc}") from None
        if meta.get("format") != STAGE_FORMAT:
            raise OperationFailed(f"the stage of run {run_id} has format {meta.get('format')}; this tether "
                                  f"reads format {STAGE_FORMAT}")
        return cls(directory, meta)

    @classmethod
    def all(cls, *, root: Path | None = None) -> list[StagedWorkspace]:
        """Every stage under `root`, newest first."""
        base = root or stages_dir()
        out: list[StagedWorkspace] = []
        with contextlib.suppress(FileNotFoundError):
            for child in base.iterdir():
                with contextlib.suppress(NotFound, OperationFailed):
                    out.append(cls.open(child.name, root=base))
        return sorted(out, key=lambda s: s.created, reverse=True)

    # ---- what it is ------------------------------------------------------------------------------

    @property
    def run_id(self) -> str:
        return str(self._meta["run_id"])

    @property
    def workspace(self) -> Path:
        return Path(self._meta["workspace"])

    @property
    def view(self) -> Path:
        """The staged copy the run's tools work in (it exists once `ready`)."""
        return self.dir / "made" / "view"

    @property
    def status(self) -> str:
        """staged, applied, partly applied, discarded or undone."""
        return str(self._meta["status"])

    @property
    def created(self) -> float:
        return float(self._meta["created"])

    @property
    def passthrough(self) -> list[str]:
        """Top-level workspace directories not copied (read from the workspace, never written)."""
        return list(self._meta["passthrough"])

    def _base(self) -> dict[str, list[Any]]:
        """The manifest taken while copying (empty before the copy is made)."""
        cached = self._base_cache
        if cached is None:
            try:
                cached = self._base_cache = json.loads((self.dir / "made" / "base.json").read_text())["base"]
            except FileNotFoundError:
                return {}
        return cached

    def _save(self) -> None:
        tmp = self.dir / f".stage.{uuid.uuid4().hex[:6]}.json"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(self._meta, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.dir / "stage.json")

    # ---- what changed ----------------------------------------------------------------------------

    def changes(self) -> list[Change]:
        """Every path added, changed or deleted in the view since it was made, sorted by path."""
        if not self.view.is_dir():
            return []
        base = self._base()
        seen: set[str] = set()
        out: list[Change] = []
        for rel, info in _walk(self.view, skip_top=set(self.passthrough)):
            seen.add(rel)
            known = base.get(rel)
            path = self.view / rel
            if known is not None and known[4] == info.st_ino and known[5] == info.st_ctime_ns:
                continue  # the copy itself, untouched (ctime moves on any write, chmod or rename)
            after = entry_of(path)
            if after is None:
                continue
            before = FileState.from_json(known[:4]) if known is not None else None
            if before == after:
                continue
            out.append(self._change(rel, "added" if before is None else "changed", before, after))
        for rel, known in base.items():
            if rel not in seen:
                out.append(self._change(rel, "deleted", FileState.from_json(known[:4]), None))
        return sorted(out, key=lambda c: c.path)

    def pending(self) -> list[Change]:
        """The changes not yet in the workspace (`changes()` less what was applied)."""
        return [c for c in self.changes() if entry_of(self.workspace / c.path) != c.after]

    def _change(self, rel: str, kind: Kind, before: FileState | None, after: FileState | None) -> Change:
        binary = False
        if after is not None and not after.link:
            with contextlib.suppress(OSError), open(self.view / rel, "rb") as fh:
                binary = b"\0" in fh.read(8192)
        why = runs_later(rel, self.view, mode_before=None if before is None or before.link else before.mode,
                         mode_after=None if after is None or after.link else after.mode)
        return Change(rel, kind, before, after, binary, why)

    def diff(self, paths: Iterable[str] | None = None, *, max_lines: int | None = None) -> str:
        """A unified diff of the chosen changes (all when None); binary files and links are named."""
        lines: list[str] = []
        for change in _select(self.changes(), paths, explicit_only=False)[0]:
            lines.extend(self._diff_one(change))
        if max_lines is not None and len(lines) > max_lines:
            lines = [*lines[:max_lines], f"[... {len(lines) - max_lines} more lines: see `tether runs diff`]"]
        return "\n".join(lines)

    def _diff_one(self, change: Change) -> Iterator[str]:
        header = f"{change.kind}: {change.path}" + (f"  (runs later: {change.runs_later})" if change.runs_later else "")
        yield header
        if change.binary or (change.after is not None and change.after.link) or (
                change.before is not None and change.before.link):
            yield "  (binary file or symbolic link: contents not shown)"
            return
        old = _text(self.workspace / change.path) if change.kind != "added" else []
        new = _text(self.view / change.path) if change.kind != "deleted" else []
        yield from difflib.unified_diff(old, new, f"a/{change.path}", f"b/{change.path}", lineterm="")
        if change.mode_changed and change.before is not None and change.after is not None:
            yield f"mode {change.before.mode:o} -> {change.after.mode:o}"

    # ---- applying, discarding, undoing ------------------------------------------------------------

    def apply(self, paths: Iterable[str] | None = None) -> ApplyReport:
        """Write the chosen changes into the workspace: all that are not code run later when `paths`
        is None; else those named (a directory names what is under it; a change that runs later is
        applied only when named itself). A path changed in the workspace since the run started is
        left alone (a conflict). What each write replaces is journalled first (`undo`)."""
        if self.status in ("discarded", "undone"):
            raise InvalidInput(f"run {self.run_id}'s changes were {self.status}; nothing to apply")
        chosen, report = _select(self.changes(), paths, explicit_only=paths is None)
        base = self._base()
        real = Beneath(self.workspace)
        batch: list[dict[str, Any]] = []
        todo: list[Change] = []
        for change in chosen:
            now = entry_of(self.workspace / change.path)
            was = FileState.from_json(base[change.path][:4]) if change.path in base else None
            if now == change.after:
                report.skipped[change.path] = "already so in the workspace"
                continue
            if now != was:
                report.skipped[change.path] = "changed in the workspace since the run started (a conflict)"
                continue
            saved = self._save_blob(self.workspace / change.path) if now is not None else None
            batch.append({"path": change.path, "before": None if now is None else now.to_json(), "blob": saved,
                          "after": None if change.after is None else change.after.to_json()})
            todo.append(change)
        if not todo:
            return report
        self._meta["journal"].append({"at": time.time(), "changes": batch})
        self._save()  # the journal is on disk before the first file is replaced
        for change in todo:
            try:
                _put(real, change.path, None if change.after is None else self.view / change.path)
                report.done.append(change.path)
            except OSError as exc:
                report.skipped[change.path] = f"could not be written: {exc.strerror or exc}"
            except OperationFailed as exc:
                report.skipped[change.path] = f"could not be written: {exc}"
        self._meta["status"] = "partly applied" if self.pending() else "applied"
        self._save()
        return report

    def undo(self) -> ApplyReport:
        """Put back what `apply` replaced, newest first. Refused as a whole (nothing undone) when a path
        was changed in the workspace since it was applied."""
        report = ApplyReport()
        batches = self._meta["journal"]
        if not batches:
            raise InvalidInput(f"run {self.run_id} has nothing applied to undo")
        records = [r for batch in reversed(batches) for r in reversed(batch["changes"])]
        for r in records:
            now = entry_of(self.workspace / r["path"])
            if (None if now is None else now.to_json()) != r["after"]:
                report.skipped[r["path"]] = "changed in the workspace since it was applied"
        if report.skipped:
            return report
        real = Beneath(self.workspace)
        for r in records:
            blob = None if r["blob"] is None else self.dir / "journal" / r["blob"]
            _put(real, r["path"], blob, mode=None if r["before"] is None else r["before"][2],
                 link=bool(r["before"] and r["before"][0]))
            report.done.append(r["path"])
        self._meta["journal"] = []
        self._meta["status"] = "undone"
        self._save()
        return report

    def discard(self) -> None:
        """Drop the staged copy (what was applied stays applied; `undo` still works). A later write
        (the next turn of a chat) makes a new copy of the workspace as it is then."""
        with self._lock:
            shutil.rmtree(self.dir / "made", ignore_errors=True)
            self._base_cache = None
        if not self._meta["journal"]:  # nothing applied stays: the stage is done with
            self._meta["status"] = "discarded"
        self._save()

    def remove(self) -> None:
        """Delete the stage entirely (a run that changed nothing leaves nothing behind)."""
        shutil.rmtree(self.dir, ignore_errors=True)

    def _save_blob(self, path: Path) -> str:
        """A copy of `path` (a file, or a link as a link) in the journal; its name there."""
        journal = self.dir / "journal"
        journal.mkdir(exist_ok=True)
        name = uuid.uuid4().hex
        if path.is_symlink():
            os.symlink(os.readlink(path), journal / name)
        else:
            shutil.copy2(path, journal / name, follow_symlinks=False)
        return name


# ---- helpers ----------------------------------------------------------------------------------------


def _select(changes: list[Change], paths: Iterable[str] | None, *, explicit_only: bool) -> tuple[list[Change], ApplyReport]:
    """The changes `paths` names (a directory: what is under it); with no paths, all of them, less the
    code run later when `explicit_only`."""
    report = ApplyReport()
    if paths is None:
        chosen = []
        for c in changes:
            if explicit_only and c.runs_later:
                report.skipped[c.path] = f"runs later ({c.runs_later}): apply it by name"
            else:
                chosen.append(c)
        return chosen, report
    wanted = [os.path.normpath(p).strip("/") or "." for p in paths]
    if any(w == ".." or w.startswith("../") for w in wanted):
        raise InvalidInput("paths must be relative to the workspace, without '..'")
    chosen: list[Change] = []
    for c in changes:
        if not any(w == "." or c.path == w or c.path.startswith(w + "/") for w in wanted):
            continue
        if c.runs_later and c.path not in wanted:
            report.skipped[c.path] = f"runs later ({c.runs_later}): apply it by name"
            continue
        chosen.append(c)
    for w in wanted:
        if w != "." and not any(c.path == w or c.path.startswith(w + "/") for c in changes):
            report.skipped[w] = "not among the run's changes"
    return chosen, report


def _text(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []


def _walk(root: Path, *, skip_top: set[str]) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) of every regular file and symbolic link under `root`, not following links."""
    stack = [("", root)]
    while stack:
        prefix, directory = stack.pop()
        try:
            it = os.scandir(directory)
        except OSError:
            continue
        with it:
            for item in it:
                rel = prefix + item.name
                if not prefix and item.name in skip_top:
                    continue
                info = item.stat(follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    stack.append((rel + "/", Path(item.path)))
                elif stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode):
                    yield rel, info


def _copy_tree(real: Path, view: Path, *, exclude: Path) -> tuple[dict[str, list[Any]], list[str]]:
    """Copy the workspace `real` to `view` (PASSTHROUGH left out at the top, their mount points made
    empty; the directory `exclude` left out wherever it is); the manifest (path -> [link, size, mode,
    digest, inode, ctime]) and the paths not copied."""
    manifest: dict[str, list[Any]] = {}
    skipped: list[str] = []
    owner = os.lstat(real)
    view.mkdir(mode=0o700)
    count = size = 0
    root_like = os.geteuid() == 0
    stack = [("", real, view)]
    while stack:
        prefix, src_dir, dst_dir = stack.pop()
        with os.scandir(src_dir) as it:
            entries = list(it)
        for item in entries:
            rel = prefix + item.name
            src, dst = Path(item.path), dst_dir / item.name
            info = item.stat(follow_symlinks=False)
            if not prefix and item.name in PASSTHROUGH:
                if stat.S_ISDIR(info.st_mode):
                    dst.mkdir()  # where the sandbox mounts the real one, read-only
                continue
            count += 1
            if count > MAX_FILES:
                raise InvalidInput(f"the workspace {real} has more than {MAX_FILES:,} files to stage; choose a "
                                   "smaller workspace (--workspace) or run with --no-stage")
            if stat.S_ISDIR(info.st_mode):
                if src == exclude:
                    continue
                dst.mkdir(mode=0o700)
                stack.append((rel + "/", src, dst))
                # permissions set after its content is copied would be simpler; 0o700 now, the real mode below
                os.chmod(dst, stat.S_IMODE(info.st_mode) | 0o700)
            elif stat.S_ISLNK(info.st_mode):
                target = os.readlink(src)
                os.symlink(target, dst)
                digest = hashlib.sha256(target.encode("utf-8", "surrogateescape")).hexdigest()
                copied = os.lstat(dst)
                manifest[rel] = [True, len(target), 0, digest, copied.st_ino, copied.st_ctime_ns]
            elif stat.S_ISREG(info.st_mode):
                size += info.st_size
                if size > MAX_BYTES:
                    raise InvalidInput(f"the workspace {real} holds more than {MAX_BYTES:,} bytes to stage; choose "
                                       "a smaller workspace (--workspace) or run with --no-stage")
                try:
                    digest = _copy_file(src, dst, info)
                except PermissionError:
                    skipped.append(rel)
                    continue
                copied = os.lstat(dst)
                manifest[rel] = [False, info.st_size, stat.S_IMODE(info.st_mode) & ~(stat.S_ISUID | stat.S_ISGID),
                                 digest, copied.st_ino, copied.st_ctime_ns]
            else:
                skipped.append(rel)  # FIFOs, sockets, devices: not staged
                continue
            if root_like:  # the sandbox runs commands as the workspace's owner: the copy is theirs too
                with contextlib.suppress(OSError):
                    os.lchown(dst, info.st_uid, info.st_gid)
                if rel in manifest:  # lchown moved its ctime: the manifest keeps the copy's last one
                    manifest[rel][5] = os.lstat(dst).st_ctime_ns
    if root_like:
        with contextlib.suppress(OSError):
            os.chown(view, owner.st_uid, owner.st_gid)
    os.chmod(view, stat.S_IMODE(owner.st_mode) | 0o700)
    return manifest, skipped


def _put(real: Beneath, rel: str, source: Path | None, *, mode: int | None = None, link: bool | None = None) -> None:
    """Make `rel` in the workspace what `source` is (a file or a link), or remove it when None: written
    beside the target and renamed over it, no symbolic link followed on the way."""
    parent, _, name = rel.rpartition("/")
    if source is None:
        try:
            dir_fd = real.open_dir(parent)
        except FileNotFoundError:
            return
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
        return
    dir_fd = real.open_dir(parent, create=True)
    try:
        tmp = f".{uuid.uuid4().hex[:12]}.tether-apply"
        is_link = source.is_symlink() if link is None else link
        if is_link:
            os.symlink(os.readlink(source), tmp, dir_fd=dir_fd)
        else:
            info = os.lstat(source)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
            try:
                with open(source, "rb", buffering=0) as fh:
                    while chunk := fh.read(_CHUNK):
                        view = memoryview(chunk)
                        while view:
                            view = view[os.write(fd, view):]
                bits = stat.S_IMODE(info.st_mode) if mode is None else mode
                os.fchmod(fd, bits & ~(stat.S_ISUID | stat.S_ISGID))
            finally:
                os.close(fd)
        try:
            old = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            old = None
        if old is not None and stat.S_ISDIR(old.st_mode):
            os.unlink(tmp, dir_fd=dir_fd)
            raise OperationFailed(f"a directory is in the way of {rel}")
        if old is not None and os.geteuid() == 0:
            with contextlib.suppress(OSError):
                os.chown(tmp, old.st_uid, old.st_gid, dir_fd=dir_fd, follow_symlinks=False)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


__all__ = ["PASSTHROUGH", "ApplyReport", "Change", "FileState", "StageExists", "StagedWorkspace", "entry_of", "stages_dir"]
