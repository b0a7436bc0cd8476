"""Textual screens and widgets that render `core.state`."""
