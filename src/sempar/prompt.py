"""`PromptTokenizer`: the token ids an engine will prefill for an OpenAI-style request body.

The model's own tokenizer (`tokenizer.json` in --model-dir, by `tokenizers`) and its chat
template when it has one (`tokenizer_config.json`'s `chat_template` or `chat_template.jinja`),
applied as vLLM and SGLang do for `/v1/chat/completions`: rendered with the generation prompt,
then encoded without adding special tokens again. A model without a template (our tiny models)
gets the messages' text joined by newlines. Nothing is downloaded.

A shared tool (the router and capture both read prompts through it), not a stage of the data flow.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sempar.bounds import token_ids
from sempar.errors import InputError


class PromptError(ValueError):
    """The request body has no prompt the router can read (-> HTTP 400, one line)."""


# Text longer than this is refused before it is tokenised (the router's body limit and capture's
# line limit are far below it; tokenising holds ~20x the text).
TEXT_CHARS_MAX = 32 << 20


def prompt_text(text: str, what: str, error: type[Exception] = PromptError) -> str:
    """`text` when a tokenizer (and any file) can take it, else `error` naming `what`: JSON's
    `"\\ud800"` decodes to a lone surrogate, which no UTF-8 encoder accepts (the Rust tokenizer
    raises on it); text above TEXT_CHARS_MAX is refused before it is tokenised."""
    if len(text) > TEXT_CHARS_MAX:
        raise error(f"{what}: {len(text)} characters is above the limit {TEXT_CHARS_MAX}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise error(f"{what}: character {err.start} is a lone surrogate "
                    f"({ascii(text[err.start])}), not text") from None
    return text


class PromptTokenizer:
    """tokens(route, body) -> int64[n]: the prompt's token ids for `route`'s body (a dict)."""

    def __init__(self, model_dir: str | Path):
        from sempar.models import FileTokenizer

        d = Path(model_dir)
        if not (d / "tokenizer.json").is_file():
            raise InputError(f"--model-dir: {d} has no tokenizer.json")
        self.tok = FileTokenizer(d / "tokenizer.json").tokenizer   # a broken file: one line
        self._fast = getattr(self.tok, "encode_batch_fast", None)
        self.template = _chat_template(d)
        self._renderer = None
        if self.template is not None:              # transformers renders the template (jinja)
            from transformers import PreTrainedTokenizerFast

            _compile(self.template, d)
            self._renderer = PreTrainedTokenizerFast(tokenizer_object=self.tok)

    def encode(self, text: str) -> list[int]:
        text = prompt_text(text, "prompt")
        # The Rust tokenizer directly (the transformers wrapper adds ~0.5 ms per 512 tokens),
        # through `encode_batch_fast` where it exists (tokenizers >= 0.20): the same ids without
        # the character offsets, ~0.26 ms instead of ~0.35-0.40 ms for 512 tokens.
        if self._fast is not None:
            return self._fast([text], add_special_tokens=False)[0].ids
        return self.tok.encode(text, add_special_tokens=False).ids

    def chat(self, messages: list) -> list[int]:
        if not isinstance(messages, list) or not messages:
            raise PromptError("'messages' must be a non-empty list")
        msgs = [{"role": str(m.get("role", "user")), "content": _text(m.get("content"))}
                for m in messages if isinstance(m, dict)]
        if len(msgs) != len(messages):
            raise PromptError("every item of 'messages' must be an object")
        if self.template is None:
            return self.encode("\n".join(m["content"] for m in msgs))
        for m in msgs:
            prompt_text(m["role"], "a message's role")
            prompt_text(m["content"], "a message's content")
        try:
            text = self._renderer.apply_chat_template(
                msgs, chat_template=self.template, tokenize=False, add_generation_prompt=True)
        except Exception as err:    # a template raises on what it does not take (a role, ...)
            msg = " ".join(str(err).split())[:200] or type(err).__name__
            raise PromptError(f"the model's chat template refused the messages: {msg}") from None
        if not isinstance(text, str):
            raise PromptError("the model's chat template rendered no text")
        return self.encode(text)

    def tokens(self, route: str, body: dict) -> np.ndarray:
        if route == "/v1/chat/completions":
            ids = self.chat(body.get("messages"))
        elif route == "/v1/completions":
            ids = self._prompt(body.get("prompt"), "prompt")
        else:                                          # SGLang /generate: text or input_ids
            src = "input_ids" if body.get("input_ids") is not None else "text"
            ids = self._prompt(body.get(src), src)
        try:
            return np.asarray(ids, np.int64)
        except OverflowError:
            raise PromptError("a token id is outside the 64-bit range") from None

    def _prompt(self, p, name: str) -> list[int]:
        """A prompt as text, a list of texts, token ids or a list of token-id lists (a batch
        goes to one rank: its tokens are scored together)."""
        if isinstance(p, str):
            return self.encode(p)
        if isinstance(p, list) and p:
            if all(isinstance(x, int) for x in p):
                return token_ids(p, f"'{name}'", PromptError)
            if all(isinstance(x, str) for x in p):
                return [i for x in p for i in self.encode(x)]
            if all(isinstance(x, list) for x in p):
                return [i for x in p for i in token_ids(x, f"'{name}'", PromptError)]
        raise PromptError(f"'{name}' must be text, token ids, or a non-empty list of either")


def _text(content) -> str:
    """A message's content as text: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content
                       if isinstance(p, dict) and p.get("type") == "text")
    raise PromptError("a message's 'content' must be text or a list of parts")


def _chat_template(d: Path) -> str | None:
    """The model's chat template text (None: it has none); a file that is not UTF-8 or not a
    JSON object is one line. A template with a list of named templates uses "default"."""
    from sempar.safe_json import parse_json

    if (d / "chat_template.jinja").is_file():
        path = d / "chat_template.jinja"
        raw = path.read_bytes()
        if len(raw) > TEMPLATE_BYTES_MAX:
            raise InputError(f"--model-dir: {path}: {len(raw)} bytes is above the limit "
                             f"{TEMPLATE_BYTES_MAX} for a chat template")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise InputError(f"--model-dir: {path}: not UTF-8 text (byte {err.start})") from None
    cfg = d / "tokenizer_config.json"
    if cfg.is_file():
        obj = parse_json(cfg.read_bytes(), f"--model-dir: {cfg}")
        if not isinstance(obj, dict):
            raise InputError(f"--model-dir: {cfg} is not a JSON object")
        t = obj.get("chat_template")
        if isinstance(t, list):     # [{"name": "default", "template": ...}, ...] (HF's form)
            t = next((x.get("template") for x in t if isinstance(x, dict)
                      and x.get("name") == "default"), None)
        if t is not None and (not isinstance(t, str) or
                              not prompt_text(t, f"--model-dir: {cfg}: chat_template", InputError)):
            raise InputError(f"--model-dir: {cfg}: chat_template is not text")
        return t
    return None


TEMPLATE_BYTES_MAX = 4 << 20


def _compile(template: str, d: Path) -> None:
    """Compile the chat template at start-up (as transformers will on the first request): a
    syntax error is one line now, not a 500 per request."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:             # another transformers: the first request will tell
        return
    try:
        _compile_jinja_template(template)
    except Exception as err:        # jinja2.TemplateSyntaxError and whatever a filter raises
        msg = " ".join(str(err).split())[:200] or type(err).__name__
        raise InputError(f"--model-dir: {d}: the chat template does not compile: {msg}") from None
