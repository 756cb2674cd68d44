"""Move a venv built at a staging path to its installed path, for packaging/build-deb.sh.

pip writes the venv's build path into the console scripts' shebangs and the activate
scripts, and the wheel's location into each distribution's direct_url.json. This rewrites
the scripts to the installed path, removes direct_url.json, and brings each RECORD up to
date (the rewritten scripts' hashes and sizes), so that `pip check`, `pip show -f` and a
rebuild elsewhere all see the same files. Run with the distribution's Python:

    python3 relocate_venv.py STAGED_VENV INSTALLED_PATH
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import sys
from pathlib import Path


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def rewrite_scripts(venv: Path, old: str, new: str) -> set[Path]:
    """Replace `old` by `new` in the text files of bin/; return the files changed."""
    changed: set[Path] = set()
    for path in sorted((venv / "bin").iterdir()):
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data or old.encode() not in data:
            continue
        path.write_bytes(data.replace(old.encode(), new.encode()))
        changed.add(path.resolve())
    return changed


def fix_record(record: Path, changed: set[Path]) -> None:
    """Drop direct_url.json (and its file) and re-hash the rows of changed files."""
    site = record.parent.parent
    rows = list(csv.reader(io.StringIO(record.read_text(encoding="utf-8"))))
    out: list[list[str]] = []
    for row in rows:
        name = row[0]
        target = (site / name).resolve()
        if name.endswith(".dist-info/direct_url.json"):
            target.unlink(missing_ok=True)
        elif target in changed:
            data = target.read_bytes()
            out.append([name, _record_hash(data), str(len(data))])
        else:
            out.append(row)
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(out)
    record.write_text(buf.getvalue(), encoding="utf-8")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    venv, installed = Path(argv[0]), argv[1]
    changed = rewrite_scripts(venv, str(venv), installed)
    for record in sorted(venv.glob("lib/python*/site-packages/*.dist-info/RECORD")):
        fix_record(record, changed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
