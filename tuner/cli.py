"""The `gputune` command line: parses, calls, renders; no logic lives here.

Every command returns an exit code from :mod:`tuner.errors` (0 good, 1 bad
answer, 2 usage, 3 gputune broke). Heavy modules are imported inside each
command so that `gputune doctor` pays only for what it uses.
"""

from __future__ import annotations

import contextlib
import os
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

try:
    import typer  # the bulk of start-up time: a Ctrl-C here must not print a traceback either
except KeyboardInterrupt:
    raise SystemExit(130) from None

from tuner.errors import ExitCode, GputuneError

app = typer.Typer(
    name="gputune",
    help=(
        "Make a Linux GPU host serve large language models with vLLM well, and explain why when it"
        " doesn't.\n\nA usual session: `gputune doctor`, then `gputune plan --model qwen72b-gptq`, then"
        " `gputune launch --model qwen72b-gptq`; if the server dies, `gputune triage runs/<run>`."
        " `gputune COMMAND --help` shows each command's options and examples.\n\n"
        "Exit codes: 0 all is well; 1 the command worked and the answer is bad (a check"
        " failed, a plan was refused, a server died, a tunable could not be set, no cause found);"
        " 2 usage error; 3 gputune itself broke."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


class OutputFormat(str, Enum):  # noqa: UP042 - StrEnum would change str() of members
    table = "table"
    json = "json"


class FailOn(str, Enum):  # noqa: UP042 - StrEnum would change str() of members
    fail = "fail"
    warn = "warn"
    error = "error"


FormatOpt = Annotated[
    OutputFormat, typer.Option("--format", "-f", help="table (for a terminal) or json (for a program).")
]

_DEBUG = {"on": bool(os.environ.get("GPUTUNE_DEBUG"))}


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for internal errors.")] = False,
) -> None:
    if debug:
        _DEBUG["on"] = True


# --------------------------------------------------------------------------------------------------
# doctor / snapshot
# --------------------------------------------------------------------------------------------------
@app.command()
def doctor(
    from_: Annotated[
        Path | None,
        typer.Option(
            "--from",
            help="Diagnose a snapshot (a .tar.gz from `gputune snapshot`, or a folder laid out as a host"
            " root: proc/, sys/, etc/os-release, nvidia-smi.xml, pip-freeze.txt, dmesg.txt).",
        ),
    ] = None,
    fmt: FormatOpt = OutputFormat.table,
    only: Annotated[
        list[str] | None, typer.Option("--only", help="Run only these check ids (repeat, or a,b).")
    ] = None,
    skip: Annotated[
        list[str] | None, typer.Option("--skip", help="Skip these check ids (repeat, or a,b).")
    ] = None,
    fail_on: Annotated[
        FailOn,
        typer.Option(
            "--fail-on", help="Lowest status that makes the exit code 1: fail (default), warn, error."
        ),
    ] = FailOn.fail,
    under_load: Annotated[
        bool,
        typer.Option(
            "--under-load",
            help="Put a short load on each idle GPU (needs torch or cupy) and re-read its PCIe link.",
        ),
    ] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show evidence for passing checks too.")
    ] = False,
) -> None:
    """Probe the host and report every problem that would make vLLM slow or unstable.

    Each finding has a stable id (pcie.link, numa.affinity, cpu.governor, swap.device, driver.cuda,
    gpu.processes, ...), a status (pass, warn, fail, skip, error), the evidence and a remediation.
    Never imports torch. Examples:

      gputune doctor

      gputune doctor --format json --fail-on warn

      gputune doctor --from snapshot.tar.gz --only pcie.link,driver.cuda
    """
    from tuner import doctor as doctor_mod

    _exit(
        doctor_mod.main(
            source=from_,
            fmt=fmt.value,
            only=_split(only),
            skip=_split(skip),
            fail_on=fail_on.value,
            under_load=under_load,
            verbose=verbose,
        )
    )


@app.command()
def snapshot(
    output: Annotated[Path, typer.Option("--output", "-o", help="The .tar.gz to write.")] = Path(
        "gputune-snapshot.tar.gz"
    ),
) -> None:
    """Capture what the doctor reads (sysfs/procfs subsets, nvidia-smi -q -x, NVML, packages, kernel log
    tail) into a tarball, secrets redacted, for `gputune doctor --from FILE` elsewhere. Prints the
    tarball's path on stdout.

    Examples:

      gputune snapshot -o gpu-host-1.tar.gz

      gputune doctor --from gpu-host-1.tar.gz --format json
    """
    from tuner import snapshot as snapshot_mod

    _exit(snapshot_mod.main(output=output))


# --------------------------------------------------------------------------------------------------
# plan / launch
# --------------------------------------------------------------------------------------------------
ModelOpt = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="A built-in profile (see `gputune plan --list-models`), a local model folder, or a Hugging Face"
        " model id already in the local cache.",
    ),
]
GpuMemOpt = Annotated[
    str | None,
    typer.Option(
        "--gpu-mem", help="Plan for a card of this size instead of the GPUs seen here (24GiB, 80GB)."
    ),
]
GpusOpt = Annotated[int | None, typer.Option("--gpus", help="Number of GPUs to plan for (tensor parallel).")]
BindHostOpt = Annotated[
    str,
    typer.Option(
        "--host",
        help="Address vLLM binds; one other than loopback needs --api-key or --allow-unauthenticated.",
    ),
]
PortOpt = Annotated[int, typer.Option("--port", help="Port vLLM listens on.")]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        envvar="VLLM_API_KEY",
        help="API key the server requires; launch passes it to vLLM through VLLM_API_KEY, never the"
        " command line.",
    ),
]
AllowUnauthenticatedOpt = Annotated[
    bool, typer.Option("--allow-unauthenticated", help="Allow a non-loopback bind without an API key.")
]
VllmArgs = Annotated[
    list[str] | None,
    typer.Argument(
        help="Extra vLLM arguments after `--`; they win over the plan.",
        show_default=False,
        metavar="VLLM_ARGS",
    ),
]


@app.command(context_settings={"allow_interspersed_args": False})
def plan(
    model: ModelOpt = "",
    gpu_mem: GpuMemOpt = None,
    gpus: GpusOpt = None,
    host: BindHostOpt = "127.0.0.1",
    port: PortOpt = 8000,
    api_key: ApiKeyOpt = None,
    allow_unauthenticated: AllowUnauthenticatedOpt = False,
    fmt: FormatOpt = OutputFormat.table,
    list_models: Annotated[
        bool, typer.Option("--list-models", help="List the built-in model profiles.")
    ] = False,
    vllm_args: VllmArgs = None,
) -> None:
    """Size weights, KV cache and overheads for the GPU at hand; choose vLLM arguments, each with its reason.

    Examples:

      gputune plan --model qwen72b-gptq

      gputune plan --model qwen72b-gptq --gpu-mem 48GiB --format json

      gputune plan --model llama3-70b-awq -- --gpu-memory-utilization 0.95 --max-model-len 16384
    """
    from tuner import plan as plan_mod

    _exit(
        plan_mod.main(
            model=model,
            gpu_mem=gpu_mem,
            gpus=gpus,
            host=host,
            port=port,
            api_key=api_key,
            allow_unauthenticated=allow_unauthenticated,
            fmt=fmt.value,
            list_models=list_models,
            extra_args=list(vllm_args or []),
        )
    )


@app.command(context_settings={"allow_interspersed_args": False})
def launch(
    model: ModelOpt = "",
    gpu_mem: GpuMemOpt = None,
    gpus: GpusOpt = None,
    host: BindHostOpt = "127.0.0.1",
    port: PortOpt = 8000,
    api_key: ApiKeyOpt = None,
    allow_unauthenticated: AllowUnauthenticatedOpt = False,
    run_dir: Annotated[
        Path | None,
        typer.Option("--run-dir", help="Where to keep this run's records (default runs/<time>-<model>)."),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Launch even when the doctor finds blocking failures.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan and the command; start nothing.")
    ] = False,
    auto_fix: Annotated[
        int,
        typer.Option(
            "--auto-fix", help="When start-up dies, relaunch up to N times with the arguments triage gives."
        ),
    ] = 0,
    telemetry_interval: Annotated[
        float,
        typer.Option("--telemetry-interval", help="Seconds between telemetry samples (NVML, /metrics)."),
    ] = 1.0,
    ready_timeout: Annotated[
        float, typer.Option("--ready-timeout", help="Seconds to wait for the server to become ready.")
    ] = 900.0,
    smoke: Annotated[
        bool, typer.Option("--smoke/--no-smoke", help="Send a short smoke load once ready.")
    ] = True,
    detach_after_ready: Annotated[
        bool,
        typer.Option(
            "--exit-when-ready", help="Stop the server and exit 0 once it is ready and the smoke load ran."
        ),
    ] = False,
    vllm_args: VllmArgs = None,
) -> None:
    """Plan, run the doctor, and start vLLM under numactl on the GPU's NUMA node; wait until it serves,
    record telemetry, and supervise it until Ctrl-C.

    Examples:

      gputune launch --model qwen72b-gptq

      gputune launch --model ./my-model --port 8001 --auto-fix 2 -- --max-model-len 8192
    """
    from tuner import launch as launch_mod

    _exit(
        launch_mod.main(
            model=model,
            gpu_mem=gpu_mem,
            gpus=gpus,
            host=host,
            port=port,
            api_key=api_key,
            allow_unauthenticated=allow_unauthenticated,
            run_dir=run_dir,
            force=force,
            dry_run=dry_run,
            auto_fix=auto_fix,
            telemetry_interval=telemetry_interval,
            ready_timeout=ready_timeout,
            smoke=smoke,
            exit_when_ready=detach_after_ready,
            extra_args=list(vllm_args or []),
        )
    )


# --------------------------------------------------------------------------------------------------
# triage
# --------------------------------------------------------------------------------------------------
@app.command()
def triage(
    path: Annotated[
        Path,
        typer.Argument(help="A run directory from `gputune launch`, or any vLLM log file.", metavar="PATH"),
    ],
    telemetry: Annotated[
        Path | None,
        typer.Option(
            "--telemetry", help="Telemetry: the recorder's CSV, NVML samples, or `nvidia-smi dmon` output."
        ),
    ] = None,
    dmesg: Annotated[
        Path | None, typer.Option("--dmesg", help="Kernel log (dmesg or journalctl -k).")
    ] = None,
    exit_code: Annotated[
        int | None, typer.Option("--exit-code", help="The process's exit status (-9 = SIGKILL).")
    ] = None,
    fmt: FormatOpt = OutputFormat.table,
) -> None:
    """Say why a vLLM run died (which kind of OOM, or which lookalike), with the evidence and the next
    arguments to try. Exit 0 when a cause is found, 1 when it is `unknown`.

    Each message is read by a signature from the program that prints it (playbooks/triage/); a log whose
    message no signature knows is read, at confidence 0.40 and never as a memory cause, from the words of
    its failure lines against the labelled corpus of real failures (the evidence says so).

    Examples:

      gputune triage runs/20261129-1700-qwen72b-gptq

      gputune triage server.log --dmesg kern.log --exit-code 137 --format json
    """
    from tuner import triage as triage_mod

    _exit(triage_mod.main(path=path, telemetry=telemetry, dmesg=dmesg, exit_code=exit_code, fmt=fmt.value))


# --------------------------------------------------------------------------------------------------
# tune
# --------------------------------------------------------------------------------------------------
@app.command()
def tune(
    apply: Annotated[
        bool, typer.Option("--apply", help="Make the changes (as root). Without it: dry run.")
    ] = False,
    revert: Annotated[
        bool, typer.Option("--revert", help="Restore the values saved in the journal.")
    ] = False,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Set one tunable explicitly, e.g. vm.swappiness=10 (repeatable)."),
    ] = None,
    only: Annotated[
        list[str] | None, typer.Option("--only", help="Limit to these tunables (repeat, or a,b).")
    ] = None,
    persist: Annotated[
        bool, typer.Option("--persist", help="Also write sysctl.d/tmpfiles so the change survives reboot.")
    ] = False,
    root: Annotated[
        Path | None, typer.Option("--root", help="Operate on another host root (a test tree). Default: /.")
    ] = None,
    fmt: FormatOpt = OutputFormat.table,
) -> None:
    """Fix what software can fix on the host, safely: dry run by default, a journal of old values,
    read-back verification, and `--revert`.

    Examples:

      gputune tune

      sudo gputune tune --apply --set vm.swappiness=10

      sudo gputune tune --revert
    """
    from tuner import tune as tune_mod

    _exit(
        tune_mod.main(
            apply=apply,
            revert=revert,
            sets=list(set_ or []),
            only=_split(only),
            persist=persist,
            root=root,
            fmt=fmt.value,
        )
    )


# --------------------------------------------------------------------------------------------------
def _split(values: list[str] | None) -> list[str]:
    out: list[str] = []
    for v in values or []:
        out.extend(x.strip() for x in v.split(",") if x.strip())
    return out


def _exit(code: int) -> None:
    raise typer.Exit(int(code))


class _ReaderMayLeave:
    """sys.stdout for a command whose reader may go away (`gputune triage run.log | head -3`): a write
    after the pipe closed goes to /dev/null instead of raising, so the command finishes and exits with
    its own code (triage's 1 for `unknown` stays 1, a found cause 0), not with click's 1 for EPIPE."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._gone = False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                return int(self._stream.write(text))
            except BrokenPipeError:
                self._leave()
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._leave()

    def _leave(self) -> None:
        self._gone = True
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())

    def __getattr__(self, name: str) -> Any:  # isatty, encoding, fileno ...: the real stream's
        return getattr(self._stream, name)


def _cli_exceptions() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """The usage-error and abort exceptions of the installed typer: typer >= 0.20 raises its own vendored
    copies of click's (typer.TyperException, typer.Abort) and does not install click, older releases
    raise click's."""
    shown: list[type[BaseException]] = [c for c in (getattr(typer, "TyperException", None),) if c]
    aborts: list[type[BaseException]] = [typer.Abort]
    try:
        import click
    except ImportError:
        pass
    else:
        shown.append(click.exceptions.ClickException)
        aborts.append(click.exceptions.Abort)
    return tuple(shown), tuple(aborts)


def main() -> None:
    """Console-script entry point: maps errors to exit codes and one-line messages."""
    if not isinstance(sys.stdout, _ReaderMayLeave):
        sys.stdout = _ReaderMayLeave(sys.stdout)
    try:
        # Without standalone mode click *returns* the code of a typer.Exit instead of raising it.
        from tuner.typer_compat import coerce_without_pydantic

        coerce_without_pydantic()
        code = app(prog_name="gputune", standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except GputuneError as exc:
        print(f"gputune: error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"  hint: {exc.hint}", file=sys.stderr)
        sys.exit(int(exc.exit_code))
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        # `gputune doctor | head`: the reader went away; not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(int(ExitCode.OK))
    except Exception as exc:  # gputune itself broke, unless it is the command line's own error
        shown, aborts = _cli_exceptions()
        if isinstance(exc, shown) and hasattr(exc, "show"):
            exc.show()
            sys.exit(int(ExitCode.USAGE))
        if isinstance(exc, aborts):
            sys.exit(130)
        if _DEBUG["on"]:
            import traceback

            traceback.print_exc()
        print(f"gputune: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        print("  hint: run again with --debug (or GPUTUNE_DEBUG=1) for the traceback", file=sys.stderr)
        sys.exit(int(ExitCode.INTERNAL))
