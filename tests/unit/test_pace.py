"""A source's pace (pffs.pace) in a real trio run: halving once per cooldown and growing back,
and the one rule that shares its places (readahead first, preload and warmup within their
share), with cancellation giving every place back. The requests are trio tasks holding places:
what runs inside a place does not matter to the pace."""

from __future__ import annotations

import trio
import trio.testing

from pffs.pace import COOLDOWN, USES, Pace, Use


def test_pace_halves_once_per_cooldown_and_grows_back_slowly() -> None:
    async def main() -> None:
        pace = Pace(16)
        for _ in range(5):  # five push backs from the requests in flight: one halving
            pace.pushed_back()
        pace.settle()
        assert pace.current == 8
        pace.pushed_back()
        pace.settle()
        assert pace.current == 8  # within the cooldown: the same crowding
        assert (pace.pushbacks, pace.halvings) == (2, 1)
        for _ in range(8):  # one window of requests that went well: one place more
            pace.went_well()
        assert pace.current == 9
        await trio.sleep(COOLDOWN)
        pace.pushed_back()
        pace.settle()
        assert pace.current == 4

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


class Requests:
    """Tasks holding places of a pace until told to leave; records who got one, in order."""

    def __init__(self, pace: Pace, nursery: trio.Nursery) -> None:
        self.pace = pace
        self.nursery = nursery
        self.served: list[str] = []
        self.leave: dict[str, trio.Event] = {}

    def start(self, name: str, use: Use) -> None:
        self.leave[name] = trio.Event()
        self.nursery.start_soon(self._hold, name, use)

    async def fill(self) -> None:
        """Readahead requests r0, r1, ... in every place, once they all hold one."""
        for number in range(self.pace.current):
            self.start(f"r{number}", "readahead")
        await trio.testing.wait_all_tasks_blocked()

    async def _hold(self, name: str, use: Use) -> None:
        async with self.pace.place(use):
            self.served.append(name)
            await self.leave[name].wait()


def test_a_freed_place_goes_to_readahead_then_preload_then_warmup() -> None:
    async def main() -> None:
        pace = Pace(4)
        async with trio.open_nursery() as nursery:
            requests = Requests(pace, nursery)
            await requests.fill()
            # Arriving in the reverse of their urgency, two of each use wait.
            for use in reversed(USES):
                for number in range(2):
                    requests.start(f"{use}{number}", use)
                    await trio.testing.wait_all_tasks_blocked()
            assert pace.gauges()["warmup_waiting"] == 2
            for number in range(4):
                requests.leave[f"r{number}"].set()
                await trio.testing.wait_all_tasks_blocked()
            # Readahead first; preload and warmup then hold at most 3 of the 4 places.
            assert requests.served[4:] == ["readahead0", "readahead1", "preload0", "preload1"]
            for name in ("readahead0", "readahead1"):
                requests.leave[name].set()
            await trio.testing.wait_all_tasks_blocked()
            assert requests.served[8:] == ["warmup0"]  # the background share: 3 of 4
            assert pace.in_flight == {"readahead": 0, "preload": 2, "warmup": 1}
            # A readahead request still finds the place the share leaves.
            requests.start("late", "readahead")
            await trio.testing.wait_all_tasks_blocked()
            assert requests.served[-1] == "late"
            for event in requests.leave.values():
                event.set()
        assert pace.in_flight == dict.fromkeys(USES, 0)

    trio.run(main)


def test_a_halving_holds_new_requests_until_enough_places_are_given_back() -> None:
    async def main() -> None:
        pace = Pace(8)
        async with trio.open_nursery() as nursery:
            requests = Requests(pace, nursery)
            await requests.fill()
            pace.pushed_back()
            pace.settle()
            assert pace.current == 4
            requests.start("new", "readahead")
            for number in range(4):  # 8 in flight on 4 places: the fifth to leave makes room
                requests.leave[f"r{number}"].set()
                await trio.testing.wait_all_tasks_blocked()
                assert "new" not in requests.served
            requests.leave["r4"].set()
            await trio.testing.wait_all_tasks_blocked()
            assert requests.served[-1] == "new"
            for event in requests.leave.values():
                event.set()

    trio.run(main)


def test_cancelled_waiters_give_every_place_back() -> None:
    async def main() -> None:
        pace = Pace(1)
        async with trio.open_nursery() as nursery:
            requests = Requests(pace, nursery)
            requests.start("holder", "preload")
            await trio.testing.wait_all_tasks_blocked()
            with trio.move_on_after(1) as waited:  # a waiter cancelled while it waits
                async with pace.place("preload"):
                    raise AssertionError("no place was free")
            assert waited.cancelled_caught
            assert pace.gauges()["preload_waiting"] == 0
            # Another waiter cancelled in the same moment its place frees.
            scope = trio.CancelScope()

            async def cancelled_waiter() -> None:
                with scope:
                    async with pace.place("readahead"):
                        await trio.sleep_forever()

            nursery.start_soon(cancelled_waiter)
            await trio.testing.wait_all_tasks_blocked()
            requests.leave["holder"].set()
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert pace.in_flight == dict.fromkeys(USES, 0)
            requests.start("next", "warmup")
            await trio.testing.wait_all_tasks_blocked()
            assert requests.served[-1] == "next"
            requests.leave["next"].set()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
