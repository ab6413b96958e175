#!/usr/bin/env python3
"""Check `ait job export` against verifiers and prime-rl themselves, for every reference job.

    python scripts/check_verifiers_export.py            # from the repo root, with ait's venv active

1. Builds a separate venv with verifiers from the package index (VERIFIERS_SPEC, default
   "verifiers>=0.4,<0.5"; it pins openai<3, so it never shares ait's venv). Kept at --vf-venv
   (default /tmp/ait-vf-check-venv) and reused while its verifiers still matches; --fresh rebuilds it.
2. For each family with a reference job: a workspace as an episode's agent leaves it (task.json
   + the reference job.toml and env.py), exported with `--to verifiers` and `--to prime-rl`.
3. Installs every exported package into that venv and, there, loads each with verifiers' own loader
   (`vf.load_environment(vf.resolve_env_config({"taskset": {"id": ...}}))`), then checks:
   - the dataset: every task's system prompt, prompt, answer and info equal ait's training rows;
   - the rewards: a set of completions per row (the gold answer in the eval's format, after a tool
     call, wrong, near, bare, verbose, empty, ending on a tool call) scored by the exported
     @vf.rewards through `Task.score` give the same per-function values, weights and total, bit for
     bit, as ait's own reward path (ait.train.grpo.to_trl_reward, weighted as ait.train.fast_grpo);
   - the tools: the per-rollout toolset registered on an MCP server lists the Environment's tools
     with ait's parameter names, types, required set and descriptions, and calling each (with the
     task's example arguments) answers what ait's rollout answers; the server also starts the way
     verifiers launches it (`python -m <package>.taskset`);
   - the package's eval command line (README) parses: `vf-eval ID ... --dry-run`;
   - rollouts: that command runs 2 tasks for real against a scripted OpenAI-compatible model on
     loopback (it makes the task's example tool calls, then answers): through the null harness's chat
     program, a tool server per rollout and verifiers' scoring; each trace's rewards equal ait's on
     the same completion, and its tool answers equal ait's Environment replaying the same calls.
4. prime-rl: neither `prime-rl` nor `prime-rl-configs` is on the package index. With --prime-rl-src
   PATH (a prime-rl checkout), its `packages/prime-rl-configs` is installed into a Python 3.12 venv
   (--prl-venv) with the exported packages, and every rl.toml is validated by prime-rl's own
   `RLConfig` (pydantic-config's TOML loader); without it, the keys written are checked against the
   extract of prime-rl's config models in ait.job.export.prime_rl_schema (which every export also does).

Prints one line per family and a summary; exits 1 if anything differs. `--dump-prime-rl-keys`, run with a
prime-rl venv's python, prints a fresh ait/job/export/prime_rl_schema.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VERIFIERS_SPEC = os.environ.get("VERIFIERS_SPEC", "verifiers>=0.4,<0.5")
ROWS_CHECKED = 3
"""Dataset rows whose completions are scored (every row's data is compared)."""


# ====================================================================================== ait side


def ait_main(args: argparse.Namespace) -> int:
    from importlib.resources import files

    start = time.monotonic()
    families = args.families.split(",") if args.families else sorted(
        p.name for p in (files("ait") / "policy" / "reference_jobs").iterdir() if p.is_dir())
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="ait-export-check-"))
    work.mkdir(parents=True, exist_ok=True)
    python = ensure_venv(Path(args.vf_venv), "python3.11", [VERIFIERS_SPEC, "uv"], args.fresh,
                         probe="import verifiers; print(verifiers.__version__)")
    vf_version = run([python, "-c", "import verifiers; print(verifiers.__version__)"]).strip()
    print(f"verifiers {vf_version} in {args.vf_venv} ({time.monotonic() - start:.0f}s)", flush=True)

    specs, packages, configs = [], [], []
    for family in families:
        spec = ait_family(family, work)
        specs.append(spec)
        packages.append(spec["package_dir"])
        configs.append({"family": family, "rl_toml": spec["rl_toml"], "package_dir": spec["prl_package_dir"]})
    synthetic = synthetic_prime_rl_export(work)
    configs.append(synthetic)
    print(f"exported {len(families)} jobs under {work} ({time.monotonic() - start:.0f}s)", flush=True)

    pip_install(python, packages)
    spec_file = work / "vf_spec.json"
    spec_file.write_text(json.dumps(specs))
    out = work / "vf_results.json"
    run([python, __file__, "--vf-side", str(spec_file), "--out", str(out)], cwd=work)
    results = json.loads(out.read_text())

    failures = 0
    print(f"\n{'family':<16} {'rows':>5} {'completions':>11} {'rewards':>10} {'tools':>6} {'server':>7} "
          f"{'eval':>5} {'rollouts':>9}")
    for spec, res in zip(specs, results):
        diffs = compare(spec, res)
        failures += len(diffs)
        n = len(spec["cases"])
        ok_rewards = n - sum(1 for d in diffs if d.startswith("reward"))
        print(f"{spec['family']:<16} {res['rows']:>5} {n:>11} {f'{ok_rewards}/{n} same':>10} "
              f"{'ok' if not any(d.startswith('tool') for d in diffs) else 'DIFF':>6} "
              f"{'ok' if res['server_started'] else 'FAIL':>7} {'ok' if res['eval_dry_run'] else 'FAIL':>5} "
              f"{len(res['rollouts'])} {'same' if not any(d.startswith('rollout') for d in diffs) else 'DIFF':>4}")
        for d in diffs:
            print(f"    {d}")

    prl = prime_rl_check(args, configs, work)
    failures += prl
    total = sum(len(s["cases"]) for s in specs)
    n_rollouts = sum(len(r["rollouts"]) for r in results)
    print(f"\nverifiers {vf_version}: {len(specs)} families, {total} completions and {n_rollouts} vf-eval rollouts "
          "scored both ways, "
          f"{'all identical' if not failures else f'{failures} difference(s)'}; "
          f"{time.monotonic() - start:.0f}s; files under {work}")
    if not args.keep and not failures:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


def ait_family(family: str, work: Path) -> dict:
    """Workspace, both exports, ait's rows, tool answers and reward values for one family."""
    from ait.harness.episode import seed_workspace
    from ait.job.env_loader import import_env, read_surface
    from ait.job.export import export_job, load_workspace
    from ait.job.export.verifiers_pkg import eval_args
    from ait.policy.reference import reference_job
    from ait.spec import load_spec
    from ait.train.request import build_rows
    from ait.train.rollouts import run_tool
    from importlib.resources import files

    root = work / family
    if root.exists():
        shutil.rmtree(root)
    ws = root / "workspace"
    spec = load_spec(Path(str(files("ait") / "tasks" / f"{family}.json")))
    seed_workspace(ws, spec)
    for name, text in reference_job(family).items():
        (ws / name).write_text(text)
    vf_export = export_job(ws, "verifiers", root / "verifiers")
    prl_export = export_job(ws, "prime-rl", root / "prime-rl")

    surface, errors = read_surface(import_env(ws / "env.py"))
    assert surface is not None, errors
    from ait.job.config import load_job_config

    config = load_job_config(ws / "job.toml")
    rows = build_rows(surface, config.train)
    examples = [(t.name, dict(t.example)) for t in spec.eval_format.tools if t.example is not None]
    # Tool calls, in order, on one Environment per row (state carries between calls): the task's example
    # calls on dataset rows 0 and 1, and the family's gold trace on a family example's world (the info
    # the reference envs read is {"world": ...}).
    from ait.families import get_family

    fam = get_family(spec.family)
    ex = fam.example(__import__("random").Random(0), fam.difficulty(spec.difficulty))
    sessions = [(i, rows[i]["info"], examples) for i in range(min(2, len(rows)))]
    sessions.append((-1, json.dumps({"world": ex.world}), [(c.name, c.arguments) for c in fam.gold_trace(ex)]))
    tools = []
    for i, info, calls in sessions:
        env = surface.env_class()
        if hasattr(env, "reset"):
            env.reset(json.loads(info))
        for name, args in calls:
            tools.append({"row": i, "info": info, "name": name, "args": args,
                          "ait": run_tool(env, set(surface.tools), name, args)[0]})
    cases = []
    for i in range(min(ROWS_CHECKED, len(rows))):
        for case_name, vf_msgs, ait_msgs in completions(rows, i, examples, surface):
            per_fn, weights, total = ait_score(surface, rows[i], ait_msgs)
            cases.append({"row": i, "name": case_name, "messages": vf_msgs,
                          "ait": {"per_fn": per_fn, "weights": weights, "total": total}})
    return {
        "family": family, "env_id": vf_export.env_id, "module": vf_export.module,
        "package_dir": str(vf_export.package_dir), "prl_package_dir": str(prl_export.package_dir),
        "rl_toml": str(prl_export.out_dir / "rl.toml"),
        "rows": rows, "cases": cases, "tools": tools, "tool_schemas": ait_tool_schemas(surface),
        "example_calls": [{"name": n, "args": a} for n, a in examples],
        "eval_args": eval_args(load_workspace(ws), vf_export.env_id, "some-model"),
    }


def ait_tool(surface, row: dict, name: str, args: dict) -> str:
    from ait.train.rollouts import run_tool

    env = surface.env_class()
    if hasattr(env, "reset"):
        env.reset(json.loads(row["info"]))
    return run_tool(env, set(surface.tools), name, args)[0]


def ait_tool_schemas(surface) -> list[dict]:
    from transformers.utils import get_json_schema

    env = surface.env_class()
    return [get_json_schema(getattr(env, name)) for name in surface.tools]


def ait_score(surface, row: dict, messages: list[dict]) -> tuple[list[float], list[float], float]:
    """ait's reward path: the TRL adapter per function (final text, safe call, clip), weighted and
    added as the fast trainer does."""
    from ait.train.grpo import to_trl_reward

    errors: dict[str, int] = {}
    per_fn = [to_trl_reward(fn, errors)([messages], [row["answer"]], [row["info"]])[0] for fn in surface.reward_funcs]
    weights = surface.reward_weights or [1.0] * len(surface.reward_funcs)
    total = sum(w * v for w, v in zip(weights, per_fn))
    return per_fn, weights, total


def completions(rows: list[dict], i: int, examples: list, surface) -> list[tuple[str, list, list]]:
    """(name, verifiers-format messages, ait-format messages) for row i."""
    answer = rows[i]["answer"]
    other = next((r["answer"] for r in rows if r["answer"] != answer), answer + "0")
    try:
        near = str(int(answer) + 1)
    except ValueError:
        near = answer[:-1] or "x"

    def say(text):
        return [{"role": "assistant", "content": text}], [{"role": "assistant", "content": text}]

    out = [("gold", *say(f"Answer: {answer}")),
           ("verbose_gold", *say(f"I worked it out step by step.\nThe result is {answer}.\nAnswer: {answer}\n")),
           ("wrong", *say(f"Answer: {other}")),
           ("near", *say(f"Answer: {near}")),
           ("bare", *say(answer)),
           ("empty", *say(""))]
    if examples:
        name, args = examples[0]
        result = ait_tool(surface, rows[i], name, args)
        vf_call = {"id": "call_0", "name": name, "arguments": json.dumps(args)}
        ait_call = {"type": "function", "function": {"name": name, "arguments": args}}
        out.append(("gold_after_tool",
                    [{"role": "assistant", "content": None, "tool_calls": [vf_call]},
                     {"role": "tool", "tool_call_id": "call_0", "name": name, "content": result},
                     {"role": "assistant", "content": f"Done.\nAnswer: {answer}"}],
                    [{"role": "assistant", "content": "", "tool_calls": [ait_call]},
                     {"role": "tool", "name": name, "content": result},
                     {"role": "assistant", "content": f"Done.\nAnswer: {answer}"}]))
        out.append(("ends_on_tool_call",
                    [{"role": "assistant", "content": None, "tool_calls": [vf_call]}],
                    [{"role": "assistant", "content": "", "tool_calls": [ait_call]}]))
    return out


def synthetic_prime_rl_export(work: Path) -> dict:
    """A job that sets every mappable knob (LoRA, cosine warmup, SGD, a hub model outside prime-rl's
    renderer map), exported to prime-rl: the config paths the reference jobs leave unexercised."""
    from ait.job.export import export_job
    from ait.policy.reference import reference_job

    ws = work / "synthetic" / "workspace"
    if ws.parent.exists():
        shutil.rmtree(ws.parent)
    ws.mkdir(parents=True)
    (ws / "env.py").write_text(reference_job("calc_chain")["env.py"])
    (ws / "job.toml").write_text(
        '[job]\nbase_model = "qwen2.5-coder-0.5b"\n\n[train]\nmax_steps = 40\nlearning_rate = 2e-6\n'
        'num_generations = 8\nprompts_per_step = 16\nmax_completion_length = 256\nmax_tool_calling_iterations = 6\n'
        'temperature = 0.8\ntop_p = 0.95\nbeta = 0.02\nepsilon = 0.3\nloss_type = "grpo"\nscale_rewards = "none"\n'
        'lr_scheduler_type = "cosine"\nwarmup_steps = 0.1\noptim = "sgd"\nweight_decay = 0.01\nmax_grad_norm = 0.5\n'
        'seed = 7\ndataset_size = 500\n\n[train.lora]\nr = 8\nlora_alpha = 16\nlora_dropout = 0.05\n'
        'target_modules = ["q_proj", "v_proj"]\n')
    result = export_job(ws, "prime-rl", work / "synthetic" / "prime-rl", name="ait-job-synthetic")
    return {"family": "synthetic", "rl_toml": str(result.out_dir / "rl.toml"), "package_dir": str(result.package_dir)}


def prime_rl_check(args: argparse.Namespace, configs: list[dict], work: Path) -> int:
    if args.prime_rl_src:
        src = Path(args.prime_rl_src) / "packages" / "prime-rl-configs"
        if not (src / "pyproject.toml").is_file():
            print(f"\nprime-rl: {src} is not prime-rl's config package")
            return 1
        python = ensure_venv(Path(args.prl_venv), "python3.12", [str(src)], args.fresh,
                             probe="import prime_rl.configs.rl")
    elif (Path(args.prl_venv) / "bin" / "python").exists() and subprocess.run(
            [str(Path(args.prl_venv) / "bin" / "python"), "-c", "import prime_rl.configs.rl"],
            capture_output=True).returncode == 0:
        python = str(Path(args.prl_venv) / "bin" / "python")
    else:
        from ait.job.export.prime_rl_schema import SOURCE as schema_source

        print("\nprime-rl: not validated by prime-rl itself: `prime-rl` and `prime-rl-configs` are not on the "
              "package index (pip: 'No matching distribution found'); pass --prime-rl-src PATH (a prime-rl "
              f"checkout). Every key written was checked against {schema_source} at export.")
        return 0
    pip_install(python, sorted({c["package_dir"] for c in configs}))
    spec_file = work / "prl_spec.json"
    spec_file.write_text(json.dumps(configs))
    out = work / "prl_results.json"
    run([python, __file__, "--prl-side", str(spec_file), "--out", str(out)], cwd=work)
    results = json.loads(out.read_text())
    version = results[0]["version"] if results else "?"
    print(f"\nprime-rl config model (prime-rl-configs {version}, RLConfig via pydantic-config's TOML loader):")
    bad = 0
    for r in results:
        print(f"  {r['family']:<16} {'valid' if r['ok'] else 'INVALID'}  {r['detail']}")
        bad += not r["ok"]
    return bad


def compare(spec: dict, res: dict) -> list[str]:
    diffs = [f"dataset: {d}" for d in res["dataset_diffs"]]
    for case, got in zip(spec["cases"], res["cases"]):
        want = case["ait"]
        if got["per_fn"] != want["per_fn"] or got["weights"] != want["weights"] or got["total"] != want["total"]:
            diffs.append(f"reward row {case['row']} {case['name']}: ait {want} verifiers {got}")
    for tool, got in zip(spec["tools"], res["tools"]):
        if got["text"] != tool["ait"]:
            diffs.append(f"tool row {tool['row']} {tool['name']}({tool['args']}): ait {tool['ait']!r} "
                         f"verifiers {got['text']!r}")
    ait_tools = {s["function"]["name"]: s["function"] for s in spec["tool_schemas"]}
    vf_tools = {t["name"]: t for t in res["tool_list"]}
    if set(ait_tools) != set(vf_tools):
        diffs.append(f"tools listed: ait {sorted(ait_tools)} verifiers {sorted(vf_tools)}")
    for name in set(ait_tools) & set(vf_tools):
        a, v = ait_tools[name], vf_tools[name]
        a_params, v_params = a["parameters"].get("properties", {}), v["input_schema"].get("properties", {})
        if set(a_params) != set(v_params):
            diffs.append(f"tool {name} parameters: ait {sorted(a_params)} verifiers {sorted(v_params)}")
        for p in set(a_params) & set(v_params):
            for key in ("type", "description"):
                if a_params[p].get(key) != v_params[p].get(key):
                    diffs.append(f"tool {name}.{p} {key}: ait {a_params[p].get(key)!r} verifiers "
                                 f"{v_params[p].get(key)!r}")
        if sorted(a["parameters"].get("required", [])) != sorted(v["input_schema"].get("required", [])):
            diffs.append(f"tool {name} required: ait {a['parameters'].get('required')} verifiers "
                         f"{v['input_schema'].get('required')}")
        if a.get("description", "") != (v.get("description") or ""):
            diffs.append(f"tool {name} description: ait {a.get('description')!r} verifiers {v.get('description')!r}")
    diffs += rollout_diffs(spec, res["rollouts"])
    diffs += res["errors"]
    return diffs


def rollout_diffs(spec: dict, rollouts: list[dict]) -> list[str]:
    """Each vf-eval trace: its rewards against ait's on the same completion, its tool answers against
    ait's Environment replaying the same calls on the same row."""
    from ait.job.env_loader import import_env, read_surface
    from ait.train.rollouts import run_tool

    surface, _ = read_surface(import_env(Path(spec["package_dir"]) / spec["module"] / "job" / "env.py"))
    diffs = []
    if not rollouts:
        return ["rollout: vf-eval produced no trace"]
    for k, r in enumerate(rollouts):
        if r["errors"] or not r["rewards"]:
            diffs.append(f"rollout {k}: {r['stop']} {r['errors']}")
            continue
        ait_msgs, names = [], {}
        for m in r["messages"]:
            if m["role"] == "assistant":
                item = {"role": "assistant", "content": m.get("content") or ""}
                if m.get("tool_calls"):
                    item["tool_calls"] = [{"type": "function", "function": {"name": c["name"],
                                                                            "arguments": json.loads(c["arguments"])}}
                                          for c in m["tool_calls"]]
                    names.update({c["id"]: c["name"] for c in m["tool_calls"]})
                ait_msgs.append(item)
            elif m["role"] == "tool":
                ait_msgs.append({"role": "tool", "name": m.get("name") or names.get(m["tool_call_id"], ""),
                                 "content": m["content"]})
        row = {"answer": r["answer"], "info": r["info"]}
        per_fn, weights, total = ait_score(surface, row, ait_msgs)
        got = [r["rewards"][n] for n in r["reward_names"]]
        if [g[0] for g in got] != per_fn or [g[1] for g in got] != weights or r["total"] != total:
            diffs.append(f"rollout {k} rewards: ait {per_fn} {weights} {total} verifiers {got} {r['total']}")
        env = surface.env_class()
        if hasattr(env, "reset"):
            env.reset(json.loads(r["info"]))
        calls = [c["function"] for m in ait_msgs for c in m.get("tool_calls", [])]
        answers = [m["content"] for m in ait_msgs if m["role"] == "tool"]
        want = [run_tool(env, set(surface.tools), c["name"], c["arguments"])[0] for c in calls]
        if want != answers:
            diffs.append(f"rollout {k} tool answers: ait {want} verifiers {answers}")
        if not calls and spec["example_calls"]:
            diffs.append(f"rollout {k}: no tool was called")
    return diffs


# ====================================================================================== helpers


def run(cmd: list[str], cwd: Path | None = None, env: dict | None = None) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(map(str, cmd))}\n"
                         f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def ensure_venv(venv: Path, interpreter: str, requirements: list[str], fresh: bool, probe: str) -> str:
    python = venv / "bin" / "python"
    if fresh and venv.exists():
        shutil.rmtree(venv)
    if python.exists() and subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0 \
            and subprocess.run([str(python), "-m", "pip", "install", "-q", "--dry-run", *requirements],
                               capture_output=True, text=True).stdout.count("Would install") == 0:
        return str(python)
    if not python.exists():
        run([find_python(interpreter), "-m", "venv", str(venv)])
    print(f"installing {' '.join(requirements)} into {venv} ...", flush=True)
    run([python, "-m", "pip", "install", "-q", "--upgrade", "pip"])
    run([python, "-m", "pip", "install", "-q", *requirements])
    return str(python)


def find_python(name: str) -> str:
    """An interpreter called `name` (python3.12, ...) that runs: on PATH, else a pyenv version's."""
    import glob

    version = name.removeprefix("python")
    candidates = [shutil.which(name), *sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}*/bin/{name}")))]
    if sys.version.startswith(version + "."):
        candidates.append(sys.executable)
    for exe in filter(None, candidates):
        if subprocess.run([exe, "--version"], capture_output=True).returncode == 0:
            return exe
    raise SystemExit(f"no working {name} here (PATH, ~/.pyenv/versions): it is needed for this venv")


def pip_install(python: str, packages: list[str]) -> None:
    run([python, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", *packages])


# ====================================================================================== verifiers side


def vf_main(spec_path: str, out_path: str) -> None:
    """Runs in the verifiers venv: stdlib + verifiers only (the exported packages installed)."""
    import asyncio

    specs = json.loads(Path(spec_path).read_text())
    results = [asyncio.run(vf_family(spec)) for spec in specs]
    Path(out_path).write_text(json.dumps(results))


async def vf_family(spec: dict) -> dict:
    import importlib

    import verifiers.v1 as vf
    from pydantic import TypeAdapter

    errors: list[str] = []
    config = vf.resolve_env_config({"taskset": {"id": spec["env_id"]}})
    env = vf.load_environment(config)
    module = importlib.import_module(f"{spec['module']}.taskset")
    if type(env.taskset) is not module.AitJobTaskset:
        errors.append(f"loader: verifiers loaded {type(env.taskset).__name__}, not the exported AitJobTaskset")
    tasks = list(env.taskset)
    dataset_diffs = []
    if len(tasks) != len(spec["rows"]):
        dataset_diffs.append(f"{len(tasks)} tasks, ait has {len(spec['rows'])} rows")
    for i, (task, row) in enumerate(zip(tasks, spec["rows"])):
        want = (row["prompt"][0]["content"], row["prompt"][1]["content"], row["answer"], row["info"])
        got = (task.data.system_prompt, task.data.prompt, task.data.answer, task.data.info)
        if want != got:
            dataset_diffs.append(f"row {i}: ait {want!r:.200} verifiers {got!r:.200}")

    message = TypeAdapter(vf.Message)
    cases = []
    for case in spec["cases"]:
        task = tasks[case["row"]]
        nodes = [vf.MessageNode(parent=None, message=vf.SystemMessage(content=task.data.system_prompt)),
                 vf.MessageNode(parent=0, message=vf.UserMessage(content=task.data.prompt))]
        for m in case["messages"]:
            nodes.append(vf.MessageNode(parent=len(nodes) - 1, message=message.validate_python(m),
                                        sampled=m["role"] == "assistant"))
        trace = vf.Trace(task=vf.TraceTask(type=type(task).__name__, data=task.data),
                         agent=vf.AgentInfo(config=vf.AgentConfig()), nodes=nodes)
        await task.score(trace)
        rewards = [trace.rewards[name] for name in module.REWARD_NAMES]
        if len(trace.rewards) != len(rewards):
            errors.append(f"reward names: trace has {sorted(trace.rewards)}")
        cases.append({"per_fn": [r.score for r in rewards], "weights": [r.weight for r in rewards],
                      "total": trace.reward})

    from mcp.server.mcpserver import MCPServer

    servers: dict[int, MCPServer] = {}  # one toolset (one Environment) per row, as per rollout
    tools = []
    for tool in spec["tools"]:
        if tool["row"] not in servers:
            toolset = module.AitJobToolset(vf.ToolsetConfig())
            data = tasks[tool["row"]].data if tool["row"] >= 0 else module.AitJobData(
                prompt="", answer="", info=tool["info"])
            await toolset.setup_task(data)
            servers[tool["row"]] = MCPServer("check")
            toolset.register(servers[tool["row"]])
        result = await servers[tool["row"]].call_tool(tool["name"], tool["args"])
        tools.append({"text": "\n".join(c.text for c in result.content if c.type == "text")})
    if not servers:
        toolset = module.AitJobToolset(vf.ToolsetConfig())
        await toolset.setup_task(tasks[0].data)
        servers[0] = MCPServer("check")
        toolset.register(servers[0])
    listed = await next(iter(servers.values())).list_tools()
    tool_list = [{"name": t.name, "description": t.description, "input_schema": t.input_schema} for t in listed]
    return {"rows": len(tasks), "dataset_diffs": dataset_diffs, "cases": cases, "tool_list": tool_list,
            "tools": tools, "errors": errors, "server_started": server_starts(spec["module"], errors),
            "eval_dry_run": eval_dry_run(spec["eval_args"], errors),
            "rollouts": rollouts(spec, module.REWARD_NAMES, errors)}


SCRIPTED_MODEL = r'''
import json, sys, time
from aiohttp import web

CALLS = json.loads(sys.argv[2])

async def chat(request):
    body = await request.json()
    msgs, tools = body["messages"], {t["function"]["name"] for t in body.get("tools") or []}
    calls = [c for c in CALLS if c["name"] in tools]
    if calls and not any(m.get("role") == "tool" for m in msgs):
        message = {"tool_calls": [{"index": i, "id": f"call_{i}", "type": "function",
                                   "function": {"name": c["name"], "arguments": json.dumps(c["args"])}}
                                  for i, c in enumerate(calls)]}
        finish = "tool_calls"
    else:
        last = msgs[-1].get("content") or ""
        last = last if isinstance(last, str) else "".join(p.get("text", "") for p in last)
        message, finish = {"content": f"I used the tools.\nAnswer: {last.splitlines()[0] if last else 0}"}, "stop"
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)

    async def send(payload):
        await resp.write(("data: " + json.dumps({"id": "s", "object": "chat.completion.chunk", "created": 0,
                                                 "model": body["model"], **payload}) + "\n\n").encode())

    await send({"choices": [{"index": 0, "delta": {"role": "assistant", **message}, "finish_reason": None}]})
    await send({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    await send({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp

app = web.Application()
app.router.add_post("/v1/chat/completions", chat)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
'''


def rollouts(spec: dict, reward_names: list[str], errors: list[str]) -> list[dict]:
    """Two real rollouts through `vf-eval` (the null harness's chat program, a tool server per rollout,
    verifiers' scoring) against a scripted OpenAI-compatible model on loopback: it makes the task's
    example tool calls in its first turn, then answers with the first line of the last tool answer."""
    import socket

    import verifiers.v1 as vf

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        model = subprocess.Popen([sys.executable, "-c", SCRIPTED_MODEL, str(port), json.dumps(spec["example_calls"])],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            args = list(spec["eval_args"])
            args[args.index("-n") + 1] = "2"
            env = {**os.environ, "SCRIPTED_KEY": "none", "NO_COLOR": "1",
                   "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
            for _ in range(50):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.2)
            proc = subprocess.run([str(Path(sys.executable).parent / "vf-eval"), *args, "--no-rich", "-o", tmp,
                                   "--client.base-url", f"http://127.0.0.1:{port}/v1",
                                   "--client.api-key-var", "SCRIPTED_KEY"],
                                  capture_output=True, text=True, cwd=tmp, env=env, timeout=600)
        finally:
            model.kill()
            model.wait()
        found = list(Path(tmp).rglob("traces.jsonl"))
        if proc.returncode != 0 or not found:
            errors.append(f"vf-eval rollouts: exit {proc.returncode}: {(proc.stdout + proc.stderr)[-800:]}")
            return []
        out = []
        for line in found[0].read_text().splitlines():
            trace = json.loads(line)["traces"][0]
            nodes = trace["nodes"]
            start = next((i for i, n in enumerate(nodes) if n.get("sampled")), len(nodes))
            rewards = {k: (v["score"], v["weight"]) for k, v in (trace.get("rewards") or {}).items() if v}
            out.append({"answer": trace["task"]["data"]["answer"], "info": trace["task"]["data"]["info"],
                        "messages": [n["message"] for n in nodes[start:]], "rewards": rewards,
                        "reward_names": reward_names,
                        "total": vf.WireTrace.model_validate(trace).reward,  # verifiers' own sum
                        "stop": trace.get("stop_condition"),
                        "errors": [e.get("message", "")[:300] for e in trace.get("errors", [])]})
        return out


def server_starts(module: str, errors: list[str]) -> bool:
    """Start the tool server as verifiers launches it (`python -m <module>.taskset`, config in
    VF_CONFIG, port in MCP_PORT_FILE) and see it answer HTTP."""
    import urllib.error
    import urllib.request

    import verifiers.v1 as vf

    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        env = {**os.environ, "VF_CONFIG": vf.ToolsetConfig().model_dump_json(), "MCP_PORT_FILE": str(port_file),
               "VF_STATE_URL": "", "VF_STATE_SECRET": ""}
        proc = subprocess.Popen([sys.executable, "-m", f"{module}.taskset"], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                port = port_file.read_text().strip() if port_file.exists() else ""
                if port.isdigit():
                    try:
                        urllib.request.urlopen(f"http://127.0.0.1:{port}/mcp", timeout=2)
                        return True
                    except urllib.error.HTTPError:
                        return True  # any HTTP answer (MCP's 406 to a bare GET) means it serves
                    except OSError:
                        pass
                time.sleep(0.3)
            errors.append(f"tool server {module}.taskset did not serve: "
                          f"{(proc.stderr.read() if proc.poll() is not None else 'timeout')[-500:]}")
            return False
        finally:
            proc.kill()
            proc.wait()


def eval_dry_run(eval_args: list[str], errors: list[str]) -> bool:
    vf_eval = Path(sys.executable).parent / "vf-eval"
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([str(vf_eval), *eval_args, "--dry-run", "-o", tmp],
                              capture_output=True, text=True, cwd=tmp, env={**os.environ, "NO_COLOR": "1"})
    if proc.returncode != 0:
        errors.append(f"vf-eval {' '.join(eval_args)} --dry-run: {(proc.stdout + proc.stderr)[-800:]}")
    return proc.returncode == 0


# ====================================================================================== prime-rl side


def prl_main(spec_path: str, out_path: str) -> None:
    """Runs in the prime-rl-configs venv: validate each rl.toml with prime-rl's RLConfig."""
    from importlib.metadata import version

    from prime_rl.configs.rl import RLConfig
    from pydantic_config import cli

    results = []
    for spec in json.loads(Path(spec_path).read_text()):
        with tempfile.TemporaryDirectory() as tmp:
            cwd = os.getcwd()
            os.chdir(tmp)
            try:
                config = cli(RLConfig, args=["@", spec["rl_toml"]], plain=True)
                source = config.orchestrator.train.source[0]
                detail = (f"model {config.trainer.model.name}, batch {config.orchestrator.batch_size} x group "
                          f"{config.orchestrator.group_size}, env {source.env.taskset.id} "
                          f"({type(source.env.taskset).__name__}), agent max_turns {source.env.agent.max_turns}")
                results.append({"family": spec["family"], "ok": True, "detail": detail})
            except SystemExit as e:
                results.append({"family": spec["family"], "ok": False, "detail": f"pydantic-config exited {e.code}"})
            except Exception as e:  # a validation error: say which
                results.append({"family": spec["family"], "ok": False, "detail": f"{type(e).__name__}: {e}"[:2000]})
            finally:
                os.chdir(cwd)
    for r in results:
        r["version"] = version("prime-rl-configs")
    Path(out_path).write_text(json.dumps(results))


def dump_prime_rl_keys() -> None:
    """Print ait/job/export/prime_rl_schema.py from the installed prime-rl-configs."""
    import types
    import typing
    from importlib.metadata import version

    import verifiers.v1 as vf
    from prime_rl.configs.rl import RLConfig
    from pydantic import BaseModel

    def models_in(ann) -> list[type]:
        origin = typing.get_origin(ann)
        if origin is typing.Annotated:
            return models_in(typing.get_args(ann)[0])
        if origin in (typing.Union, types.UnionType, list, tuple, set, frozenset):
            return [m for a in typing.get_args(ann) for m in models_in(a)]
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            return [ann]
        return []  # scalars, and dicts (free-form keys)

    keys: set[str] = set()

    def walk(model: type, prefix: str, seen: frozenset) -> None:
        for name, field in model.model_fields.items():
            path = prefix + name
            keys.add(path)
            subs = models_in(field.annotation)
            if any(issubclass(m, vf.EnvConfig) for m in subs):
                subs = [vf.SingleAgentEnvConfig]  # what a plain taskset's env narrows to
            for sub in subs:
                if (sub, path) not in seen:
                    walk(sub, path + ".", seen | {(sub, path)})

    walk(RLConfig, "", frozenset())
    print('"""Every dotted key of prime-rl\'s `rl` config (RLConfig), the environment part as a plain taskset\'s\n'
          "(verifiers' SingleAgentEnvConfig, base TasksetConfig), extracted from the models' field names.\n\n"
          f"Generated from prime-rl-configs {version('prime-rl-configs')} (prime-rl {PRIME_RL_COMMIT}) with verifiers "
          f"{version('verifiers')}\nby `python scripts/check_verifiers_export.py --dump-prime-rl-keys` run with that "
          'venv\'s python. Union\nvariants all count; list entries share their list\'s path."""\n')
    print(f'SOURCE = "prime-rl-configs {version("prime-rl-configs")} (prime-rl {PRIME_RL_COMMIT})"')
    print("KEYS = frozenset({")
    for k in sorted(keys):
        print(f'    "{k}",')
    print("})")


PRIME_RL_COMMIT = os.environ.get("PRIME_RL_COMMIT", "559b44772")
"""The prime-rl commit the extract came from (its packages/prime-rl-configs)."""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", help="comma-separated families (default: every reference job)")
    p.add_argument("--vf-venv", default=os.environ.get("AIT_VF_VENV", "/tmp/ait-vf-check-venv"))
    p.add_argument("--prl-venv", default=os.environ.get("AIT_PRL_VENV", "/tmp/ait-prl-check-venv"))
    p.add_argument("--prime-rl-src", default=os.environ.get("PRIME_RL_SRC"),
                   help="a prime-rl checkout: validate rl.toml with its own config model")
    p.add_argument("--fresh", action="store_true", help="rebuild the venvs")
    p.add_argument("--keep", help="work here and keep the files")
    p.add_argument("--vf-side", help=argparse.SUPPRESS)
    p.add_argument("--prl-side", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--dump-prime-rl-keys", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.vf_side:
        vf_main(args.vf_side, args.out)
        return 0
    if args.prl_side:
        prl_main(args.prl_side, args.out)
        return 0
    if args.dump_prime_rl_keys:
        dump_prime_rl_keys()
        return 0
    return ait_main(args)


if __name__ == "__main__":
    sys.exit(main())
