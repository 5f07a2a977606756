"""Bearer-key authentication: every /v1 route acts for the owner of the key it was sent."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from darkroom.api.problems import Problem
from darkroom.keys import KEY_PREFIX, Principal, find_key

# auto_error=False: a missing key must be our own 401 problem, not FastAPI's 403 text.
bearer = HTTPBearer(auto_error=False, description="An API key from `darkroom keys create`.")

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="darkroom"'}
_MAX_KEY_LENGTH = 200


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
    found = await find_key(request.app.state.pool, key)
    if found is None:
        raise Problem(401, "unauthorized", "The API key is not valid.", headers=_CHALLENGE)
    return found


async def admin(who: Annotated[Principal, Depends(principal)]) -> Principal:
    if not who.admin:
        raise Problem(403, "forbidden", "This needs an admin key.")
    return who


Caller = Annotated[Principal, Depends(principal)]
Admin = Annotated[Principal, Depends(admin)]
