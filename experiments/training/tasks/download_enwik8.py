"""Download enwik8 (the Hutter Prize archive, about 36 MB) for the `enwik8` task.

    python -m experiments.training.tasks.download_enwik8 [destination]   # default data/enwik8.zip

The archive is written to a temporary file and renamed only once it has been checked to hold
`enwik8` of exactly 10^8 bytes, so an interrupted download never leaves a file the task would
read. Nothing is downloaded if the destination already holds a valid archive.
"""

from __future__ import annotations

import sys
import urllib.request
import zipfile
from pathlib import Path

URL = "http://mattmahoney.net/dc/enwik8.zip"
DEFAULT_DESTINATION = Path("data/enwik8.zip")
ENWIK8_BYTES = 100_000_000


def is_valid_archive(path: Path) -> bool:
    """True if `path` is a zip whose member `enwik8` is 10^8 bytes."""
    if not path.is_file() or not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        try:
            return archive.getinfo("enwik8").file_size == ENWIK8_BYTES
        except KeyError:
            return False


def download(destination: Path = DEFAULT_DESTINATION, url: str = URL) -> Path:
    """Fetch the archive to `destination` unless a valid one is there; returns the path."""
    if is_valid_archive(destination):
        print(f"{destination} is already there")
        return destination
    destination.parent.mkdir(parents=True, exist_ok=True)
    partial = destination.with_name(destination.name + ".part")
    print(f"downloading {url} -> {destination}")
    urllib.request.urlretrieve(url, partial)
    if not is_valid_archive(partial):
        partial.unlink(missing_ok=True)
        raise SystemExit(f"{url} did not give a zip holding enwik8 of {ENWIK8_BYTES} bytes")
    partial.replace(destination)
    return destination


if __name__ == "__main__":
    download(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DESTINATION)
