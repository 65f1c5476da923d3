"""Streaming scan of a log for failure signatures and stage landmarks (the data in playbooks/triage/).

A log is read in 4 MiB binary chunks. A small set of trigger words (each signature's needle contains
one of them, or is its own trigger) is searched with ``bytes.find``, which runs at memory speed; only
the lines around a trigger are decoded and tested against the needles and regular expressions. Memory
stays bounded: the current chunk, a few kept hits per signature, and the last lines of the log.
Each distinct trigger word costs one ``bytes.find`` pass per chunk, so a new signature should be keyed on
a word already in ANCHORS where its message allows.

Besides failures, the scan reads what describes the run: vLLM's logged arguments and version, a vLLM
command line pasted into the log (``vllm serve M -tp 2``), the GPU's name, and Python tracebacks,
including IPython/Jupyter frames (both IPython 8's and the older form Colab prints), which are rewritten
as Python's own frame lines.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import html
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from tuner.data import data_dir, load_toml
from tuner.xid import XidCode, catalogue

try:  # one pass of a compiled Aho-Corasick automaton finds every trigger word in a chunk
    import ahocorasick
except ImportError:  # absent is not an error: one bytes.find pass per trigger word finds the same lines
    ahocorasick = None

STAGES: tuple[str, ...] = ("load", "memory_profiling", "kv_allocation", "graph_capture", "warmup", "serving")
CHUNK = 4 << 20
MAX_LINE = 20_000  # characters of one line looked at (a pasted dict can be huge)
KEEP_PER_SIGNATURE = 4
KEEP_EXCEPTIONS = 8  # traceback ends kept (the root cause and the wrappers printed after it)
KEEP_FRAMES = 12
INNER_FRAMES = 4  # how many of the innermost frames say where an exception was raised
FRAME_WINDOW = 80  # lines: a frame further above an exception line belongs to another traceback
TAIL_BYTES = 4096
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
CARET_ANSI = re.compile(r"\^\[\[[0-9;?]*[A-Za-z]")

# Prefilter words, searched case-insensitively in each chunk: every needle contains one of them (or is
# its own trigger), and they are rare in a healthy serving log, so few lines reach the needle tests.
ANCHORS: tuple[str, ...] = (
    "error",
    "memory",
    "kill",
    "cuda",
    "nccl",
    "xid",
    ", in ",
    "support",
    "driver",
    "seq len",
    "max_model_len",
    "device",
    "fault",
    "ddress",
    "swap",
    "shm",
    "gpus",
    "exit code",
    "fallen",
    "fail",
    "cannot",
    "is not ",
    "illegal",
    "to serve",
    "stored in kv",
    "startup",
    "peer",
    "watchdog",
    "quantization",
    "lost",
    "parallel size",
    "recogni",
    "not found",
)
# Words common in a healthy log: they only serve stage landmarks and configuration lines, which retire.
LANDMARK_ANCHORS: tuple[str, ...] = (
    "load",
    "took",
    "captur",
    "blocks",
    "kv cache",
    "engine",
    "startup",
    "uvicorn",
    "throughput",
    "request",
    "/v1/",
    "serving_",
    "warming",
    "compil",
    "args",
    "config:",
    "cpu_",
    "version",
    "processing method",
    "profile run",
)

# Lines that describe the configuration (current argument values, vLLM version, device).
INFO_NEEDLES: tuple[str, ...] = (
    "vllm serve ",
    "vllm.entrypoints.",
    "--model",
    "non-default args:",
    "args: Namespace(",
    "with config:",
    "cpu_worker.py",
    "cpu_model_runner.py",
    "version ",
    "text_generation_",
    "sglang",
    "NVIDIA ",
    "world_size=",
    "KV cache memory: ",
    "MiB",
    "fatal signal from worker processes",
    "Received sigquit from a child process",
    "lightllm",
    "self.key_buffer = [torch.empty(",
    "self.value_buffer = [torch.empty(",
    "exllamav2",
    "ExLlamaV2",
)
# Servers other than vLLM whose logs triage reads (their own messages are in signatures.toml): the
# advice then names their options, not vLLM's.
ENGINE_NEEDLES = {
    "text_generation_": "tgi",
    "sglang": "sglang",
    "lightllm": "lightllm",
    # LightLLM's own KV pool lines as its tracebacks print them (lightllm/common/mem_manager.py, 1.x .. 2.x)
    "self.key_buffer = [torch.empty(": "lightllm",
    "self.value_buffer = [torch.empty(": "lightllm",
    # ExLlamaV2 and the servers on it (TabbyAPI, text-generation-webui's ExLlamav2 loader)
    "exllamav2": "exllamav2",
    "ExLlamaV2": "exllamav2",
}


@dataclass(frozen=True)
class Signature:
    """One failure message from playbooks/triage/signatures.toml."""

    id: str
    cause: str
    needle: str
    regex: re.Pattern[str] | None
    weight: float
    stage: str | None
    kind: str  # log | kernel | any
    source: str
    nocase: bool = False  # the needle (stored lower-case) and the regex ignore case: retyped messages
    # for cause "oom": the cause once loading is over, whatever the stage map says (an allocator that
    # only grows at start-up, such as vLLM's sleep-mode allocator)
    cause_after_load: str | None = None
    # this message's own fix is an argument, although its cause's fixes in general are not
    fixable_by_args: bool = False
    # the signatures whose lines this message explains: where it is in the log, their hits count for nothing
    # (NCCL's shm_open or CUDA registration failure before its 'Error while creating shared memory segment')
    explains: tuple[str, ...] = ()


@dataclass(frozen=True)
class Landmark:
    """One stage landmark from playbooks/triage/stages.toml."""

    stage: str
    needle: str


@dataclass(frozen=True)
class Hit:
    """A line that matched a signature."""

    signature: Signature
    line_no: int
    text: str
    groups: dict[str, str]
    stage: str  # furthest stage reached when the line was printed ("unknown" before any landmark)


@dataclass(frozen=True)
class PyException:
    """The closing line of a Python traceback ('ValueError: ...'), with the source files of the innermost
    frames printed just before it (Python prints the innermost frame last)."""

    line_no: int
    exc: str  # the class as printed, possibly qualified ('huggingface_hub.errors.HFValidationError')
    message: str
    text: str
    frames: tuple[str, ...]  # innermost last, '/' separators, each 'path in function' when printed


@dataclass(frozen=True)
class Structural:
    """A rule on the shape of a traceback rather than on one message (signatures.toml [[structural]]):
    the exception class, where it was raised, and optionally what its message says or must not say."""

    signature: Signature  # id, cause, weight and source, for the evidence
    exception: re.Pattern[str]  # matched against the class name without its module
    frames: re.Pattern[str] | None  # one of the innermost frames' files must match
    message: re.Pattern[str] | None
    not_message: re.Pattern[str] | None

    def matches(self, exc: PyException) -> bool:
        name = exc.exc.rsplit(".", 1)[-1]
        if not self.exception.fullmatch(name):
            return False
        if self.frames is not None and not any(self.frames.search(f) for f in exc.frames[-INNER_FRAMES:]):
            return False
        if self.message is not None and not self.message.search(exc.message):
            return False
        return not (self.not_message is not None and self.not_message.search(exc.message))


@dataclass
class ScanResult:
    """What one pass over a log found."""

    hits: list[Hit] = field(default_factory=list)
    hit_counts: dict[str, int] = field(default_factory=dict)
    stage_first_line: dict[str, int] = field(default_factory=dict)
    # the first line that says the checkpoint's tensors are being read (WEIGHT_READ_NEEDLES), after the
    # distributed set-up: a SIGBUS after it is a memory-mapped checkpoint file that could not be read
    weights_read_line: int | None = None
    # the last assert statement's source line a traceback printed (line, condition), for a bare AssertionError
    assert_source: tuple[int, str] | None = None
    stage: str = "unknown"
    pids: set[int] = field(default_factory=set)
    args: dict[str, Any] = field(default_factory=dict)
    vllm_version: str | None = None
    cpu_backend: bool = False
    engine: str = "vllm"  # "tgi" (text_generation_launcher/_server lines) | "sglang" | "vllm"
    lines: int = 0
    bytes: int = 0
    tail: list[tuple[int, str]] = field(default_factory=list)
    exceptions: list[PyException] = field(default_factory=list)  # the last KEEP_EXCEPTIONS tracebacks' ends
    recent_frames: list[tuple[int, str]] = field(default_factory=list)  # (line, file) of the last frames
    vllm_paths: bool = False  # a traceback frame or a logged path inside a vllm/ package
    gpu_name: str | None = None  # an 'NVIDIA <model>' device name in the log (nvidia-smi, torch, vLLM)
    # 'Available KV cache memory: X GiB' as each worker logged it (vllm/v1/worker/gpu_worker.py), by the
    # worker's log prefix ('Worker_TP1', 'VllmWorker rank=1'; 'main' without one): the first value each
    kv_available: dict[str, float] = field(default_factory=dict)
    # vLLM 0.7 .. 0.8's engine client kills its own process tree after a worker failed
    # (vllm/v1/engine/core_client.py sigusr1_handler: 'Got fatal signal from worker processes, shutting
    # down.', then kill_process_tree(os.getpid())): the SIGKILL and the shell's 'Killed' that follow are
    # its teardown, not the kernel's OOM killer; SGLang's launcher does the same (python/sglang/srt/
    # entrypoints/engine.py sigquit_handler: 'Received sigquit from a child process. It usually means the
    # child failed.', then kill_process_tree(os.getpid()), 0.4 .. 0.5)
    self_sigkill: bool = False
    # rows of an nvidia-smi or nvitop process table pasted into the log: (GPU index, pid, MiB, the row)
    gpu_processes: list[tuple[int, int, float, str]] = field(default_factory=list)
    # IPython's traceback header ('OutOfMemoryError    Traceback (most recent call last)') not yet closed
    # by its exception line: (line, class, the header)
    notebook_header: tuple[int, str, str] | None = None


@dataclass(frozen=True)
class Playbook:
    signatures: tuple[Signature, ...]
    landmarks: tuple[Landmark, ...]
    causes: dict[str, dict[str, Any]]
    oom_by_stage: dict[str, str]
    # servers whose stage means another cause: LightLLM sizes its KV pool by --max_total_token_num, not by
    # the memory free, so an OOM while it allocates the pool is a pool too large, not memory held elsewhere
    oom_by_stage_engine: dict[str, dict[str, str]]
    xid: dict[int, XidCode]  # checks/kernel.toml [xid], the catalogue the doctor reads too
    structural: tuple[Structural, ...] = ()
    # words with which a person's sentence about an OOM names its stage ('OOM when capturing CUDA graphs')
    stated: tuple[tuple[str, re.Pattern[str]], ...] = ()


@functools.cache
def playbook(folder: str | None = None) -> Playbook:
    """Load signatures.toml, stages.toml and causes.toml from playbooks/triage/ (or ``folder``)."""
    base = Path(folder) if folder else data_dir("playbooks") / "triage"
    sig_doc = load_toml(base / "signatures.toml")
    stage_doc = load_toml(base / "stages.toml")
    cause_doc = load_toml(base / "causes.toml")
    sigs = []
    for raw in sig_doc.get("signature", []):
        rx = raw.get("regex")
        nocase = bool(raw.get("nocase", False))
        needle = str(raw["needle"])
        sigs.append(
            Signature(
                id=str(raw["id"]),
                cause=str(raw["cause"]),
                needle=needle.lower() if nocase else needle,
                regex=(re.compile(rx, re.IGNORECASE) if nocase else re.compile(rx)) if rx else None,
                weight=float(raw.get("weight", 0.5)),
                stage=raw.get("stage"),
                kind=str(raw.get("kind", "log")),
                source=str(raw.get("source", "")),
                nocase=nocase,
                cause_after_load=raw.get("cause_after_load"),
                fixable_by_args=bool(raw.get("fixable_by_args", False)),
                explains=tuple(str(i) for i in raw.get("explains", ())),
            )
        )
    marks = [
        Landmark(stage=str(group["stage"]), needle=str(n))
        for group in stage_doc.get("landmark", [])
        for n in group.get("needles", [])
    ]
    structural = []
    for raw in sig_doc.get("structural", []):

        def rx(key: str, raw: dict[str, Any] = raw) -> re.Pattern[str] | None:
            return re.compile(str(raw[key])) if raw.get(key) else None

        exception = rx("exception")
        if exception is None:
            raise ValueError(f"structural rule {raw.get('id')!r} has no exception pattern")
        structural.append(
            Structural(
                signature=Signature(
                    id=str(raw["id"]),
                    cause=str(raw["cause"]),
                    needle="",
                    regex=None,
                    weight=float(raw.get("weight", 0.5)),
                    stage=raw.get("stage"),
                    kind="log",
                    source=str(raw.get("source", "")),
                ),
                exception=exception,
                frames=rx("frames"),
                message=rx("message"),
                not_message=rx("not_message"),
            )
        )
    return Playbook(
        signatures=tuple(sigs),
        landmarks=tuple(marks),
        causes={str(k): dict(v) for k, v in cause_doc.get("cause", {}).items()},
        oom_by_stage={str(k): str(v) for k, v in cause_doc.get("oom_by_stage", {}).items()},
        oom_by_stage_engine={
            str(engine): {str(k): str(v) for k, v in table.items()}
            for engine, table in cause_doc.get("oom_by_stage_engine", {}).items()
        },
        xid=catalogue(),
        structural=tuple(structural),
        stated=tuple(
            (str(raw["stage"]), re.compile(str(raw["regex"]), re.IGNORECASE))
            for raw in stage_doc.get("stated", [])
        ),
    )


def trigger_of(needle: str, landmark: bool = False) -> str:
    """The (lower-case) word the prefilter searches for to find lines that may hold ``needle``."""
    low = needle.lower()
    for anchor in ANCHORS + (LANDMARK_ANCHORS if landmark else ()):
        if anchor in low:
            return anchor
    return low


# IPython / Jupyter print a frame as 'File ~/x/y.py:64, in Cls.meth(self, a)' (Jupyter Lab wraps the
# path in a markdown link '[~/x/y.py:64](http://...)'); rewritten as Python's own frame line so that frame
# landmarks and the structural rules read notebook tracebacks too.
_IPY_FRAME = re.compile(
    r"^(?P<indent>\s*)File \[?(?P<path>[^\s\]\[]+?):(?P<line>\d+)\]?(?:\([^)\s]*\))?, in "
    r"(?:[\w<>]+\.)*(?P<func>[\w<>]+)\(.*$"
)


# IPython before 8 (Colab's, Kaggle's) prints a frame as '/usr/lib/python3.11/copy.py in deepcopy(x, memo)'
# with the source lines and a '--> 153' arrow below it: no line number on the frame line itself
_IPY_OLD_FRAME = re.compile(
    r"^(?P<indent>\s*)(?P<path>(?:[A-Za-z]:)?[^\s:]*[/\\][^\s]*\.py) in (?:[\w<>]+\.)*(?P<func>[\w<>]+)\(.*$"
)


# rich's tracebacks (rich.traceback, installed by typer, DeepSpeed's and many CLIs' pretty errors) print a
# frame in a box as '│ /usr/lib/python3/dist-packages/torch/nn/modules/module.py:987 in convert      │'
_RICH_FRAME = re.compile(
    r"^(?P<indent>[^│]*?)│\s*(?P<path>\S+\.py):(?P<line>\d+) in (?P<func>[\w<>]+)\s*│?\s*$"
)


_CJK_LATIN = re.compile(
    r"(?<=[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af])(?=[A-Za-z0-9])|(?<=[A-Za-z0-9])(?=[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af])"
)
_HTML_ENTITY = re.compile(r"&(?:gt|lt|amp|quot|apos|#\d{2,3});")


def clean_line(raw: bytes) -> str:
    """Decode one log line, drop ANSI colours and carriage-return progress bars' earlier frames."""
    text = raw[: MAX_LINE * 2].decode("utf-8", "replace")
    if "\x1b" in text:
        text = ANSI.sub("", text)
    if "^[[" in text:
        # the same colours as `cat -v` and some terminals' copy print them, in caret notation
        text = CARET_ANSI.sub("", text)
    text = text.rstrip("\r\n")
    if not text.isascii() and _CJK_LATIN.search(text):
        # Chinese or Japanese words run straight into Latin ones ('出现CUDA out of memory'); Python's \b
        # sees no boundary there (CJK letters are word characters), so a space is put between them
        text = _CJK_LATIN.sub(" ", text)
    if "&" in text and _HTML_ENTITY.search(text):
        # a log copied out of a web page (an issue's HTML, a dashboard): '&gt;=', '&quot;', '&#39;'
        text = html.unescape(text)
    if text.lstrip().startswith("File ") and 'File "' not in text:
        m = _IPY_FRAME.match(text)
        if m:
            text = f'{m["indent"]}File "{m["path"]}", line {m["line"]}, in {m["func"]}'
    elif "│" in text and ".py:" in text:
        m = _RICH_FRAME.match(text)
        if m:
            text = f'{m["indent"]}File "{m["path"]}", line {m["line"]}, in {m["func"]}'
    elif ".py in " in text and 'File "' not in text:
        m = _IPY_OLD_FRAME.match(text)
        if m:
            text = f'{m["indent"]}File "{m["path"]}", line 0, in {m["func"]}'
    return text


AUTOMATON_WINDOW = 1 << 20  # characters: the automaton copies what it searches into 4 bytes a character


def _windows(text: str, overlap: int = 0) -> Iterable[tuple[int, str]]:
    """The chunk in pieces of about AUTOMATON_WINDOW characters that end at a line's end (no trigger word
    holds a newline, so none is cut in two), each with its offset. A line longer than the window is cut
    anyway, the next piece starting `overlap` characters (the longest trigger word less one) before the
    cut so that no word across it is lost."""
    start, n = 0, len(text)
    while start < n:
        end = start + AUTOMATON_WINDOW
        if end >= n:
            yield start, text[start:]
            return
        nl = text.find("\n", end, end + AUTOMATON_WINDOW)
        if nl >= 0:
            yield start, text[start : nl + 1]
            start = nl + 1
        elif n <= end + AUTOMATON_WINDOW:  # the chunk's last, unfinished line: the rest in one piece
            yield start, text[start:]
            return
        else:  # a monstrous line
            yield start, text[start:end]
            start = max(start + 1, end - overlap)


class _Matcher:
    """Trigger words -> the needles behind them. Rebuilt when a stage is passed (its landmarks retire)
    and when an information line has been read (it is needed once)."""

    def __init__(self, sigs: Iterable[Signature], marks: Iterable[Landmark]) -> None:
        self.sigs = list(sigs)
        self.marks = list(marks)
        self.info_left = set(INFO_NEEDLES)
        self.stage_idx = -1
        self.rebuild()

    def rebuild(self) -> None:
        entries: list[tuple[str, object]] = [(sig.needle, sig) for sig in self.sigs]
        entries += [(m.needle, m) for m in self.marks if STAGES.index(m.stage) > self.stage_idx]
        entries += [(n, None) for n in INFO_NEEDLES if n in self.info_left]
        self.entries = entries
        words = {trigger_of(n, not isinstance(o, Signature)) for n, o in entries} | set(TRACEBACK_TRIGGERS)
        # a trigger that holds another one finds no line the shorter one misses: one pass less per chunk
        # (every candidate line is tested against all the needles, whichever trigger found it)
        words = {w for w in words if not any(o != w and o in w for o in words)}
        self.triggers = sorted(w.encode() for w in words)
        self.longest_trigger = max(map(len, self.triggers))
        self.automaton = None
        if ahocorasick is not None:
            automaton = ahocorasick.Automaton()
            for w in self.triggers:
                key = w.decode("latin-1")  # the UTF-8 bytes, as the chunk is read ('显存' too)
                automaton.add_word(key, key)
            automaton.make_automaton()
            self.automaton = automaton

    def candidate_lines(self, low: bytes) -> dict[int, int]:
        """Start -> end of each line of the (lower-cased) chunk that holds a trigger word."""
        starts: dict[int, int] = {}
        if self.automaton is not None:
            text = low.decode("latin-1")  # one character per byte: offsets stay byte offsets
            line_end = -1
            for base, window in _windows(text, self.longest_trigger - 1):
                for end, _word in self.automaton.iter(window):
                    end += base
                    if end < line_end:
                        continue  # another trigger on a line already taken
                    ls = text.rfind("\n", 0, end) + 1
                    line_end = text.find("\n", end)
                    if line_end < 0:
                        line_end = len(text)
                    starts.setdefault(ls, line_end)
            return starts
        for trig in self.triggers:
            pos = low.find(trig)
            while pos >= 0:
                ls = low.rfind(b"\n", 0, pos) + 1
                le = low.find(b"\n", pos)
                if le < 0:
                    le = len(low)
                starts.setdefault(ls, le)
                pos = low.find(trig, le)
        return starts


# load landmarks printed once the weights are being read, after the ranks' distributed set-up (vLLM's
# gpu_model_runner.py load_model and weight_utils.py iterators, SGLang's model_runner.py load_model)
WEIGHT_READ_NEEDLES = frozenset(
    {
        "Loading safetensors checkpoint shards",
        "Loading pt checkpoint shards",
        "Load weight begin",
        "Multi-thread loading shards",
    }
)

# Lines that make up a Python traceback: its frames ('  File "/x/y.py", line 3, in f') and its closing
# exception line ('ValueError: ...', 'torch.OutOfMemoryError: ...'), read for the [[structural]] rules.
TRACEBACK_TRIGGERS = (
    'file "',
    ".py in ",  # IPython 7's frame line ('/usr/lib/python3.11/copy.py in deepcopy(x, memo)')
    "\x1b[0m in ",  # the same line in a notebook's saved colours ('copy.py\x1b[0m in \x1b[0;36mdeepcopy')
    "^[[0m in ",  # and in caret notation
    "assert ",  # the source line Python prints above a bare AssertionError: its condition is its message
    "error",
)  # an exception class without 'Error' is read only when the line has another trigger
_FRAME = re.compile(r'File "(?P<path>[^"]+)", line \d+(?:, in (?P<func>[\w.<>]+))?')
# the source line of an assert statement as a traceback prints it ('    assert param_data.shape == ...'),
# behind a wrapper's prefix; not an exception line, not a comment
_ASSERT_SOURCE = re.compile(r"(?:^|[\s\]|:])assert\s+(?P<cond>[^\s#'\"].*?)\s*$")
ASSERT_WINDOW = 6  # lines between an assert's source line and its bare AssertionError (carets, blank lines)
_EXC = re.compile(
    r"(?:^|[\s\]\)>:|：\"'`*])(?P<exc>(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*(?:Error|Exception|Exit|Interrupt)|Exception|gaierror|herror))"
    r"(?::[ \t]*(?P<msg>.*?))?\s*$"
)
# an exception as repr() prints it inside a wrapper's sentence: "The error was ValueError('Unsupported
# config format: auto')." (EuroEval), "exception=RuntimeError('...')" (vLLM V0's MQ engine), "raised
# AssertionError('...')": the class and the quoted message, read where _EXC finds no 'Class: message'
_EXC_REPR = re.compile(
    r"(?:^|[\s\]\)>:=(\[,])(?P<exc>(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception))"
    r"\((?P<q>['\"])(?P<msg>.+?)(?P=q),?\)"
)
_RAISE = re.compile(r"\braise\b")  # a source line a traceback shows, before a repr-form class
# words one of which every exception class _EXC reads holds (the socket module's classes are lower-case)
_EXC_WORDS = ("Error", "Exception", "Exit", "Interrupt", "gaierror", "herror")
# IPython / Jupyter open a traceback with the exception's class ('LocalEntryNotFoundError     Traceback
# (most recent call last)', IPython.core.ultratb) and close it with 'Class: message'; a notebook excerpt
# cut before its end still names the class
_IPY_HEADER = re.compile(
    r"^\s*(?P<exc>(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt))"
    r"\s+Traceback \(most recent call last\)"
)
_PID = re.compile(r"\bpid=(\d+)")
_VERSION = re.compile(r"(?:version |\(v)(\d+\.\d+\.\d+[\w.+-]*)")
_GPU_NAME = re.compile(
    r"NVIDIA (?:GeForce |RTX |Tesla |PRO )*[A-Z]{0,3}\d+\w*"
    r"(?: (?:Ti|SUPER|Ada|Blackwell|\d+GB|NVL|PCIe|SXM\w*|HBM\w*))*"
)
_WORLD_SIZE = re.compile(r"\bworld_size=(\d+)")
_KV_AVAILABLE = re.compile(r"Available KV cache memory: (-?[\d.]+) GiB")
_WORKER_PREFIX = re.compile(r"\((\w+(?: rank=\d+)?) pid=\d+\)")
MAX_KV_WORKERS = 64
# A process row of nvidia-smi's table: '|    0   N/A  N/A   1880122      C   python3      5102MiB |' (the
# GI/CI columns since driver 450; without them before), and of nvitop's: '1880122 root  0  Compute  0%
# 5102MiB  33% ...' (PID USER DEV TYPE GPU-SM GPU-MEM ...).
_SMI_PROCESS = re.compile(
    r"(?:^|\|)\s*(?P<gpu>\d{1,2})\s+(?:(?:N/A|\d+)\s+(?:N/A|\d+)\s+)?(?P<pid>\d+)\s+(?:C|G|C\+G|M|M\+C)\s+"
    r"\S.*?\s(?P<mib>\d+)\s*MiB\s*\|?\s*$"
)
_NVITOP_PROCESS = re.compile(
    r"(?:^|[│|])\s*(?P<pid>\d+)\s+\S+\s+(?P<gpu>\d{1,2})\s+(?:Compute|Graphics|C\+G)\s+\S+\s+"
    r"(?P<mib>[\d.]+)(?P<unit>MiB|GiB)\b"
)
MAX_PROCESS_ROWS = 256
_CONFIG_KV = re.compile(r"\b(\w+)=([^,()\s]+)")


def _parse_args_line(text: str, into: dict[str, Any]) -> None:
    """Current argument values from vLLM's 'non-default args: {...}' (vllm/entrypoints/utils.py
    log_non_default_args, 0.9 .. 0.32), 'args: Namespace(...)' (V0 api_server) or the engine's
    'with config: k=v, ...' line."""
    if "non-default args:" in text:
        start = text.find("{", text.find("non-default args:"))
        end = text.rfind("}")
        if start >= 0 and end > start:
            try:
                value = ast.literal_eval(text[start : end + 1])
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                value = None
            if isinstance(value, dict):
                for k, v in value.items():
                    into[str(k)] = v
                return
    if "args: Namespace(" in text or "with config:" in text:
        for key, val in _CONFIG_KV.findall(text):
            if key in into:
                continue
            try:
                into[key] = ast.literal_eval(val)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                into[key] = val.strip("'\"")


_SHORT_FLAGS = {"-tp": "tensor_parallel_size", "-pp": "pipeline_parallel_size", "-q": "quantization"}
_CMD_START = re.compile(r"(?:^|[\s$#>])((?:\S*python3?\S*\s+-m\s+)?vllm(?:\s+serve\b|\.entrypoints\.\S+).*)$")


def _parse_command_line(text: str, into: dict[str, Any]) -> bool:
    """Argument values from a vLLM command line that a log or a pasted report holds ('vllm serve M
    --tensor-parallel-size 2', 'python -m vllm.entrypoints.openai.api_server --model M ...'). Values
    vLLM itself logs later (non-default args, the engine config) take precedence."""
    m = _CMD_START.search(text[:MAX_LINE])
    if m is None or "usage:" in text[: m.start(1)].lower():
        return False  # argparse's 'usage: vllm serve [model_tag] [options]' describes, it does not run
    cmd = m.group(1)
    env = re.search(r"\bCUDA_VISIBLE_DEVICES=([\d,]+)", text[: m.start(1)])
    if env:
        into.setdefault("CUDA_VISIBLE_DEVICES", env.group(1))
    return _parse_flags(cmd, into)


# A continuation line of a command pasted over several lines ('python -m vllm.entrypoints... \' then
# '--model M \'), or the arguments after a container image ('vllm/vllm-openai:latest --model M').
_FLAGS_LINE = re.compile(r"^\s*(?:\S*vllm-openai\S*\s+)?(--model[\s=].*)$|\svllm/vllm-openai\S*\s+(--.*)$")


# A Python script that passes vLLM's engine arguments through (vLLM's own benchmarks/*.py, an evaluation
# script built on EngineArgs.add_cli_args): 'python3 mmmu_bench.py --model M --gpu-memory-utilization
# 0.99'. Only with one of the engine's own memory or parallelism flags on the line, so that a training
# script's '--model' is not taken for vLLM's.
_SCRIPT_CMD = re.compile(r"(?:^|[\s$#>])\S*python3?(?:\.\d+)?\s+\S+\.py\s+(.*--model[\s=].*)$")
_ENGINE_FLAGS = re.compile(
    r"--(gpu-memory-utilization|max-model-len|tensor-parallel-size|max-num-seqs|max-num-batched-tokens|"
    r"kv-cache-dtype|enforce-eager|swap-space|cpu-offload-gb)\b"
)


def _parse_continuation(text: str, into: dict[str, Any]) -> bool:
    """Arguments on a line that carries on a pasted command ('--model M --max-model-len 4096 \\'), or on
    a Python script's command line that passes vLLM's engine arguments through."""
    m = _FLAGS_LINE.search(text[:MAX_LINE])
    if m is not None:
        return _parse_flags(m.group(1) or m.group(2), into)
    s = _SCRIPT_CMD.search(text[:MAX_LINE])
    if s is None or not _ENGINE_FLAGS.search(s.group(1)):
        return False
    return _parse_flags(s.group(1), into)


def _parse_flags(cmd: str, into: dict[str, Any]) -> bool:
    try:
        toks = shlex.split(cmd, comments=False)
    except ValueError:
        toks = cmd.split()
    found: dict[str, Any] = {}
    for i, tok in enumerate(toks):
        if tok == "serve" and i + 1 < len(toks) and not toks[i + 1].startswith(("-", "[", "<", "{")):
            found.setdefault("model", toks[i + 1])
            found.setdefault("model_tag", toks[i + 1])
            continue
        if tok in _SHORT_FLAGS and i + 1 < len(toks):
            found.setdefault(_SHORT_FLAGS[tok], toks[i + 1])
            continue
        if not tok.startswith("--") or len(tok) < 4:
            continue
        key, eq, val = tok[2:].partition("=")
        key = key.replace("-", "_")
        if key == "model":
            key = "model_option" if "model_tag" in found else key
        if eq:
            found.setdefault(key, val)
        elif i + 1 < len(toks) and not toks[i + 1].startswith("-"):
            found.setdefault(key, toks[i + 1])
        else:
            found.setdefault(key, True)
    found.pop("help", None)
    for key, raw in found.items():
        if isinstance(raw, str) and re.fullmatch(r"-?\d+", raw):
            into.setdefault(key, int(raw))
        elif isinstance(raw, str) and re.fullmatch(r"-?\d+\.\d+", raw):
            into.setdefault(key, float(raw))
        else:
            into.setdefault(key, raw)
    return bool(found)


def scan(stream: BinaryIO, kind: str = "log", pb: Playbook | None = None) -> ScanResult:
    """Scan a log (``kind`` "log") or a kernel log (``kind`` "kernel") for signatures and landmarks."""
    pb = pb or playbook()
    sigs = [s for s in pb.signatures if s.kind == "any" or s.kind == kind]
    marks = list(pb.landmarks) if kind == "log" else []
    matcher = _Matcher(sigs, marks)
    res = ScanResult()
    stage_idx = -1
    base_line = 0
    carry = b""
    last_buf = b""
    while True:
        data = stream.read(CHUNK)
        eof = not data
        buf = carry + data
        if not buf:
            break
        if eof:
            cut = len(buf)
            carry = b""
        else:
            cut = buf.rfind(b"\n") + 1
            if cut == 0:
                if len(buf) < 4 * CHUNK:
                    carry = buf
                    continue
                cut = len(buf)  # a monstrous line: take it as it is
            carry = buf[cut:]
            buf = buf[:cut]
        res.bytes += len(buf)
        # line starts that hold a trigger, in order
        starts = matcher.candidate_lines(buf.lower())
        counted_at = 0
        line_no = base_line
        for ls in sorted(starts):
            le = starts[ls]
            line_no += buf.count(b"\n", counted_at, ls)
            counted_at = ls
            raw = buf[ls:le]
            text = clean_line(raw)
            info_before = len(matcher.info_left)
            new_idx = _match_line(text, line_no + 1, matcher, res, stage_idx)
            if new_idx > stage_idx or len(matcher.info_left) != info_before:
                stage_idx = max(stage_idx, new_idx)
                res.stage = STAGES[stage_idx] if stage_idx >= 0 else "unknown"
                matcher.stage_idx = stage_idx
                matcher.rebuild()
        base_line += buf.count(b"\n")
        if not eof and buf and not buf.endswith(b"\n"):
            base_line += 0
        last_buf = (last_buf + buf)[-TAIL_BYTES:] if len(buf) < TAIL_BYTES else buf[-TAIL_BYTES:]
        if eof:
            break
    res.lines = base_line + (0 if last_buf.endswith(b"\n") or not last_buf else 1)
    tail_lines = last_buf.split(b"\n")
    if tail_lines and tail_lines[-1] == b"":
        tail_lines.pop()
    first_no = res.lines - len(tail_lines) + 1
    skip = 0 if res.bytes <= len(last_buf) else 1  # the first tail line may be cut unless it opens the log
    res.tail = [(first_no + i, clean_line(t)) for i, t in enumerate(tail_lines[skip:], start=skip)][-40:]
    if res.notebook_header is not None:
        # a notebook traceback cut before its closing line: its class, without a message, as its end
        n, exc, header = res.notebook_header
        frames = tuple(path for line, path in res.recent_frames if line > n)
        res.exceptions.append(PyException(n, exc, "", header, frames))
        del res.exceptions[:-KEEP_EXCEPTIONS]
    _rejoin_wrapped(res, sigs)
    return res


JOIN_SPANS = (2, 3)  # consecutive tail lines a wrapped message may be spread over
_RICH_LOCATION = re.compile(r"\s{2,}[\w.-]+\.py:\d+\s*$")


def _joined(lines: list[str], sep: str = " ") -> tuple[str, tuple[str, str]]:
    """The lines joined with ``sep``, and the two joins one line shorter (without the last, the first)."""
    return sep.join(lines), (sep.join(lines[:-1]), sep.join(lines[1:]))


def _joins(parts: list[str]) -> list[tuple[str, tuple[str, str]]]:
    """The ways a wrapped message's lines go back together, each with the two joins one line shorter: a
    fixed-width wrap (no separator), a re-flow (a space), a re-flow inside an indented quote (a space, each
    line's indent dropped), and rich's log column (Python servers such as infinity: the source location,
    'batch_handler.py:574', at the right of the first line and the rest indented), whose location and
    padding are dropped before joining with spaces."""
    out = [_joined(parts, ""), _joined(parts)]
    stripped = [t.strip() for t in parts]
    if stripped != parts:
        # a commit message or an e-mail quotes the message indented, and each of its lines keeps the indent
        out.append(_joined(stripped))
    bare = [_RICH_LOCATION.sub("", t).strip() for t in parts]
    if bare != stripped:
        out.append(_joined(bare))
    return out


def _sig_match(sig: Signature, text: str) -> dict[str, str] | None:
    """The named groups when ``text`` carries the signature (needle, then regex), else None."""
    if sig.needle not in (text.lower() if sig.nocase else text):
        return None
    if sig.regex is None:
        return {}
    m = sig.regex.search(text[:MAX_LINE])
    return None if m is None else {k: v for k, v in m.groupdict().items() if v is not None}


def _rejoin_wrapped(res: ScanResult, sigs: list[Signature]) -> None:
    """Match signatures across the line breaks of a wrapped message in the log's tail.

    Terminals, ``docker logs`` in a narrow window, log collectors and issue forms hard-wrap long lines at
    a fixed width (mid-word: 'Decre' / 'ase GPU memory ...') or re-flow them at sentence ends, so the
    one line a signature is written for arrives as two or three. The error that ends a run is in the
    tail, so the last lines are re-joined (without a separator for fixed-width wraps, with a space for
    re-flowed ones) and matched again; a match counts only when no shorter run of those lines matches, so
    nothing already found line by line is counted twice. Bounded: the tail is at most TAIL_BYTES."""
    tail = res.tail
    if len(tail) < 2:
        return
    stage = res.stage
    for i in range(len(tail) - 1):
        for span in JOIN_SPANS:
            if i + span > len(tail):
                break
            for joined, shorter in _joins([t for _, t in tail[i : i + span]]):
                for sig in sigs:
                    groups = _sig_match(sig, joined)
                    if groups is None or any(_sig_match(sig, x) is not None for x in shorter):
                        continue  # no match, or found on fewer lines (or on one line by the streaming pass)
                    n = res.hit_counts.get(sig.id, 0)
                    res.hit_counts[sig.id] = n + 1
                    if n < KEEP_PER_SIGNATURE:
                        res.hits.append(Hit(sig, tail[i][0], joined[:1000], groups, stage))


def _whole_frame(text: str, needle: str) -> bool:
    """A frame landmark (', in f') names the whole function: ', in _warmup' is not ', in _warmup_and_capture'
    (vllm/v1/worker/gpu_model_runner.py, whose capture helpers share prefixes with other stages' names)."""
    start = text.find(needle)
    while start >= 0:
        end = start + len(needle)
        if end >= len(text) or not (text[end].isalnum() or text[end] == "_"):
            return True
        start = text.find(needle, start + 1)
    return False


def _match_line(text: str, line_no: int, matcher: _Matcher, res: ScanResult, stage_idx: int) -> int:
    """Test one decoded line against the active needles; returns the new stage index."""
    new_idx = stage_idx
    pending: list[Signature] = []
    low: str | None = None
    for needle, obj in matcher.entries:
        if isinstance(obj, Signature) and obj.nocase:
            if low is None:
                low = text.lower()
            if needle not in low:
                continue
        elif needle not in text:
            continue
        if obj is None:
            if _info(needle, text, res):
                matcher.info_left.discard(needle)
        elif isinstance(obj, Landmark):
            if obj.needle.startswith(", in ") and not _whole_frame(text, obj.needle):
                continue
            idx = STAGES.index(obj.stage)
            if idx > new_idx:
                new_idx = idx
            res.stage_first_line.setdefault(obj.stage, line_no)
            if res.weights_read_line is None and obj.needle in WEIGHT_READ_NEEDLES:
                res.weights_read_line = line_no
        elif isinstance(obj, Signature):
            pending.append(obj)
    for sig in pending:
        groups: dict[str, str] = {}
        if sig.regex is not None:
            m = sig.regex.search(text[:MAX_LINE])
            if m is None:
                continue
            groups = {k: v for k, v in m.groupdict().items() if v is not None}
        stage = STAGES[new_idx] if new_idx >= 0 else "unknown"
        n = res.hit_counts.get(sig.id, 0)
        res.hit_counts[sig.id] = n + 1
        if n < KEEP_PER_SIGNATURE:
            res.hits.append(Hit(sig, line_no, text[:1000], groups, stage))
    if pending or new_idx != stage_idx:
        for pid in _PID.findall(text[:200]):
            res.pids.add(int(pid))
    if not res.vllm_paths and ("/vllm/" in text or "\\vllm\\" in text):
        res.vllm_paths = True
    _traceback_line(text, line_no, res)
    return new_idx


def _assert_source_line(text: str, line_no: int, res: ScanResult) -> None:
    """Keep an assert statement's source line (not an exception line) for the bare AssertionError below it."""
    if "assert " in text:
        a = _ASSERT_SOURCE.search(text[:MAX_LINE])
        if a:
            res.assert_source = (line_no, a.group("cond").strip()[:300])


def _traceback_line(text: str, line_no: int, res: ScanResult) -> None:
    """Keep the files of recent traceback frames and the exception lines that close tracebacks."""
    if 'File "' in text:
        m = _FRAME.search(text[:MAX_LINE])
        if m:
            path = m.group("path").replace("\\", "/")
            if m.group("func"):
                path += " in " + m.group("func")  # '.../torch/cuda/__init__.py in _lazy_init'
            res.recent_frames.append((line_no, path))
            del res.recent_frames[:-KEEP_FRAMES]
            if res.engine == "vllm" and not res.vllm_version:
                # another engine's frames: its messages get its options, not vLLM's
                if "/lmdeploy/" in path:
                    res.engine = "lmdeploy"
                elif "/exllamav2/" in path:
                    res.engine = "exllamav2"
        return
    if not any(word in text for word in _EXC_WORDS):
        _assert_source_line(text, line_no, res)
        return
    m = _EXC.search(text[:MAX_LINE])
    if m is None:
        m = _EXC_REPR.search(text[:MAX_LINE])
        if m is not None and _RAISE.search(text[: m.start("exc")]):
            m = None  # a source line a traceback shows ('raise ValueError("...")'), not an error
    if m is None:
        h = _IPY_HEADER.match(text[:MAX_LINE])
        if h:
            res.notebook_header = (line_no, h.group("exc"), text[:1000])
            res.recent_frames.clear()
        else:
            _assert_source_line(text, line_no, res)
        return
    res.notebook_header = None
    frames = tuple(path for n, path in res.recent_frames if line_no - n <= FRAME_WINDOW)
    msg = (m.group("msg") or "")[:500]
    src = res.assert_source
    if not msg and m.group("exc").endswith("AssertionError") and src and line_no - src[0] <= ASSERT_WINDOW:
        # a bare assert: Python printed its source line just above, which states the condition that failed
        msg = "assert " + src[1]
    res.assert_source = None
    res.exceptions.append(PyException(line_no, m.group("exc"), msg, text[:1000], frames))
    del res.exceptions[:-KEEP_EXCEPTIONS]
    res.recent_frames.clear()  # the next traceback brings its own frames


def _info(needle: str, text: str, res: ScanResult) -> bool:
    """Read a configuration line; True when it was what the needle is for (so it retires)."""
    for pid in _PID.findall(text[:200]):
        res.pids.add(int(pid))
    if needle == "version ":
        m = _VERSION.search(text)
        if m and ("vllm" in text.lower() or "LLM engine" in text or "API server version" in text):
            res.vllm_version = m.group(1)
            return True
        return False
    if needle in ENGINE_NEEDLES:
        if res.engine == "vllm" and not res.vllm_version:
            res.engine = ENGINE_NEEDLES[needle]
        return True
    if needle == "NVIDIA ":
        m = _GPU_NAME.search(text)
        if m and res.gpu_name is None:
            res.gpu_name = m.group(0)
        return m is not None
    if needle == "KV cache memory: ":
        m = _KV_AVAILABLE.search(text)
        if m:
            prefixes = _WORKER_PREFIX.findall(text[: m.start()])
            with contextlib.suppress(ValueError):  # '-.' and other digits-and-dots that are no number
                res.kv_available.setdefault(prefixes[-1] if prefixes else "main", float(m.group(1)))
        return len(res.kv_available) >= MAX_KV_WORKERS
    if needle in ("fatal signal from worker processes", "Received sigquit from a child process"):
        res.self_sigkill = True
        return True
    if needle == "MiB":
        m = _SMI_PROCESS.search(text[:MAX_LINE]) or _NVITOP_PROCESS.search(text[:MAX_LINE])
        if m:
            mib = float(m.group("mib")) * (1024.0 if m.groupdict().get("unit") == "GiB" else 1.0)
            res.gpu_processes.append((int(m.group("gpu")), int(m.group("pid")), mib, text.strip()[:300]))
        return len(res.gpu_processes) >= MAX_PROCESS_ROWS
    if needle == "world_size=":
        # vllm/distributed/parallel_state.py init_distributed_environment: 'world_size=%d rank=%d ...'
        m = _WORLD_SIZE.search(text)
        if m:
            res.args.setdefault("world_size", int(m.group(1)))
        return m is not None
    if needle in ("cpu_worker.py", "cpu_model_runner.py"):
        res.cpu_backend = True
        return True
    if needle in ("vllm serve ", "vllm.entrypoints."):
        return _parse_command_line(text, res.args)
    if needle == "--model":
        return _parse_continuation(text, res.args) and "model" in res.args
    if "device_config=cpu" in text:
        res.cpu_backend = True
    if res.vllm_version is None:
        m = _VERSION.search(text)
        if m:
            res.vllm_version = m.group(1)
    _parse_args_line(text, res.args)
    return True
