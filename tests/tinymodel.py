"""Generate a tiny, randomly initialised Llama (weights, config, tokenizer) on disk.

vLLM's CPU build serves it in about a minute on 2 cores. Nothing is downloaded:
the tokenizer is a byte-level BPE trained here on a few sentences.
Usage: python tests/tinymodel.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# head_dim = hidden_size / num_attention_heads = 64: vLLM's CPU attention rejects 16, takes 64 and 128.
TINY_LLAMA = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A GPU host serves large language models with vLLM.",
    "Hello, world! How are you today? 0123456789",
    "Memory, cache, tokens, layers, heads and bytes.",
]


def make_tiny_llama(out: Path, vocab_size: int = 512) -> Path:
    """Write a tiny Llama to ``out`` and return it; reuses an existing complete one."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    if all((out / name).exists() for name in ("config.json", "model.safetensors", "tokenizer.json")):
        return out
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(out)
    n_vocab = tok.get_vocab_size()
    config = LlamaConfig(
        vocab_size=n_vocab,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        **TINY_LLAMA,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    cfg = json.loads((out / "config.json").read_text())
    cfg["torch_dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


if __name__ == "__main__":
    print(make_tiny_llama(Path(sys.argv[1])))
