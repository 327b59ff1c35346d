"""The ``sf_trt`` deployment's request router: every turn of a ``user`` to the same replica.

A replica's prefix cache (:mod:`sf_trt.prefix_cache`) holds the conversations it served,
so a conversation's next turn gains only on the replica that served the last one. Ray's
HTTP proxy runs :class:`sf_trt.serve.proxy.UserRoutingKey`, which sets the request's
session id to a hash of its ``user``; :class:`UserAffinityRouter` ranks the replicas for
that key by rendezvous hashing (each replica scores ``sha256(key, replica id)``, the
highest first): every router in the cluster ranks alike with no shared state, and a
replica that goes away moves only the keys it held, each to its second choice. The
first choice takes the request unless it is full (``max_ongoing_requests``); then the
next in rank does (a miss of the cache, never a wait). A request without a key goes to
the less loaded of two replicas drawn at random, as Ray's default router sends it.

Imports Ray: loaded by :mod:`sf_trt.cli.ray_deployment` only.
"""

from __future__ import annotations

import hashlib
import random
from typing import Optional, Sequence

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

__all__ = ["UserAffinityRouter", "rendezvous_order"]


def rendezvous_order(key: str, replica_ids: Sequence[str]) -> list[str]:
    """``replica_ids`` from most to least preferred for ``key`` (highest rendezvous score first)."""
    def score(replica: str) -> bytes:
        return hashlib.sha256(f"{key}\x00{replica}".encode()).digest()

    return sorted(replica_ids, key=score, reverse=True)


class UserAffinityRouter(RequestRouter):
    """Ranks the replicas by :func:`rendezvous_order` of the request's session id (one replica a
    rank, so Ray tries them in that order); without one, two at random.

    Not Ray's ``FIFOMixin``: with it, the replica found for one request goes to the oldest
    request waiting, another user's; without it, to the request it was chosen for."""

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: Optional[PendingRequest] = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        key = pending_request.metadata.session_id if pending_request is not None else ""
        if not key:
            return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        return [[by_id[i]] for i in rendezvous_order(key, list(by_id))]
