"""Helpers shared by tests (the real OpenSSH sshd launcher: tests.support.sshd)."""
