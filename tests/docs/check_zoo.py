#!/usr/bin/env python3
"""The model zoo (examples/zoo/, issue 44): one imported file per `tally import-hf` family.

    check_zoo.py TALLY REPO            check (exit 1 on any difference)
    check_zoo.py TALLY REPO --update   rewrite the .tally files and docs/zoo.md's table

For each family in ZOO below:
  1. `tally import-hf examples/zoo/NAME.json` equals the committed examples/zoo/NAME.tally;
  2. `tally report NAME.tally` (its train plan) exits 0 and warns only with the kinds listed
     (each is a true statement about that model: GPT-2's and BERT's vocabularies and
     Qwen1.5-MoE's 60-expert router are not multiples of 8);
  3. `tally report --plan serve --format json NAME.tally` (one sequence of 8192 tokens, or the
     model's whole context when shorter) gives the table's numbers: parameters
     (params.total), active parameters (params.active), forward FLOPs per token of the prefill
     (inference.prefill_flops / prompt tokens; model FLOPs, attention counted densely within
     the causal window, the loss included) and the KV cache per token at that context
     (inference.kv_cache_bytes / prompt tokens: a sliding-window layer holds only its window);
  4. the counts equal the exact sums derived by hand in tests/lit/import-hf-*.tally (each the
     model's `sum(p.numel())`), and round (or truncate) to the counts the model cards publish;
     DeepSeek's KV bytes per token equal their papers' (d_c + d_h^R) × layers × 2 bytes;
  5. the table generated from those numbers equals the one in docs/zoo.md between its
     markers.
Nothing in the table is typed by hand: every number is read from tally's JSON report.
"""
import json
import os
import subprocess
import sys
import tempfile

B = 1e9

# name: the config's file stem in examples/zoo/. repo: its Hugging Face repository (the
# config.json copied from it; tests/hf/README.md lists the same files). exact: the
# sum(p.numel()) count derived in the lit test named. card: the model card's published
# counts (billions, as written there) and where they are published. warnings: the warning
# kinds the train plan's report may print. active_without: blocks the card leaves out of its
# active count.
ZOO = [
    dict(family="llama", name="llama-2-7b", repo="meta-llama/Llama-2-7b-hf",
         exact=6738415616, lit="import-hf-families", card=dict(total="7", source="model card: 7B")),
    dict(family="mistral", name="mistral-7b-v0.1", repo="mistralai/Mistral-7B-v0.1",
         exact=7241732096, lit="import-hf-families",
         # The announcement's 7.3B (Mistral AI, 2023-09-27) is not the checkpoint's sum, which
         # rounds to 7.2B; the name's 7B is checked.
         card=dict(total="7", source="model name: 7B")),
    dict(family="mixtral", name="mixtral-8x7b", repo="mistralai/Mixtral-8x7B-v0.1",
         exact=46702792704, lit="import-hf-families",
         card=dict(total="46.7", active="12.9",
                   source="Mistral AI, 'Mixtral of experts' (2023-12-11): 46.7B total, 12.9B per token")),
    dict(family="qwen2", name="qwen2-0.5b", repo="Qwen/Qwen2-0.5B",
         exact=494032768, lit="import-hf-families", card=dict(total="0.49", source="model card: 0.49B")),
    dict(family="qwen2_moe", name="qwen1.5-moe-a2.7b", repo="Qwen/Qwen1.5-MoE-A2.7B",
         exact=14315784192, lit="import-hf-modern",
         card=dict(total="14.3", active="2.7", source="model card: 14.3B total, 2.7B activated"),
         warnings=["unaligned-matmul"]),
    dict(family="qwen3", name="qwen3-0.6b", repo="Qwen/Qwen3-0.6B",
         exact=596049920, lit="import-hf-modern", card=dict(total="0.6", source="model card: 0.6B")),
    dict(family="qwen3_moe", name="qwen3-30b-a3b", repo="Qwen/Qwen3-30B-A3B",
         exact=30532122624, lit="import-hf-modern",
         card=dict(total="30.5", active="3.3", source="model card: 30.5B total, 3.3B activated")),
    dict(family="gemma", name="gemma-7b", repo="google/gemma-7b",
         exact=8537680896, lit="import-hf-families",
         card=dict(total="8.5", source="8,537,680,896 (tests/hf/README.md)")),
    dict(family="gemma2", name="gemma-2-2b", repo="google/gemma-2-2b",
         exact=2614341888, lit="import-hf-modern", card=dict(total="2.6", source="model card: 2.6B")),
    dict(family="gemma3_text", name="gemma-3-1b-pt", repo="google/gemma-3-1b-pt",
         exact=999885952, lit="import-hf-modern", card=dict(total="1", source="model card: 1B")),
    dict(family="phi3", name="phi-3-mini-4k-instruct", repo="microsoft/Phi-3-mini-4k-instruct",
         exact=3821079552, lit="import-hf-modern", card=dict(total="3.8", source="model card: 3.8B")),
    dict(family="falcon", name="falcon-7b", repo="tiiuae/falcon-7b",
         exact=6921720704, lit="import-hf-modern", card=dict(total="7", source="model card: 7B")),
    dict(family="olmo", name="olmo-7b-hf", repo="allenai/OLMo-7B-hf",
         exact=6888095744, lit="import-hf-modern", card=dict(total="7", source="model card: 7B")),
    dict(family="olmo2", name="olmo-2-1124-7b", repo="allenai/OLMo-2-1124-7B",
         exact=7298617344, lit="import-hf-modern", card=dict(total="7", source="model card: 7B")),
    dict(family="gpt2", name="gpt2", repo="openai-community/gpt2",
         exact=124439808, lit="import-hf-families", card=dict(total="0.124", source="model card: 124M"),
         warnings=["unaligned-matmul"]),
    dict(family="gpt_neox", name="pythia-160m", repo="EleutherAI/pythia-160m",
         exact=162322944, lit="import-hf-families",
         card=dict(total="0.162", source="Pythia (arXiv:2304.01373) Table 1: 162,322,944")),
    dict(family="starcoder2", name="starcoder2-3b", repo="bigcode/starcoder2-3b",
         exact=3030371328, lit="import-hf-modern", card=dict(total="3", source="model card: 3B")),
    dict(family="deepseek_v2", name="deepseek-v2-lite", repo="deepseek-ai/DeepSeek-V2-Lite",
         exact=15706484224, lit="import-hf-deepseek",
         card=dict(total="15.7", active="2.4",
                   source="DeepSeek-V2 (arXiv:2405.04434) and model card: 15.7B total, 2.4B activated"),
         # The card's 2.4B leaves out the input embedding table (a lookup, not a product).
         active_without=["embed"],
         # (d_c + d_h^R) x layers x 2 bytes: DeepSeek-V2 §2.1.3, Table 1 (512 + 64, 27 layers).
         kv_paper=(512 + 64) * 27 * 2),
    dict(family="deepseek_v3", name="deepseek-v3", repo="deepseek-ai/DeepSeek-V3",
         exact=671026419200, lit="import-hf-deepseek",
         card=dict(total="671", active="37",
                   source="DeepSeek-V3 (arXiv:2412.19437): 671B total, 37B activated"),
         # 70.272 KB: Zhao et al. 2025 (arXiv:2505.09343) Table 1; (512 + 64) x 61 layers x 2 B.
         kv_paper=(512 + 64) * 61 * 2),
    dict(family="bert", name="bert-base-uncased", repo="google-bert/bert-base-uncased",
         exact=109514298, lit="import-hf-families", card=dict(total="0.110", source="model card: 110M"),
         warnings=["unaligned-matmul"], encoder=True),
]


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def close_to_card(count, published):
    """The count rounds, or truncates, to the card's figure at the card's precision."""
    decimals = len(published.split(".")[1]) if "." in published else 0
    unit = 10.0 ** -decimals
    p, x = float(published), count / B
    return p - unit / 2 <= x < p + unit


def group(n):
    return f"{int(round(n)):,}"


def row_of(z, d):
    inf, params = d["inference"], d["params"]
    tokens = d["batch"] * inf["max_context"]
    flops = inf["prefill_flops"] / tokens
    kv = inf["kv_cache_bytes"] / tokens
    active = params["active"]
    # tally says when a model is an encoder (no causal attention: no KV cache, no decoding).
    kv_text = "— (encoder)" if inf["encoder"] else (group(kv) if kv == int(kv) else f"{kv:,.1f}")
    return (f"| `{z['family']}` | [{z['name']}](../examples/zoo/{z['name']}.tally) "
            f"| {group(params['total'])} "
            f"| {group(active) if active < params['total'] else '(dense)'} "
            f"| {flops / B:.3g} | {int(inf['max_context']):,} | {kv_text} |")


def check_family(tally, repo, z, update, errors, rows):
    base = os.path.join(repo, "examples", "zoo", z["name"])
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, z["name"] + ".tally")
        r = run([tally, "import-hf", base + ".json", "-o", out])
        if r.returncode != 0:
            errors.append(f"{z['name']}: import-hf failed: {r.stderr.strip()}")
            return
        fresh = open(out).read()
    committed = open(base + ".tally").read() if os.path.exists(base + ".tally") else ""
    if fresh != committed:
        if update:
            open(base + ".tally", "w").write(fresh)
        else:
            errors.append(f"{z['name']}.tally differs from what import-hf writes now "
                          f"(run with --update)")
    r = run([tally, "report", "--no-color", base + ".tally"])
    kinds = sorted({line.rsplit("[", 1)[1].rstrip("]") for line in r.stderr.splitlines()
                    if ": warning: " in line})
    if r.returncode != 0 or "error:" in r.stderr:
        errors.append(f"{z['name']}: tally report failed: {r.stderr.strip()[:400]}")
    if kinds != sorted(z.get("warnings", [])):
        errors.append(f"{z['name']}: warnings {kinds}, expected {sorted(z.get('warnings', []))}")
    r = run([tally, "report", "--plan", "serve", "--format", "json", "-w", base + ".tally"])
    if r.returncode != 0:
        errors.append(f"{z['name']}: tally report --plan serve failed: {r.stderr.strip()[:400]}")
        return
    d = json.loads(r.stdout)
    params = d["params"]
    if params["total"] != z["exact"]:
        errors.append(f"{z['name']}: {params['total']:,.0f} parameters, the exact count "
                      f"(tests/lit/{z['lit']}.tally) is {z['exact']:,}")
    card = z["card"]
    if not close_to_card(params["total"], card["total"]):
        errors.append(f"{z['name']}: {params['total']:,.0f} parameters is not the card's "
                      f"{card['total']}B ({card['source']})")
    if "active" in card:
        active = params["active"]
        for block in z.get("active_without", []):
            active -= sum(b["count"] for b in params["by_block"] if b["path"] == block)
        if not close_to_card(active, card["active"]) or params["active"] >= params["total"]:
            errors.append(f"{z['name']}: {active:,.0f} active parameters is not the card's "
                          f"{card['active']}B ({card['source']})")
    elif params["active"] != params["total"]:
        errors.append(f"{z['name']}: a dense model with {params['active']:,.0f} active "
                      f"of {params['total']:,.0f}")
    inf = d["inference"]
    if inf["encoder"] != z.get("encoder", False):
        errors.append(f"{z['name']}: tally reports encoder = {inf['encoder']}, expected "
                      f"{z.get('encoder', False)}")
    if inf["encoder"] and (inf["kv_bytes_per_token"] != 0 or inf["decode_steps"] != 0
                           or inf["tokens_per_s"] is not None):
        errors.append(f"{z['name']}: an encoder with a KV cache or decode steps: "
                      f"{inf['kv_bytes_per_token']} B per token, {inf['decode_steps']} steps")
    if "kv_paper" in z and d["inference"]["kv_bytes_per_token"] != z["kv_paper"]:
        errors.append(f"{z['name']}: KV {d['inference']['kv_bytes_per_token']} bytes per token, "
                      f"the paper's is {z['kv_paper']}")
    rows.append(row_of(z, d))


BEGIN, END = "<!-- zoo-table: begin (tests/docs/check_zoo.py --update) -->", "<!-- zoo-table: end -->"


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    tally, repo = sys.argv[1], sys.argv[2]
    update = "--update" in sys.argv[3:]
    errors, rows = [], []
    for z in ZOO:
        check_family(tally, repo, z, update, errors, rows)
    table = "\n".join([
        "| family | file | parameters | active parameters | forward GFLOPs per token | context | KV bytes per token (bf16) |",
        "|---|---|---:|---:|---:|---:|---:|",
        *rows])
    doc = os.path.join(repo, "docs", "zoo.md")
    text = open(doc).read()
    head, _, rest = text.partition(BEGIN + "\n")
    _, _, tail = rest.partition(END)
    fresh = head + BEGIN + "\n" + table + "\n" + END + tail
    if fresh != text:
        if update:
            open(doc, "w").write(fresh)
        else:
            errors.append("docs/zoo.md's table differs from the reports (run with --update):\n" + table)
    for e in errors:
        print("check_zoo:", e, file=sys.stderr)
    print(f"check_zoo: {len(ZOO)} families, {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
