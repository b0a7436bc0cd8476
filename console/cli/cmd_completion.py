"""`k26-console completion bash|zsh`: the shell completion script, for `eval` or a completions dir.

Commands and options come from the parser itself, through its shape (console/cli/shape.py: made from the
parser, shipped as data, held equal to it by a test), so the script cannot drift from the command line.
Host and profile names change after the script is installed, so it asks for them when it completes:
`k26-console completion --names hosts|profiles` prints them, one a line (nothing when there are none or
the hosts file cannot be read: a completion never prints an error into the command line).
"""

from __future__ import annotations

import argparse
import shlex
import sys

from console.cli.errors import EXIT_OK, UsageError
from console.cli.shape import Shape, load_shape

_HOST_FIRST = ("apply", "restart", "rollback", "confirm", "audit", "probe", "verify", "open")
"""Commands whose first positional argument is a host."""
_NAME_OPTIONS = {"--profile": "profiles", "--host": "hosts"}
_FILE_OPTIONS = ("--hosts", "--journal", "--state-dir", "--dir")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "completion",
        help="print the bash or zsh completion script (commands, options, host and profile names)",
        description=(
            'Print a completion script for SHELL. bash: eval "$(k26-console completion bash)" in ~/.bashrc. '
            'zsh: eval "$(k26-console completion zsh)" in ~/.zshrc (after compinit). Host names come from '
            "hosts.toml and profile names from the profile directories when you press Tab."
        ),
    )
    p.add_argument("shell", nargs="?", choices=("bash", "zsh"), metavar="SHELL", help="bash or zsh")
    p.add_argument(
        "--names",
        choices=("hosts", "profiles"),
        help="print the host or profile names, one a line (what the script asks for on Tab)",
    )
    p.add_argument("--hosts", metavar="FILE", help="with --names hosts: the hosts file to read")
    p.set_defaults(func=run)


def names(kind: str, hosts_file: str | None = None) -> list[str]:
    """The names the script offers; nothing when they cannot be read."""
    if kind == "hosts":
        from console.sources.hosts import HostsError, load_hosts

        try:
            return sorted(load_hosts(hosts_file).hosts)
        except HostsError:
            return []
    from console.sources.profile_store import ProfileStore

    try:
        return sorted({entry.name for entry in ProfileStore().entries()})
    except OSError:
        return []


def bash_script(shape: Shape) -> str:
    commands = shape["commands"]
    valued = sorted({option for c in commands.values() for option in c["valued"]})
    option_cases = "\n".join(
        f"        {shlex.quote(name)}) opts={shlex.quote(' '.join(c['options']))} ;;"
        for name, c in commands.items()
    )
    if "open" in commands:  # `k26-console HOST --...` is `open HOST --...`
        option_cases += f"\n        *) opts={shlex.quote(' '.join(commands['open']['options']))} ;;"
    actions = " ".join(commands["profiles"]["actions"]) if "profiles" in commands else ""
    return f"""# k26-console completion for bash (k26-console completion bash)
_k26_console_names() {{
    # Host names from the hosts file the command line names with --hosts, if it names one.
    local i file=""
    for (( i=1; i < ${{#COMP_WORDS[@]}}; i++ )); do
        case "${{COMP_WORDS[i]}}" in
            --hosts) file="${{COMP_WORDS[i+1]}}" ;;
            --hosts=*) file="${{COMP_WORDS[i]#--hosts=}}" ;;
        esac
    done
    if [[ "$1" == hosts && -n "$file" ]]; then
        command k26-console completion --names hosts --hosts "$file" 2>/dev/null
    else
        command k26-console completion --names "$1" 2>/dev/null
    fi
}}

_k26_console() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    local valued=" {" ".join(valued)} "
    COMPREPLY=()
    case "$prev" in
        {"|".join(_FILE_OPTIONS)})
            COMPREPLY=( $(compgen -f -- "$cur") ); return ;;
        --profile)
            COMPREPLY=( $(compgen -W "$(_k26_console_names profiles)" -- "$cur") ); return ;;
        --host)
            COMPREPLY=( $(compgen -W "$(_k26_console_names hosts)" -- "$cur") ); return ;;
    esac
    if [[ $COMP_CWORD -eq 1 ]]; then
        if [[ "$cur" == -* ]]; then
            COMPREPLY=( $(compgen -W "--help --version" -- "$cur") )
        else
            COMPREPLY=( $(compgen -W "{" ".join(commands)} $(_k26_console_names hosts)" -- "$cur") )
        fi
        return
    fi
    local cmd="${{COMP_WORDS[1]}}" opts=""
    if [[ "$cur" == -* ]]; then
        case "$cmd" in
{option_cases}
        esac
        COMPREPLY=( $(compgen -W "$opts" -- "$cur") )
        return
    fi
    # The positional arguments before the cursor, options and their values skipped.
    local i n=0 word
    for (( i=2; i < COMP_CWORD; i++ )); do
        word="${{COMP_WORDS[i]}}"
        if [[ "$word" == -* ]]; then
            [[ "$word" != *=* && "$valued" == *" $word "* ]] && (( i++ ))
            continue
        fi
        (( n++ ))
    done
    case "$cmd" in
        {"|".join(_HOST_FIRST)})
            if [[ $n -eq 0 ]]; then
                COMPREPLY=( $(compgen -W "$(_k26_console_names hosts)" -- "$cur") )
            elif [[ "$cmd" == apply && $n -eq 1 ]]; then
                COMPREPLY=( $(compgen -W "$(_k26_console_names profiles)" -- "$cur") )
                [[ ${{#COMPREPLY[@]}} -eq 0 ]] && COMPREPLY=( $(compgen -f -- "$cur") )
            fi ;;
        profiles)
            if [[ $n -eq 0 ]]; then
                COMPREPLY=( $(compgen -W "{actions}" -- "$cur") )
            else
                COMPREPLY=( $(compgen -W "$(_k26_console_names profiles)" -- "$cur") )
            fi ;;
        parse|plan)
            COMPREPLY=( $(compgen -f -- "$cur") ) ;;
        completion)
            [[ $n -eq 0 ]] && COMPREPLY=( $(compgen -W "bash zsh" -- "$cur") ) ;;
    esac
}}
complete -o default -F _k26_console k26-console
"""


def zsh_script(shape: Shape) -> str:
    # zsh runs bash completion functions through bashcompinit: one script, the same answers in both.
    return (
        "# k26-console completion for zsh (k26-console completion zsh)\n"
        "autoload -U +X compinit && { (( ${+_comps} )) || compinit; }\n"
        "autoload -U +X bashcompinit && bashcompinit\n" + bash_script(shape).split("\n", 1)[1]
    )


def run(args: argparse.Namespace) -> int:
    if args.names:
        found = names(args.names, args.hosts)
        sys.stdout.write("".join(f"{name}\n" for name in found if name.isprintable()))
        return EXIT_OK
    if args.shell is None:
        raise UsageError("name the shell: k26-console completion bash, or k26-console completion zsh.")
    shape = load_shape()  # the parser's shape, shipped: no command module is imported (console/cli/shape.py)
    sys.stdout.write(bash_script(shape) if args.shell == "bash" else zsh_script(shape))
    return EXIT_OK
