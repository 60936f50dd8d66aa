"""Which host candidates one peer connection offers: the addresses its sockets bind,
the UDP ports they may take, and the address they are advertised with.

- `loopback_only`: bind 127.0.0.1 (or ::1) only. aioice never offers loopback, so
  a browser or client on the same machine could only reach us through a real
  interface; local development and tests keep WebRTC on loopback instead.
- `announced_address` (1:1 NAT, as on a cloud VM or a Kubernetes node behind a
  public IP): each host candidate keeps its real socket but is advertised with this
  address, same port. Sockets then bind the wildcard address of its family, so the
  one candidate works whichever interface the NAT forwards to.
- `port_range`: sockets bind only ports in [min, max], tried from a random start and
  wrapping around, so a firewall, security group or hostPort range can be opened
  for them. With none free the offer fails with `UdpPortRangeExhausted` (503).

The policy is applied to one RTCPeerConnection, after `setRemoteDescription` and
before `setLocalDescription` (which gathers), never process-wide: a server and a
client, or two models with different settings, share one Python process.
STUN (server-reflexive) and TURN (relay) candidates are gathered as aioice always
does; under the `relay` transport policy there are no host candidates to shape.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import random
import socket
from dataclasses import dataclass
from typing import Any

from aioice import Candidate, Connection, TransportPolicy
from aioice.candidate import candidate_foundation, candidate_priority
from aioice.ice import StunProtocol, server_reflexive_candidate
from aioice.turn import UDP_SOCKET_BUFFER_SIZE
from aiortc import RTCPeerConnection

from reactor_serve.protocol.errors import ModelUnavailable
from reactor_serve.rtc.settings import WebRTCSettings

__all__ = ["HostCandidatePolicy", "UdpPortRangeExhausted", "is_loopback_host"]

log = logging.getLogger(__name__)


def is_loopback_host(host: str) -> bool:
    """Whether a host name or address is this machine's loopback: a server or client
    there wants `HostCandidatePolicy(loopback_only=True)`."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class UdpPortRangeExhausted(ModelUnavailable):
    """Every UDP port of `udp_port_range` is taken (by other sessions on this node):
    this offer cannot get a media socket now. 503 with Retry-After."""

    # A port frees when a session on this node ends; clients retry after this long.
    RETRY_AFTER_S = 5.0


@dataclass(frozen=True)
class HostCandidatePolicy:
    """How one peer connection's host candidates are bound and advertised."""

    loopback_only: bool = False
    announced_address: str | None = None
    port_range: tuple[int, int] | None = None

    @classmethod
    def from_settings(cls, settings: WebRTCSettings) -> HostCandidatePolicy | None:
        """The policy `settings` ask for; None where aioice's own gathering is right
        (nothing set, or the relay transport policy, which gathers no host candidate)."""
        if settings.ice_transport_policy == "relay":
            return None
        policy = cls(settings.loopback_candidates, settings.announced_address,
                     settings.udp_port_range)
        return None if policy == cls() else policy

    def apply(self, pc: RTCPeerConnection) -> None:
        """Shape the host candidates `pc` gathers. Call it after the transceivers and
        the data channel exist (for an answer: after `setRemoteDescription`) and
        before `setLocalDescription`."""
        for gatherer in _ice_gatherers(pc):
            if gatherer._connection._transport_policy == TransportPolicy.RELAY:
                continue  # relay candidates only: no host candidate to shape
            # Why aiortc's and aioice's internals: neither has an option for the
            # addresses, ports or advertised address of host candidates (aioice binds
            # port 0 on every interface but loopback, from a module-level function).
            # So each ICE gatherer's own aioice Connection gets an instance-level
            # `get_component_candidates` (the coroutine aioice's gather_candidates
            # calls per component), which leaves every other connection alone.
            connection: Connection = gatherer._connection
            aioice_gathering = connection.get_component_candidates
            if isinstance(aioice_gathering, _ComponentGathering):
                aioice_gathering = aioice_gathering.aioice_gathering  # applied again
            connection.get_component_candidates = _ComponentGathering(  # type: ignore[method-assign]
                self, connection, aioice_gathering
            )

    def bind_addresses(self, interface_addresses: list[str]) -> list[str]:
        """The local addresses to bind, given the interface addresses aioice found."""
        family = None
        if self.announced_address is not None:
            family = ipaddress.ip_address(self.announced_address).version
        if self.loopback_only:
            return ["::1"] if family == 6 else ["127.0.0.1"]
        if family is not None:
            return ["::" if family == 6 else "0.0.0.0"]
        return list(interface_addresses)


def _ports_to_try(port_range: tuple[int, int] | None) -> list[int]:
    """Every port of the range from a random start, wrapping around (so concurrent
    sessions rarely race for the same one); [0] (any) with no range."""
    if port_range is None:
        return [0]
    low, high = port_range
    start = random.randint(low, high)
    return [*range(start, high + 1), *range(low, start)]


def _ice_gatherers(pc: RTCPeerConnection) -> list[Any]:
    """Every ICE gatherer of `pc`, through aiortc's public objects (a bundled
    transceiver shares its transport, so each gatherer is listed once)."""
    transports = [t.sender.transport for t in pc.getTransceivers()]
    if pc.sctp is not None:
        transports.append(pc.sctp.transport)
    gatherers: dict[int, Any] = {}
    for dtls in transports:
        gatherer = dtls.transport.iceGatherer
        gatherers[id(gatherer)] = gatherer
    return list(gatherers.values())


class _ComponentGathering:
    """One aioice Connection's candidates for a component, under a HostCandidatePolicy:
    host candidates bound and advertised by the policy, server-reflexive ones from
    the STUN server for them, relayed ones by aioice itself."""

    def __init__(self, policy: HostCandidatePolicy, connection: Connection,
                 aioice_gathering: Any) -> None:
        self._policy = policy
        self._connection = connection
        # aioice's own method, bound: given no address it gathers the TURN relay only.
        self.aioice_gathering = aioice_gathering

    async def __call__(self, component: int, addresses: list[str],
                       timeout: int = 5) -> list[Candidate]:
        connection = self._connection
        protocols = await self._bind_all(component, self._policy.bind_addresses(addresses))
        # Registered with the connection as aioice registers its own: it pairs them
        # with remote candidates, receives on them and closes them.
        connection._protocols += protocols
        candidates = [protocol.local_candidate for protocol in protocols]
        reflexive = [
            asyncio.create_task(server_reflexive_candidate(protocol, connection.stun_server))
            for protocol in protocols
            if connection.stun_server is not None
            and ipaddress.ip_address(protocol.local_candidate.host).version == 4
        ]
        # The TURN allocation runs meanwhile, bounded by aioice's own timeout.
        relayed = asyncio.ensure_future(
            self.aioice_gathering(component=component, addresses=[], timeout=timeout)
        )
        try:
            if reflexive:
                done, pending = await asyncio.wait(reflexive, timeout=timeout)
                for task in pending:
                    task.cancel()
                candidates += [task.result()[0] for task in done if task.exception() is None]
            candidates += await relayed
        finally:
            relayed.cancel()
        return candidates

    async def _bind_all(self, component: int, addresses: list[str]) -> list[StunProtocol]:
        protocols: list[StunProtocol] = []
        try:
            for address in addresses:
                protocol = await self._bind(component, address)
                if protocol is not None:
                    protocols.append(protocol)
        except BaseException:
            for protocol in protocols:
                protocol.transport.close()
            raise
        return protocols

    async def _bind(self, component: int, address: str) -> StunProtocol | None:
        sock = self._socket(address)
        if sock is None:
            return None
        loop = asyncio.get_running_loop()
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UDP_SOCKET_BUFFER_SIZE)
            _, protocol = await loop.create_datagram_endpoint(
                lambda: StunProtocol(self._connection), sock=sock
            )
        except BaseException:
            sock.close()
            raise
        host, port = sock.getsockname()[:2]
        advertised = self._policy.announced_address or host
        protocol.local_candidate = Candidate(
            foundation=candidate_foundation("host", "udp", advertised),
            component=component,
            transport="udp",
            priority=candidate_priority(component, "host"),
            host=advertised,
            port=port,
            type="host",
        )
        return protocol

    def _socket(self, address: str) -> socket.socket | None:
        """A UDP socket bound on `address` (a port of the range when one is set);
        None when the address cannot be bound at all (aioice skips those too)."""
        family = socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
        for port in _ports_to_try(self._policy.port_range):
            sock = socket.socket(family, socket.SOCK_DGRAM)
            try:
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind((address, port))
            except OSError as exc:
                sock.close()
                if exc.errno == errno.EADDRINUSE and port != 0:
                    continue
                log.info("could not bind a media socket on %s: %s", address, exc)
                return None
            sock.setblocking(False)
            return sock
        assert self._policy.port_range is not None
        low, high = self._policy.port_range
        raise UdpPortRangeExhausted(
            f"no free UDP port for this session's media: every port of udp_port_range "
            f"{low}-{high} on {address} is in use (by other sessions on this node, or "
            f"other programs); retry later, or widen the range",
            retry_after_s=UdpPortRangeExhausted.RETRY_AFTER_S,
        )
