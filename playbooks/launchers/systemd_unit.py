"""systemd's unit-file syntax, as far as the server's command line needs it (pure functions).

kvpilot never edits an operator's unit file. It reads the unit as `systemctl cat` prints it (the
unit file, then every drop-in, each behind a `# /path` line), finds the `ExecStart=` that systemd
would run, and writes its own command line into a drop-in that resets `ExecStart=` first.

Quoting follows systemd.service(5) "Command lines": words split on whitespace, double or single
quotes around a word, C-style escapes. `$VAR`, `${VAR}` and `%` specifiers are left as written in
both directions, so an operator's `--port ${PORT}` keeps meaning what it meant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Characters a word may hold without quotes. `$` and `%` stay bare on purpose (see above).
_SAFE_WORD = re.compile(r"^[A-Za-z0-9_@%+=:,./$-]+$")
_EXEC_PREFIXES = "@-:+!|"
_SIMPLE_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "s": " ",
    "\\": "\\",
    '"': '"',
    "'": "'",
}


class UnitSyntaxError(ValueError):
    pass


@dataclass(frozen=True)
class ExecCommand:
    prefix: str  # systemd's special executable prefixes, such as "-" or "+", kept as written
    argv: list[str]


@dataclass(frozen=True)
class UnitFile:
    path: str
    text: str


def quote_word(word: str) -> str:
    """One argument as systemd reads it back unchanged."""
    if _SAFE_WORD.match(word):
        return word
    out = []
    for ch in word:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def format_exec(command: ExecCommand) -> str:
    return command.prefix + " ".join(quote_word(w) for w in command.argv)


def _unescape(text: str, i: int) -> tuple[str, int]:
    """The C-style escape starting at text[i] == "\\": (its character, the index after it)."""
    if i + 1 >= len(text):
        raise UnitSyntaxError("a command line ends in a lone backslash")
    ch = text[i + 1]
    if ch in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[ch], i + 2
    if ch == "x" and re.fullmatch(r"[0-9a-fA-F]{2}", text[i + 2 : i + 4]):
        return chr(int(text[i + 2 : i + 4], 16)), i + 4
    if ch in "01234567" and re.fullmatch(r"[0-7]{3}", text[i + 1 : i + 4]):
        return chr(int(text[i + 1 : i + 4], 8)), i + 4
    if ch == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[i + 2 : i + 6]):
        return chr(int(text[i + 2 : i + 6], 16)), i + 6
    if ch == "U" and re.fullmatch(r"[0-9a-fA-F]{8}", text[i + 2 : i + 10]):
        return chr(int(text[i + 2 : i + 10], 16)), i + 10
    # systemd keeps an unknown escape as written (its "relaxed" unescaping).
    return "\\" + ch, i + 2


def split_words(text: str) -> list[str]:
    """systemd's word splitting with quotes and escapes."""
    words: list[str] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in " \t":
            i += 1
        if i >= n:
            return words
        word: list[str] = []
        while i < n and text[i] not in " \t":
            ch = text[i]
            if ch in "\"'":
                quote, i = ch, i + 1
                while True:
                    if i >= n:
                        raise UnitSyntaxError(f"unbalanced quoting in: {text}")
                    ch = text[i]
                    if ch == quote:
                        i += 1
                        break
                    if ch == "\\":
                        piece, i = _unescape(text, i)
                        word.append(piece)
                        continue
                    word.append(ch)
                    i += 1
            elif ch == "\\":
                piece, i = _unescape(text, i)
                word.append(piece)
            else:
                word.append(ch)
                i += 1
        words.append("".join(word))


def parse_exec(value: str) -> ExecCommand:
    value = value.strip()
    i = 0
    while i < len(value) and value[i] in _EXEC_PREFIXES:
        i += 1
    return ExecCommand(value[:i], split_words(value[i:]))


def entries(text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) for every assignment, with continuation lines joined."""
    out: list[tuple[str, str, str]] = []
    section = ""
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if pending:
            if line.startswith(("#", ";")):
                continue  # systemd skips comments inside a continued line
            line = pending + " " + line
            pending = ""
        elif not line or line.startswith(("#", ";")):
            continue
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        if "=" not in line:
            raise UnitSyntaxError(f"not an assignment: {line}")
        key, value = line.split("=", 1)
        out.append((section, key.strip(), value.strip()))
    if pending and "=" in pending:  # a last line ending in a backslash
        key, value = pending.split("=", 1)
        out.append((section, key.strip(), value.strip()))
    return out


def split_cat_output(text: str, unit: str) -> list[UnitFile]:
    """The files `systemctl cat UNIT` printed, in the order systemd applies them.

    A file begins with a `# /absolute/path` line at the top or after a blank line, naming the unit
    itself or a `.conf` drop-in in a `UNIT.d/` directory (so a comment in a unit is not mistaken
    for a file boundary).
    """
    files: list[UnitFile] = []
    path: str | None = None
    body: list[str] = []
    previous_blank = True
    for line in text.splitlines():
        name = line[2:]
        header = line.startswith("# /") and " " not in name and previous_blank
        ours = name.endswith("/" + unit) or (f"/{unit}.d/" in name and name.endswith(".conf"))
        if header and ours:
            if path is not None:
                files.append(UnitFile(path, "\n".join(body).rstrip("\n") + "\n"))
            path, body = name, []
        elif path is not None:
            body.append(line)
        previous_blank = not line.strip()
    if path is not None:
        files.append(UnitFile(path, "\n".join(body).rstrip("\n") + "\n"))
    return files


def effective_exec_start(files: list[UnitFile], skip: str | None = None) -> ExecCommand | None:
    """The single command systemd would start, applying resets (`ExecStart=`) in file order.

    `skip` leaves one file out (kvpilot's own drop-in, to learn the operator's command).
    """
    commands: list[ExecCommand] = []
    for f in files:
        if f.path == skip:
            continue
        for section, key, value in entries(f.text):
            if section != "Service" or key != "ExecStart":
                continue
            if not value:
                commands = []
            else:
                commands.append(parse_exec(value))
    if not commands:
        return None
    if len(commands) > 1:
        raise UnitSyntaxError(
            f"the unit starts {len(commands)} commands (ExecStart= given more than once); "
            "kvpilot manages a unit with a single SGLang command"
        )
    return commands[0]


def render_dropin(command: ExecCommand) -> str:
    return (
        "# Written by kvpilot: the SGLang command line under its control. The unit file itself\n"
        "# is not edited; delete this file and run `systemctl daemon-reload` to return to it.\n"
        "[Service]\n"
        "ExecStart=\n"
        f"ExecStart={format_exec(command)}\n"
    )
