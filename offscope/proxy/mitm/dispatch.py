"""Event dispatch for the embedded proxy: each event goes only to the addons that handle it.

mitmproxy's AddonManager delivers every event by walking the whole addon chain: for
each addon a generator, a `getattr` per sub-addon, a `contextlib` guard and the
event's arguments rebuilt, whether the addon handles the event or not. Every flow
event is then sent a second time as `update` (for mitmproxy's UIs; no sidecar addon
handles it). On a small JSON request that walk is a large share of the proxy's CPU
(bench/proxy_overhead.py).

`ListenerDispatch` keeps mitmproxy's semantics (chain order, one error guard per
chain addon, `AddonHalt` ends the chain, sync and async handlers) and learns once per
event name which handlers exist, forgetting it whenever an addon is added or removed.
It assumes what mitmproxy's own addons do: an addon's handler methods do not come and
go at run time. Only `offscope proxy` and embedders of `running_proxy` use it; the
addon loaded into a stock mitmdump (`-s`) runs under mitmproxy's own manager.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from mitmproxy import exceptions, hooks
from mitmproxy.addonmanager import AddonManager, safecall
from mitmproxy.master import Master

Listeners = list[tuple[Any, list[Callable[..., Any]]]]


class ListenerDispatch(AddonManager):
    """mitmproxy's AddonManager, dispatching each event to its handlers only."""

    def __init__(self, master: Master) -> None:
        super().__init__(master)
        self._listeners: dict[str, Listeners] = {}

    def register(self, addon: Any) -> Any:
        self._listeners.clear()
        return super().register(addon)

    def add(self, *addons: Any) -> None:
        super().add(*addons)
        self._listeners.clear()  # `add` appends to the chain after registering

    def remove(self, addon: Any) -> None:
        self._listeners.clear()
        super().remove(addon)

    def listeners(self, event: hooks.Hook) -> Listeners:
        """(chain addon, its handlers of this event, sub-addons included), in chain order."""
        found = self._listeners.get(event.name)
        if found is None:
            found = [
                (addon, funcs)
                for addon in self.chain
                if (funcs := [func for _, func in self._iter_hooks(addon, event)])
            ]
            self._listeners[event.name] = found
        return found

    async def trigger_event(self, event: hooks.Hook) -> None:
        listeners = self.listeners(event)
        if not listeners:
            return
        args = event.args()
        for _addon, funcs in listeners:
            try:
                for func in funcs:
                    result = func(*args)
                    if result is not None and inspect.isawaitable(result):
                        await result
            except exceptions.AddonHalt:
                return
            except Exception:
                # mitmproxy's guard decides: options errors propagate, any other error
                # is logged as "Addon error" and the next addon still gets the event.
                with safecall():
                    raise


def use_listener_dispatch(master: Master) -> None:
    """Give a new `master` (no addons yet) a ListenerDispatch in place of its manager."""
    if len(master.addons):
        raise RuntimeError("replace the addon manager before adding addons")
    master.options.changed.disconnect(master.addons._configure_all)
    master.addons = ListenerDispatch(master)
