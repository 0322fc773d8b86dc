"""Reading the benchmarks' JSONL files (bench/step_time, bench/overhead and their PyTorch peers), and
the table scripts' shared ends: LABEL=PATH arguments and writing a finished table.

Every line is one JSON object with at least tool, model and mode; blank lines are skipped; a line
that is not JSON or lacks those keys is reported on stderr with its file and line number and
skipped, so one bad line (a run killed mid-write) does not lose the rest.
"""
import argparse
import json
import os
import sys


def iter_records(paths, required=("tool", "model", "mode")):
    """Yields (path, lineno, record) for every valid line of the files, in reading order: a JSON
    object holding every key of `required`."""
    for path in paths:
        with open(path) as f:
            for lineno, text in enumerate(f, 1):
                text = text.strip()
                if not text:
                    continue
                try:
                    rec = json.loads(text)
                except json.JSONDecodeError:
                    print(f"{path}:{lineno}: not JSON, skipped", file=sys.stderr)
                    continue
                missing = [k for k in required if not isinstance(rec, dict) or k not in rec]
                if missing:
                    print(f"{path}:{lineno}: no {'/'.join(missing)}, skipped", file=sys.stderr)
                    continue
                yield path, lineno, rec


def emit(text, out=None):
    """Writes a finished table to the file `out` (write, then rename: a reader never sees half a
    table, and a failed write leaves the old one), or to stdout when none is given."""
    if out:
        tmp = f"{out}.tmp{os.getpid()}"
        try:
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, out)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    else:
        sys.stdout.write(text)


def labelled(text, form="LABEL=PATH"):
    """(label, path) of a LABEL=PATH argument; argparse's error (naming `form`) when either side is
    empty. As an argparse type: type=labelled, or type=lambda t: labelled(t, "PRECISION=RUN_DIR")."""
    label, sep, path = text.partition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {form}")
    return label, path
