"""The byte-level BPE tokenizers the tiny models share, trained on generated text."""

from __future__ import annotations

from typing import Any

VOCAB_SIZE = 2000
SMALL_VOCAB_SIZE = 1000
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]
#: Plain-text chat template, so the OpenAI chat endpoint works with the tiny models.
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def train(corpus: list[str], vocab_size: int) -> Any:
    """A byte-level BPE tokenizer of ``vocab_size`` tokens learnt from ``corpus``, with the chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    return fast
