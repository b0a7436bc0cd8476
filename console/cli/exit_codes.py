"""Every command's exit statuses, in one table: `docs/exit-codes.md` shows it (a test holds the two
equal), and scripts rely on it. The codes themselves are in console.cli.errors: 0 ok, 1 the check said no,
2 bad input or usage (an unknown or unreachable host included), 3 the host is busy; 128+N a signal N
stopped a change cleanly (its interruption audited, the lock released); 130 Ctrl-C elsewhere."""

from __future__ import annotations

SIGNALLED = "128+N: signal N (SIGINT, SIGHUP, SIGTERM, SIGQUIT) stopped it cleanly: audited as interrupted, lock released"

EXIT_CODES: dict[str, dict[str, str]] = {
    "parse": {
        "0": "the events were printed (a reader that closed the pipe early included)",
        "2": "bad input: a file that cannot be read, an unknown host, a journal that cannot be followed",
        "130": "Ctrl-C while following",
    },
    "plan": {
        "0": "the target fits",
        "1": "no fraction reaches the target with the headroom asked",
        "2": "bad input",
    },
    "verify": {
        "0": "the boot holds: pool >= target, ready, no errors since this boot",
        "1": "it does not",
        "2": "bad input, or the host cannot be reached",
    },
    "probe": {
        "0": "every depth was measured",
        "1": "a depth was refused or failed, or the output was closed before the result was written",
        "2": "bad input, or the server cannot be reached",
    },
    "profiles": {
        "0": "done (validate: every profile is valid)",
        "1": "validate found a profile invalid or refused",
        "2": "bad input: an unknown profile, bad TOML",
    },
    "apply": {
        "0": "the new boot verified (also when the output's reader went away meanwhile)",
        "1": "refused by the planner, the boot did not verify (rolled back or not), its outcome is not in "
        "the audit trail, or the host's rollback fired first",
        "2": "bad input: an unknown flag, bad TOML, an unknown host, an unwritable drop-in dir; the host "
        "is unchanged",
        "3": "another console holds the host's lock",
        "128+N": SIGNALLED,
    },
    "restart": {
        "0": "the new boot verified",
        "1": "it did not, or its outcome is not in the audit trail",
        "2": "bad input, or a host-side rollback is still armed (settle it with confirm)",
        "3": "another console holds the host's lock",
        "128+N": SIGNALLED,
    },
    "rollback": {
        "0": "the new boot verified",
        "1": "it did not, or its outcome is not in the audit trail",
        "2": "bad input: nothing to roll back, the console's first drop-in without --to-unit-default, an "
        "armed host-side rollback",
        "3": "another console holds the host's lock",
        "128+N": SIGNALLED,
    },
    "confirm": {
        "0": "settled: the boot verified and the rollback is disarmed (or, --rollback-now, rolled back)",
        "1": "nothing is armed, the boot does not verify (the rollback stays armed), or the host's "
        "rollback fired first",
        "2": "bad input",
        "3": "another console holds the host's lock",
        "128+N": SIGNALLED,
    },
    "twin": {
        "0": "stopped",
        "2": "bad input: a bad state dir, scenario or option",
        "130": "Ctrl-C (the usual way to stop it)",
    },
    "demo": {
        "0": "quit",
        "1": "the console stopped on an error (its traceback's file is named)",
        "2": "bad input, or no terminal",
        "128+N": "signal N (129: the terminal was lost); the simulated hosts are stopped",
    },
    "open": {
        "0": "quit",
        "1": "the console stopped on an error (its traceback's file is named)",
        "2": "bad input: an unknown host, a bad hosts file, no terminal",
        "128+N": "signal N (129: the terminal was lost); presence and locks are left on the hosts",
    },
    "audit": {
        "0": "the trail was printed",
        "2": "bad input, or the host cannot be reached",
    },
    "host": {
        "0": "what was learned was printed",
        "2": "bad input, or the host cannot be reached",
    },
    "completion": {
        "0": "the script was printed",
        "2": "an unknown shell",
    },
    "export": {
        "0": "stopped (SIGINT/SIGTERM)",
        "2": "bad input: an unknown host, a bad or busy address",
    },
    "snapshot": {
        "0": "no alert fires",
        "1": "an alert fires, or the service's state cannot be read",
        "2": "bad input (a bad [alerts] table included), or the host cannot be reached",
    },
    "record": {
        "0": "ended cleanly (its duration, Ctrl-C or SIGTERM)",
        "2": "bad input: an unknown host, an output that cannot be written",
    },
    "replay": {
        "0": "quit (--json: no alert fired at that time)",
        "1": "--json: an alert fired at that time; or the console stopped on an error",
        "2": "bad input: not a recording, a time outside it",
    },
}
