"""A schemathesis check, loaded by the repository's schemathesis.toml: a schema-valid
body may be refused (400) only for a rule /openapi.json cannot state — prompt plus
``max_tokens`` counted in tokens against the context, ``n`` times the number of prompts,
or the chat template's own rules. Any other refusal of a schema-valid body means the
document and the validation have drifted apart."""

from __future__ import annotations

import re

import schemathesis

#: Messages of the refusals the document cannot express.
INEXPRESSIBLE = re.compile(
    r"(max_tokens|max_completion_tokens): prompt \(\d+ tokens\) \+ max_tokens"
    r"|prompt of \d+ tokens needs \d+ KV blocks"
    r"|n times the number of prompts"
    r"|the chat template (failed|rendered an empty prompt)"
)


@schemathesis.check
def refused_only_for_what_the_document_cannot_state(ctx, response, case):
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code != 400:
        return None
    message = response.json().get("error", {}).get("message", "")
    if not INEXPRESSIBLE.match(message):
        raise AssertionError(f"a schema-valid request was refused: {message}")
    return None
