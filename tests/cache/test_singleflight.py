"""The single-flight table on its own: one flight per block, and how a flight ends."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from pffs.cache.keys import BlockKey
from pffs.cache.singleflight import Flight, SingleFlight
from pffs.errors import Transient

KEY = BlockKey("s", "u", "p", "v", 0)


async def _wait(flight: Flight, got: list[bytes | None]) -> None:
    got.append(await flight.outcome())


def test_waiters_get_the_bytes_and_where_they_came_from() -> None:
    flights = SingleFlight()
    flight = flights.start(KEY)
    assert KEY in flights and flights.get(KEY) is flight and not flight.ahead
    got: list[bytes | None] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(_wait, flight, got)
            await trio.testing.wait_all_tasks_blocked()  # all three wait on the flight
            flights.land(KEY, flight, b"data", "disk")

    trio.run(main)
    assert got == [b"data"] * 3 and flight.tier == "disk"
    assert KEY not in flights and flights.get(KEY) is None


def test_an_error_reaches_every_waiter() -> None:
    flights = SingleFlight()
    flight = flights.start(KEY, ahead=True)
    assert flight.ahead
    flights.abandon(KEY, flight, Transient("store down"))

    async def main() -> None:
        with pytest.raises(Transient):
            await flight.outcome()

    trio.run(main)
    assert KEY not in flights


def test_an_abandoned_flight_sends_waiters_to_load_the_block_themselves() -> None:
    flights = SingleFlight()
    flight = flights.start(KEY)
    flights.abandon(KEY, flight, None)
    assert trio.run(flight.outcome) is None
    assert KEY not in flights


def test_ending_an_old_flight_leaves_its_successor_in_place() -> None:
    flights = SingleFlight()
    old = flights.start(KEY)
    new = flights.start(KEY)  # the block's next load, registered over the old one
    flights.abandon(KEY, old, None)
    assert flights.get(KEY) is new
    flights.land(KEY, new, b"x", "store")
    assert KEY not in flights
