"""Real workers on a CUDA host, through the gateway: what the CPU suite can only mock.

For each (role layout, dtype) it starts real worker processes with `--device cuda` and a gateway, then checks:
- `/info` names the dtype the worker runs ("auto" resolves to the model config's dtype);
- `/metrics` carries the NVML series (`tandem_gpu_utilization_ratio`, `tandem_gpu_memory_used_bytes`, ...) with the
  GPU label, read from the real driver;
- a greedy completion through the gateway answers, and in float32 it equals the same request on a CPU worker;
- disaggregated: the KV handoff from a prefill worker to a decode worker on the GPU works in bfloat16; a float32
  prefill feeds a bfloat16 decode worker through the gateway (which names the decode dtype: the prefill worker
  converts its KV), and a float32 prefill asked directly, without the decode dtype, is refused (naming both);
- `--compile` (CUDA graphs): /info says compiled with `reduce-overhead`, and float32 completions equal the CPU's;
- `--quantization int8` (the weight-only CUDA path) answers, its agreement with float32 reported;
- `--kv-cache-bytes auto` sizes the pool from free GPU memory (`--kv-memory-fraction`): the KV series are reported.
Prints one JSON document; exits 1 when a check fails.

    python bench/engine/gpu_worker_check.py --model var/models/tiny
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

ROOT = Path(__file__).resolve().parents[2]
NVML_SERIES = ("tandem_gpu_utilization_ratio", "tandem_gpu_memory_used_bytes", "tandem_gpu_memory_total_bytes",
               "tandem_gpu_temperature_celsius", "tandem_gpu_power_watts")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Proc:
    def __init__(self, argv: list[str], log: Path):
        self.log = log
        self.handle = subprocess.Popen(argv, cwd=ROOT, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                                       env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def stop(self) -> None:
        self.handle.terminate()
        try:
            self.handle.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.handle.kill()


def worker(role: str, model: str, *, device: str, dtype: str, logs: Path, extra: tuple[str, ...] = ()
           ) -> tuple[Proc, str]:
    port = free_port()
    kv = () if "--kv-cache-bytes" in extra else ("--kv-cache-bytes", str(256 << 20))
    proc = Proc([sys.executable, "-m", "inference.worker", "--role", role, "--model", model, "--port", str(port),
                 "--device", device, "--dtype", dtype, *kv, "--threads", "4", *extra],
                logs / f"{role}-{device.replace(':', '')}-{dtype}-{port}.log")
    return proc, f"http://127.0.0.1:{port}"


def gateway(logs: Path, **urls: str) -> tuple[Proc, str]:
    port = free_port()
    argv = [sys.executable, "-m", "inference.gateway", "--port", str(port), "--served-model-name", "check"]
    for role, url in urls.items():
        argv += [f"--{role}", url]
    return Proc(argv, logs / f"gateway-{port}.log"), f"http://127.0.0.1:{port}"


def wait_ready(url: str, proc: Proc, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.handle.poll() is not None:
            raise RuntimeError(f"{url} exited: {proc.log.read_text()[-2000:]}")
        try:
            if requests.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{url} not healthy in {timeout_s} s: {proc.log.read_text()[-2000:]}")


def complete(gateway_url: str, prompt: str, max_tokens: int = 24) -> dict:
    response = requests.post(f"{gateway_url}/v1/completions", timeout=120, json={
        "model": "check", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    response.raise_for_status()
    return response.json()


def nvml_series(url: str) -> dict[str, float]:
    text = requests.get(f"{url}/metrics", timeout=10).text
    found = {}
    for line in text.splitlines():
        for name in NVML_SERIES:
            if line.startswith(name + "{") or line.startswith(name + " "):
                found[name] = float(line.rsplit(" ", 1)[1])
    return found


PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land far away,"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "var" / "models" / "tiny"))
    parser.add_argument("--logs", default="/tmp/gpu-worker-check")
    parser.add_argument("--device", default="cuda", help="the device under test (cpu: a dry run of this script)")
    options = parser.parse_args()
    logs = Path(options.logs)
    logs.mkdir(parents=True, exist_ok=True)
    report: dict = {"model": options.model, "checks": {}, "failures": []}
    procs: list[Proc] = []

    def check(name: str, ok: bool, detail) -> None:
        report["checks"][name] = {"ok": bool(ok), "detail": detail}
        if not ok:
            report["failures"].append(name)

    try:
        # 1. colocated on the GPU in float32 and in bfloat16, against the same worker on the CPU in float32.
        cpu, cpu_url = worker("colocated", options.model, device="cpu", dtype="float32", logs=logs)
        procs.append(cpu)
        wait_ready(cpu_url, cpu)
        cpu_gw, cpu_gw_url = gateway(logs, colocated=cpu_url)
        procs.append(cpu_gw)
        wait_ready(cpu_gw_url, cpu_gw, 60)
        reference = [complete(cpu_gw_url, p)["choices"][0]["text"] for p in PROMPTS]
        for dtype in ("float32", "bfloat16", "auto"):
            gpu, gpu_url = worker("colocated", options.model, device=options.device, dtype=dtype, logs=logs)
            procs.append(gpu)
            wait_ready(gpu_url, gpu)
            info = requests.get(f"{gpu_url}/info", timeout=10).json()
            check(f"colocated-{dtype}-info", info.get("dtype") in ("float32", "bfloat16", "float16"),
                  {k: info.get(k) for k in ("dtype", "dtype_requested", "device")})
            gw, gw_url = gateway(logs, colocated=gpu_url)
            procs.append(gw)
            wait_ready(gw_url, gw, 60)
            texts = [complete(gw_url, p)["choices"][0]["text"] for p in PROMPTS]
            series = nvml_series(gpu_url)
            check(f"colocated-{dtype}-nvml", set(NVML_SERIES[:3]) <= set(series), series)
            if info.get("dtype") == "float32":
                check(f"colocated-{dtype}-equals-cpu-float32", texts == reference,
                      {"gpu": texts, "cpu": reference})
            else:
                same = sum(a == b for a, b in zip(texts, reference))
                report["checks"][f"colocated-{dtype}-vs-cpu-float32"] = {"ok": True, "detail": {
                    "identical_completions": f"{same}/{len(PROMPTS)}", "gpu": texts}}
            for proc in (gw, gpu):
                proc.stop()
                procs.remove(proc)

        # 2. colocated on the GPU with each setting that has a CUDA path of its own.
        for name, dtype, extra in (("compile", "float32", ("--compile",)),
                                   ("int8", "float32", ("--quantization", "int8")),
                                   ("kv-auto", "float32",
                                    ("--kv-cache-bytes", "auto", "--kv-memory-fraction", "0.05"))):
            gpu, gpu_url = worker("colocated", options.model, device=options.device, dtype=dtype, logs=logs,
                                  extra=extra)
            procs.append(gpu)
            wait_ready(gpu_url, gpu, 600 if name == "compile" else 240)
            info = requests.get(f"{gpu_url}/info", timeout=10).json()
            gw, gw_url = gateway(logs, colocated=gpu_url)
            procs.append(gw)
            wait_ready(gw_url, gw, 60)
            texts = [complete(gw_url, p)["choices"][0]["text"] for p in PROMPTS]
            same = sum(a == b for a, b in zip(texts, reference))
            detail = {"identical_completions_vs_cpu_float32": f"{same}/{len(PROMPTS)}", "gpu": texts}
            if name == "compile":
                compiled = info.get("compile") or {}
                check("colocated-compile-info", compiled.get("enabled") is True
                      and compiled.get("mode") == "reduce-overhead", compiled)
                check("colocated-compile-equals-cpu-float32", texts == reference, detail)
            elif name == "int8":
                check("colocated-int8-info", info.get("quantization") == "int8",
                      {k: info.get(k) for k in ("quantization", "weight_bytes", "note")})
                report["checks"]["colocated-int8-vs-cpu-float32"] = {"ok": True, "detail": detail}
            else:
                kv = {line.split(" ")[0]: line.rsplit(" ", 1)[1] for line in
                      requests.get(f"{gpu_url}/metrics", timeout=10).text.splitlines()
                      if line.startswith("tandem_kv") and "_seconds" not in line}
                check("colocated-kv-auto", bool(texts[0]) and info.get("max_model_len", 0) > 0,
                      {"max_model_len": info.get("max_model_len"), "kv_series": kv})
            for proc in (gw, gpu):
                proc.stop()
                procs.remove(proc)

        # 3. disaggregated on the GPU: bfloat16 prefill → bfloat16 decode through the gateway; a float32 prefill →
        #    bfloat16 decode through the gateway (converted); the same asked directly, without the decode dtype,
        #    refused by the decode worker.
        prefill, prefill_url = worker("prefill", options.model, device=options.device, dtype="bfloat16", logs=logs)
        decode, decode_url = worker("decode", options.model, device=options.device, dtype="bfloat16", logs=logs)
        prefill32, prefill32_url = worker("prefill", options.model, device=options.device, dtype="float32", logs=logs)
        procs += [prefill, decode, prefill32]
        for url, proc in ((prefill_url, prefill), (decode_url, decode), (prefill32_url, prefill32)):
            wait_ready(url, proc)
        gw, gw_url = gateway(logs, prefill=prefill_url, decode=decode_url)
        procs.append(gw)
        wait_ready(gw_url, gw, 60)
        answer = complete(gw_url, PROMPTS[0])
        check("disaggregated-bfloat16-handoff", bool(answer["choices"][0]["text"]) and
              answer["usage"]["completion_tokens"] > 0, answer["usage"])
        mixed_gw, mixed_gw_url = gateway(logs, prefill=prefill32_url, decode=decode_url)
        procs.append(mixed_gw)
        wait_ready(mixed_gw_url, mixed_gw, 60)
        mixed = complete(mixed_gw_url, PROMPTS[0])
        check("disaggregated-float32-prefill-bfloat16-decode-converted", bool(mixed["choices"][0]["text"]),
              {"usage": mixed["usage"], "text": mixed["choices"][0]["text"],
               "bfloat16_pair": answer["choices"][0]["text"]})
        refused = requests.post(f"{prefill32_url}/v1/prefill", timeout=60, json={
            "request_id": "gpu-check-mismatch", "prompt": PROMPTS[0], "max_tokens": 8, "decode_url": decode_url})
        check("kv-dtype-mismatch-refused", refused.status_code >= 400 and "'float32'" in refused.text
              and "'bfloat16'" in refused.text, {"status": refused.status_code, "body": refused.text[:300]})
        check("decode-healthy-after-refusal", requests.get(f"{decode_url}/health", timeout=5).status_code == 200,
              "GET /health")
    except Exception as exc:  # report what broke, with the checks done so far
        report["failures"].append(f"error: {exc!r}"[:2000])
    finally:
        for proc in procs:
            proc.stop()
    print(json.dumps(report, indent=1))
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
