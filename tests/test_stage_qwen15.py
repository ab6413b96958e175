"""bench/stage_qwen15.py reads a GGUF header and refuses a file that is not the 1.5B coder model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
spec = importlib.util.spec_from_file_location("stage_qwen15", Path(__file__).resolve().parents[1] / "bench" / "stage_qwen15.py")
stage = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stage)


def write_gguf(path: Path, name: str, blocks: int, file_type: int) -> None:
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name(name)
    w.add_string("general.size_label", "1.5B")
    w.add_block_count(blocks)
    w.add_file_type(file_type)
    w.add_chat_template("{{ messages }}")
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    w.add_tensor("t", np.zeros((2, 2), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_the_header_of_the_right_model_passes(tmp_path):
    path = tmp_path / "ok.gguf"
    write_gguf(path, "Qwen2.5 Coder 1.5B Instruct GGUF", 28, 15)
    meta = stage.header(path)
    assert meta["general.architecture"] == "qwen2" and meta["qwen2.block_count"] == 28
    assert meta["tokenizer.ggml.tokens"] == "<array of 3>"
    stage.check(meta)


@pytest.mark.parametrize("name, blocks, file_type", [("Qwen2.5 Coder 0.5B Instruct", 24, 15),
                                                     ("Qwen2.5 Coder 1.5B Instruct", 28, 7)])
def test_another_model_or_quantisation_is_refused(tmp_path, name, blocks, file_type):
    path = tmp_path / "bad.gguf"
    write_gguf(path, name, blocks, file_type)
    with pytest.raises(SystemExit, match="does not describe"):
        stage.check(stage.header(path))


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(ValueError, match="not a GGUF file"):
        stage.header(path)
