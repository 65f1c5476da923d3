"""The host probes' pure parsers: known inputs, and garbage that must never crash them (hypothesis)."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.probes.cpu import parse_cpuinfo
from tuner.probes.memory import (
    UNLIMITED,
    mount_for,
    parse_cgroup_limit,
    parse_limits,
    parse_meminfo,
    parse_mountinfo,
    parse_mounts,
    parse_proc_cgroup,
    parse_selected,
    parse_size,
    parse_ulimit_memlock,
)
from tuner.probes.net import is_vllm_server, parse_proc_net_tcp, redact_argv
from tuner.probes.numa import format_cpulist, parse_cpulist, parse_cpumask, parse_status_cpus
from tuner.probes.swap import Media, media_from_sysfs, parse_swaps

garbage = st.text(alphabet=st.characters(codec="utf-8"), max_size=400) | st.binary(max_size=400).map(
    lambda b: b.decode("utf-8", errors="replace")
)
linesy = st.lists(
    st.text(alphabet=" \t:0123456789abcdefkKBx-,[]/=\\_.ABCDEFMemTotalNodeFilenamepartition", max_size=60),
    max_size=12,
).map("\n".join)


# -- cpulist -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-3,8-11", (0, 1, 2, 3, 8, 9, 10, 11)),
        ("32-63\n", tuple(range(32, 64))),
        ("5", (5,)),
        ("", ()),
        ("0-7:2/4", (0, 1, 4, 5)),
    ],
)
def test_parse_cpulist_expands_kernel_notation(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("bad", ["3-1", "a", "0-", ",", "1,,2", "-1", "0-99999999", "0-7:5/4"])
def test_parse_cpulist_rejects_garbage_with_value_error(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_cpulist(bad)


@given(st.sets(st.integers(min_value=0, max_value=4095), max_size=200))
def test_format_then_parse_cpulist_round_trips(cpus: set[int]) -> None:
    text = format_cpulist(cpus)
    assert parse_cpulist(text) == tuple(sorted(cpus))
    assert "--" not in text and not text.startswith(",")


def test_format_cpulist_collapses_runs() -> None:
    assert format_cpulist([8, 9, 10, 11, 0, 1, 2, 3, 5]) == "0-3,5,8-11"


@given(garbage | linesy)
def test_cpulist_and_mask_parsers_raise_only_value_error(text: str) -> None:
    for fn in (parse_cpulist, parse_cpumask, parse_status_cpus):
        with contextlib.suppress(ValueError):
            fn(text)


def test_parse_cpumask_of_local_cpus() -> None:
    assert parse_cpumask("ffff") == tuple(range(16))
    assert parse_cpumask("00000000,000000f0") == (4, 5, 6, 7)


# -- meminfo / swaps / cpuinfo -----------------------------------------------------------------------------
def test_parse_meminfo_in_bytes_for_host_and_node_files() -> None:
    assert parse_meminfo("MemTotal:       24684096 kB\nHugePages_Total:       0\n") == {
        "MemTotal": 24684096 * 1024,
        "HugePages_Total": 0,
    }
    assert parse_meminfo("Node 1 MemFree:   1024 kB\n")["MemFree"] == 1 << 20


def test_parse_swaps_partitions_files_and_escaped_names() -> None:
    text = (
        "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
        "/dev/nvme0n1p3                          partition\t8388604\t\t0\t\t-2\n"
        "/swap\\040file (deleted)                  file\t\t1048572\t\t512\t\t-3\n"
        "garbage line\n"
    )
    a, b = parse_swaps(text)
    assert (a.filename, a.type, a.size, a.priority) == ("/dev/nvme0n1p3", "partition", 8388604 * 1024, -2)
    assert (b.filename, b.type, b.used) == ("/swap file (deleted)", "file", 512 * 1024)


def test_parse_cpuinfo_x86_and_arm() -> None:
    x86 = parse_cpuinfo("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: sse avx2\n\nprocessor\t: 1\n")
    assert (x86.model, x86.logical_cpus, x86.flags) == ("AMD EPYC", 2, frozenset({"sse", "avx2"}))
    arm = parse_cpuinfo(
        "processor\t: 0\nFeatures\t: fp asimd sve bf16\nCPU implementer\t: 0x41\nCPU part\t: 0xd4f\n"
    )
    assert arm.model == "Arm CPU part 0xd4f" and "sve" in arm.flags and arm.vendor == "0x41"


@settings(max_examples=200)
@given(garbage | linesy)
def test_text_parsers_never_raise_on_garbage(text: str) -> None:
    parse_meminfo(text)
    parse_swaps(text)
    parse_cpuinfo(text)
    parse_mountinfo(text)
    parse_mounts(text)
    parse_limits(text)
    parse_ulimit_memlock(text)
    parse_selected(text)
    parse_proc_cgroup(text)
    parse_proc_net_tcp(text)


@given(garbage)
def test_value_parsers_raise_only_value_error(text: str) -> None:
    for fn in (parse_size, parse_cgroup_limit):
        with contextlib.suppress(ValueError):
            fn(text)


# -- mounts / limits / cgroup / selectors --------------------------------------------------------------------
def test_mount_for_picks_the_longest_mount_point() -> None:
    mounts = parse_mounts(
        "/dev/sda1 / ext4 rw 0 0\n/dev/nvme0n1p1 /data ext4 rw 0 0\n/dev/sdb1 /data2 xfs rw 0 0\n"
    )
    assert mount_for(mounts, "/data/swapfile") is mounts[1]
    assert mount_for(mounts, "/data2/x") is mounts[2]
    assert mount_for(mounts, "/swapfile") is mounts[0]


def test_parse_size_and_limits_units() -> None:
    assert parse_size("65536k") == 64 << 20
    assert parse_size("16G") == 16 << 30
    assert parse_ulimit_memlock("max locked memory           (kbytes, -l) 8192\n") == 8 << 20
    assert parse_ulimit_memlock("max locked memory           (kbytes, -l) unlimited\n") == UNLIMITED


def test_cgroup_parsing_v1_v2_and_no_limit() -> None:
    assert parse_proc_cgroup("0::/user.slice\n") == (2, "/user.slice")
    assert parse_proc_cgroup("4:memory:/docker/abc\n0::/\n") == (1, "/docker/abc")
    assert parse_cgroup_limit("max") is None
    assert parse_cgroup_limit("9223372036854771712") is None
    assert parse_cgroup_limit("17179869184") == 16 << 30


def test_parse_selected_sysfs_choice() -> None:
    assert parse_selected("always [madvise] never") == "madvise"
    assert parse_selected("never") == "never"


# -- /proc/net/tcp and vLLM command lines -------------------------------------------------------------------
def test_parse_proc_net_tcp_listeners_v4_and_v6() -> None:
    v4 = (
        "  sl  local_address rem_address   st ...\n"
        "   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 111 1 0\n"
        "   1: 0100007F:1F41 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 112 1 0\n"
        "   2: 0100007F:1F42 0100007F:D000 01 00000000:00000000 00:00000000 00000000 0 0 113 1 0\n"
    )
    got = parse_proc_net_tcp(v4)
    assert [(ln.address, ln.port, ln.inode, ln.loopback) for ln in got] == [
        ("0.0.0.0", 8000, 111, False),
        ("127.0.0.1", 8001, 112, True),
    ]
    v6 = (
        "  sl  local_address remote_address st ...\n"
        "   0: 00000000000000000000000000000000:1F40 00000000000000000000000000000000:0000 0A "
        "00000000:00000000 00:00000000 00000000 0 0 221 1 0\n"
        "   1: 00000000000000000000000001000000:1F41 00000000000000000000000000000000:0000 0A "
        "00000000:00000000 00:00000000 00000000 0 0 222 1 0\n"
    )
    a, b = parse_proc_net_tcp(v6)
    assert (a.address, a.family, a.loopback) == ("::", 6, False)
    assert (b.address, b.loopback) == ("::1", True)


def test_vllm_server_command_lines_and_key_redaction() -> None:
    assert is_vllm_server(["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"])
    assert is_vllm_server(["/usr/bin/vllm", "serve", "Qwen/Qwen2.5-72B"])
    assert is_vllm_server(["/usr/bin/python3", "/venv/bin/vllm", "serve", "m"])
    assert not is_vllm_server(["python3", "-m", "http.server", "8000"])
    assert redact_argv(["vllm", "serve", "--api-key", "s3cret", "--hf-token=abc"]) == (
        "vllm",
        "serve",
        "--api-key",
        "<redacted>",
        "--hf-token=<redacted>",
    )


# -- media classification ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "path", "rotational", "transport", "media"),
    [
        ("nvme0n1", "/sys/devices/pci0000:00/0000:00:1d.0/nvme/nvme0/nvme0n1", False, None, Media.NVME),
        (
            "sda",
            "/sys/devices/pci0000:00/0000:00:17.0/ata3/host2/target2:0:0/2:0:0:0/block/sda",
            False,
            None,
            Media.SSD,
        ),
        (
            "sdb",
            "/sys/devices/pci0000:00/0000:00:17.0/ata4/host3/target3:0:0/3:0:0:0/block/sdb",
            True,
            None,
            Media.ROTATIONAL,
        ),
        ("zram0", "/sys/devices/virtual/block/zram0", False, None, Media.ZRAM),
        ("vda", "/sys/devices/pci0000:00/0000:00:02.0/virtio1/block/vda", True, None, Media.VIRTIO),
        ("loop0", "/sys/devices/virtual/block/loop0", False, None, Media.UNKNOWN),
        ("sdc", None, None, "sas", Media.UNKNOWN),
    ],
)
def test_media_from_sysfs(
    name: str, path: str | None, rotational: bool | None, transport: str | None, media: Media
) -> None:
    assert media_from_sysfs(name, path, rotational, transport) is media
