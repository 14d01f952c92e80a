"""A vLLM prefill/decode pair handing the KV cache over through vLLM's NixlConnector, on a CUDA host: the check that
decides whether Tandem can lift its refusal of disaggregated vLLM revisions (docs/engines.md). Not run in CI: on
the CPU build no connector hands a KV cache over, and this needs a GPU and a vLLM built for it (with NIXL).

It starts two vLLM OpenAI servers on one GPU (each with --gpu-memory-utilization 0.35), one as prefill and one as
decode, both `kv_role: kv_both` (the NixlConnector's usual setup), then for each prompt:
1. asks the prefill server for one token with `kv_transfer_params: {"do_remote_decode": true}`: it computes the
   prompt's KV and answers with the parameters the decode side needs to pull it;
2. asks the decode server for the completion with those parameters: it pulls the KV over NIXL, computes no prompt
   token itself, and generates;
3. asks the decode server again for the same prompt without them (prefix caching off: it computes the prompt):
   the colocated reference.
Checks: the decode server counts the prompt's tokens as `external_kv_transfer`
(vllm:prompt_tokens_by_source_total), and the disaggregated greedy text equals the colocated one. Prints one JSON
document; exits 1 when a check fails. This is the exchange Tandem's gateway would drive for a vLLM pair (the
prefill leg to its first token, then the decode leg's stream), as vLLM's own toy proxy does.

    python bench/engine/gpu_vllm_disagg.py --python /opt/vllm-cuda/bin/python --model var/models/smollm2-135m-instruct
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

PROMPTS = ["The capital of France is", "Write one sentence about the sea:", "def fibonacci(n):\n"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(python: str, model: str, port: int, side_port: int, log: Path) -> subprocess.Popen:
    config = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0"),
           "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_port), "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", "m",
            "--port", str(port), "--host", "127.0.0.1", "--dtype", "float32", "--enforce-eager",
            "--gpu-memory-utilization", "0.35", "--no-enable-prefix-caching",
            "--kv-transfer-config", json.dumps(config)]
    return subprocess.Popen(argv, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with {proc.returncode}")
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(1)
    raise RuntimeError(f"{url}: not ready within {timeout_s:g} s")


def external_tokens(url: str) -> float:
    for line in requests.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("vllm:prompt_tokens_by_source_total") and 'source="external_kv_transfer"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def complete(url: str, prompt: str, max_tokens: int, kv_transfer_params: dict | None = None) -> dict:
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if kv_transfer_params is not None:
        body["kv_transfer_params"] = kv_transfer_params
    response = requests.post(url + "/v1/completions", json=body, timeout=120)
    response.raise_for_status()
    return response.json()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", required=True, help="a Python with vLLM built for CUDA, and NIXL")
    parser.add_argument("--model", required=True)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--log-dir", type=Path, default=Path("var/gpu_vllm_disagg"))
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    args.log_dir.mkdir(parents=True, exist_ok=True)
    prefill_url, decode_url = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    procs = [start(args.python, args.model, int(prefill_url.rsplit(":", 1)[1]), free_port(),
                   args.log_dir / "prefill.log"),
             start(args.python, args.model, int(decode_url.rsplit(":", 1)[1]), free_port(),
                   args.log_dir / "decode.log")]
    result = {"model": args.model, "connector": "NixlConnector", "prompts": [], "ok": False}
    try:
        for url, proc in zip((prefill_url, decode_url), procs):
            wait_ready(url, proc, args.timeout)
        for prompt in PROMPTS:
            before = external_tokens(decode_url)
            first = complete(prefill_url, prompt, 1, {"do_remote_decode": True, "do_remote_prefill": False,
                                                      "remote_engine_id": None, "remote_block_ids": None,
                                                      "remote_host": None, "remote_port": None})
            params = first.get("kv_transfer_params")
            disaggregated = complete(decode_url, prompt, args.max_tokens, params)
            pulled = external_tokens(decode_url) - before
            colocated = complete(decode_url, prompt, args.max_tokens)
            result["prompts"].append({
                "prompt": prompt, "kv_transfer_params": params, "prompt_tokens": disaggregated["usage"]["prompt_tokens"],
                "external_kv_transfer_tokens": pulled,
                "same_text": disaggregated["choices"][0]["text"] == colocated["choices"][0]["text"]})
        result["ok"] = all(p["kv_transfer_params"] and p["external_kv_transfer_tokens"] > 0 and p["same_text"]
                           for p in result["prompts"])
    except (RuntimeError, requests.RequestException, KeyError) as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(json.dumps(result, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
