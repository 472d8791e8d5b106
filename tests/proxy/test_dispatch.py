"""The embedded proxy's event dispatch delivers events as mitmproxy's own manager does
(order, sub-addons, async handlers, errors, AddonHalt), only to the addons that handle
them (offscope/proxy/mitm/dispatch.py). No sockets: a Master and hooks, in one loop."""

from __future__ import annotations

import asyncio
import logging

import pytest
from mitmproxy import exceptions, hooks, options
from mitmproxy.master import Master
from mitmproxy.proxy.layers.http import HttpRequestHook
from mitmproxy.test import tflow

from offscope.proxy.mitm.dispatch import ListenerDispatch, use_listener_dispatch


class Recorder:
    def __init__(self, name: str, seen: list[str]) -> None:
        self.name, self.seen = name, seen

    def request(self, flow) -> None:
        self.seen.append(f"{self.name}:request")


class AsyncRecorder(Recorder):
    async def request(self, flow) -> None:  # type: ignore[override]  # mitmproxy takes both
        await asyncio.sleep(0)
        self.seen.append(f"{self.name}:request-async")


class Failing(Recorder):
    def request(self, flow) -> None:
        self.seen.append(f"{self.name}:request")
        raise ValueError("boom")


class Halting(Recorder):
    def request(self, flow) -> None:
        self.seen.append(f"{self.name}:halt")
        raise exceptions.AddonHalt()


class Parent(Recorder):
    """An addon with sub-addons (mitmproxy walks `addons` after the parent)."""

    def __init__(self, name: str, seen: list[str]) -> None:
        super().__init__(name, seen)
        self.addons = [Recorder(f"{name}.child", seen)]


class Silent:
    """Handles no flow event: never called, and not walked per event."""

    def __init__(self, name: str) -> None:
        self.name = name


def in_master(dispatch: bool, body) -> None:
    """Run `body(master)` in a new loop with a new Master (with our dispatch or mitmproxy's)."""

    async def main() -> None:
        master = Master(options.Options(), with_termlog=False)
        try:
            if dispatch:
                use_listener_dispatch(master)
            await body(master)
        finally:  # its log handler would outlive the loop (Master.done removes it)
            master._legacy_log_events.uninstall()

    asyncio.run(main())


def deliver(dispatch: bool, make_addons) -> tuple[list[str], list[str]]:
    """Run one `request` event through a Master with the given manager; what was called,
    and the error lines logged."""
    seen: list[str] = []
    records: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    async def body(master: Master) -> None:
        master.addons.add(*make_addons(seen))
        await master.addons.handle_lifecycle(HttpRequestHook(tflow.tflow()))

    handler = Capture(level=logging.ERROR)
    logging.getLogger("mitmproxy.addonmanager").addHandler(handler)
    try:
        in_master(dispatch, body)
    finally:
        logging.getLogger("mitmproxy.addonmanager").removeHandler(handler)
    return seen, records


CHAINS = {
    "order, async and sub-addons": lambda seen: [
        Silent("quiet"),
        Recorder("a", seen),
        AsyncRecorder("b", seen),
        Parent("p", seen),
    ],
    "an error is logged and the next addon still runs": lambda seen: [
        Failing("f", seen),
        Recorder("after", seen),
    ],
    "AddonHalt ends the chain": lambda seen: [
        Recorder("first", seen),
        Halting("h", seen),
        Recorder("never", seen),
    ],
}


@pytest.mark.parametrize("chain", CHAINS, ids=list(CHAINS))
def test_delivers_as_mitmproxy_does(chain):
    stock, stock_errors = deliver(False, CHAINS[chain])
    ours, our_errors = deliver(True, CHAINS[chain])
    assert ours == stock and our_errors == stock_errors
    assert ours  # the chains above all call someone


def test_the_cases_differ():
    """The three chains exercise what they name (so the equality above means something)."""
    assert deliver(True, CHAINS["order, async and sub-addons"])[0] == [
        "a:request",
        "b:request-async",
        "p:request",
        "p.child:request",
    ]
    seen, errors = deliver(True, CHAINS["an error is logged and the next addon still runs"])
    assert seen == ["f:request", "after:request"] and any("boom" in e for e in errors)
    assert deliver(True, CHAINS["AddonHalt ends the chain"])[0] == ["first:request", "h:halt"]


def test_only_handlers_are_listed_and_a_new_addon_is_seen():
    async def body(master: Master) -> None:
        assert isinstance(master.addons, ListenerDispatch)
        seen: list[str] = []
        master.addons.add(Silent("quiet"), Recorder("a", seen))
        event = HttpRequestHook(tflow.tflow())
        assert [type(a).__name__ for a, _ in master.addons.listeners(event)] == ["Recorder"]
        assert master.addons.listeners(hooks.UpdateHook([])) == []
        master.addons.add(AsyncRecorder("late", seen))  # the learned listeners are forgotten
        await master.addons.trigger_event(event)
        assert seen == ["a:request", "late:request-async"]
        master.addons.remove(master.addons.get("a"))
        await master.addons.trigger_event(event)
        assert seen[2:] == ["late:request-async"]

    in_master(True, body)


def test_options_reach_the_new_manager_once():
    """The replaced manager no longer hears option changes; the new one does."""

    class Configured:
        def __init__(self) -> None:
            self.updates: list[set[str]] = []

        def configure(self, updated: set[str]) -> None:
            self.updates.append(set(updated))

    async def body(master: Master) -> None:
        addon = Configured()
        master.addons.add(addon)
        master.options.update(listen_port=9999)
        assert addon.updates == [{"listen_port"}]

    in_master(True, body)


def test_refuses_a_manager_with_addons():
    async def body(master: Master) -> None:
        master.addons.add(Silent("quiet"))
        with pytest.raises(RuntimeError, match="before adding addons"):
            use_listener_dispatch(master)

    in_master(False, body)
