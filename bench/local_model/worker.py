"""One bench variant in a fresh process: `python -m bench.local_model.worker JOB_JSON`.

The job names the family, the variant, the working-directory name and the model settings; the
workspace is written under a temporary folder with that name and the process runs inside it, so
nothing carries over between variants (no KV cache, no grammar cache, no working directory).
Prints one JSON line: the outcome and llama.cpp's timings.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.local_model.tasks import TASKS, Task, check, make_workspace
from tether._agent import Agent
from tether._limits import Limits
from tether._types import StopReason
from tether.cli._build import default_instructions
from tether.models._local import LocalModel
from tether.policy import DenyAll, SafetyPolicy
from tether.tools._base import Tool
from tether.tools._executor import Executor
from tether.tools.builtin._calculator import calculator
from tether.tools.builtin._files import read_tool

LIMITS = Limits(max_steps=6, max_repeats=2)


def families() -> dict[str, Task]:
    out = {t.name: t for t in TASKS}
    from bench.local_model.rag import rag_task

    rag = rag_task()
    if rag is not None:
        out[rag[0].name] = rag[0]
    return out


def tools_for(kind: str, workspace: Path) -> list[Tool]:
    if kind == "calculator":
        return [calculator]
    if kind == "files":
        return [read_tool(workspace)]
    if kind == "rag":
        from bench.local_model.rag import rag_task

        rag = rag_task()
        if rag is None:
            raise SystemExit("the retrieval example is not available")
        return rag[1]()
    raise ValueError(f"unknown tool set {kind!r}")


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    task = families()[job["family"]]
    variant = task.variants[job["index"]]
    with tempfile.TemporaryDirectory(prefix="tether-bench-") as tmp:
        workspace = make_workspace(Path(tmp) / job["dirname"])
        os.chdir(workspace)
        model = LocalModel(job.get("gguf"), n_threads=job.get("threads"), temperature=0.0)
        model.load()
        tools = tools_for(task.tools, workspace)
        # As `tether -p` runs it: the CLI's default instructions and its policy when nobody can
        # approve (untrusted results wrapped as data). No read_result: every result fits the cap.
        policy = SafetyPolicy(approver=DenyAll())
        executor = Executor(tools, policy=policy, read_result=False)
        agent = Agent(model, tools=tools, instructions=default_instructions(model, tools, workspace),
                      limits=LIMITS, policy=policy, executor=executor)
        stats: list[Any] = []
        inner = model.complete_sync

        def recording(request: Any) -> Any:
            reply = inner(request)
            stats.append(model.last_stats)
            return reply

        model.complete_sync = recording  # type: ignore[method-assign]
        start = time.perf_counter()
        result = agent.run(variant.prompt)
        elapsed = time.perf_counter() - start
        os.chdir(tmp)
    return {
        "family": task.name,
        "index": job["index"],
        "dirname": job["dirname"],
        "prompt": variant.prompt,
        "held_out": variant.held_out,
        "ok": result.stop_reason is StopReason.COMPLETED and check(result.answer, variant.expected),
        "answer": result.answer,
        "stop_reason": result.stop_reason.value,
        "seconds": elapsed,
        "steps": result.steps,
        "tool_calls": [f"{c.name}({c.arguments})" for m in result.messages for c in m.tool_calls],
        "model": model.name,
        "gguf": model.path.name,
        "n_threads": model.n_threads,
        "calls": [[s.prompt_tokens, s.prompt_eval_tokens, s.prompt_eval_seconds, s.eval_tokens, s.eval_seconds]
                  for s in stats],
    }


def main(argv: list[str]) -> int:
    print(json.dumps(run_job(json.loads(argv[0]))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
