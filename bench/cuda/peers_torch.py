#!/usr/bin/env python3
"""PyTorch + transformers on the same random checkpoint as scr (run on the GPU machine).

    peers_torch.py MODEL_DIR [--figures prefill,batch,eager,compile] [--prompt 128] [--decode 128]
                   [--batch 64] [--batch-decode 32] [--prefill 2048]

Loads MODEL_DIR (the `scr make-random` folder: the same bytes scr reads) in bf16 on cuda, SDPA
attention, and prints one JSON line per figure as soon as it is measured ("JSON {...}"), so that a
run cut short by an outer `timeout` keeps what it finished. Figures, cheapest first:
  prefill  one forward over --prefill tokens (logits of the last position only), median of 3 after a warm-up;
  batch    `generate` at batch --batch, dynamic cache, eager: decode tok/s over all sequences;
  eager    `generate` at batch 1, dynamic cache, eager: decode tok/s;
  compile  `generate` at batch 1 with a static cache, which makes transformers compile the decode
           step (torch.compile, mode reduce-overhead = CUDA graphs, fullgraph); the first call
           compiles (its seconds are reported as compile_s), the second is timed.
Decode tok/s comes from time stamps taken by a stopping criterion after every generated token
(generate synchronizes every step anyway): (tokens after the first) / (last stamp - first stamp),
so the prompt's prefill is not counted. EOS is disabled so every call runs its full length.
"""
import argparse
import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM, StoppingCriteria, StoppingCriteriaList


class StepStamps(StoppingCriteria):
    """Records the time after every generated token; never stops generation."""

    def __init__(self):
        self.stamps = []

    def __call__(self, input_ids, scores, **kwargs):
        self.stamps.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def decode_tps(self, batch):
        s = self.stamps
        if len(s) < 3:
            return float("nan")
        return batch * (len(s) - 1) / (s[-1] - s[0])


def emit(figure, args, **values):
    line = {"peer": "transformers", "model": args.label, "figure": figure, **values}
    print("JSON " + json.dumps(line), flush=True)


def random_ids(vocab, batch, length, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(256, vocab - 256, (batch, length), generator=g).cuda()


def generate(model, ids, new_tokens, **kw):
    stamps = StepStamps()
    with torch.inference_mode():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                       stopping_criteria=StoppingCriteriaList([stamps]), **kw)
    torch.cuda.synchronize()
    return stamps


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir")
    p.add_argument("--figures", default="prefill,batch,eager,compile")
    p.add_argument("--label", default="", help="model name in the JSON lines (default: the folder)")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--decode", type=int, default=128, help="tokens generated at batch 1")
    p.add_argument("--eager-decode", type=int, default=32, help="tokens generated at batch 1, eager (slow)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--batch-decode", type=int, default=32, help="tokens generated per sequence at --batch")
    p.add_argument("--prefill", type=int, default=2048)
    args = p.parse_args()
    args.label = args.label or args.model_dir.rstrip("/").split("/")[-1]
    figures = args.figures.split(",")

    t0 = time.perf_counter()
    try:  # straight onto the GPU
        model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.bfloat16, device_map="cuda",
                                                     attn_implementation="sdpa")
    except Exception as e:  # noqa: BLE001 - device_map wants accelerate in some versions
        print(f"device_map='cuda' refused ({e}); loading on the CPU, then .cuda()", flush=True)
        model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.bfloat16,
                                                     attn_implementation="sdpa").cuda()
    model.eval()
    torch.cuda.synchronize()
    vocab = model.config.vocab_size
    # Random weights emit any id: no EOS stop, every call runs its full length.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    emit("load", args, seconds=round(time.perf_counter() - t0, 2), torch=torch.__version__,
         transformers=__import__("transformers").__version__, gpu=torch.cuda.get_device_name(),
         params_b=round(sum(t.numel() for t in model.parameters()) / 1e9, 3))

    def prefill():
        ids = random_ids(vocab, 1, args.prefill, 1)
        times = []
        with torch.inference_mode():
            for i in range(4):  # the first is the warm-up
                torch.cuda.synchronize()
                t = time.perf_counter()
                model(ids, use_cache=False, logits_to_keep=1)
                torch.cuda.synchronize()
                if i:
                    times.append(time.perf_counter() - t)
        times.sort()
        emit("prefill", args, tokens=args.prefill, tok_s=round(args.prefill / times[len(times) // 2], 1), mode="eager")

    def batch():
        ids = random_ids(vocab, args.batch, args.prompt, 2)
        generate(model, ids, 4)  # warm-up (allocator, kernels' autotuning)
        stamps = generate(model, ids, args.batch_decode)
        emit("decode_batch", args, batch=args.batch, prompt=args.prompt, new_tokens=args.batch_decode,
             tok_s=round(stamps.decode_tps(args.batch), 1), mode="eager, dynamic cache")

    def eager():
        ids = random_ids(vocab, 1, args.prompt, 3)
        generate(model, ids, 4)
        stamps = generate(model, ids, args.eager_decode)
        emit("decode_b1", args, prompt=args.prompt, new_tokens=args.eager_decode,
             tok_s=round(stamps.decode_tps(1), 1), mode="eager, dynamic cache")

    def compiled(fullgraph=True):
        from transformers import CompileConfig
        model.generation_config.cache_implementation = "static"
        model.generation_config.compile_config = CompileConfig(fullgraph=fullgraph, mode="reduce-overhead")
        ids = random_ids(vocab, 1, args.prompt, 3)
        t = time.perf_counter()
        first = generate(model, ids, args.decode)  # compiles the decode step (and captures its graphs)
        compile_s = time.perf_counter() - t
        stamps = generate(model, ids, args.decode)
        emit("decode_b1", args, prompt=args.prompt, new_tokens=args.decode, tok_s=round(stamps.decode_tps(1), 1),
             first_call_tok_s=round(first.decode_tps(1), 1), compile_s=round(compile_s, 1),
             mode=f"static cache + torch.compile (reduce-overhead{', fullgraph' if fullgraph else ''})")

    failed = 0
    steps = {"prefill": prefill, "batch": batch, "eager": eager, "compile": compiled}
    for name in figures:
        try:
            steps[name]()
        except Exception as e:  # noqa: BLE001 - report and go on with the next figure
            failed += 1
            emit(name, args, error=f"{type(e).__name__}: {str(e)[:400]}")
            torch.cuda.empty_cache()
            if name == "compile":  # a graph break under fullgraph: try once more without it
                try:
                    torch._dynamo.reset()
                    compiled(fullgraph=False)
                except Exception as e2:  # noqa: BLE001
                    emit(name, args, error=f"without fullgraph too: {type(e2).__name__}: {str(e2)[:400]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
