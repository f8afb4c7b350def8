"""Check a Ray cluster address before anything runs: does Ray answer there, within seconds.

``ray.init(address=...)`` on an address where no cluster answers retries for a long time (a
minute or more) before it fails, after the study was opened. :func:`check_ray_address` makes the
same mistake one line within a few seconds, at load time (``validate`` and ``optimize`` alike).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from explorer.errors import SpecError

__all__ = ["PROBE_TIMEOUT_S", "check_ray_address", "ray_endpoint"]

PROBE_TIMEOUT_S = 3.0
_HEALTH_CHECK = "/grpc.health.v1.Health/Check"
_CLUSTER_ID = "/ray.rpc.NodeInfoGcsService/GetClusterId"
"""A GCS call that token authentication guards (an empty request asks for the cluster's id)."""
"""The standard gRPC health check; an empty request asks about the whole server."""
RAY_CLIENT_PORT = 10001
"""Ray Client's default port, for a ``ray://host`` address without one."""


def _current_cluster_file() -> Path:
    """Where ``ray start`` records the latest local cluster's address (Ray reads it for ``auto``)."""
    tmp = os.environ.get("RAY_TMPDIR") or os.path.join(tempfile.gettempdir(), "ray")
    return Path(tmp) / "ray_current_cluster"


def _host_port(text: str, *, default_port: int | None) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as a pair.

    Raises:
        ValueError: no port (and no default), or a port that is not a number in 1..65535.
    """
    if text.startswith("["):  # [v6]:port
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:  # no port, or a bare IPv6 address
        host, port = text, ""
    if not port:
        if default_port is None:
            raise ValueError("needs host:port")
        port = str(default_port)
    if not host:
        raise ValueError("needs a host before the port")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"port {port!r} is not a number in 1..65535")
    return host, int(port)


def ray_endpoint(address: str) -> tuple[str, int] | None:
    """The host and port that ``ray.init(address=address)`` connects to; ``None``: none (``local``
    starts a new local Ray).

    Raises:
        ValueError: an address Ray cannot use, or ``auto`` with no cluster recorded on this machine.
    """
    address = address.strip()
    if address == "local":
        return None
    if address == "auto":
        recorded = _current_cluster_file()
        text = recorded.read_text().strip() if recorded.is_file() else ""
        if not text:
            raise ValueError(f"auto: no Ray cluster is running on this machine (no address in {recorded})")
        return _host_port(text, default_port=None)
    if "://" in address:
        scheme, rest = address.split("://", 1)
        if scheme != "ray":
            raise ValueError(
                f"unsupported scheme {scheme!r}: use host:port (GCS) or ray://host:port (Ray Client)"
            )
        return _host_port(rest.split("/", 1)[0], default_port=RAY_CLIENT_PORT)
    return _host_port(address, default_port=None)


def check_ray_address(address: str | None, *, file: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Fail unless ``address`` (or, when it is ``None``, ``RAY_ADDRESS``) answers a TCP connect.

    ``None`` and no ``RAY_ADDRESS``: a local Ray will be started; nothing to check.

    Raises:
        SpecError: naming ``file`` and ``launcher.address``: a malformed address, or nobody
            listening there within ``timeout_s``.
    """
    source = ""
    if address is None:
        address = os.environ.get("RAY_ADDRESS") or None
        source = "RAY_ADDRESS=" if address else ""
    if address is None:
        return
    shown = f"{source}{address}" if source else repr(address)
    try:
        endpoint = ray_endpoint(address)
    except ValueError as exc:
        raise SpecError(file=file, field="launcher.address", problem=f"{shown}: {exc}") from None
    if endpoint is None:
        return
    host, port = endpoint
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    why = _probe(host, port, timeout_s)
    if why is not None:
        raise SpecError(
            file=file, field="launcher.address", problem=f"{shown}: cannot reach Ray at {where}: {why}"
        )


def _ray_token() -> str | None:
    """The token Ray's driver would send (``RAY_AUTH_TOKEN``, the file ``RAY_AUTH_TOKEN_PATH``
    names, else ``~/.ray/auth_token``), or ``None``. Never printed."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip()
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _token_refused(channel: Any, timeout_s: float) -> str | None:
    """Why a cluster with token authentication would refuse this driver (the health check answers
    without a token; a GCS call does not), or ``None``: it accepts it, or it is no GCS."""
    import grpc

    token = _ray_token()
    call = channel.unary_unary(_CLUSTER_ID, request_serializer=None, response_deserializer=None)
    try:
        call(b"", timeout=timeout_s, metadata=(("authorization", f"Bearer {token}"),) if token else None)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
            has = "has a token that is not the cluster's" if token else "has no token"
            return (
                f"the cluster requires an authentication token and this driver {has}; set "
                "RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH to the cluster's token"
            )
    return None


def _probe(host: str, port: int, timeout_s: float) -> str | None:
    """``None`` when Ray answers at host:port within ``timeout_s``; else why not.

    A TCP connect is not enough: a proxy or firewall that accepts every connection (some sandboxes
    and corporate networks do, and some answer HTTP/2 too) would pass it, and ``ray.init`` would
    then hang. So the probe makes a gRPC call, the standard health check, which Ray's GCS
    answers. A gRPC server that does not know the health service (Ray Client's server) still
    answers with a gRPC status of its own, and passes; an HTTP answer that is not gRPC does not.
    """
    import grpc  # Ray's own dependency; about 50 ms to import

    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    channel = grpc.insecure_channel(where, options=[("grpc.enable_http_proxy", 0)])
    try:
        check = channel.unary_unary(_HEALTH_CHECK, request_serializer=None, response_deserializer=None)
        check(b"", timeout=timeout_s, wait_for_ready=False)
        return _token_refused(channel, timeout_s)
    except grpc.RpcError as exc:
        code, details = exc.code(), (exc.details() or "").strip()
    finally:
        channel.close()
    if code == grpc.StatusCode.UNIMPLEMENTED and not details.startswith("Received http2 header"):
        return None  # a gRPC server without the health service: something that speaks Ray's protocol
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"no answer within {timeout_s:g} s"
    if code == grpc.StatusCode.UNAVAILABLE:
        if "Connection refused" in details:
            return "connection refused (no Ray cluster listens there)"
        if "resolving" in details or "DNS" in details:
            return f"cannot resolve {host!r}"
        return details.split(";")[-1].strip()[:160] or "unavailable"
    return f"it answered, but not as Ray does ({code.name}: {details[:120]})"
