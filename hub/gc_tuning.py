"""Keep cyclic garbage collection from stopping the hub for seconds.

With 10,000 devices the hub tracks about 3 million objects; a full (generation 2) collection walks
all of them and stopped every trio task for up to 2.3 s, 21 times while 10,000 devices connected
(bench/memory_profile.py --gc-pauses, bench/RESULTS.md). Most of those objects live as long as their
device's connection. So after each full collection we freeze what survived (``gc.freeze()``): later
collections skip it. The cost: a frozen object that later becomes part of unreachable cycle is not
reclaimed until the next thaw, so every ``thaw_every`` seconds everything is unfrozen and the next full
collection sees it all again (one long pause per period instead of one every few seconds).
"""

from __future__ import annotations

import gc
import logging

import trio

log = logging.getLogger("fleethub.gc")


def _freeze_after_full_collection(phase: str, info: dict) -> None:
    if phase == "stop" and info.get("generation") == 2:
        gc.freeze()


async def run(*, thaw_every: float = 600.0, task_status=trio.TASK_STATUS_IGNORED) -> None:
    gc.collect()
    gc.freeze()  # everything built at start-up (modules, the app, the pool) is never garbage
    gc.callbacks.append(_freeze_after_full_collection)
    task_status.started()
    try:
        while True:
            await trio.sleep(thaw_every)
            log.debug("thawing %d frozen objects", gc.get_freeze_count())
            gc.unfreeze()
    finally:
        gc.callbacks.remove(_freeze_after_full_collection)
        gc.unfreeze()
