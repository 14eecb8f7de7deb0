"""A source's flow of requests (pffs.flow.permits) in a real trio run: its pace halving once per
cooldown and growing back, the one rule that shares loading ahead's permits (readahead first,
preload and warmup within their share), cancellation giving every permit back, and a reader's
permit never waiting behind loading ahead. The requests are trio tasks holding permits: what
runs inside one does not matter to the flow."""

from __future__ import annotations

import trio
import trio.testing

from pffs.flow.permits import (
    AHEAD,
    COOLDOWN,
    Ahead,
    Pace,
    PeerFlow,
    SourceFlow,
    at_once,
    ceiling_for,
)


def test_pace_halves_once_per_cooldown_and_grows_back_slowly() -> None:
    async def main() -> None:
        pace = Pace(16)
        for _ in range(5):  # five requests in flight throttled: one halving
            pace.throttled()
        pace.settle()
        assert pace.current == 8
        pace.throttled()
        pace.settle()
        assert pace.current == 8  # within the cooldown: the same crowding
        assert (pace.throttles, pace.halvings) == (2, 1)
        for _ in range(8):  # one window of requests that went well: one permit more
            pace.went_well()
        assert pace.current == 9
        await trio.sleep(COOLDOWN)
        pace.throttled()
        pace.settle()
        assert pace.current == 4

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


class Requests:
    """Tasks holding permits of a pace until told to leave; records who got one, in order."""

    def __init__(self, pace: Pace, nursery: trio.Nursery) -> None:
        self.pace = pace
        self.nursery = nursery
        self.served: list[str] = []
        self.leave: dict[str, trio.Event] = {}

    def start(self, name: str, priority: Ahead) -> None:
        self.leave[name] = trio.Event()
        self.nursery.start_soon(self._hold, name, priority)

    async def fill(self) -> None:
        """Readahead requests r0, r1, ... in every permit, once they all hold one."""
        for number in range(self.pace.current):
            self.start(f"r{number}", "readahead")
        await trio.testing.wait_all_tasks_blocked()

    async def _hold(self, name: str, priority: Ahead) -> None:
        async with self.pace.permit(priority):
            self.served.append(name)
            await self.leave[name].wait()


def test_a_freed_permit_goes_to_readahead_then_preload_then_warmup() -> None:
    async def main() -> None:
        pace = Pace(4)
        async with trio.open_nursery() as nursery:
            requests = Requests(pace, nursery)
            await requests.fill()
            # Arriving in the reverse of their urgency, two of each priority wait.
            for priority in reversed(AHEAD):
                for number in range(2):
                    requests.start(f"{priority}{number}", priority)
                    await trio.testing.wait_all_tasks_blocked()
            assert pace.gauges()["warmup_waiting"] == 2
            for number in range(4):
                requests.leave[f"r{number}"].set()
                await trio.testing.wait_all_tasks_blocked()
            # Readahead first; preload and warmup then hold at most 3 of the 4 permits.
            assert requests.served[4:] == ["readahead0", "readahead1", "preload0", "preload1"]
            for name in ("readahead0", "readahead1"):
                requests.leave[name].set()
            await trio.testing.wait_all_tasks_blocked()
            assert requests.served[8:] == ["warmup0"]  # the background share: 3 of 4
            assert pace.in_flight == {"readahead": 0, "preload": 2, "warmup": 1}
            # A readahead request still finds the permit the share leaves.
            requests.start("late", "readahead")
            await trio.testing.wait_all_tasks_blocked()
            assert requests.served[-1] == "late"
            for event in requests.leave.values():
                event.set()
        assert pace.in_flight == dict.fromkeys(AHEAD, 0)

    trio.run(main)


def test_a_halving_holds_new_requests_until_enough_permits_are_given_back() -> None:
    async def main() -> None:
        pace = Pace(8)
        async with trio.open_nursery() as nursery:
            requests = Requests(pace, nursery)
            await requests.fill()
            pace.throttled()
            pace.settle()
            assert pace.current == 4
            requests.start("new", "readahead")
            for number in range(4):  # 8 in flight on 4 permits: the fifth to leave makes room
                requests.leave[f"r{number}"].set()
                await trio.testing.wait_all_tasks_blocked()
                assert "new" not in requests.served
            requests.leave["r4"].set()
            await trio.testing.wait_all_tasks_blocked()
            assert requests.served[-1] == "new"
            for event in requests.leave.values():
                event.set()

    trio.run(main)


def test_cancelled_waiters_give_every_permit_back() -> None:
    async def main() -> None:
        pace = Pace(1)
        async with trio.open_nursery() as nursery:
            requests = Requests(pace, nursery)
            requests.start("holder", "preload")
            await trio.testing.wait_all_tasks_blocked()
            with trio.move_on_after(1) as waited:  # a waiter cancelled while it waits
                async with pace.permit("preload"):
                    raise AssertionError("no permit was free")
            assert waited.cancelled_caught
            assert pace.gauges()["preload_waiting"] == 0
            # Another waiter cancelled in the same moment its permit frees.
            scope = trio.CancelScope()

            async def cancelled_waiter() -> None:
                with scope:
                    async with pace.permit("readahead"):
                        await trio.sleep_forever()

            nursery.start_soon(cancelled_waiter)
            await trio.testing.wait_all_tasks_blocked()
            requests.leave["holder"].set()
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert pace.in_flight == dict.fromkeys(AHEAD, 0)
            requests.start("next", "warmup")
            await trio.testing.wait_all_tasks_blocked()
            assert requests.served[-1] == "next"
            requests.leave["next"].set()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_readers_permit_never_waits_behind_loading_ahead() -> None:
    async def main() -> None:
        flow = SourceFlow(2)
        assert flow.pace.ceiling == ceiling_for(2)
        async with trio.open_nursery() as nursery:
            requests = Requests(flow.pace, nursery)
            await requests.fill()  # every permit of loading ahead held
            flow.throttled()
            flow.went_well()  # settles: loading ahead's permits halve, the readers' do not
            assert flow.pace.current == ceiling_for(2) // 2
            readers: list[int] = []

            async def read(number: int) -> None:
                async with flow.permit("reader"):
                    readers.append(number)
                    await trio.sleep_forever()

            with trio.move_on_after(1):  # both readers' permits at once, loading ahead held
                async with trio.open_nursery() as readers_nursery:
                    for number in range(3):
                        readers_nursery.start_soon(read, number)
            assert len(readers) == 2  # the third waits on the readers' cap only
            for event in requests.leave.values():
                event.set()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_files_at_once_are_the_permits_the_flows_give_now() -> None:
    async def main() -> None:
        flows = [SourceFlow(4), SourceFlow(2)]  # 16 and 8 permits: 12 and 6 for preload
        assert at_once(flows, "preload", 64) == 18
        assert at_once(flows, "readahead", 64) == 24
        assert at_once(flows, "preload", 10) == 10
        flows[0].throttled()
        flows[0].went_well()
        assert at_once(flows, "preload", 64) == 6 + 6  # the first halved: 8 permits, 6 preload's

    trio.run(main)


def test_a_readers_ask_of_a_peer_never_waits_behind_loading_ahead() -> None:
    """A cache group's `PeerFlow`: with every permit of loading ahead held, another load
    ahead waits, and a reader's ask (or the owner's side's) gets a permit at once."""

    async def main() -> None:
        flow = PeerFlow(most=2)
        async with trio.open_nursery() as nursery:
            requests = Requests(flow.pace, nursery)
            await requests.fill()
            requests.start("late", "readahead")
            await trio.testing.wait_all_tasks_blocked()
            assert sorted(requests.served) == ["r0", "r1"]  # the late load ahead waits
            with trio.fail_after(1):
                async with flow.permit("reader"):
                    pass
            requests.leave["r0"].set()
            await trio.testing.wait_all_tasks_blocked()
            assert requests.served[2:] == ["late"]
            for event in requests.leave.values():
                event.set()

    trio.run(main)
