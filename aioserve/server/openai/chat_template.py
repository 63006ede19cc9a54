"""Chat messages to prompt text, through the tokenizer's chat template or an override."""

from __future__ import annotations

from typing import Any

from aioserve.server.schema import RequestFieldError


class ChatTemplate:
    """Renders chat messages with ``tokenizer.apply_chat_template`` (a sandboxed Jinja
    environment), using ``override`` when given, else the tokenizer's own template.

    Args:
        tokenizer: a transformers tokenizer, or None (then chat is unavailable).
        override: template text from ``--chat-template``, or None.
    """

    def __init__(self, tokenizer: Any, override: str | None) -> None:
        self._tokenizer = tokenizer
        self._override = override

    @property
    def available(self) -> bool:
        """True when chat requests can be rendered."""
        if self._tokenizer is None:
            return False
        return bool(self._override or getattr(self._tokenizer, "chat_template", None))

    def render(self, messages: list[dict[str, str]]) -> list[int]:
        """The prompt token ids for ``messages``, ending with the generation prompt (the
        template places any BOS itself; none is added).

        Raises:
            RequestFieldError: no template is available (param ``messages``), or the
                template rejects the messages.
        """
        if not self.available:
            raise RequestFieldError(
                "messages",
                "this model has no chat template; start the server with --chat-template "
                "FILE (examples/chat_template.jinja in the aioserve repository is one to "
                "start from), or use /v1/completions",
            )
        from jinja2 import TemplateError

        try:
            text = self._tokenizer.apply_chat_template(
                messages, chat_template=self._override, tokenize=False,
                add_generation_prompt=True,
            )
        except TemplateError as exc:
            raise RequestFieldError("messages", f"the chat template failed: {exc}") from None
        if not isinstance(text, str) or not text:
            raise RequestFieldError("messages", "the chat template rendered an empty prompt")
        return list(self._tokenizer(text, add_special_tokens=False).input_ids)
