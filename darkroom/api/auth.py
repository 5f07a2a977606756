"""Bearer-key authentication: every /v1 route acts for the owner of the key it was sent."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from darkroom.api.limits import RateLimiter
from darkroom.api.problems import Problem
from darkroom.keys import KEY_PREFIX, Principal, find_key, hash_key

# auto_error=False: a missing key must be our own 401 problem, not FastAPI's 403 text.
bearer = HTTPBearer(auto_error=False, description="An API key from `darkroom keys create`.")

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="darkroom"'}
_MAX_KEY_LENGTH = 200


class KeyCache:
    """Keys this process found valid in the last `ttl` seconds, so that a client's every
    request does not look its key up again (a third of a confirm's database work).

    Only valid keys are kept, by hash, at most `size` of them (the oldest go first): a
    key revoked in the database stops working in every API process within `ttl`, and
    an unknown key is always looked up. `ttl` 0 turns the cache off.
    """

    def __init__(self, ttl: float, size: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.size = size
        self._clock = clock
        self._found: OrderedDict[str, tuple[float, Principal]] = OrderedDict()

    def get(self, key_hash: str) -> Principal | None:
        entry = self._found.get(key_hash)
        if entry is None:
            return None
        if self._clock() >= entry[0]:
            del self._found[key_hash]
            return None
        return entry[1]

    def put(self, key_hash: str, who: Principal) -> None:
        if self.ttl <= 0:
            return
        self._found[key_hash] = (self._clock() + self.ttl, who)
        self._found.move_to_end(key_hash)
        while len(self._found) > self.size:
            self._found.popitem(last=False)


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
    if found is None:
        # A key this process does not know costs a database lookup. Each client address
        # may send `unknown_key_rate_per_minute` keys that turn out not to exist; past
        # that it is answered without a lookup, so guessing keys costs the database a
        # bounded number of lookups per address. Only a miss is charged: a client with a
        # valid key may open many connections at once, and each looks its key up once.
        # (Guesses in flight together are all looked up: at most the connection limit.)
        limiter: RateLimiter = request.app.state.unknown_keys
        address = request.client.host if request.client else "?"
        wait = limiter.retry_after(address)
        if wait:
            raise Problem(429, "too_many_requests",
                          "Too many requests with unknown keys; try again later.",
                          headers={"Retry-After": str(wait)})
        found = await find_key(request.app.state.db, key)
        if found is None:
            limiter.spend(address)
            raise Problem(401, "unauthorized", "The API key is not valid.", headers=_CHALLENGE)
        cache.put(key_hash, found)
    return found


async def admin(who: Annotated[Principal, Depends(principal)]) -> Principal:
    if not who.admin:
        raise Problem(403, "forbidden", "This needs an admin key.")
    return who


Caller = Annotated[Principal, Depends(principal)]
Admin = Annotated[Principal, Depends(admin)]
