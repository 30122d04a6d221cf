"""A peer's stream is new the first time any frame of it arrives, in whatever order streams start."""

from __future__ import annotations

from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

from services.runtime.quic.tunnel import TunnelProtocol


def _tunnel(opened: list[int]) -> TunnelProtocol:
    quic = QuicConnection(configuration=QuicConfiguration(is_client=True))

    def on_peer_stream(tunnel: TunnelProtocol, stream_id: int) -> None:
        opened.append(stream_id)

    return TunnelProtocol(
        quic, peer="p", side="server", send_buffer_high=1 << 20, on_peer_stream=on_peer_stream
    )


async def test_a_stream_whose_first_frame_comes_after_a_later_streams_is_still_opened() -> None:
    opened: list[int] = []
    tunnel = _tunnel(opened)
    # Two sockets accepted together on the client got streams 0 and 4; the second wrote first.
    for stream_id in (4, 0, 12, 8):
        tunnel._new_peer_stream(stream_id)
    assert opened == [4, 0, 12, 8]
    # Frames of streams already seen open nothing again (a late frame after the stream closed here).
    for stream_id in (0, 4, 8, 12):
        assert tunnel._new_peer_stream(stream_id) is None
    assert opened == [4, 0, 12, 8]
    assert tunnel._peer_seen_below == 16 and not tunnel._peer_seen  # nothing kept per stream
