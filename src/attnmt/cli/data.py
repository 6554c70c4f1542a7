"""``attnmt download``: every file of a registered dataset's pairs, checked against its SHA-256,
for a machine that will work offline (``attnmt.data.download``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attnmt.names import canonical_name


def cmd_download(args: argparse.Namespace) -> int:
    from attnmt.data.download import download_dataset

    pairs = None if args.pairs is None else [p.strip() for p in args.pairs.split(",")]
    if pairs is not None and not all(pairs):
        from attnmt.errors import AttnmtError

        raise AttnmtError(f"--pairs {args.pairs!r}: expected pairs separated by commas, e.g. de-en,fr-en")
    folder, files = download_dataset(args.dataset, pairs, args.data_dir)
    print(f"{len(files)} files of {args.dataset}, SHA-256 checked, in {folder}")
    if args.data_dir is not None:
        print(f"read them there with: export ATTNMT_DATA={Path(args.data_dir).resolve()}")
    return 0


def add_download_parser(sub) -> None:
    p = sub.add_parser("download", help="fetch every file of a registered dataset's pairs (train, val, test sets), "
                       "checked against their SHA-256, for an offline machine")
    p.add_argument("dataset", type=canonical_name, help="a registered dataset: multi30k")
    p.add_argument("--pairs", metavar="PAIR,...", help="language pairs, e.g. de-en,fr-en (default: all of them)")
    # where the files are written (not where the other commands read: its default is the cache, not $ATTNMT_DATA)
    p.add_argument("--data-dir", metavar="DIR", help="write into DIR/DATASET/ (read it with ATTNMT_DATA=DIR); "
                   "default: the cache, ~/.cache/attnmt/DATASET/")
    p.set_defaults(func=cmd_download)
