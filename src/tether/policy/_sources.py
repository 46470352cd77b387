"""Which secret-bearing source a call's path or command line names (a `.env`, a key file, the environment).

A text rule: exact for a path argument, and for a command line that names the file in a word the shell
passes on as it is (`cat ./.env`, `sh -c 'cat .env'`, `base64 .env`, `cp .env x && cat x`); it also sees
through quote removal (`cat .e""nv`) and a glob with two literal characters or more that matches a secret
file's name (`cat .en?`, `cat config/*.env`). It cannot see a name the shell computes (`cat $(printf
'\\x2eenv')`, `f=.e; cat ${f}nv`), a bare glob (`cat config/*`), nor a directory read whole (`tar c .`;
`grep -r KEY .` is known by its output's `.env:` lines instead). With a workspace
(`SafetyPolicy(workspace=)`, tether.policy._workspace) those reads of its secret files are known by
their output's values instead: docs/safety.md ("Secrets by value").
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any

from tether.policy._leaks import secret_file

ENVIRONMENT = "the environment"
# arguments naming what a call reads: a file's path, a command line
READS = frozenset({"file_path", "path", "file", "filename", "command", "cmd", "script"})
# arguments holding a command line (the rest that name what a call reads hold a path)
COMMAND_ARGS = frozenset({"command", "cmd", "script"})

_TOKEN = re.compile(r"""[^\s'"`<>|;&()=]+""")  # a path-like word in a command line or an argument
_QUOTES = re.compile(r"""["'\\]""")
_GLOB = re.compile(r"[*?\[]")
# names a glob is tried against: one of each kind secret_file knows
_SECRET_EXAMPLES = (".env", ".env.local", ".env.production", "prod.env", "id_rsa", "id_ed25519", "id_ecdsa",
                    "server.key", "server.pem", "cert.p12", "vault.kdbx", ".netrc", ".pgpass", ".npmrc",
                    ".pypirc", ".git-credentials", ".htpasswd", "credentials", "credentials.json",
                    "secrets.yaml", "secrets.json", "api_token.txt", "github.token", "db.password")
# reading the environment: a command that prints it, or a variable's value that is not a public one
# (`set`, `export`, `declare` print the variables only alone or with -p / -x: `set -e` sets an option)
# (`env` prints them alone or with -0; `env X=1 cmd` runs cmd, whose own reading no text shows)
_ENV_WORD = re.compile(r"(?<![\w./-])(?:printenv(?![\w./-])|"
                       r"env(?=\s*(?:$|[;&|)`]|-0\b|--null\b))|"
                       r"(?:set|export|declare|typeset)(?=\s*(?:$|[;&|)`]|-[px]+\b)))")
_VARIABLE = re.compile(r"\$\{?([A-Z][A-Z0-9_]*)")
# a variable the command sets itself (`X=1; echo $X`, `for F in *`, `read LINE`): its value is the command's
_ASSIGNED = re.compile(r"(?:^|[\s;&|(])([A-Z][A-Z0-9_]*)=|\bfor\s+([A-Z][A-Z0-9_]*)\s+in\b|"
                       r"\bread\s+(?:-\w+\s+)*([A-Z][A-Z0-9_]*)")
_PUBLIC_VARIABLES = frozenset({
    "PATH", "HOME", "PWD", "OLDPWD", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR",
    "HOSTNAME", "SHLVL", "IFS", "PS1", "PS2", "PS4", "RANDOM", "SECONDS", "LINENO", "BASH", "BASH_VERSION",
    "BASH_SOURCE", "FUNCNAME", "PIPESTATUS", "EUID", "UID", "PPID", "OPTARG", "OPTIND", "REPLY", "COLUMNS",
    "LINES", "EDITOR", "PAGER", "VIRTUAL_ENV", "PYTHONPATH", "CI"})
_PREFIXES = frozenset({"then", "do", "else", "sudo", "exec", "xargs", "command", "builtin", "time", "nohup", "-c"})
_PROC_ENVIRON = re.compile(r"/proc/(?:self|\d+|\$\$|\$\{?\w+\}?)/environ\b")


def _glob_match(word: str) -> str | None:
    """The glob's last part when it could match a secret file's name and has two literal characters or
    more (a bare `*` matches every name: counted, it would hide every `ls *`)."""
    name = word.rstrip("/").rsplit("/", 1)[-1]
    if len(_GLOB.sub("", re.sub(r"\[[^\]]*\]", "", name))) < 2:
        return None
    for example in _SECRET_EXAMPLES:
        # the shell's glob: a leading dot is matched only by a dot
        if (example.startswith(".") == name.startswith(".")) and fnmatch.fnmatchcase(example, name):
            return name
    return None


def _files(text: str) -> list[str]:
    found: list[str] = []
    for words in (_TOKEN.findall(text), _TOKEN.findall(_QUOTES.sub("", text))):
        for word in words:
            name = secret_file(word) if not _GLOB.search(word) else _glob_match(word)
            if name is not None and name not in found:
                found.append(name)
    return found


def reads_environment(command: str) -> bool:
    """Whether a command line reads the environment by a word the shell passes on: a command printing it
    (`env`, `printenv`, `export -p`, `declare -x`, `set`), `/proc/self/environ`, or the value of a
    variable that is not a public one (`$OPENAI_API_KEY`; `$HOME` and lower-case names are not)."""
    plain = _QUOTES.sub("", command)
    if _PROC_ENVIRON.search(plain):
        return True
    own = {name for m in _ASSIGNED.finditer(plain) for name in m.groups() if name}
    if any(m.group(1) not in _PUBLIC_VARIABLES and m.group(1) not in own for m in _VARIABLE.finditer(plain)):
        return True
    for m in _ENV_WORD.finditer(plain):
        # a command word: first on its line or after a separator, not an argument (`git config set`)
        before = plain[:m.start()].rstrip()
        if not before or before[-1] in ";&|({`$!\n" or before.rsplit(None, 1)[-1] in _PREFIXES:
            return True
    return False


def may_read_secrets(tool: Any) -> bool:
    """Whether some call of `tool` may read a secret-bearing source: it is declared `secret_output`, or it
    takes a path or a command line (READS) and writes no file (so the agent needs the query tool)."""
    declared = tool.declared
    if declared.secret_output:
        return True
    properties = tool.parameters.get("properties") if isinstance(tool.parameters, dict) else None
    return not declared.writes_path and isinstance(properties, dict) and not READS.isdisjoint(properties)


def secret_sources_named(key: str, text: str) -> list[str]:
    """The secret-bearing sources a call's argument `key` (a path, or a command line when `key` is in
    COMMAND_ARGS) names: secret files by name (`.env`, `id_ed25519`), and ENVIRONMENT for a command line
    that reads the environment or a path that is a process's environ."""
    found = _files(text)
    if key in COMMAND_ARGS:
        if reads_environment(text):
            found.append(ENVIRONMENT)
    elif _PROC_ENVIRON.search(text):
        found.append(ENVIRONMENT)
    return found


__all__ = ["COMMAND_ARGS", "ENVIRONMENT", "READS", "may_read_secrets", "reads_environment", "secret_sources_named"]
