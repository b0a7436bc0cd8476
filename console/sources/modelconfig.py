"""Find and read a model's config.json on a host, as SGLang finds it, size-limited.

`--model-path` is a local directory (absolute, or relative to the unit's WorkingDirectory=) or a Hugging
Face repository id, looked up in the hub cache (`models--ORG--NAME/refs/REV` → `snapshots/REV/`). One
POSIX shell script does the lookup on the host (no Python needed there: a unit whose interpreter cannot
be asked still has its model read) and sends the file only when it is under the limit.
"""

from __future__ import annotations

from console.core.hostfacts import CONFIG_MAX_BYTES
from console.core.models import ModelConfigError, ModelSpec, parse_hf_config
from console.core.text import split_lines
from console.sources.transport import CommandResult

# Finds and reads a model's config.json as SGLang would find it; prints one status line
# (`ok SIZE PATH`, `nocache DIR`, `missing PATH`, `unreadable PATH`, `huge SIZE PATH`) and, for ok, the
# file after it. Arguments: model path, revision, hub dir ('~/' = the unit user's home), working
# directory, unit user, size limit.
CONFIG_SCRIPT = r"""
model=$1 rev=$2 hub=$3 wd=$4 user=$5 limit=$6
home=$HOME
if [ -n "$user" ]; then
  h=$(getent passwd "$user" 2>/dev/null | cut -d: -f6)
  [ -n "$h" ] && home=$h
fi
case $hub in "~/"*) hub=$home/${hub#"~/"} ;; esac
dir=
case $model in
  /*) dir=$model ;;
  *) if [ -n "$wd" ] && [ -d "$wd/$model" ]; then dir=$wd/$model; fi ;;
esac
if [ -z "$dir" ]; then
  case $model in */*/*|.*|*/) echo "missing $model"; exit 0 ;; esac
  repo=$hub/models--$(printf '%s' "$model" | sed 's#/#--#')
  if [ ! -d "$repo" ]; then echo "nocache $repo"; exit 0; fi
  r=${rev:-main}
  if [ -f "$repo/refs/$r" ]; then r=$(head -c 128 "$repo/refs/$r"); fi
  dir=$repo/snapshots/$r
fi
f=$dir/config.json
if [ ! -e "$f" ]; then echo "missing $f"; exit 0; fi
if [ ! -f "$f" ] || ! size=$(wc -c < "$f" 2>/dev/null); then echo "unreadable $f"; exit 0; fi
size=$(printf '%s' "$size" | tr -d ' ')
if [ "$size" -gt "$limit" ]; then echo "huge $size $f"; exit 0; fi
echo "ok $size $f"
exec head -c "$limit" "$f"
"""


def config_argv(
    model_path: str, revision: str | None, hub: str, working_directory: str, user: str
) -> list[str]:
    """The command that looks the config.json up and prints it (every value a separate argument)."""
    return [
        "sh",
        "-c",
        CONFIG_SCRIPT,
        "sh",
        model_path,
        revision or "",
        hub,
        working_directory,
        user,
        str(CONFIG_MAX_BYTES),
    ]


def _first_line(result: CommandResult) -> str:
    line = result.first_error_line() or next(iter(split_lines(result.stdout)), "")
    return line.strip()[:200] or f"exit status {result.exit_status}"


def read_config_answer(
    result: CommandResult, model_path: str, host: str
) -> tuple[ModelSpec | None, str | None, str]:
    """(spec, the config.json's path on the host, where the spec came from or why there is none)."""
    status, _, body = result.stdout.partition("\n")
    word, _, rest = status.partition(" ")
    if word == "nocache":
        return None, None, f"there is no Hugging Face cache of {model_path} at {rest} on {host}"
    if word == "missing":
        return None, rest, f"{rest} does not exist on {host}"
    if word == "unreadable":
        return None, rest, f"{rest} on {host} cannot be read"
    if word == "huge":
        size, _, path = rest.partition(" ")
        return (
            None,
            path,
            f"{path} on {host} is {int(size):,} bytes, over the {CONFIG_MAX_BYTES:,} a config.json may have",
        )
    if word != "ok":
        return None, None, f"the config.json of {model_path} cannot be looked up ({_first_line(result)})"
    _, _, path = rest.partition(" ")
    if len(body.encode()) > CONFIG_MAX_BYTES:
        return None, path, f"{path} on {host} came back over {CONFIG_MAX_BYTES:,} bytes"
    try:
        spec = parse_hf_config(body, model_path)
    except ModelConfigError as exc:
        return None, path, f"{path} on {host}: {str(exc).rstrip('.')}"
    return spec, path, f"{path} on {host}"


__all__ = ["CONFIG_SCRIPT", "config_argv", "read_config_answer"]
