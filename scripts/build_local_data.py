"""Build the local model folder and the JSONL dataset of ``studies/local-jsonl.yaml`` from files in
this repository only (nothing is downloaded):

* ``studies/data/instructions.jsonl``: ENTRIES instruction-style entries ``{"id", "topic",
  "text"}``, each ``text`` an instruction and its response (``### Instruction: ... ### Response:
  ...``), composed from the hand-written ``scripts/local_data_text.yaml``. The number of sentences
  of a response is lognormal (median MEDIAN_SENTENCES, sigma SIGMA_SENTENCES, 1..MAX_SENTENCES),
  so entries run from a few dozen tokens to about a thousand, most of them short.
* ``studies/local-model/tokenizer.json``: a byte-level BPE (any text encodes; no unknown token)
  trained with the ``tokenizers`` library on that JSONL's texts, VOCAB_SIZE tokens at most, its
  special tokens ``<pad>`` (0), ``<s>`` (1), ``</s>`` (2); every encoded text is ``<s> ... </s>``.
  ``tokenizer_config.json`` makes it a ``PreTrainedTokenizerFast`` for ``AutoTokenizer``.
* ``studies/local-model/config.json``: a tiny llama (2 layers, hidden size 64) whose vocabulary
  is the tokenizer's. No weights: explorer builds random ones (``weights: random``).

The output is deterministic (a seeded ``random.Random``; the BPE trainer breaks ties by order).
``tests/test_local_data.py`` rebuilds into a temporary folder and compares with the committed
files. After editing the text or the constants below, rebuild and commit the files together::

    .venv/bin/python scripts/build_local_data.py            # writes under studies/
    .venv/bin/python scripts/build_local_data.py --out-dir /tmp/x
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
TEXT = ROOT / "scripts" / "local_data_text.yaml"
ENTRIES = 320
SEED = 15
MEDIAN_SENTENCES = 4
SIGMA_SENTENCES = 0.8
MAX_SENTENCES = 40
VOCAB_SIZE = 2048
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>"]
MAX_LENGTH = 2048
"""The tokenizer's ``model_max_length`` and the model's ``max_position_embeddings``."""
LISTS = ("Write a short checklist", "Write a step-by-step", "List the")
"""Instructions whose response is a numbered list."""
MODEL_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": MAX_LENGTH,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
TOKENIZER_CONFIG: dict[str, Any] = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": "<s>",
    "eos_token": "</s>",
    "pad_token": "<pad>",
    "model_max_length": MAX_LENGTH,
    "clean_up_tokenization_spaces": False,
}


def _response(rng: random.Random, topic: list[str], general: list[str], n: int, *, numbered: bool) -> str:
    """``n`` sentences: the topic's in a random order, then the general ones, then again."""
    pool = rng.sample(topic, len(topic)) + rng.sample(general, len(general))
    sentences = [pool[i % len(pool)] for i in range(n)]
    if numbered:
        return "\n".join(f"{i}. {s}" for i, s in enumerate(sentences, 1))
    return "\n\n".join(" ".join(sentences[i : i + 3]) for i in range(0, n, 3))


def entries(text: dict[str, Any], count: int = ENTRIES, seed: int = SEED) -> Iterator[dict[str, Any]]:
    """The dataset's records, in order."""
    rng = random.Random(seed)
    keys = sorted(text["topics"])
    for i in range(count):
        key = rng.choice(keys)
        topic = text["topics"][key]
        instruction = rng.choice(text["instructions"]).format(topic=topic["name"])
        draw = MEDIAN_SENTENCES * math.exp(SIGMA_SENTENCES * rng.gauss(0.0, 1.0))
        n = min(MAX_SENTENCES, max(1, round(draw)))
        response = _response(
            rng, topic["sentences"], text["general"], n, numbered=instruction.startswith(LISTS)
        )
        yield {"id": i, "topic": key, "text": f"### Instruction:\n{instruction}\n\n### Response:\n{response}"}


def train_tokenizer(texts: list[str]) -> Any:
    """A byte-level BPE trained on ``texts`` that wraps every text in ``<s> ... </s>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    bos, eos = SPECIAL_TOKENS[1], SPECIAL_TOKENS[2]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}",
        special_tokens=[(bos, tokenizer.token_to_id(bos)), (eos, tokenizer.token_to_id(eos))],
    )
    return tokenizer


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def build(out_dir: Path) -> dict[str, Path]:
    """Write ``data/instructions.jsonl`` and ``local-model/`` under ``out_dir``; return the files."""
    text = yaml.safe_load(TEXT.read_text(encoding="utf-8"))
    records = list(entries(text))
    data = out_dir / "data" / "instructions.jsonl"
    model = out_dir / "local-model"
    data.parent.mkdir(parents=True, exist_ok=True)
    model.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    tokenizer = train_tokenizer([r["text"] for r in records])
    tokenizer.save(str(model / "tokenizer.json"), pretty=False)
    _write_json(model / "tokenizer_config.json", TOKENIZER_CONFIG)
    _write_json(model / "config.json", MODEL_CONFIG | {"vocab_size": tokenizer.get_vocab_size()})
    files = [data, *(model / f for f in ("tokenizer.json", "tokenizer_config.json", "config.json"))]
    return {str(f.relative_to(out_dir)): f for f in files}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=ROOT / "studies")
    args = parser.parse_args()
    for name, path in build(args.out_dir).items():
        print(f"{name}: {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
