#!/usr/bin/env python3
"""Dependency-light reference for scratchy-tiny (and other small Llama checkpoints with a
SentencePiece-style BPE tokenizer.json): float32 PyTorch forward with a KV cache, greedy decoding,
written from the Hugging Face Llama definition. Needs only torch and jinja2 (Debian: python3-torch,
python3-jinja2) -- no transformers, no tokenizers -- so it runs on the 2-core CPU machine.

Use it to see what the model answers without the engine, and to cross-check the engine:
  python3 tools/train/reference_chat.py [--model models/default/scratchy-tiny] [--max-tokens 64] "What is a telescope?" ...
  python3 tools/train/reference_chat.py --ids "What is a telescope?"   # print prompt token ids too
"""
import argparse
import json
import math
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_format import ChatFormat  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


class BpeTokenizer:
    """The subset of tokenizer.json that Llama-2-style tokenizers use: special tokens split out first,
    normalizer Prepend('▁') + Replace(' ', '▁') on each remaining piece, BPE by merge rank over the
    whole piece (no pre-tokenizer), byte fallback; decoder Replace('▁', ' '), ByteFallback, Fuse,
    Strip(1 leading space)."""

    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            t = json.load(f)
        m = t["model"]
        if m["type"] != "BPE" or t.get("pre_tokenizer"):
            raise ValueError("only pre-tokenizer-free BPE tokenizers are supported")
        self.vocab = m["vocab"]
        self.inv = {i: s for s, i in self.vocab.items()}
        merges = [tuple(x.split(" ", 1)) if isinstance(x, str) else tuple(x) for x in m["merges"]]
        self.rank = {pair: r for r, pair in enumerate(merges)}
        self.special = {a["content"]: a["id"] for a in t["added_tokens"]}
        self.special_ids = {a["id"] for a in t["added_tokens"] if a.get("special")}

    def _bpe(self, piece):
        syms = []
        for ch in piece:
            if ch in self.vocab:
                syms.append(ch)
            else:
                syms += ["<0x%02X>" % b for b in ch.encode("utf-8")]
        while len(syms) > 1:
            best, at = None, -1
            for i in range(len(syms) - 1):
                r = self.rank.get((syms[i], syms[i + 1]))
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            syms[at:at + 2] = [syms[at] + syms[at + 1]]
        return [self.vocab.get(s, self.vocab.get("<unk>", 0)) for s in syms]

    def encode(self, text):
        """Text as rendered by the chat template (special tokens written out), no BOS added."""
        ids, start, i = [], 0, 0
        specials = sorted(self.special, key=len, reverse=True)
        while i < len(text):
            hit = next((s for s in specials if text.startswith(s, i)), None)
            if hit is None:
                i += 1
                continue
            if start < i:
                ids += self._bpe("▁" + text[start:i].replace(" ", "▁"))
            ids.append(self.special[hit])
            i += len(hit)
            start = i
        if start < len(text):
            ids += self._bpe("▁" + text[start:].replace(" ", "▁"))
        return ids

    def decode(self, ids):
        out, pending = [], bytearray()
        for t in ids:
            if t in self.special_ids:
                continue
            s = self.inv[t]
            if len(s) == 6 and s.startswith("<0x") and s.endswith(">"):
                pending.append(int(s[3:5], 16))
                continue
            if pending:
                out.append(pending.decode("utf-8", errors="replace"))
                pending = bytearray()
            out.append(s.replace("▁", " "))
        if pending:
            out.append(pending.decode("utf-8", errors="replace"))
        text = "".join(out)
        return text[1:] if text.startswith(" ") else text


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        blob = f.read()
    dtypes = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16}
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        b, e = meta["data_offsets"]
        t = torch.frombuffer(bytearray(blob[b:e]), dtype=dtypes[meta["dtype"]]) if e > b else torch.empty(0)
        out[name] = t.view(meta["shape"]).float()
    return out


class Llama:
    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            c = json.load(f)
        self.c = c
        self.w = load_safetensors(os.path.join(model_dir, "model.safetensors"))
        self.L, self.nh, self.nkv = c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"]
        self.hd = c.get("head_dim") or c["hidden_size"] // self.nh
        theta = (c.get("rope_parameters") or {}).get("rope_theta", c.get("rope_theta", 10000.0))
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd))
        self.eps = c["rms_norm_eps"]
        self.lm_head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])

    def _norm(self, x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def _rope(self, x, pos):
        freqs = pos[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], -1)
        cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
        x1, x2 = x[..., :self.hd // 2], x[..., self.hd // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    @torch.no_grad()
    def forward(self, ids, cache, start):
        """ids: new tokens at positions start..; cache: per layer [k, v] (T, nkv, hd), grown in place."""
        w = self.w
        h = w["model.embed_tokens.weight"][torch.tensor(ids)]
        pos = torch.arange(start, start + len(ids))
        T_new = len(ids)
        for i in range(self.L):
            p = "model.layers.%d." % i
            x = self._norm(h, w[p + "input_layernorm.weight"])
            q = (x @ w[p + "self_attn.q_proj.weight"].T).view(T_new, self.nh, self.hd)
            k = (x @ w[p + "self_attn.k_proj.weight"].T).view(T_new, self.nkv, self.hd)
            v = (x @ w[p + "self_attn.v_proj.weight"].T).view(T_new, self.nkv, self.hd)
            q, k = self._rope(q, pos), self._rope(k, pos)
            if len(cache) <= i:
                cache.append([k, v])
            else:
                cache[i] = [torch.cat([cache[i][0], k]), torch.cat([cache[i][1], v])]
            K, V = cache[i]
            rep = self.nh // self.nkv
            K, V = K.repeat_interleave(rep, 1), V.repeat_interleave(rep, 1)
            scores = torch.einsum("qhd,khd->hqk", q, K) / math.sqrt(self.hd)
            kpos = torch.arange(K.shape[0])
            scores = scores.masked_fill(kpos[None, None, :] > pos[None, :, None], float("-inf"))
            att = torch.einsum("hqk,khd->qhd", scores.softmax(-1), V).reshape(T_new, self.nh * self.hd)
            h = h + att @ w[p + "self_attn.o_proj.weight"].T
            x = self._norm(h, w[p + "post_attention_layernorm.weight"])
            gate = x @ w[p + "mlp.gate_proj.weight"].T
            up = x @ w[p + "mlp.up_proj.weight"].T
            h = h + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
        return self._norm(h[-1], w["model.norm.weight"]) @ self.lm_head.T

    def greedy(self, prompt_ids, max_new, eos):
        cache, out = [], []
        logits = self.forward(prompt_ids, cache, 0)
        gaps = []
        while len(out) < max_new:
            top2 = torch.topk(logits, 2).values
            gaps.append(float(top2[0] - top2[1]))
            nxt = int(logits.argmax())
            if nxt == eos:
                break
            out.append(nxt)
            logits = self.forward([nxt], cache, len(prompt_ids) + len(out) - 1)
        return out, (min(gaps) if gaps else 0.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("questions", nargs="*")
    ap.add_argument("--model", default=os.path.join(REPO, "models/default/scratchy-tiny"))
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ids", action="store_true", help="also print prompt and answer token ids")
    ap.add_argument("--json", action="store_true", help="read a JSON list of questions from stdin, print JSON")
    a = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    fmt = ChatFormat(a.model)
    tok = BpeTokenizer(os.path.join(a.model, "tokenizer.json"))
    model = Llama(a.model)
    eos = model.c.get("eos_token_id", 2)
    questions = json.load(sys.stdin) if a.json else a.questions
    results = []
    for q in questions:
        prompt = tok.encode(fmt.render([{"role": "user", "content": q}], add_generation_prompt=True))
        out, gap = model.greedy(prompt, a.max_tokens, eos)
        r = {"question": q, "answer": tok.decode(out).strip(), "min_top2_gap": round(gap, 4)}
        if a.ids:
            r.update(prompt_ids=prompt, answer_ids=out)
        results.append(r)
        if not a.json:
            print(json.dumps(r, ensure_ascii=False), flush=True)
    if a.json:
        print(json.dumps(results, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
