"""The `sh` scripts that run on the host for sources/hoststate, one per operation (the design, and
why each one is safe against racing consoles, is in that module's docstring).

$1 is always the state directory; every script prints `now <host clock>` first.

The lock's operations (ACQUIRE, RELEASE, BREAK and LEAVE's release) take turns (`take_turn`): flock(1) on
the state directory itself, where the host has flock and its filesystem can lock a directory, so no file
of its own is added to the directory. The commit-confirmed rollback (console.core.confirm) releases a lock
under flock on `.lock.flock`: where that file is there, the turn takes it too. Without a turn (no flock,
a filesystem without locks) each operation is still safe on its own: the lock is only ever taken with
`ln` and removed after a rename that shows what was removed (see `RELEASE_LOCK`).
"""

__all__ = [
    "ACQUIRE",
    "APPEND",
    "BEAT_AND_READ",
    "BREAK",
    "FOLLOW_AUDIT",
    "HEARTBEAT",
    "LEAVE",
    "PRESENCE_NAME",
    "PROLOGUE",
    "PUT_FILE",
    "READ_AUDIT",
    "READ_PROLOGUE",
    "READ_STATE",
    "RELEASE",
    "REMOVE_FILE",
    "REMOVE_IF_UNCHANGED",
    "WHERE",
    "WRITE_PRESENCE",
]

READ_PROLOGUE = r"""
set -u
d=$1; shift
case $d in "~") d=$HOME ;; "~/"*) d=$HOME/${d#"~/"} ;; esac
printf 'now %s\n' "$(date +%s.%N 2>/dev/null || date +%s)"
"""
# Scripts that write make the directory first; readers leave a host they only look at untouched.
PROLOGUE = (
    READ_PROLOGUE
    + r"""mkdir -p "$d/presence" || exit 70
"""
)

# The lock operations' turn, held until the script exits (see the module's docstring). A flock that
# times out fails the operation (exit 73); one that cannot lock at all lets it go on alone.
TAKE_TURN = r"""
take_turn() {
  command -v flock >/dev/null 2>&1 || return 0
  # `command exec`: a file that cannot be opened is no turn, where a plain exec would end the script.
  { command exec 8<"$d"; } 2>/dev/null || return 0
  flock -w 10 8; s=$?
  [ $s = 1 ] && { echo "another lock operation in $d did not end within 10 s" >&2; exit 73; }
  [ $s = 0 ] || exec 8<&-
  [ -f "$d/.lock.flock" ] || return 0
  { command exec 7>>"$d/.lock.flock"; } 2>/dev/null || return 0
  flock -w 10 7; s=$?
  [ $s = 1 ] && { echo "the rollback's release in $d did not end within 10 s" >&2; exit 73; }
  [ $s = 0 ] || exec 7>&-
  return 0
}
"""

# What is at path $1: nothing (""), "file" (a regular file, not a link) or the words for anything else.
LOCK_KIND = r"""
lock_kind() {
  if [ -L "$1" ]; then echo "a symbolic link"
  elif [ ! -e "$1" ]; then :
  elif [ -f "$1" ]; then echo file
  elif [ -d "$1" ]; then echo "a directory"
  elif [ -p "$1" ]; then echo "a named pipe"
  elif [ -S "$1" ]; then echo "a socket"
  elif [ -b "$1" ] || [ -c "$1" ]; then echo "a device"
  else echo "something else"; fi
}
"""

# $1 lock id: remove the lock if it is that one; prints `released` or `not ours`. Taken in turn, it looks
# first (another console's lock is never moved), then renames the lock away and removes it only if the
# moved file is ours: a lock replaced between the look and the rename (by whatever takes no turn) is put
# back with `ln`, which never overwrites a lock taken since.
RELEASE_LOCK = r"""
release_lock() {
  take_turn
  l=$d/lock
  m=$d/.releasing.$1.$$
  if [ "$(lock_kind "$l")" = file ] && grep -qF "\"lock_id\":\"$1\"" "$l" 2>/dev/null && mv "$l" "$m" 2>/dev/null
  then
    if [ -f "$m" ] && grep -qF "\"lock_id\":\"$1\"" "$m" 2>/dev/null; then rm -f "$m"; echo released; return 0; fi
    [ -n "$(lock_kind "$l")" ] || ln "$m" "$l" 2>/dev/null
    rm -f "$m"
  fi
  echo "not ours"
}
"""

# $1 console id, $2 presence JSON: write the heartbeat atomically (`try_presence`: status 1 when it cannot,
# the script goes on; `put_presence`: the script ends, exit 71).
WRITE_PRESENCE = r"""
try_presence() {
  t=$d/presence/.$1.json.$$
  if printf '%s\n' "$2" > "$t" && mv -f "$t" "$d/presence/$1.json"; then return 0; fi
  rm -f "$t"; echo "cannot write $d/presence/$1.json" >&2; return 1
}
put_presence() { try_presence "$1" "$2" || exit 71; }
"""

# $3, when this console holds a lock: its id; prints `held ours` or `held lost`.
_CHECK_HELD = r"""
if [ -n "${3-}" ]; then
  # -f first: grep would wait forever on a named pipe put there by hand.
  if [ -f "$d/lock" ] && grep -qF "\"lock_id\":\"$3\"" "$d/lock" 2>/dev/null; then echo "held ours"; else echo "held lost"; fi
fi
"""
HEARTBEAT = (
    PROLOGUE
    + WRITE_PRESENCE
    + r"""
put_presence "$1" "$2"
"""
    + _CHECK_HELD
)

# A presence file a console could have written: its name is a console id (console.core.pairing.Identity).
PRESENCE_NAME = r"^[A-Za-z0-9_-]+\.json$"

# The lock and every heartbeat, one line each (`head -n 1`: a foreign file cannot spill into the next).
# The heartbeats are read by ONE awk, not a `head` per file: with 5,000 files left by consoles that died
# the fork per file made every read take ~9 s of the host's time (issue 36); the shell's loop only runs
# builtins. Only regular files with a console's name are read (a named pipe would hang the read, a link
# is nothing a console writes), and a line is cut at 4 KiB (a heartbeat is ~300 bytes).
_READ_STATE = (
    r"""
if [ -f "$d/lock" ]; then printf 'lock '; head -n 1 "$d/lock" 2>/dev/null; echo; fi
if [ -f "$d/pending-rollback.json" ]; then printf 'pending '; head -n 1 "$d/pending-rollback.json" 2>/dev/null; echo; fi
if [ -d "$d/presence" ] && cd "$d/presence" 2>/dev/null; then
  for f in *.json; do
    [ -f "$f" ] && [ ! -L "$f" ] && printf '%s\n' "$f"
  done | awk '
    /"""
    + PRESENCE_NAME
    + r"""/ { f = $0; line = ""; if ((getline line < f) > 0) print "presence " f " " substr(line, 1, 4096); close(f) }'
fi
exit 0
"""
)
READ_STATE = READ_PROLOGUE + _READ_STATE

# HEARTBEAT then READ_STATE in one run (a console's link does both every beat: one SSH channel, not two).
# A beat that cannot be written (a read-only state directory) says so on stderr, as `beat not written`
# on stdout, and the state is read all the same, as READ_STATE alone would.
BEAT_AND_READ = (
    READ_PROLOGUE
    + WRITE_PRESENCE
    + r"""
{ mkdir -p "$d/presence" && try_presence "$1" "$2"; } || echo "beat not written"
"""
    + _CHECK_HELD
    + _READ_STATE
)

# On stdin, one `NAME LINE` a heartbeat judged stale: the file NAME is removed only when its first line
# is still LINE (a console that came back since has rewritten it and keeps it). One awk compares them all
# and one rm removes them, whatever their number; the caller bounds how many it sends. A console that
# rewrites its file between the compare and the rm loses it until its next beat, as it did before.
REMOVE_IF_UNCHANGED = (
    READ_PROLOGUE
    + r"""
[ -d "$d/presence" ] && cd "$d/presence" 2>/dev/null || exit 0
gone=$(awk '
  $1 ~ /"""
    + PRESENCE_NAME
    + r"""/ { f = $1; seen = substr($0, length(f) + 2); line = ""
    if ((getline line < f) > 0 && line == seen) print f; close(f) }')
[ -n "$gone" ] || exit 0
rm -f -- $gone || exit 71
for f in $gone; do echo "removed $f"; done
"""
)

# $1 console id, $2 presence JSON, $3 lock JSON. Prints `acquired`, or `held <the lock's line>` (and
# `holder <its heartbeat>`), or refuses what is no console's lock, taking nothing: `lock-kind <words>`
# for a path that is not a regular file (`ln` would put its link INSIDE a directory and succeed, for
# every console), `lock-empty` for an empty file; a file of garbage is `held <garbage>`, for the console
# to refuse.
ACQUIRE = (
    PROLOGUE
    + WRITE_PRESENCE
    + TAKE_TURN
    + LOCK_KIND
    + r"""
put_presence "$1" "$2"
t=$d/.lock.$1.$$
printf '%s\n' "$3" > "$t" || { rm -f "$t"; echo "cannot write $t" >&2; exit 71; }
take_turn
l=$d/lock
held=
i=0
while :; do
  k=$(lock_kind "$l")
  if [ -z "$k" ]; then
    if ln "$t" "$l" 2>/dev/null; then
      if [ ! -L "$l" ] && [ "$l" -ef "$t" ]; then rm -f "$t"; echo acquired; exit 0; fi
      # A directory appeared there meanwhile and ln linked INTO it: take that back; the next round refuses.
      [ "$l/${t##*/}" -ef "$t" ] && rm -f "$l/${t##*/}"
    fi
  elif [ "$k" != file ]; then
    rm -f "$t"; printf 'lock-kind %s\n' "$k"; exit 0
  elif held=$(head -n 1 "$l" 2>/dev/null); then
    break
  fi
  # The lock went away between the look and the link (released meanwhile): try again.
  i=$((i + 1))
  [ $i -lt 20 ] || { rm -f "$t"; echo "cannot create $l" >&2; exit 72; }
done
rm -f "$t"
if [ -z "$held" ] && [ ! -s "$l" ]; then echo lock-empty; exit 0; fi
printf 'held %s\n' "$held"
cid=$(printf '%s\n' "$held" | sed -n 's/.*"console_id":"\([A-Za-z0-9_-]*\)".*/\1/p')
if [ -n "$cid" ] && [ -f "$d/presence/$cid.json" ]; then
  printf 'holder '; head -n 1 "$d/presence/$cid.json" 2>/dev/null; echo
fi
"""
)

# $1 lock id.
RELEASE = (
    PROLOGUE
    + TAKE_TURN
    + LOCK_KIND
    + RELEASE_LOCK
    + r"""
release_lock "$1"
"""
)

# $1 lock id seen, $2 holder console id, $3 holder heartbeat line seen ("" when none), $4 audit line.
BREAK = (
    PROLOGUE
    + TAKE_TURN
    + r"""
take_turn
l=
[ -f "$d/lock" ] && { l=$(head -n 1 "$d/lock" 2>/dev/null) || l=; }
case $l in *"\"lock_id\":\"$1\""*) ;; *) echo "changed lock"; exit 0 ;; esac
p=$(head -n 1 "$d/presence/$2.json" 2>/dev/null) || p=
[ "$p" = "$3" ] || { echo "changed holder"; exit 0; }
m=$d/.broken.$1.$$
mv "$d/lock" "$m" 2>/dev/null || { echo "changed lock"; exit 0; }
if grep -qF "\"lock_id\":\"$1\"" "$m"; then
  rm -f "$m" "$d/presence/$2.json"
  a=$d/audit.jsonl
  if [ -s "$a" ] && [ -n "$(tail -c 1 "$a")" ]; then printf '\n%s\n' "$4" >> "$a"; else printf '%s\n' "$4" >> "$a"; fi
  echo broken
else
  ln "$m" "$d/lock" 2>/dev/null; rm -f "$m"; echo "changed lock"
fi
"""
)

# $1 the line. A torn last line (a writer that died mid-line) gets its newline first, so the new entry
# is not glued to it.
APPEND = (
    PROLOGUE
    + r"""
a=$d/audit.jsonl
# The check below reads the file's last byte, and it can see another console's append half-written (a
# file's size grows page by page): it would then add a needless blank line. flock (util-linux) makes
# appends take turns where the host has it; without it a blank line is the worst case, and readers skip it.
if command -v flock >/dev/null 2>&1; then { exec 9>>"$a" && flock -w 10 9; } || exit 71; fi
if [ -s "$a" ] && [ -n "$(tail -c 1 "$a")" ]; then printf '\n%s\n' "$1" >> "$a"; else printf '%s\n' "$1" >> "$a"; fi || exit 71
"""
)

# The state dir's absolute path on the host ("~" expanded as the SSH user's): for what runs elsewhere
# (the commit-confirmed rollback runs as a systemd service, with no such home).
WHERE = (
    READ_PROLOGUE
    + r"""printf 'dir %s\n' "$d"
"""
)

# $1 a file name in the state dir, $2 its text, $3 its mode: written atomically.
PUT_FILE = (
    PROLOGUE
    + r"""
t=$d/.$1.$$
if printf '%s\n' "$2" > "$t" && chmod "$3" "$t" && mv -f "$t" "$d/$1"; then exit 0; fi
rm -f "$t"; echo "cannot write $d/$1" >&2; exit 71
"""
)

REMOVE_FILE = (
    READ_PROLOGUE
    + r"""rm -f -- "$d/$1"
"""
)

# $1 the most bytes to print: the trail's last $1 bytes, after `trail LINES BYTES` (the whole file's, as it
# was when read: a follower resumes after LINES). A trail that is not a regular file (a link to /dev/zero,
# a FIFO) is refused: `cat` of it never ended.
READ_AUDIT = (
    READ_PROLOGUE
    + r"""a=$d/audit.jsonl
[ -e "$a" ] || { printf 'trail 0 0\n'; exit 0; }
[ -f "$a" ] || { echo "$a is not a regular file" >&2; exit 74; }
s=$(wc -c < "$a" | tr -d ' ') || exit 74
n=$(head -c "$s" "$a" | wc -l | tr -d ' ')
printf 'trail %s %s\n' "$n" "$s"
if [ "$s" -gt "$1" ]; then tail -c "+$((s - $1 + 1))" "$a" | head -c "$1"; else head -c "$s" "$a"; fi
exit 0
"""
)

LEAVE = (
    PROLOGUE
    + TAKE_TURN
    + LOCK_KIND
    + RELEASE_LOCK
    + r"""
rm -f "$d/presence/$1.json"
[ -n "${2-}" ] && release_lock "$2"
exit 0
"""
)

# $1 the first line to print (1-based): resume where the last stream stopped.
FOLLOW_AUDIT = r"""
set -u
d=$1
case $d in "~") d=$HOME ;; "~/"*) d=$HOME/${d#"~/"} ;; esac
mkdir -p "$d" && : >> "$d/audit.jsonl" || exit 70
[ -f "$d/audit.jsonl" ] || { echo "$d/audit.jsonl is not a regular file" >&2; exit 74; }
exec tail -n "+$2" -F "$d/audit.jsonl"
"""
