#!/usr/bin/env python3
"""Train scratchy-tiny, the project's embedded default chat model: a small LlamaForCausalLM (config from
models/configs/llama/scratchy-tiny.json) on the WordNet chat corpus made by tools/corpus/make_corpus.py.

Runs on one CUDA GPU with PyTorch + transformers + tokenizers + jinja2; downloads nothing: the tokenizer
(tokenizer.json) and chat template (tokenizer_config.json) come from the repository, the corpus from
--corpus. Conversations are rendered with the model's own chat template (tools/train/chat_format.py),
tokenized as a server would tokenize the rendered text (special tokens in the text, no extra BOS), and
the loss is on the assistant's tokens (weight 1) plus a little on the rest (--prompt-weight).

Usage (see models/default/scratchy-tiny/README.md):
  python3 tools/train/train.py --corpus .train/corpus --out OUTDIR [--minutes 7] [--steps N]

Writes OUTDIR/model/ (config.json, model.safetensors in bf16, generation_config.json, tokenizer files),
OUTDIR/metrics.json (held-out loss/perplexity, steps, tokens) and OUTDIR/samples.json (greedy answers).
"""
import argparse
import gzip
import json
import math
import multiprocessing as mp
import os
import random
import shutil
import sys
import time

# Workers are forked after the tokenizer was used once; its own thread pool must stay off.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_format import ChatFormat  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
DEMO_QUESTIONS = ["What is a telescope?", "What does 'ephemeral' mean?", "What is a dog?",
                  "Give an example of 'happy' in a sentence.", "What is a synonym of 'quickly'?",
                  "What is the opposite of 'happy'?", "What does it mean to run?", "Who are you?",
                  "What is a computer?", "What is a river?"]


def log(*args):
    print("[%7.1fs]" % (time.time() - T0), *args, flush=True)


T0 = time.time()

# ---------------------------------------------------------------- data

_worker = {}


def _init_worker(tokenizer_dir):
    from tokenizers import Tokenizer
    _worker["fmt"] = ChatFormat(tokenizer_dir)
    _worker["tok"] = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))


def _encode(rows):
    """rows -> list of (ids, answer_mask) with answer_mask[i] = 1 where token i is assistant text."""
    fmt, tok = _worker["fmt"], _worker["tok"]
    texts, spans = [], []
    for messages in rows:
        text, sp = fmt.render_with_spans(messages)
        texts.append(text)
        spans.append(sp)
    out = []
    for enc, sp in zip(tok.encode_batch(texts, add_special_tokens=False), spans):
        ids = enc.ids
        mask = bytearray(len(ids))
        for i, (start, _end) in enumerate(enc.offsets):
            for a, b in sp:
                if a <= start < b:
                    mask[i] = 1
                    break
        out.append((ids, bytes(mask)))
    return out


def load_jsonl_gz(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def encode_all(rows, tokenizer_dir, workers):
    chunks = [[r["messages"] for r in rows[i:i + 2000]] for i in range(0, len(rows), 2000)]
    if workers <= 1:
        _init_worker(tokenizer_dir)
        parts = [_encode(c) for c in chunks]
    else:
        with mp.get_context("fork").Pool(workers, _init_worker, (tokenizer_dir,)) as pool:
            parts = pool.map(_encode, chunks)
    return [x for p in parts for x in p]


class Packed:
    """All examples as one flat token array plus per-example offsets; weights per token."""

    def __init__(self, encoded, repeats, max_len, prompt_weight):
        keep = [i for i, (ids, _) in enumerate(encoded) if len(ids) <= max_len]
        self.dropped = len(encoded) - len(keep)
        lengths = np.array([len(encoded[i][0]) for i in keep], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        self.lengths = lengths
        self.tokens = np.fromiter((t for i in keep for t in encoded[i][0]), dtype=np.int32, count=int(lengths.sum()))
        answer = np.frombuffer(b"".join(encoded[i][1] for i in keep), dtype=np.uint8)
        self.answer = answer.astype(bool)
        self.weights = np.where(self.answer, 1.0, prompt_weight).astype(np.float32)
        self.repeats = np.array([repeats[i] for i in keep], dtype=np.int64)

    def __len__(self):
        return len(self.lengths)

    def batch(self, idx, device):
        """Right-padded batch. Causal attention means pads after a sequence never affect it, so no
        attention mask is needed; pads get weight 0. Targets are the next token."""
        T = int(self.lengths[idx].max())
        ids = np.zeros((len(idx), T), dtype=np.int64)
        w = np.zeros((len(idx), T), dtype=np.float32)
        ans = np.zeros((len(idx), T), dtype=bool)
        for r, i in enumerate(idx):
            s, n = self.starts[i], self.lengths[i]
            ids[r, :n] = self.tokens[s:s + n]
            w[r, :n] = self.weights[s:s + n]
            ans[r, :n] = self.answer[s:s + n]
        ids = torch.from_numpy(ids).to(device, non_blocking=True)
        # weight of predicting token t+1 from position t
        w = torch.from_numpy(w[:, 1:]).to(device, non_blocking=True)
        ans = torch.from_numpy(ans[:, 1:]).to(device, non_blocking=True)
        return ids, w, ans


def pack_sorted(order, lengths, tokens_per_batch):
    """Cut index list `order` (sorted by length, ascending) into batches whose padded size
    rows * longest stays within tokens_per_batch."""
    out, b = [], 0
    while b < len(order):
        end = b + 1
        while end < len(order) and int(lengths[order[end]]) * (end + 1 - b) <= tokens_per_batch:
            end += 1
        out.append(order[b:end])
        b = end
    return out


def batches(data, tokens_per_batch, rng):
    """Endless stream of index batches: each epoch shuffles (examples with repeat=k appear k times),
    groups similar lengths (sorted within chunks of ~64 batches) to waste little on padding, then
    shuffles the batch order."""
    base = np.repeat(np.arange(len(data)), data.repeats)
    chunk = max(1, int(64 * tokens_per_batch / float(data.lengths.mean())))
    while True:
        order = base[rng.permutation(len(base))]
        out = []
        for c in range(0, len(order), chunk):
            part = order[c:c + chunk]
            out += pack_sorted(part[np.argsort(data.lengths[part], kind="stable")], data.lengths, tokens_per_batch)
        for i in rng.permutation(len(out)):
            yield out[i]


# ---------------------------------------------------------------- model helpers

def weighted_loss(model, ids, w):
    logits = model(input_ids=ids).logits[:, :-1]
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none")
    ce = ce.view_as(w)
    return (ce * w).sum() / w.sum().clamp_min(1e-6), ce


@torch.no_grad()
def evaluate(model, data, device, tokens_per_batch, limit=None):
    """Mean cross-entropy over assistant tokens (what the user sees), per token."""
    model.eval()
    order = np.argsort(data.lengths, kind="stable")
    if limit is not None and len(order) > limit:
        order = np.sort(np.random.default_rng(0).choice(order, limit, replace=False))
        order = order[np.argsort(data.lengths[order], kind="stable")]
    total, count = 0.0, 0
    for idx in pack_sorted(order, data.lengths, tokens_per_batch):
        ids, w, ans = data.batch(idx, device)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            _loss, ce = weighted_loss(model, ids, w)
        total += float((ce * ans).sum())
        count += int(ans.sum())
    model.train()
    loss = total / max(count, 1)
    return {"loss": loss, "perplexity": math.exp(loss), "tokens": count}


@torch.no_grad()
def greedy(model, tok, fmt, question, device, max_new=120, eos=2):
    """Plain argmax loop with full recompute (no cache): simple and obviously correct."""
    model.eval()
    text = fmt.render([{"role": "user", "content": question}], add_generation_prompt=True)
    ids = tok.encode(text, add_special_tokens=False).ids
    out = []
    for _ in range(max_new):
        x = torch.tensor([ids + out], device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            nxt = int(model(input_ids=x).logits[0, -1].float().argmax())
        if nxt == eos:
            break
        out.append(nxt)
    model.train()
    return tok.decode(out, skip_special_tokens=True).strip()


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", required=True, help="folder with train.jsonl.gz and heldout.jsonl.gz")
    ap.add_argument("--out", required=True)
    ap.add_argument("--config", default=os.path.join(REPO, "models/configs/llama/scratchy-tiny.json"))
    ap.add_argument("--tokenizer-dir", default=os.path.join(REPO, "models/default/scratchy-tiny"))
    ap.add_argument("--minutes", type=float, default=7.0, help="training wall-time budget")
    ap.add_argument("--steps", type=int, default=0, help="fixed step count (0: as many as fit in --minutes)")
    ap.add_argument("--tokens-per-batch", type=int, default=65536)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--prompt-weight", type=float, default=0.1, help="loss weight of non-assistant tokens")
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--max-conversations", type=int, default=0, help="for quick tests: use only the first N")
    ap.add_argument("--samples", type=int, default=30, help="held-out questions to answer greedily")
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    random.seed(a.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    from tokenizers import Tokenizer
    import transformers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    log("torch", torch.__version__, "transformers", transformers.__version__, "device", device)

    fmt = ChatFormat(a.tokenizer_dir)
    tok = Tokenizer.from_file(os.path.join(a.tokenizer_dir, "tokenizer.json"))
    train_rows = load_jsonl_gz(os.path.join(a.corpus, "train.jsonl.gz"))
    held_rows = load_jsonl_gz(os.path.join(a.corpus, "heldout.jsonl.gz"))
    if a.max_conversations:
        train_rows, held_rows = train_rows[:a.max_conversations], held_rows[:max(50, a.max_conversations // 50)]
    log("conversations: train", len(train_rows), "held-out", len(held_rows))

    # Check on one conversation that the answer mask lines up with the template's assistant text.
    _init_worker(a.tokenizer_dir)
    ids, mask = _encode([train_rows[0]["messages"]])[0]
    log("example ids", ids[:48], "answer part:", repr(tok.decode([t for t, m in zip(ids, mask) if m])))

    train = Packed(encode_all(train_rows, a.tokenizer_dir, a.workers), [r["repeat"] for r in train_rows],
                   a.max_len, a.prompt_weight)
    held = Packed(encode_all(held_rows, a.tokenizer_dir, a.workers), [1] * len(held_rows), a.max_len,
                  a.prompt_weight)
    log("tokens: train", int(train.lengths.sum()), "weighted", int((train.lengths * train.repeats).sum()),
        "held-out", int(held.lengths.sum()), "dropped (too long):", train.dropped, held.dropped,
        "mean length", round(float(train.lengths.mean()), 1), "max", int(train.lengths.max()))

    with open(a.config) as f:
        cfg_dict = json.load(f)
    cfg_dict.pop("dtype", None)
    config = LlamaConfig(**{k: v for k, v in cfg_dict.items() if k not in ("architectures", "model_type")})
    config.architectures = ["LlamaForCausalLM"]
    model = LlamaForCausalLM(config).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    log("params", n_params, "bf16 bytes", 2 * n_params)

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if device.type == "cuda" else {}))
    rng = np.random.default_rng(a.seed)
    stream = batches(train, a.tokens_per_batch, rng)

    budget_s = a.minutes * 60
    total_steps = a.steps or 10 ** 9  # fixed once the step speed is known (see below)
    step, tokens_seen, t_start = 0, 0, time.time()
    model.train()
    while step < total_steps:
        # Fix the schedule length once the step rate has settled (the first ~100 steps are slower).
        if step == 100:
            t_100 = time.time()
        if a.steps == 0 and step == 300:
            rate = 200 / (time.time() - t_100)
            total_steps = max(400, int(300 + rate * (budget_s - (time.time() - t_start))))
            log("measured %.2f steps/s -> %d steps in %.1f min" % (rate, total_steps, a.minutes))
        frac = step / max(total_steps, 1) if total_steps < 10 ** 9 else 0.0
        lr = a.lr * min(1.0, (step + 1) / a.warmup) * (
            a.min_lr_ratio + (1 - a.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
        for g in opt.param_groups:
            g["lr"] = lr
        ids, w, _ans = train.batch(next(stream), device)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss, _ce = weighted_loss(model, ids, w)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        tokens_seen += ids.numel()
        if step % 100 == 0 or step == 1:
            log("step %d/%s loss %.4f lr %.2e tokens %d (%.0f tok/s)" % (
                step, total_steps if total_steps < 10 ** 9 else "?", loss.item(), lr, tokens_seen,
                tokens_seen / (time.time() - t_start)))
        if a.steps == 0 and time.time() - t_start > budget_s * 1.05:
            log("time budget reached at step", step)
            break
    train_s = time.time() - t_start
    log("trained", step, "steps,", tokens_seen, "tokens in", round(train_s, 1), "s")

    # Save first (so a failure below loses nothing), then evaluate the bf16 weights exactly as shipped.
    model = model.to(torch.bfloat16)
    out_model = os.path.join(a.out, "model")
    os.makedirs(out_model, exist_ok=True)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(out_model, safe_serialization=True)
    GenerationConfig(bos_token_id=1, eos_token_id=2, do_sample=False, max_new_tokens=128).save_pretrained(out_model)
    for name in TOKENIZER_FILES:
        shutil.copy(os.path.join(a.tokenizer_dir, name), out_model)
    metrics = {"steps": step, "tokens_seen": tokens_seen, "train_seconds": round(train_s, 1),
               "params": n_params, "lr": a.lr, "tokens_per_batch": a.tokens_per_batch,
               "prompt_weight": a.prompt_weight, "seed": a.seed,
               "train_conversations": len(train), "heldout_conversations": len(held),
               "heldout_answer": evaluate(model, held, device, a.tokens_per_batch),
               "train_answer_sample": evaluate(model, train, device, a.tokens_per_batch, limit=10000),
               "torch": torch.__version__, "transformers": transformers.__version__}
    log("held-out answer loss %.4f ppl %.2f | train sample loss %.4f ppl %.2f" % (
        metrics["heldout_answer"]["loss"], metrics["heldout_answer"]["perplexity"],
        metrics["train_answer_sample"]["loss"], metrics["train_answer_sample"]["perplexity"]))

    samples = []
    # Held-out questions about common words (repeat 2 = senses seen in SemCor), spread over the alphabet.
    pool = [r for r in held_rows if r["repeat"] > 1 and r["headword"].isalpha()
            and r["kind"] in ("definition", "meaning", "verb", "synonym", "example")]
    picks = pool[::max(1, len(pool) // max(a.samples, 1))][:a.samples]
    for q in DEMO_QUESTIONS:
        samples.append({"set": "demo", "question": q, "answer": greedy(model, tok, fmt, q, device)})
    for r in picks:
        q, ref = r["messages"][0]["content"], r["messages"][1]["content"]
        samples.append({"set": "heldout", "question": q, "reference": ref,
                        "answer": greedy(model, tok, fmt, q, device)})
    for s in samples:
        log("Q:", s["question"], "| A:", s["answer"], ("| REF: " + s["reference"]) if "reference" in s else "")

    with open(os.path.join(a.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    with open(os.path.join(a.out, "samples.json"), "w") as f:
        json.dump(samples, f, indent=1, ensure_ascii=False)
    log("saved to", out_model, sorted(os.listdir(out_model)), "and metrics.json, samples.json")


if __name__ == "__main__":
    main()
