"""The two fields of several shapes: a completion ``prompt`` (text, token ids, or a list
of either) and chat ``messages``; each read by one function with the API's words and
described by the type next to it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from aioserve.server.schema.field_errors import refuse
from aioserve.server.schema.kinds import String, TokenId

#: Most prompts (or samples: ``n`` times the prompts) one call may start.
MAX_SEQUENCES_PER_CALL = 256

TokenIds = Annotated[list[TokenId], Field(min_length=1)]
#: ``prompt`` as the JSON Schema describes it.
PromptSchema = (
    Annotated[String, Field(min_length=1)]
    | Annotated[list[Annotated[String, Field(min_length=1)]],
                Field(min_length=1, max_length=MAX_SEQUENCES_PER_CALL)]
    | TokenIds
    | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_SEQUENCES_PER_CALL)]
)
#: ``prompt`` of a websocket ``generate`` message: one prompt.
OnePromptSchema = Annotated[String, Field(min_length=1)] | TokenIds


def _id_list(value: Any) -> list[int] | None:
    """``value`` as token ids (integral floats taken as integers), or None when it is not
    a list of integers. One C-speed pass for the common case of plain integers."""
    if not isinstance(value, list):
        return None
    ids: list[int] = value
    if not all(type(x) is int for x in value):
        if not all(type(x) is int or (type(x) is float and x.is_integer()) for x in value):
            return None
        ids = [int(x) for x in value]
    if ids and min(ids) < 0:
        raise refuse(f"prompt token ids must be non-negative integers, got {min(ids)}")
    return ids


def check_prompt(value: Any) -> list[str] | list[list[int]]:
    """The ``prompt`` field as a list of prompts.

    Raises:
        PydanticCustomError: missing, empty, or of another shape.
    """
    ids = _id_list(value) if value else None
    if isinstance(value, str):
        prompts: list[Any] = [value]
    elif ids is not None:
        prompts = [ids]
    elif isinstance(value, list) and value and all(isinstance(p, str) for p in value):
        prompts = list(value)
    elif isinstance(value, list) and value and all(_id_list(p) is not None for p in value):
        prompts = [_id_list(p) for p in value]
    elif value is None:
        raise refuse("prompt is required")
    elif isinstance(value, list) and not value:
        raise refuse("prompt is empty")
    else:
        raise refuse("prompt must be a string, a list of strings, a list of token ids, "
                     "or a list of token-id lists")
    if any(len(p) == 0 for p in prompts):
        raise refuse("prompt is empty")
    return prompts


def check_one_prompt(value: Any) -> str | list[int]:
    """The ``prompt`` of a websocket message: text or token ids, not a list of prompts.

    Raises:
        PydanticCustomError: a list of prompts, or as :func:`check_prompt`.
    """
    if isinstance(value, list) and value and all(isinstance(p, (str, list)) for p in value):
        raise refuse("prompt must be one string or one list of token ids on the websocket: "
                     "send one generate message per prompt")
    return check_prompt(value)[0]


Role = Literal["system", "developer", "user", "assistant", "tool"]
_ROLES = sorted(Role.__args__)  # type: ignore[attr-defined]


class TextPart(BaseModel):
    """A text part of a message's content (the only kind of part supported)."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: String


class ChatMessage(BaseModel):
    """One chat message; its content is text, text parts, or null (empty)."""

    model_config = ConfigDict(extra="ignore")
    role: Role
    content: String | list[TextPart] | None = None


MessagesSchema = Annotated[list[ChatMessage], Field(min_length=1)]


def _content_text(index: int, content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise refuse(f"messages[{index}].content must be a string or a list of text parts")
    parts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text":
            raise refuse(f"messages[{index}].content: only text parts are supported")
        text = part.get("text")
        if not isinstance(text, str):
            raise refuse(f"messages[{index}].content: a text part needs a string 'text'")
        parts.append(text)
    return "".join(parts)


def check_messages(messages: Any) -> list[dict[str, str]]:
    """Chat messages with their content flattened to text.

    Raises:
        PydanticCustomError: not a non-empty list of ``{"role", "content"}`` objects.
    """
    if not isinstance(messages, list):
        raise refuse("messages must be a list of message objects")
    if not messages:
        raise refuse("messages is empty: the prompt would be empty")
    result = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise refuse(f"messages[{index}] must be an object")
        role = message.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise refuse(f"messages[{index}].role must be one of {_ROLES}")
        result.append({"role": role, "content": _content_text(index, message.get("content"))})
    return result
