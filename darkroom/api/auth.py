"""Bearer-key authentication: every /v1 route acts for the owner of the key it was sent."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from darkroom.api.limits import RateLimiter, client_bucket
from darkroom.api.problems import Problem
from darkroom.keys import KEY_PREFIX, Principal, find_key, hash_key

# auto_error=False: a missing key must be our own 401 problem, not FastAPI's 403 text.
bearer = HTTPBearer(auto_error=False, description="An API key from `darkroom keys create`.")

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="darkroom"'}
_MAX_KEY_LENGTH = 200
# All addresses together may spend this many times one address's unknown-key budget
# before every further lookup of an unknown key goes through the single lane.
_TOTAL_BUDGETS = 10
# A request waits this long at most for its turn in the single lane.
_LANE_WAIT_SECONDS = 5.0
# A miss in the single lane keeps it this long, so such misses cost the database at most
# a hundred lookups a second per process, whoever sends them.
_LANE_MISS_SECONDS = 0.01


class KeyCache:
    """Keys this process found valid in the last `ttl` seconds, so that a client's every
    request does not look its key up again (a third of a confirm's database work).

    Only valid keys are kept, by hash, at most `size` of them (the oldest go first): a
    key revoked in the database stops working in every API process within `ttl`, and
    an unknown key is always looked up. `ttl` 0 turns the cache off.

    Apart from that, and for as long as there is room, the hashes of keys once found
    valid are remembered with no time limit (`known`): such a key is still looked up
    once its `ttl` has passed, but never counted against the unknown-key budget of the
    address it comes from, so nobody's guessing can lock its owner out.
    """

    def __init__(self, ttl: float, size: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.size = size
        self._clock = clock
        self._found: OrderedDict[str, tuple[float, Principal]] = OrderedDict()
        self._known: OrderedDict[str, None] = OrderedDict()

    def get(self, key_hash: str) -> Principal | None:
        entry = self._found.get(key_hash)
        if entry is None:
            return None
        if self._clock() >= entry[0]:
            del self._found[key_hash]
            return None
        return entry[1]

    def known(self, key_hash: str) -> bool:
        return key_hash in self._known

    def forget(self, key_hash: str) -> None:
        """The key was looked up and is no longer valid (revoked)."""
        self._known.pop(key_hash, None)
        self._found.pop(key_hash, None)

    def put(self, key_hash: str, who: Principal) -> None:
        self._known[key_hash] = None
        self._known.move_to_end(key_hash)
        while len(self._known) > self.size:
            self._known.popitem(last=False)
        if self.ttl <= 0:
            return
        self._found[key_hash] = (self._clock() + self.ttl, who)
        self._found.move_to_end(key_hash)
        while len(self._found) > self.size:
            self._found.popitem(last=False)


class _Address:
    """One address's requests waiting for the lane: they go in one at a time."""

    def __init__(self) -> None:
        self.turn = asyncio.Lock()
        self.users = 0


class UnknownKeys:
    """Bounds what keys this process has never found valid cost the database.

    Each client address may have `rate_per_minute` lookups that find no key, and all
    addresses together `_TOTAL_BUDGETS` times that. Past either, a lookup is not refused
    but made in a single lane, one at a time and each miss holding it a little: the
    database does a bounded number of such lookups whoever sends them, and a valid key
    sent from an address that someone else is guessing from is still served.

    The lane is not first come, first served: the address with the most of its own
    budget left goes first, and each address has one request at most waiting for it or
    in it (the others wait behind it, within the same time limit). Misses in the lane are
    charged to the address too. However many connections strangers hold on however many
    addresses they have guessed from, a valid key this process has not seen yet (a new
    user's, or everyone's after a restart), sent from an address that has not been
    guessing, is next in the lane.
    """

    def __init__(self, rate_per_minute: float) -> None:
        self.per_address = RateLimiter(rate_per_minute)
        self.total = RateLimiter(rate_per_minute * _TOTAL_BUDGETS)
        self._busy = False
        self._waiting: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._addresses: dict[str, _Address] = {}

    def within_budget(self, address: str) -> bool:
        return not (self.per_address.retry_after(address) or self.total.retry_after("*"))

    def missed(self, address: str) -> None:
        self.per_address.spend(address)
        self.total.spend("*")

    async def in_lane(self, address: str,
                      lookup: Callable[[], Awaitable[Principal | None]]) -> Principal | None:
        """`lookup` in the single lane; TimeoutError when its turn does not come soon."""
        deadline = asyncio.get_running_loop().time() + _LANE_WAIT_SECONDS
        mine = self._addresses.setdefault(address, _Address())
        mine.users += 1
        try:
            async with asyncio.timeout_at(deadline):
                await mine.turn.acquire()  # behind this address's earlier requests
            try:
                await self._enter(-self.per_address.tokens(address), deadline)
                try:
                    found = await lookup()
                    if found is None:
                        self.per_address.spend(address)
                        await asyncio.sleep(_LANE_MISS_SECONDS)
                    return found
                finally:
                    self._leave()
            finally:
                mine.turn.release()
        finally:
            mine.users -= 1
            if not mine.users:
                del self._addresses[address]

    async def _enter(self, rank: float, deadline: float) -> None:
        if not self._busy:
            self._busy = True
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (rank, next(self._order), turn))
        try:
            async with asyncio.timeout_at(deadline):
                await turn
        except BaseException:
            if turn.done() and not turn.cancelled():
                self._leave()  # given the lane just as the wait ended: pass it on
            else:
                turn.cancel()
            raise

    def _leave(self) -> None:
        while self._waiting:
            turn = heapq.heappop(self._waiting)[2]
            if not turn.done():
                turn.set_result(None)
                return
        self._busy = False


def _too_many(wait: int) -> Problem:
    return Problem(429, "too_many_requests",
                   "Too many requests with unknown keys; try again later.",
                   headers={"Retry-After": str(max(1, wait))})


async def principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    if credentials is None:
        raise Problem(401, "unauthorized", "An API key is required.", headers=_CHALLENGE)
    key = credentials.credentials.strip()
    # A string that cannot be one of our keys is not worth a database round trip.
    if not key.startswith(KEY_PREFIX) or len(key) > _MAX_KEY_LENGTH:
        raise Problem(401, "unauthorized", "The API key is not valid.", headers=_CHALLENGE)
    cache: KeyCache = request.app.state.key_cache
    key_hash = hash_key(key)
    request.state.key_hash = key_hash  # per-key limits name the key by its hash
    found = cache.get(key_hash)
    if found is not None:
        return found
    db = request.app.state.db
    if cache.known(key_hash):
        # Found valid here before: looked up again, never charged nor refused.
        found = await find_key(db, key)
    else:
        # A key this process does not know costs a database lookup. Only a miss is
        # charged: a client with a valid key may open many connections at once, and
        # each looks its key up once. (Guesses in flight together are all looked up: at
        # most the per-client connection limit.)
        gate: UnknownKeys = request.app.state.unknown_keys
        address = client_bucket(request.client.host) if request.client else "?"
        if gate.within_budget(address):
            found = await find_key(db, key)
            if found is None:
                gate.missed(address)
        else:
            try:
                found = await gate.in_lane(address, lambda: find_key(db, key))
            except TimeoutError:
                raise _too_many(gate.per_address.retry_after(address)) from None
            if found is None:
                raise _too_many(gate.per_address.retry_after(address))
    if found is None:
        cache.forget(key_hash)
        raise Problem(401, "unauthorized", "The API key is not valid.", headers=_CHALLENGE)
    cache.put(key_hash, found)
    return found


async def admin(who: Annotated[Principal, Depends(principal)]) -> Principal:
    if not who.admin:
        raise Problem(403, "forbidden", "This needs an admin key.")
    return who


Caller = Annotated[Principal, Depends(principal)]
Admin = Annotated[Principal, Depends(admin)]
