"""Reading the benchmarks' JSONL files (bench/step_time, bench/overhead and their PyTorch peers).

Every line is one JSON object with at least tool, model and mode; blank lines are skipped; a line
that is not JSON or lacks those keys is reported on stderr with its file and line number and
skipped, so one bad line (a run killed mid-write) does not lose the rest.
"""
import json
import sys


def iter_records(paths):
    """Yields (path, lineno, record) for every valid line of the files, in reading order."""
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
                if not isinstance(rec, dict) or not all(k in rec for k in ("tool", "model", "mode")):
                    print(f"{path}:{lineno}: no tool/model/mode, skipped", file=sys.stderr)
                    continue
                yield path, lineno, rec
