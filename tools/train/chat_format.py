"""Render conversations with the model's own chat template, the way Hugging Face's
apply_chat_template does (jinja2 sandbox, trim_blocks, lstrip_blocks), so that the training text is
exactly what a server renders from tokenizer_config.json. Needs only jinja2."""
import json
import os

from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise_exception(message):
    raise TemplateError(message)


class ChatFormat:
    def __init__(self, tokenizer_dir):
        with open(os.path.join(tokenizer_dir, "tokenizer_config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        if not cfg.get("chat_template"):
            raise ValueError("tokenizer_config.json in %s has no chat_template" % tokenizer_dir)
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.globals["raise_exception"] = _raise_exception
        self.template = env.from_string(cfg["chat_template"])
        self.bos_token = cfg.get("bos_token", "<s>")
        self.eos_token = cfg.get("eos_token", "</s>")

    def render(self, messages, add_generation_prompt=False):
        return self.template.render(messages=messages, bos_token=self.bos_token, eos_token=self.eos_token,
                                    add_generation_prompt=add_generation_prompt)

    def render_with_spans(self, messages):
        """Full text plus the [start, end) character spans of every assistant turn (the text the model
        must learn to produce, template glue such as the closing eos included)."""
        full = self.render(messages)
        spans = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            start = len(self.render(messages[:i], add_generation_prompt=True))
            upto = self.render(messages[:i + 1])
            end = len(upto)
            if full[:end] != upto:
                raise ValueError("chat template output is not prefix-stable; cannot find assistant spans")
            spans.append((start, end))
        return full, spans
