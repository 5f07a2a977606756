"""Decode cost per format, and what the thumb and thumbhash add to the preview alone.

    .venv/bin/python -m bench.formats [--rounds 3]

One 4032×3024 (12 MP, a phone's frame) crop of a corpus photo, encoded by Pillow and
pillow-heif (never by libvips) in each format the archive accepts; `derive()` in this
process with one libvips thread, CPU time, best of interleaved rounds
(`bench.derive.formats_section`). Writes bench/out/formats.json and prints the section
`bench/report.py` renders from it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.derive import formats_section
from bench.runs import BY_NAME
from tests.support.services import CORPUS, corpus_photos


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--corpus", default=str(CORPUS))
    args = parser.parse_args()
    paths = corpus_photos(Path(args.corpus))
    return formats_section(paths, args.rounds, BY_NAME["formats"].json_path)


if __name__ == "__main__":
    raise SystemExit(main())
