"""Make `console/data/cli-shape.json` from the parser (console/cli/shape.py says why it exists):

    python -m console.tools.cli_shape --write     # rewrite the file in the source tree
    python -m console.tools.cli_shape             # print it

A tool beside the package rather than in console/cli/shape.py: the parser's module reads the shape, so
the shape's module must not import the parser back.
"""

from __future__ import annotations

import sys
from pathlib import Path

from console.cli.main import build_parser
from console.cli.shape import SHAPE_FILE, render, shape_of


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = render(shape_of(build_parser()))
    if args == ["--write"]:
        path = Path(__file__).resolve().parents[1] / "data" / SHAPE_FILE
        path.write_text(text, encoding="utf-8")
        sys.stderr.write(f"wrote {path}\n")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
