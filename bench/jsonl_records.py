"""Reading the benchmarks' JSONL files (bench/step_time, bench/overhead and their PyTorch peers).

Every line is one JSON object with at least tool, model and mode; blank lines are skipped; a line
that is not JSON or lacks those keys is reported on stderr with its file and line number and
skipped, so one bad line (a run killed mid-write) does not lose the rest.
"""
import json
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
    """Writes a finished table to the file `out`, or to stdout when none is given."""
    if out:
        with open(out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
