"""One build's policy engine, timed in this process: run as a script by ``benchmarks/policy_cpu.py``.

It imports ``policy`` from whichever tree is first on ``PYTHONPATH`` (today's checkout, or an earlier
build unpacked by ``benchmarks/baseline.py``) and uses only what every build since the stream
moderator has: ``parse_ruleset``, ``check_segments`` and ``StreamModerator`` on the default ruleset.
Prints one JSON object: for each measure, the thread CPU µs per item of each round.

What a mesh request costs the policy service, without gRPC and Redis around it:

- ``input_check``: the input check of one new chat question carrying an ID (as `llmesh bench
  mesh`'s questions do; every question is new, so no memo answers it);
- ``answer_1_delta``: a moderated answer of one delta ("No", as every answer of the mesh
  bench's model opens) and its end, the first step's offers included;
- ``answer_1_new_delta``: the same with a first delta no answer had before (a new word each time:
  the cost of an opening the policy has not seen);
- ``answer_48_deltas``: a moderated answer of 48 word-sized deltas and its end.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from policy.engine import Segment, check_segments
from policy.rules import Scope, parse_ruleset
from policy.stream import StreamModerator

ANSWER = (
    "No, I'm sorry, but boots can only be returned within 30 days of purchase. After that, our store "
    "policy does not allow returns. However, you may be able to exchange them for store credit if "
    "they are unworn and in the original box, with the receipt. Please contact customer service or "
    "visit any of our stores, and a member of staff will be happy to help you with it today."
)
DELTAS = re.findall(r"\s*\S+", ANSWER)[:48]
# Hex digits to letters: a new word from a uuid.
_LETTERS = str.maketrans("0123456789", "ghijklmnop")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=200, help="items per round (answers: a quarter)")
    args = parser.parse_args(argv)
    import policy

    ruleset_file = Path(policy.__file__).with_name("rulesets") / "default.yaml"
    ruleset = parse_ruleset(ruleset_file.read_text(encoding="utf-8"), "default").for_tenant("bench")

    days = itertools.count(5)

    def question() -> str:
        return f"[{uuid.uuid4().hex[:8]}] Can I return boots after {next(days) % 90} days?"

    def input_check() -> None:
        check_segments(ruleset, Scope.INPUT, [Segment(question(), 0, role="user")])

    def answer_1_delta() -> None:
        moderator = StreamModerator(ruleset)
        moderator.feed("No")
        moderator.finish()

    def answer_1_new_delta() -> None:
        moderator = StreamModerator(ruleset)
        moderator.feed(uuid.uuid4().hex[:8].translate(_LETTERS))
        moderator.finish()

    def answer_48_deltas() -> None:
        moderator = StreamModerator(ruleset)
        for delta in DELTAS:
            moderator.feed(delta)
        moderator.finish()

    measures: dict[str, tuple[Callable[[], None], int]] = {
        "input_check": (input_check, args.n),
        "answer_1_delta": (answer_1_delta, args.n),
        "answer_1_new_delta": (answer_1_new_delta, args.n),
        "answer_48_deltas": (answer_48_deltas, max(1, args.n // 4)),
    }
    for fn, _ in measures.values():  # warm: imports, the classifier's tables, regex caches
        fn()
    out: dict[str, list[float]] = {name: [] for name in measures}
    for _ in range(args.rounds):
        for name, (fn, n) in measures.items():
            started = time.thread_time_ns()
            for _ in range(n):
                fn()
            out[name].append((time.thread_time_ns() - started) / n / 1000.0)
    json.dump({"policy": str(Path(policy.__file__).parent), "us": out}, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
