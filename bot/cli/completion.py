"""`kvpilot completion bash`: a bash completion script made from the CLI's own parser.

Made from the parser, the script cannot fall behind a new command or flag. It completes the
commands, their verbs (with `experiment run|list|show|...`, the grammar `normalise` reads),
each command's flags, and the values of flags with fixed choices (`-o text|json`); a flag that
takes a path or a name falls back to file names. zsh runs it through `bashcompinit`.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterator
from typing import TextIO


def nodes(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every (command path, parser) of the tree, the top first."""
    yield path, parser
    for action in parser._actions:  # argparse keeps its tree here; it has no public walk
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from nodes(child, (*path, name))


def subcommands(parser: argparse.ArgumentParser) -> list[str]:
    return [
        name
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name in action.choices
    ]


class Tables:
    """What the script looks up by command path ("kvpilot/experiments/list"): the verbs below
    it, the positional words it takes (`server start|stop|status`), its flags, the fixed values
    of a flag ("PATH FLAG"), and the flags that take a free value."""

    def __init__(self, parser: argparse.ArgumentParser, root: str) -> None:
        self.subs: dict[str, list[str]] = {}
        self.words: dict[str, list[str]] = {}
        self.opts: dict[str, list[str]] = {}
        self.choices: dict[str, list[str]] = {}
        self.values: dict[str, list[str]] = {}
        for path, node in nodes(parser):  # bash's arrays take no empty key: the root has one
            self.add("/".join((root, *path)), node)

    def add(self, key: str, node: argparse.ArgumentParser) -> None:
        self.subs[key] = subcommands(node)
        self.words[key] = []
        self.opts[key] = sorted(o for a in node._actions for o in a.option_strings if o != "-h")
        for action in node._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            fixed = [str(c) for c in action.choices] if action.choices is not None else None
            if not action.option_strings and fixed:
                self.words[key] += fixed
            for option in action.option_strings:
                if fixed:
                    self.choices[f"{key} {option}"] = fixed
                elif action.nargs != 0:
                    self.values[f"{key} {option}"] = ["1"]

    def alias(self, alias: str, source: str) -> None:
        """`alias` completes as `source` does (`experiment list` as `experiments list`)."""
        for table in (self.subs, self.words, self.opts):
            table[alias] = table[source]
        for table in (self.choices, self.values):
            for k, v in list(table.items()):
                if k.startswith(source + " "):
                    table[alias + k[len(source) :]] = v


def bash_script(parser: argparse.ArgumentParser, prog: str = "kvpilot") -> str:
    t = Tables(parser, prog)
    ex, exs = f"{prog}/experiment", f"{prog}/experiments"
    if exs in t.subs and ex in t.subs:
        # `experiment VERB` as `normalise` reads it: run is `experiment`, the others
        # `experiments VERB`
        verbs = ["run", *t.subs[exs]]
        for verb in verbs:
            t.alias(f"{ex}/{verb}", ex if verb == "run" else f"{exs}/{verb}")
        t.subs[ex] = verbs

    def table(name: str, values: dict[str, list[str]]) -> str:
        rows = "".join(
            f"    [{shlex.quote(k)}]={shlex.quote(' '.join(v))}\n"
            for k, v in sorted(values.items())
        )
        return f"declare -gA {name}=(\n{rows})\n"

    fn = f"_{prog}_complete"
    return (
        f"# bash completion for {prog}: made by `{prog} completion bash`\n"
        + table(f"_{prog}_subs", t.subs)
        + table(f"_{prog}_words", t.words)
        + table(f"_{prog}_opts", t.opts)
        + table(f"_{prog}_choices", t.choices)
        + table(f"_{prog}_values", t.values)
        + f"""{fn}() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    local path="{prog}" i w
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${{COMP_WORDS[i]}}"
        [[ "$w" == -* ]] && continue
        if [[ " ${{_{prog}_subs[$path]}} " == *" $w "* ]]; then
            path="$path/$w"
        fi
    done
    if [[ -n "${{_{prog}_choices[$path $prev]+x}}" ]]; then
        COMPREPLY=($(compgen -W "${{_{prog}_choices[$path $prev]}}" -- "$cur"))
        return
    fi
    if [[ -n "${{_{prog}_values[$path $prev]+x}}" ]]; then
        COMPREPLY=()  # a value: file names (complete -o default)
        return
    fi
    local offer="${{_{prog}_subs[$path]}} ${{_{prog}_words[$path]}} ${{_{prog}_opts[$path]}}"
    COMPREPLY=($(compgen -W "$offer" -- "$cur"))
}}
complete -o default -F {fn} {prog}
"""
    )


def completion(parser: argparse.ArgumentParser, shell: str, out: TextIO) -> int:
    if shell == "zsh":  # the same script, through zsh's bash completion layer
        out.write("autoload -U +X bashcompinit && bashcompinit\n")
    out.write(bash_script(parser))
    return 0
