"""`tiny`: a randomly initialised Qwen3-architecture model with a locally trained tokenizer.

Built on the fly (a few seconds on CPU), deterministic, cached under AIT_HOME/models.
It exists so the whole pipeline runs for real with no hub and no GPU: it trains, its
weights change, and it scores honestly (near zero) on the hidden eval.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import tempfile
from importlib.resources import files
from pathlib import Path

from ait.home import models_dir

TINY_VERSION = "tiny-v1"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                  "<tool_response>", "</tool_response>", "<think>", "</think>"]


def chat_template() -> str:
    """Qwen3's chat template as TRL ships it, so TRL's tool-call parsing recognises it."""
    return (files("trl") / "chat_templates" / "qwen3.jinja").read_text()


def _corpus(n: int = 3000) -> list[str]:
    """Text the tokenizer learns its merges from: task prompts, tool-call JSON, answers."""
    from ait.families import FAMILIES

    rng = random.Random(0)
    texts = [chat_template()]
    for family in FAMILIES.values():
        d = family.difficulty()
        fmt = family.eval_format(d)
        texts.append(fmt.system_prompt + " " + fmt.answer_format)
        for _ in range(n // len(FAMILIES)):
            ex = family.example(rng, d)
            calls = " ".join(f'{{"name": "{c.name}", "arguments": {c.arguments}}}' for c in family.gold_trace(ex))
            texts.append(f"{ex.prompt} {calls} Answer: {ex.answer}")
    return texts


def build_tiny(dest: Path, corpus: list[str]) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a 1 MB model needs no progress bar in `ait episode`

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2048, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                     chat_template=chat_template(), padding_side="left")
    config = Qwen3Config(
        vocab_size=len(hf_tok), hidden_size=64, intermediate_size=192, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
        tie_word_embeddings=True, eos_token_id=hf_tok.eos_token_id, pad_token_id=hf_tok.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = hf_tok.eos_token_id
    model.generation_config.pad_token_id = hf_tok.pad_token_id
    model.save_pretrained(dest, safe_serialization=True)
    hf_tok.save_pretrained(dest)


def tiny_model_path() -> Path:
    """The cached tiny model directory, building it once (atomic rename: safe under races).
    The cache key includes a digest of the tokenizer corpus, so adding a family rebuilds it."""
    corpus = _corpus()
    digest = hashlib.sha256("\n".join(corpus).encode()).hexdigest()[:10]
    dest = models_dir() / f"{TINY_VERSION}-{digest}"
    if (dest / "model.safetensors").exists():
        return dest
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=models_dir()))
    try:
        build_tiny(tmp, corpus)
        try:
            os.rename(tmp, dest)
        except OSError:  # another process won the race; its copy is identical
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
