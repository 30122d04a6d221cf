"""Loss detection that tolerates reordering (RFC 9002 §6.1 lets a sender adapt its thresholds).

The finding behind this module: on a link whose delay jitters per packet (20 ± 10 ms RTT, netem
style), packets arrive out of order by tens of packets. aioquic declares a packet lost as soon as a
packet 3 numbers later is acknowledged (or after 9/8 RTT), and every such *spurious* loss halves the
congestion window. The window never leaves a few packets, and a bulk transfer crawls at about one
initial window per round trip (~0.2-0.4 MB/s) where Linux TCP, whose RACK adapts its reordering
window and undoes spurious reductions, keeps ~25 MB/s on the same emulated link.

``TunnelRecovery`` does what RACK does:

* it remembers the packets it declared lost; an ACK for one of them proves the loss spurious;
* after the first spurious loss it stops using the packet-count threshold (time only, RACK) and
  widens the time threshold by 1/8 RTT per spurious loss, up to 2 RTT;
* a congestion event all of whose packets turn out to have arrived is undone (the window and
  slow-start threshold from before it are restored).

And one for tail latency: aioquic advertises ``max_ack_delay`` = 25 ms but acknowledges after 1 ms.
Every probe timeout (PTO, what recovers a lost last packet of a request or response) includes the
peer's max_ack_delay, so a lost unary request waited ~25 ms longer than needed. Both ends of the
tunnel run this code, so the PTO here counts ``PEER_ACK_DELAY`` instead.

aioquic 1.7.2 internals (``_detect_loss``, ``_on_packets_lost``, ``sent_packets``) are used, as in
``tunnel.CreditedConnection``; the version is pinned.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aioquic.quic.congestion.base import K_GRANULARITY
from aioquic.quic.rangeset import RangeSet
from aioquic.quic.recovery import (
    K_PACKET_THRESHOLD,
    K_TIME_THRESHOLD,
    QuicPacketPacer,
    QuicPacketRecovery,
)

_MAX_TIME_THRESHOLD = 2.0
_TIME_STEP = 1 / 8
_EVENTS_KEPT = 64
# What the peer (this same code, aioquic's 1 ms ack timer) really delays ACKs by, with margin.
PEER_ACK_DELAY = 0.005
# Smallest pacing burst, in seconds of sending at the pacing rate: about one event-loop wakeup.
PACING_QUANTUM = float(os.environ.get("LLMESH_QUIC_PACING_QUANTUM", "0.004"))


class TunnelPacer(QuicPacketPacer):
    """aioquic's pacer with bursts sized to the event loop's wakeups.

    aioquic caps a burst at 16 packets (``bucket_max``) and then waits ``packet_time`` (microseconds
    at high rates) on an asyncio timer. asyncio wakes no sooner than ~1 ms later (several ms on a
    busy host), and the bucket refills only up to 16 packets, so the sender is held to 16 packets per
    loop iteration — ~10 MB/s at best, a few MB/s under load — whatever the window allows. Letting
    a burst cover ``PACING_QUANTUM`` of the pacing rate removes that ceiling; the congestion window
    still bounds what is in flight.
    """

    def update_rate(self, congestion_window: int, smoothed_rtt: float) -> None:
        super().update_rate(congestion_window=congestion_window, smoothed_rtt=smoothed_rtt)
        self.bucket_max = max(self.bucket_max, PACING_QUANTUM)


@dataclass
class _CongestionEvent:
    cwnd: int
    ssthresh: int | None
    recovery_start: float
    outstanding: set[int] = field(default_factory=set)


class TunnelRecovery(QuicPacketRecovery):
    """QuicPacketRecovery with RACK-style reordering tolerance and spurious-loss undo."""

    reorder_packets: float
    reorder_time: float
    spurious_losses: int
    on_spurious: Callable[[int], None] | None
    _lost_events: OrderedDict[int, _CongestionEvent]
    _event_of: dict[int, int]

    @classmethod
    def adopt(cls, recovery: QuicPacketRecovery) -> TunnelRecovery:
        """Give aioquic's recovery object this class's behaviour (it adds state, no new init)."""
        recovery.__class__ = cls
        recovery._pacer.__class__ = TunnelPacer
        assert isinstance(recovery, TunnelRecovery)
        recovery.reorder_packets = K_PACKET_THRESHOLD
        recovery.reorder_time = K_TIME_THRESHOLD
        recovery.spurious_losses = 0
        recovery.on_spurious = None
        recovery._lost_events = OrderedDict()
        recovery._event_of = {}
        return recovery

    def get_probe_timeout(self, *, include_max_ack_delay: bool = True) -> float:
        # aioquic's formula (RFC 9002 §6.2.1) with the peer's real ack delay; called per datagram.
        if not self._rtt_initialized:
            return float(2 * self._rtt_initial)
        pto = self._rtt_smoothed + max(4 * self._rtt_variance, K_GRANULARITY)
        if include_max_ack_delay:
            pto += min(self.max_ack_delay, PEER_ACK_DELAY)
        return float(pto)

    def on_ack_received(self, *, ack_rangeset: RangeSet, ack_delay: float, now: float, space: Any) -> None:
        if self._event_of and space is self.spaces[-1]:
            self._check_spurious(ack_rangeset, space)
        super().on_ack_received(ack_rangeset=ack_rangeset, ack_delay=ack_delay, now=now, space=space)

    def _check_spurious(self, ack_rangeset: RangeSet, space: Any) -> None:
        largest = ack_rangeset.bounds().stop - 1
        found = 0
        for r in ack_rangeset:
            for packet_number in [pn for pn in self._event_of if r.start <= pn < r.stop]:
                found += 1
                key = self._event_of.pop(packet_number)
                event = self._lost_events.get(key)
                if event is None:
                    continue
                event.outstanding.discard(packet_number)
                if not event.outstanding:
                    self._undo(key, event)
                self.reorder_packets = max(self.reorder_packets, largest - packet_number + 1)
        if found:
            self.spurious_losses += found
            # RACK: once reordering is seen, time decides loss, not packet counts.
            self.reorder_packets = float("inf")
            self.reorder_time = min(_MAX_TIME_THRESHOLD, self.reorder_time + _TIME_STEP * found)
            if self.on_spurious is not None:
                self.on_spurious(found)

    def _undo(self, key: int, event: _CongestionEvent) -> None:
        del self._lost_events[key]
        cc: Any = self._cc
        if cc.congestion_window < event.cwnd:
            cc.congestion_window = event.cwnd
            cc.ssthresh = event.ssthresh
            if hasattr(cc, "_congestion_recovery_start_time"):
                cc._congestion_recovery_start_time = event.recovery_start

    def _detect_loss(self, *, now: float, space: Any) -> None:
        loss_delay = self.reorder_time * (
            max(self._rtt_latest, self._rtt_smoothed) if self._rtt_initialized else self._rtt_initial
        )
        packet_threshold = space.largest_acked_packet - self.reorder_packets
        time_threshold = now - loss_delay
        lost_packets = []
        space.loss_time = None
        for packet_number, packet in space.sent_packets.items():
            if packet_number > space.largest_acked_packet:
                break
            if packet_number <= packet_threshold or packet.sent_time <= time_threshold:
                lost_packets.append(packet)
            else:
                packet_loss_time = packet.sent_time + loss_delay
                if space.loss_time is None or space.loss_time > packet_loss_time:
                    space.loss_time = packet_loss_time
        self._on_packets_lost(
            now=now,
            packets=lost_packets,
            persistent_congestion=self._in_persistent_congestion(packets=lost_packets),
            space=space,
        )

    def _on_packets_lost(
        self,
        *,
        congestion_event: bool = True,
        now: float,
        packets: Iterable[Any],
        persistent_congestion: bool = False,
        space: Any,
    ) -> None:
        packets = list(packets)
        if congestion_event and packets and space is self.spaces[-1]:
            cc: Any = self._cc
            key = packets[-1].packet_number
            event = _CongestionEvent(
                cwnd=cc.congestion_window,
                ssthresh=cc.ssthresh,
                recovery_start=getattr(cc, "_congestion_recovery_start_time", 0.0),
                outstanding={p.packet_number for p in packets if p.in_flight},
            )
            if event.outstanding and not persistent_congestion:
                self._lost_events[key] = event
                for packet_number in event.outstanding:
                    self._event_of[packet_number] = key
                while len(self._lost_events) > _EVENTS_KEPT:
                    _, old = self._lost_events.popitem(last=False)
                    for packet_number in old.outstanding:
                        self._event_of.pop(packet_number, None)
        super()._on_packets_lost(
            congestion_event=congestion_event,
            now=now,
            packets=packets,
            persistent_congestion=persistent_congestion,
            space=space,
        )
