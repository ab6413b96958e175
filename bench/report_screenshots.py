"""Render `ait report` for every committed outer-loop run and take a headless-browser screenshot of
each HTML page, to look at what a reader sees (legends, overlap, colours, empty charts).

    python bench/report_screenshots.py [--work DIR] [--check-dir docs/report-check] [--browser chromium]

For each `docs/outer-*` directory: `ait report RUN --out WORK/<run>/report.html` (so nothing is
written into the committed run), then `chromium --headless --screenshot` of the page at 1400 px
wide. The full screenshots stay in WORK; a small copy (page content only, cropped to the text
column, full scale, 128-colour palette) goes to `--check-dir` as <run>.png, small enough to commit.
A run directory without metrics.jsonl is not a report: its one-line `ait report` error is recorded
instead. Prints one line per run and a JSON summary at the end; exits 1 if a run that has
metrics.jsonl failed to render or to screenshot.

Needs a Chromium (`apt-get install chromium`) and Pillow (a matplotlib dependency).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BROWSER_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--hide-scrollbars"]


def screenshot(browser: str, html: Path, png: Path, width: int = 1400, height: int = 6000) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([browser, *BROWSER_FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}",
                        f"--window-size={width},{height}", html.resolve().as_uri()],
                       check=True, capture_output=True, timeout=120)


def small_copy(full: Path, out: Path, scale: float = 1.0, colours: int = 128) -> tuple[int, int]:
    """The page's content (white margins cropped), scaled by `scale`, palette-quantized (small to commit)."""
    from PIL import Image, ImageChops

    image = Image.open(full).convert("RGB")
    box = ImageChops.difference(image, Image.new("RGB", image.size, "white")).getbbox()
    if box:
        pad = 16
        image = image.crop((max(0, box[0] - pad), max(0, box[1] - pad), min(image.width, box[2] + pad),
                            min(image.height, box[3] + pad)))
    if scale != 1.0:
        image = image.resize((round(image.width * scale), round(image.height * scale)), Image.LANCZOS)
    image.quantize(colours, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE).save(out, optimize=True)
    return image.size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", nargs="*", type=Path, help="run directories (default: docs/outer-*)")
    parser.add_argument("--work", type=Path, help="where reports and full screenshots go (default: a temp dir)")
    parser.add_argument("--check-dir", type=Path, default=ROOT / "docs" / "report-check",
                        help="where the small screenshots go (default docs/report-check)")
    parser.add_argument("--browser", default=shutil.which("chromium") or shutil.which("chromium-browser") or "chromium")
    args = parser.parse_args()
    runs = args.runs or sorted(p for p in (ROOT / "docs").glob("outer-*") if p.is_dir())
    work = args.work or Path(tempfile.mkdtemp(prefix="ait-report-check-"))
    args.check_dir.mkdir(parents=True, exist_ok=True)
    results, failed = [], False
    for run in runs:
        out = work / run.name / "report.html"
        shown = run.resolve().relative_to(ROOT) if run.resolve().is_relative_to(ROOT) else run.resolve()
        proc = subprocess.run([sys.executable, "-m", "ait.cli", "report", str(shown), "--out", str(out.resolve()),
                               "--json"], capture_output=True, text=True, cwd=ROOT)
        has_metrics = (run / "metrics.jsonl").is_file()
        if proc.returncode != 0:
            error = proc.stderr.strip()
            failed |= has_metrics or "Traceback" in error or len(error.splitlines()) != 1
            results.append({"run": run.name, "rc": proc.returncode, "error": error})
            print(f"{run.name}: no report (exit {proc.returncode}): {error}")
            continue
        full = work / run.name / "screenshot.png"
        try:
            screenshot(args.browser, out, full)
        except (subprocess.SubprocessError, OSError) as e:
            failed = True
            results.append({"run": run.name, "rc": 0, "report": str(out), "error": f"screenshot failed: {e}"})
            print(f"{run.name}: screenshot failed: {e}")
            continue
        small = args.check_dir / f"{run.name}.png"
        size = small_copy(full, small)
        results.append({"run": run.name, "rc": 0, "report": str(out), "screenshot": str(full),
                        "small": str(small), "small_size": size, "small_bytes": small.stat().st_size})
        print(f"{run.name}: {out} · {full} · {small} {size[0]}x{size[1]} {small.stat().st_size / 1024:.0f} KiB")
    print(json.dumps({"work": str(work), "runs": results}, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
