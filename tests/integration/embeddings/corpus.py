"""A small corpus with one clearly relevant document per query."""

from __future__ import annotations

DOCUMENTS = {
    "volcano": (
        "Volcanoes form where magma from the Earth's mantle reaches the surface. "
        "An eruption can send ash and lava over the surrounding land.",
        {"topic": "geology", "lang": "en"},
    ),
    "sourdough": (
        "Sourdough bread rises with a starter of wild yeast and lactic acid bacteria. "
        "Bakers feed the starter with flour and water every day.",
        {"topic": "cooking", "lang": "en"},
    ),
    "tcp": (
        "TCP retransmits lost packets and uses a congestion window to avoid overloading the network. "
        "Each connection begins with a three-way handshake.",
        {"topic": "networking", "lang": "en"},
    ),
    "photosynthesis": (
        "Plants turn sunlight, water and carbon dioxide into sugar through photosynthesis. "
        "Chlorophyll in the leaves absorbs the light.",
        {"topic": "biology", "lang": "en"},
    ),
    "chess": (
        "In chess the bishop moves diagonally and the knight jumps in an L shape. "
        "Checkmate ends the game when the king cannot escape.",
        {"topic": "games", "lang": "en"},
    ),
    "marathon": (
        "Marathon runners train for months to cover forty-two kilometres. "
        "Pacing and hydration matter as much as speed.",
        {"topic": "sport", "lang": "en"},
    ),
}

QUERIES = {
    "Why do plants need light to make food?": "photosynthesis",
    "How does a network protocol recover from dropped packets?": "tcp",
    "What happens when molten rock erupts from a mountain?": "volcano",
    "How do I keep my bread starter alive?": "sourdough",
    "Which piece moves in an L shape?": "chess",
    "How should I prepare for a long-distance running race?": "marathon",
}
