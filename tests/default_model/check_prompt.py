#!/usr/bin/env python3
"""`scr complete --prompt` is the engine fed with the tokenizer's ids: for each prompt its ids equal
`scr complete --ids` (the same prompt tokenized with BOS, EOS ignored) up to where it stopped, it
stops only at --max-tokens or right after an end-of-sequence id, and its text equals the detokenized
prompt + ids minus the detokenized prompt. Usage: check_prompt.py SCR MODEL_DIR"""
import json
import subprocess
import sys

scr, model = sys.argv[1], sys.argv[2]
prompts = ["What is a telescope?", "A river is", "Define the word: lantern", "The meaning of ubiquitous"]
max_tokens = 24
eos = json.load(open(f"{model}/config.json")).get("eos_token_id", 2)
eos = set(eos if isinstance(eos, list) else [eos])


def run(*args):
    r = subprocess.run([scr, *args], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        sys.exit(f"FAIL: scr {' '.join(args)} exited {r.returncode}: {r.stderr.strip()}")
    return r.stdout


fails = 0
for p in prompts:
    ids = json.loads(run("tokenize", model, p, "--json", "--add-special"))["ids"]
    got = json.loads(run("complete", model, "--prompt", p, "--max-tokens", str(max_tokens), "--json"))
    forced = json.loads(run("complete", model, "--ids", ",".join(map(str, ids)), "--max-tokens", str(max_tokens), "--json"))
    out = got["ids"]
    problems = []
    if not out or out != forced["ids"][:len(out)]:
        problems.append(f"ids {out} are not a prefix of the --ids run {forced['ids']}")
    if len(out) < max_tokens and out[-1] not in eos:
        problems.append(f"stopped after {len(out)} tokens without an end-of-sequence id")
    if len(out) < max_tokens and any(t in eos for t in out[:-1]):
        problems.append("generated past an end-of-sequence id")
    # The continuation is decoded in the prompt's context (a leading "▁" is a space there), so the
    # reference is decode(prompt + output) minus decode(prompt).
    def decode(seq):
        return run("detokenize", model, ",".join(map(str, seq)), "--skip-special").rstrip("\n")
    whole, head = decode(ids + out), decode(ids)
    if not whole.startswith(head) or got["text"] != whole[len(head):]:
        problems.append(f"text {got['text']!r} != decode(prompt + ids) - decode(prompt): {whole!r} / {head!r}")
    status = "FAIL" if problems else "ok  "
    print(f"{status} {p!r}: {len(out)} ids, {got['text']!r}" + "".join("\n     " + x for x in problems))
    fails += bool(problems)
print(f"{len(prompts) - fails}/{len(prompts)} prompts consistent")
sys.exit(1 if fails else 0)
