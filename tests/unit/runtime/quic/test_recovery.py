"""TunnelRecovery: reordering tolerance and spurious-loss undo, driven packet by packet."""

from __future__ import annotations

from aioquic.quic.packet import QuicPacketType
from aioquic.quic.packet_builder import QuicSentPacket
from aioquic.quic.rangeset import RangeSet
from aioquic.quic.recovery import QuicPacketRecovery, QuicPacketSpace
from aioquic.tls import Epoch

from services.runtime.quic.congestion import NAME
from services.runtime.quic.recovery import PEER_ACK_DELAY, TunnelRecovery

MSS = 1200


def _recovery() -> tuple[TunnelRecovery, QuicPacketSpace]:
    recovery = TunnelRecovery.adopt(
        QuicPacketRecovery(
            congestion_control_algorithm=NAME,
            initial_rtt=0.1,
            max_datagram_size=MSS,
            peer_completed_address_validation=True,
            send_probe=lambda: None,
        )
    )
    space = QuicPacketSpace(is_application_data=True)
    recovery.spaces = [QuicPacketSpace(), QuicPacketSpace(), space]
    return recovery, space


def _send(recovery: TunnelRecovery, space: QuicPacketSpace, numbers: range, now: float) -> None:
    for number in numbers:
        packet = QuicSentPacket(
            epoch=Epoch.ONE_RTT,
            in_flight=True,
            is_ack_eliciting=True,
            is_crypto_packet=False,
            packet_number=number,
            packet_type=QuicPacketType.ONE_RTT,
            sent_time=now,
            sent_bytes=MSS,
        )
        recovery.on_packet_sent(packet=packet, space=space)


def _ack(recovery: TunnelRecovery, space: QuicPacketSpace, *ranges: tuple[int, int], now: float) -> None:
    rangeset = RangeSet()
    for start, stop in ranges:
        rangeset.add(start, stop)
    recovery.on_ack_received(ack_rangeset=rangeset, ack_delay=0.0, now=now, space=space)


def test_reordered_packet_is_a_spurious_loss_and_the_window_reduction_is_undone() -> None:
    recovery, space = _recovery()
    _send(recovery, space, range(0, 10), now=1.0)
    window = recovery.congestion_window
    # Packets 1..9 arrive before 0: 0 is declared lost (3 packets overtook it) and the window shrinks.
    _ack(recovery, space, (1, 10), now=1.02)
    assert 0 not in space.sent_packets
    assert recovery.congestion_window < window
    reduced = recovery.congestion_window
    # Then 0 arrives after all: the loss was reordering.
    _ack(recovery, space, (0, 10), now=1.03)
    assert recovery.spurious_losses == 1
    assert recovery.congestion_window > reduced
    assert recovery.reorder_packets == float("inf")
    assert recovery.reorder_time > 9 / 8


def test_real_loss_keeps_the_reduction() -> None:
    recovery, space = _recovery()
    _send(recovery, space, range(0, 10), now=1.0)
    _ack(recovery, space, (1, 10), now=1.02)
    reduced = recovery.congestion_window
    _send(recovery, space, range(10, 12), now=1.03)
    _ack(recovery, space, (1, 12), now=1.05)
    assert recovery.spurious_losses == 0
    assert recovery.congestion_window <= reduced + 2 * MSS
    assert recovery.reorder_packets == 3


def test_after_reordering_only_time_declares_loss() -> None:
    recovery, space = _recovery()
    _send(recovery, space, range(0, 10), now=1.0)
    _ack(recovery, space, (1, 10), now=1.02)
    _ack(recovery, space, (0, 10), now=1.03)
    # Now far more than 3 packets may overtake one without it being declared lost at once.
    _send(recovery, space, range(10, 30), now=2.0)
    _ack(recovery, space, (11, 30), now=2.001)
    assert 10 in space.sent_packets


def test_probe_timeout_counts_the_real_ack_delay_of_the_peer() -> None:
    recovery, space = _recovery()
    _send(recovery, space, range(0, 2), now=1.0)
    _ack(recovery, space, (0, 2), now=1.02)
    recovery.max_ack_delay = 0.025  # what aioquic advertises
    expected = recovery._rtt_smoothed + max(4 * recovery._rtt_variance, 0.001) + PEER_ACK_DELAY
    assert recovery.get_probe_timeout() == expected
    assert recovery.max_ack_delay == 0.025
