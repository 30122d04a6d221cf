"""Congestion control of the tunnel: aioquic's New Reno (default) or CUBIC, minus their delay-based
slow-start exit.

aioquic leaves slow start when ``QuicRttMonitor`` sees five RTT samples whose minimum is 25 % above
the filtered minimum. On a cross-zone path whose RTT jitters by ± half its value that signal is
noise, and leaving slow start early means growing one packet per round trip from there. Here slow
start ends on loss only (TCP New Reno's rule); what made reordering look like loss is handled in
``recovery.py``. Every loss is reported to the owner for ``llmesh_quic_lost_packets_total``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from aioquic.quic.congestion.base import register_congestion_control
from aioquic.quic.congestion.cubic import CubicCongestionControl
from aioquic.quic.congestion.reno import RenoCongestionControl
from aioquic.quic.packet_builder import QuicSentPacket

NAME = "llmesh-reno"
CUBIC_NAME = "llmesh-cubic"


class _CountsLosses:
    """Reports every batch of lost packets to ``on_loss`` (the tunnel's loss counter)."""

    on_loss: Callable[[int], None] | None = None

    def on_packets_lost(self, *, now: float, packets: Iterable[QuicSentPacket]) -> None:
        lost = list(packets)
        if self.on_loss is not None and lost:
            self.on_loss(len(lost))
        super().on_packets_lost(now=now, packets=lost)  # type: ignore[misc]


class TunnelCongestionControl(_CountsLosses, RenoCongestionControl):
    """New Reno whose slow start ends on loss, not on RTT jitter; counts lost packets."""

    def on_rtt_measurement(self, *, now: float, rtt: float) -> None:
        # Deliberately no delay-based slow-start exit: see the module docstring.
        return


register_congestion_control(NAME, TunnelCongestionControl)


class TunnelCubic(_CountsLosses, CubicCongestionControl):
    """aioquic's CUBIC (window x0.7 on loss, cubic regrowth) minus the same jitter-blind exit."""

    def on_rtt_measurement(self, *, now: float, rtt: float) -> None:
        self.rtt = rtt  # CUBIC's Reno-friendly estimate needs it; no slow-start exit here


register_congestion_control(CUBIC_NAME, TunnelCubic)
