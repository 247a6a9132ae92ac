"""The browser libraries the web page uses, pinned (name, version, the tarball's integrity), and
`python -m appliance.web.vendor_refresh`, which downloads each pinned release from the npm
registry, checks it against its pinned sha512, and rewrites appliance/web/static/vendor/ with the
files the page loads and each package's licence.

To move to a newer release: change its version, run with --print-integrity to read the new
tarball's integrity from the registry, pin that, then run without flags.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import shutil
import sys
import tarfile
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from appliance.web import VENDOR_DIR

REGISTRY = "https://registry.npmjs.org"


@dataclass(frozen=True)
class Pin:
    """One npm package release and the files of its tarball the page ships."""

    name: str
    version: str
    integrity: str
    """The tarball's Subresource-Integrity string (sha512-BASE64), as the registry reports it."""
    folder: str
    """The folder under static/vendor/ the files go to."""
    files: dict[str, str]
    """Path inside the tarball (under package/) -> file name under the folder."""


PINS = (
    Pin(
        "marked",
        "18.2.1",
        "sha512-ii4bxCTCqqwpT86XZWgJNs+ZnAIZksmLGYMViWA7PDIXYIeNo1x6cDdX3JOip9NM/cI6p8z57FxliACboTruMA==",
        "marked",
        {"lib/marked.esm.js": "marked.esm.js", "LICENSE": "LICENSE"},
    ),
    Pin(
        "dompurify",
        "3.4.18",
        "sha512-ofe3wI/uNm68HInABYFJYqQxRw1EaKAjNdrFVKqjUY+UZurvNd2L/HuQe097s/4RivWiZyP6tT7aoT8atjfhwg==",
        "dompurify",
        {
            "dist/purify.es.mjs": "purify.es.mjs",
            "LICENSE": "LICENSE",
            "LICENSE-MPL": "LICENSE-MPL",
        },
    ),
    Pin(
        "@highlightjs/cdn-assets",
        "11.12.0",
        "sha512-KvOKXODaiFmId9xaq3xc5xCL66wVLUuOngDbO9B/kewbFTqdGbn2nJxNhN3H5R1cgDTVj6R8vH0zgiNDEGjpDw==",
        "highlight",
        {
            "es/highlight.min.js": "highlight.min.js",
            "styles/github-dark.min.css": "github-dark.min.css",
            "LICENSE": "LICENSE",
        },
    ),
)
"""Every vendored library; the one list the refresher, the tests and the page's files follow."""


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as resp:
        return resp.read()


def release(pin: Pin) -> dict:
    """The registry's document of the pinned release (dist.tarball, dist.integrity)."""
    name = urllib.parse.quote(pin.name, safe="@")  # a scoped name's slash is %2F
    return json.loads(_get(f"{REGISTRY}/{name}/{pin.version}"))


def integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def unpack(pin: Pin, tarball: bytes) -> dict[str, bytes]:
    """The pinned files of a release's tarball, by their name under the vendor folder."""
    if integrity(tarball) != pin.integrity:
        raise ValueError(f"{pin.name} {pin.version}: the tarball does not match its pinned sha512")
    out = {}
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        for inner, name in pin.files.items():
            member = tar.extractfile(f"package/{inner}")
            if member is None:
                raise ValueError(f"{pin.name} {pin.version}: no {inner} in the tarball")
            out[name] = member.read()
    return out


def refresh(pin: Pin, vendor_dir: Path = VENDOR_DIR) -> Path:
    """Download `pin`, check it and rewrite its vendor folder (with a VERSION file)."""
    files = unpack(pin, _get(release(pin)["dist"]["tarball"]))
    folder = vendor_dir / pin.folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    (folder / "VERSION").write_text(f"{pin.name} {pin.version}\n")
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m appliance.web.vendor_refresh",
        description="Rewrite appliance/web/static/vendor/ from the pinned npm releases.",
    )
    parser.add_argument(
        "--print-integrity",
        action="store_true",
        help="print the registry's integrity of each pinned version (to pin) and change nothing",
    )
    args = parser.parse_args(argv)
    for pin in PINS:
        if args.print_integrity:
            print(pin.name, pin.version, release(pin)["dist"]["integrity"])
            continue
        try:
            folder = refresh(pin)
        except (OSError, ValueError) as exc:
            print(f"vendor_refresh: {exc}", file=sys.stderr)
            return 1
        print(f"{pin.name} {pin.version} -> {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
