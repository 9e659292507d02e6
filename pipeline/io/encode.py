"""A rendered prompt -> token ids, as the model's own tokenizer makes them, with the row's text
unable to write special tokens.

A prompt is a template (the job's prompt template inside the model's chat template) with the
row's values (its text, or its chat turns' contents) in slots. vLLM's ``LLM.chat`` and
transformers' ``apply_chat_template(tokenize=True)`` tokenize the whole rendered string at once,
so tokens merge across the seams between template and text (``'.\\n\\n'`` + ``'These'`` is
``'.', 'ĊĊ', 'These'`` there, not ``'.', 'Ċ', 'Ċ', 'These'``); the model was trained on that
tokenization, and :class:`Encoder` gives exactly it. A value that holds a special-token string
(``<|im_start|>``) would open a turn of its own that way, so such a value reads as plain text
instead (the tokenizer's ``split_special_tokens``).
"""

from __future__ import annotations

import re
from typing import Any


class Encoder:
    """Token ids of ``pieces[0] + values[0] + pieces[1] + ... + pieces[-1]``.

    - No value holds a special-token string (the common case): the tokenizer's own tokenization
      of the whole string (``tokenizer(prompt, add_special_tokens=...)``), equal to what
      ``apply_chat_template(..., tokenize=True)`` or vLLM gives for the same string.
    - Some value does: the string is cut at the template's own special tokens only (a special
      token is a boundary of the tokenizer's own tokenization anyway); each stretch between them
      is tokenized with ``split_special_tokens``, so the value's special-token strings are text
      (``'<', '|', 'im', ...``) and the template's special tokens are still one token each.

    ``add_special_tokens``: add the tokenizer's BOS/EOS as for a plain text prompt (a model
    without a chat template); ``False`` for a prompt rendered by a chat template, which writes
    its own (as ``apply_chat_template`` tokenizes).
    """

    def __init__(self, tokenizer: Any, add_special_tokens: bool = False):
        self.tokenizer = tokenizer
        self.add_special_tokens = add_special_tokens
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        # The strings the tokenizer reads as one special token wherever they stand; longest first
        # so that an alternation matches as the tokenizer's own (longest) match does.
        self.specials = sorted({t.content for t in added.values() if getattr(t, "special", False)},
                               key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, self.specials))) if self.specials else None

    def holds_special(self, text: str) -> bool:
        """Whether ``text`` holds a string the tokenizer would read as a special token."""
        return self._pattern is not None and self._pattern.search(text) is not None

    def ids(self, text: str, **kw: Any) -> list[int]:
        """``text`` tokenized alone, no BOS/EOS added unless ``add_special_tokens=True`` is given."""
        kw.setdefault("add_special_tokens", False)
        return list(self.tokenizer(text, **kw)["input_ids"]) if text else []

    def __call__(self, pieces: list[str], values: list[str]) -> list[int]:
        """The prompt's token ids (see the class). ``len(pieces) == len(values) + 1``."""
        assert len(pieces) == len(values) + 1
        if not any(self.holds_special(v) for v in values):
            prompt = pieces[0] + "".join(v + p for v, p in zip(values, pieces[1:]))
            # A special-token string can also be made across a seam (a value ending in "<|im_"
            # before a template piece starting "start|>"): then only the template's count as such.
            if self._specials_in(prompt) == sum(self._specials_in(p) for p in pieces):
                return self.ids(prompt, add_special_tokens=self.add_special_tokens)
        return self._with_inert_values(pieces, values)

    def _specials_in(self, text: str) -> int:
        return 0 if self._pattern is None else len(self._pattern.findall(text))

    def _with_inert_values(self, pieces: list[str], values: list[str]) -> list[int]:
        stretches, tokens = [""], []  # text between the template's special tokens, and those tokens
        for i, piece in enumerate(pieces):
            if i:
                stretches[-1] += values[i - 1]
            parts = self._pattern.split(piece) if self._pattern else [piece]
            found = self._pattern.findall(piece) if self._pattern else []
            stretches[-1] += parts[0]
            for special, part in zip(found, parts[1:]):
                tokens.append(special)
                stretches.append(part)
        ids: list[int] = []
        for i, stretch in enumerate(stretches):
            ids += self.ids(stretch, split_special_tokens=True)
            if i < len(tokens):
                ids.append(self.tokenizer.convert_tokens_to_ids(tokens[i]))
        return self._framed(ids) if self.add_special_tokens else ids

    def _framed(self, ids: list[int]) -> list[int]:
        """``ids`` with the BOS/EOS the tokenizer adds around a plain text prompt."""
        plain = self.ids("x")
        full = self.ids("x", add_special_tokens=True)
        for start in range(len(full) - len(plain) + 1):
            if full[start:start + len(plain)] == plain:
                return full[:start] + ids + full[start + len(plain):]
        return ids

    def cut(self, text: str, n: int) -> str:
        """The start of ``text`` that its first ``n`` tokens cover (tokenized alone, special
        strings as text); ``''`` for ``n <= 0``."""
        if n <= 0:
            return ""
        try:
            spans = self.tokenizer(text, add_special_tokens=False, split_special_tokens=True,
                                   return_offsets_mapping=True)["offset_mapping"]
        except (NotImplementedError, TypeError, ValueError, KeyError):  # a slow (Python) tokenizer
            return self.tokenizer.decode(self.ids(text, split_special_tokens=True)[:n])
        return text if n >= len(spans) else text[:spans[n - 1][1]]
