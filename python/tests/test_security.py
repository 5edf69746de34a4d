"""API keys and TLS from Python: a kernel with an auth file refuses what a key does not allow
(a subagent, from a handler or a tool body, needs `runs:write` on the worker's key), and a kernel
serving TLS is reached with the CA that signed its certificate."""

from __future__ import annotations

import datetime
import ipaddress
import json
import subprocess
from pathlib import Path

import hosted_agents
import pytest
from conftest import ended_run, serving
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from harness import Kernel, binary, within

from kernel_sdk import (
    AgentClient,
    KernelError,
    Tls,
    ToolCall,
    ToolContext,
    Worker,
    WorkerRefused,
    tool,
)


@tool(read_only=True)
async def secure_echo(ctx: ToolContext, text: str) -> str:
    """Echoes a text."""
    return text


@tool(read_only=True)
async def other_echo(ctx: ToolContext, text: str) -> str:
    """Echoes a text, but its name is outside the worker key's globs."""
    return text


def _key(*args: str) -> dict[str, str]:
    made = subprocess.run(
        [str(binary("kernelctl")), "keys", "create", "--json", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    created: dict[str, str] = json.loads(made.stdout)
    return created


def _secured(
    folder: Path, worker: str, tools: str
) -> tuple[Kernel, dict[str, str], dict[str, str]]:
    """A kernel with an auth file of two keys: a worker's named `worker` (`workers:connect` for
    the tool glob `tools`), and an agent's (`runs:write`, `tools:call`, `runs:read`)."""
    worker_key = _key("--name", worker, "--scope", "workers:connect", "--tools", tools)
    agent_key = _key(
        "--name",
        "py-agent",
        "--scope",
        "runs:write",
        "--scope",
        "tools:call",
        "--scope",
        "runs:read",
    )
    auth = folder / "keys.yaml"
    auth.write_text("keys:\n" + worker_key["entry"] + agent_key["entry"])
    return Kernel(folder, "--auth-file", str(auth)), worker_key, agent_key


async def test_keys_are_sent_and_what_they_do_not_allow_is_refused(tmp_path: Path) -> None:
    kernel, worker_key, agent_key = _secured(tmp_path, "py-worker", "secure_*")
    try:
        with pytest.raises(WorkerRefused) as unauthenticated:
            await Worker(kernel.addr, [secure_echo]).run(handle_signals=False)
        assert unauthenticated.value.code == "UNAUTHENTICATED"
        with pytest.raises(WorkerRefused) as outside:
            await Worker(kernel.addr, [other_echo], api_key=worker_key["secret"]).run(
                handle_signals=False
            )
        assert outside.value.code == "PERMISSION_DENIED" and "other_echo" in outside.value.message

        async with AgentClient(kernel.addr) as anonymous:
            with pytest.raises(KernelError) as refused:
                await anonymous.create_run("py-agent")
            assert refused.value.code == "UNAUTHENTICATED"
        async with (
            serving(kernel, secure_echo, api_key=worker_key["secret"]),
            AgentClient(kernel.addr, api_key=agent_key["secret"]) as agent,
        ):
            run = await agent.create_run("py-agent")
            turn = await agent.call_turn(run.id, 0, [ToolCall("secure_echo", {"text": "hi"})])
            assert turn.results[0].output == "hi"
    finally:
        kernel.stop()


async def test_a_subagent_needs_runs_write_on_the_hosting_workers_key(tmp_path: Path) -> None:
    kernel, worker_key, agent_key = _secured(tmp_path, "py-hosts", "*")
    try:
        async with (
            serving(
                kernel,
                *hosted_agents.TOOLS,
                agents=hosted_agents.AGENTS,
                api_key=worker_key["secret"],
            ),
            AgentClient(kernel.addr, api_key=agent_key["secret"]) as agent,
        ):
            # From a handler: the run fails, naming the key and the scope it lacks.
            parent = await agent.create_run("py_parent", hosted=True)
            ended = await within("the parent to end", ended_run(agent, parent.id), 30)
            assert ended.status == "failed", ended
            assert "key 'py-hosts' needs the scope runs:write" in ended.reason, ended.reason
            # From a tool body: the call fails with the same refusal, and the run goes on.
            delegating = await agent.create_run("py_delegating", hosted=True)
            done = await within("the run to end", ended_run(agent, delegating.id), 30)
            assert done.status == "completed", done
            assert done.output.startswith("subagent 'py_sleeper': PERMISSION_DENIED"), done.output
            assert "needs the scope runs:write" in done.output, done.output
            for run in (parent, delegating):
                steps = (await agent.get_run(run.id)).steps
                assert not [s for s in steps if s.child_run_id], "no child run was created"
    finally:
        kernel.stop()


def _certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a certificate it signed for 127.0.0.1 and localhost: (ca, cert, key) files."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kernel")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = folder / "ca.pem", folder / "kernel.pem", folder / "kernel.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


async def test_a_kernel_serving_tls_is_reached_with_its_ca(tmp_path: Path) -> None:
    ca, cert, key = _certificates(tmp_path)
    kernel = Kernel(tmp_path, "--tls-cert", str(cert), "--tls-key", str(key))
    tls = Tls.from_files(ca)
    try:
        async with (
            serving(kernel, secure_echo, tls=tls),
            AgentClient(f"https://{kernel.addr}", tls=tls) as agent,
        ):
            run = await agent.create_run("py-agent")
            turn = await agent.call_turn(run.id, 0, [ToolCall("secure_echo", {"text": "tls"})])
            assert turn.results[0].output == "tls"
        # Plain text to a TLS port never gets through.
        async with AgentClient(kernel.addr) as plain:
            with pytest.raises(KernelError) as refused:
                await plain.create_run("py-agent")
            assert refused.value.code == "UNAVAILABLE"
    finally:
        kernel.stop()
