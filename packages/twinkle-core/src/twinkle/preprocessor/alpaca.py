"""AlpacaProcessor: instruction/input/output rows -> a one-turn conversation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twinkle.dataset.errors import DataError
from twinkle.multimodal.media import row_media
from twinkle.preprocessor.base import Preprocessor
from twinkle.preprocessor.messages import standard_row


class AlpacaProcessor(Preprocessor):
    """``instruction`` (+ optional ``input``, joined by a blank line) is the user turn, ``output`` the reply.

    An optional ``system`` column becomes the system turn; ``images``/``videos`` columns are the
    row's media (tagged ``<image>``/``<video>`` in the text, or placed before the instruction). An
    empty output is an error: it would train only the end-of-turn token.
    """

    def preprocess(self, row: Mapping[str, Any]) -> dict[str, Any]:
        instruction = self.field(row, "instruction")
        extra = self.field(row, "input", required=False, default="")
        output = self.field(row, "output")
        system = self.field(row, "system", required=False)
        if not output.strip():
            raise DataError("AlpacaProcessor: 'output' is empty; there is no reply to train on.")
        prompt = f"{instruction}\n\n{extra}" if extra.strip() else instruction
        if not prompt.strip():
            raise DataError("AlpacaProcessor: 'instruction' and 'input' are both empty.")
        messages = [{"role": "system", "content": system}] if system else []
        messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": output}]
        return standard_row(messages, None, *row_media(row))
