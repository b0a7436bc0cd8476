"""The `k26-console` command line: one module per subcommand, wired in `main.py`."""
