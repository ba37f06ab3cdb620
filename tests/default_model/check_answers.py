#!/usr/bin/env python3
"""Ask the embedded default model (scratchy-tiny) questions through `scr chat` and check that each
greedy answer contains the expected key words.

The key words come from WordNet's own entries for the held-out headwords (words the model never
saw during training; see questions.json), never from the model's output.

With --complete MODEL_DIR it checks, instead, the compiled model's greedy token ids
(`scr complete MODEL_DIR --ids PROMPT --json`) against the "reference" cases: token ids from an
independent float32 PyTorch implementation (tools/train/reference_chat.py), up to and including the
first end-of-sequence token. That works without `scr chat` (no tokenizer or chat loop involved).

Usage: check_answers.py SCR_BINARY QUESTIONS_JSON [--max-tokens 48] [--complete MODEL_DIR]
Exit status: 0 all pass, 1 some answer misses a key word (or token), 2 scr failed to run.
"""
import argparse
import json
import subprocess
import sys


def run(cmd):
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        print("FAIL (timeout): %s" % " ".join(cmd))
        sys.exit(2)
    if done.returncode != 0:
        print("FAIL (exit %d): %s\n%s" % (done.returncode, " ".join(cmd), done.stderr.strip()))
        sys.exit(2)
    return done.stdout.strip()


def ask(scr, question, max_tokens):
    return run([scr, "chat", "-q", question, "--max-tokens", str(max_tokens), "--temperature", "0"])


def check_ids(scr, model_dir, cases):
    failed = 0
    for case in cases:
        want = case["greedy_ids"]
        out = run([scr, "complete", model_dir, "--ids", ",".join(map(str, case["prompt_ids"])),
                   "--max-tokens", str(len(want)), "--json"])
        got = json.loads(out)["ids"]
        ok = got == want
        print("%s %s\n     want %s\n     got  %s" % ("ok  " if ok else "FAIL", case["question"], want, got))
        failed += not ok
    print("token checks: %d equal, %d different" % (len(cases) - failed, failed))
    return failed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("scr")
    ap.add_argument("questions")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--complete", metavar="MODEL_DIR", help="check token ids with scr complete instead")
    a = ap.parse_args()
    with open(a.questions, encoding="utf-8") as f:
        spec = json.load(f)
    if a.complete:
        sys.exit(1 if check_ids(a.scr, a.complete, spec["reference"]) else 0)
    cases = spec["cases"]
    failed = 0
    for case in cases:
        answer = ask(a.scr, case["question"], a.max_tokens)
        missing = [k for k in case["keywords"] if k.lower() not in answer.lower()]
        status = "ok  " if not missing else "FAIL"
        print("%s [%s] %s -> %s%s" % (status, case["set"], case["question"], answer,
                                      "" if not missing else "   (missing: %s)" % ", ".join(missing)))
        failed += bool(missing)
    print("answers: %d with all key words, %d missing some" % (len(cases) - failed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
