"""Pure logic: no sockets, no subprocesses, no asyncio, no Textual. Everything a screen shows is computed here."""
