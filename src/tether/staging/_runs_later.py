"""Which staged changes are code that a common tool runs later, implicitly, outside any sandbox.

Recognised by what a file is, not only by its name: a directory shaped like a git repository is one
whatever it is called (a `HEAD` file beside `objects/` or `refs/`, or a `.git` file pointing at one),
and a file that parses as a git config with a key that runs a program is one wherever it lies. The
classes (docs/safety.md, "Staged changes"):

- git: a git-repository-shaped directory, a `.git` file (gitdir pointer), a git config key that runs
  a program (core.fsmonitor, core.hooksPath, core.pager, core.editor, core.sshCommand, diff/merge/filter
  drivers, aliases starting with `!`, credential helpers ...), anything under a `hooks/` directory
  of such a repository, `.gitmodules`;
- Python start-up: `*.pth`, `sitecustomize.py`, `usercustomize.py` anywhere;
- executables: a new file with an execute bit, or an execute bit added; anything in a virtualenv's
  `bin/` (a directory beside a `pyvenv.cfg`);
- shell environments: `.envrc` (direnv), `.env.local`-style files are data and not listed;
- CI, build and editor hooks: `.github/workflows/*`, `.gitlab-ci.yml`, `.circleci/*`, `.travis.yml`,
  `azure-pipelines.yml`, `Jenkinsfile`, `.pre-commit-config.yaml`, `.husky/*`, `.devcontainer/*`,
  `.vscode/tasks.json` and `settings.json`, `setup.py`, `package.json` with install-time scripts;
- a symbolic link that points out of the workspace (what is later written through it lands there).

A change is flagged when any class matches; the review shows it apart and it is applied only when
named on its own (never by "apply all").
"""

from __future__ import annotations

import configparser
import json
import os
import re
from pathlib import Path

# git config keys (section.key, or section.*.key for subsections) whose value git runs as a program
_GIT_RUNS = re.compile(
    r"^(core\.(fsmonitor|hookspath|pager|editor|sshcommand|askpass|gitproxy|alternaterefscommand)"
    r"|sequence\.editor|gpg(\.[^.]+)?\.program|credential(\..+)?\.helper|diff\..+\.(textconv|command)"
    r"|merge\..+\.driver|filter\..+\.(clean|smudge|process)|pager\..+|alias\..+|uploadpack\.packobjectshook"
    r"|remote\..+\.(uploadpack|receivepack|vcs)|include(if\..+)?\.path|ssh\.variant|web\.browser"
    r"|browser\..+\.cmd|man\..+\.cmd|difftool\..+\.cmd|mergetool\..+\.cmd|core\.worktree)$"
)
_CI_FILES = {".gitlab-ci.yml", ".travis.yml", "azure-pipelines.yml", "Jenkinsfile", ".pre-commit-config.yaml",
             "setup.py", ".envrc", ".gitmodules", "bitbucket-pipelines.yml"}
_CI_DIRS = (".github/workflows/", ".circleci/", ".husky/", ".githooks/", ".devcontainer/")
_EDITOR_FILES = (".vscode/tasks.json", ".vscode/settings.json")
_NPM_HOOKS = {"preinstall", "install", "postinstall", "prepare", "prepublish", "preprepare", "postprepare"}


def git_dir_shaped(directory: Path) -> bool:
    """Whether `directory` looks like a git repository's directory (whatever its name)."""
    try:
        return (directory / "HEAD").is_file() and (
            (directory / "objects").is_dir() or (directory / "refs").is_dir() or (directory / "commondir").is_file())
    except OSError:
        return False


def git_config_runs(text: str) -> str | None:
    """The first key of a git config text that makes git run a program, or None (also None for a text
    that is not a git config)."""
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    try:
        parser.read_string(text)
    except configparser.Error:
        # git is laxer than configparser: look line by line for a key that runs something
        for line in text.splitlines():
            key = line.strip().split("=", 1)[0].strip().lower()
            if key in ("fsmonitor", "hookspath", "pager", "editor", "sshcommand", "textconv", "clean", "smudge",
                       "process", "helper", "program", "askpass", "worktree"):
                return key
        return None
    for section in parser.sections():
        name, _, sub = section.partition(" ")
        for key in parser.options(section):
            full = f"{name.lower()}.{sub.strip().strip(chr(34))}.{key}" if sub else f"{name.lower()}.{key}"
            if _GIT_RUNS.match(full.lower()) or _GIT_RUNS.match(f"{name.lower()}.{key}"):
                return full
    return None


def runs_later(path: str, view: Path, *, mode_before: int | None, mode_after: int | None) -> str | None:
    """Why the changed `path` (relative, in the staged `view`; `mode_*`: permission bits before and
    after, None where absent) is code that runs later, or None."""
    parts = path.split("/")
    name = parts[-1]
    # git: a repository-shaped directory among its ancestors, a gitdir pointer, a config that runs programs
    for depth in range(len(parts) - 1, -1, -1):
        ancestor = "/".join(parts[:depth])
        if git_dir_shaped(view / ancestor if ancestor else view):
            where = f"{ancestor}/" if ancestor else "the workspace root"
            return f"inside a directory shaped like a git repository ({where}): git may run code from it"
    if name == ".git":
        return "a .git entry: git reads its configuration (and may run programs) from what it names"
    target = view / path
    if target.is_symlink():
        link = os.readlink(target)
        inside = os.path.normpath(os.path.join(os.path.dirname(path), link))
        if os.path.isabs(link) or inside == ".." or inside.startswith("../"):
            return f"a symbolic link out of the workspace (to {link}): what is written through it lands there"
    if mode_after is not None and target.is_file() and not target.is_symlink():
        try:
            head = target.open("rb").read(65_536)
        except OSError:
            head = b""
        if name == "config" or name.endswith((".gitconfig", ".config")) or b"[core]" in head or b"[alias]" in head:
            key = git_config_runs(head.decode("utf-8", errors="replace"))
            if key is not None:
                return f"a git config that runs a program ({key})"
        if name == "package.json":
            try:
                scripts = json.loads(head.decode("utf-8", errors="replace")).get("scripts") or {}
            except (ValueError, AttributeError):
                scripts = {}
            hooks = sorted(_NPM_HOOKS & set(scripts)) if isinstance(scripts, dict) else []
            if hooks:
                return f"package.json with install-time scripts ({', '.join(hooks)}): npm runs them"
    startup = next((part for part in parts if part.split(".", 1)[0] in ("sitecustomize", "usercustomize")), None)
    if name.endswith(".pth") or startup is not None:  # a module, a package or an extension of that name
        return f"{startup or name}: Python runs it at start-up"
    if name in _CI_FILES or any(path.startswith(d) for d in _CI_DIRS) or path in _EDITOR_FILES:
        return f"{name}: a CI, build, editor or shell hook runs it"
    if len(parts) >= 2 and parts[-2] in ("bin", "Scripts") and (view / "/".join(parts[:-2]) / "pyvenv.cfg").is_file():
        return "in a virtualenv's bin/: run when the environment is used"
    if mode_after is not None and mode_after & 0o111 and (mode_before is None or not mode_before & 0o111):
        return "an executable file (execute bit set)"
    return None


__all__ = ["git_config_runs", "git_dir_shaped", "runs_later"]
