"""Entry script for a stock mitmproxy: `mitmdump -s <this file> --set offscope_ledger=...`.

Adds the offscope options (offscope_ledger, offscope_policy, offscope_trace,
offscope_metrics, ...). Set `connection_strategy=lazy` so blocked or synthetic
targets need no upstream connection.
"""

from offscope import logs
from offscope.proxy.mitm.addon import OffscopeAddon
from offscope.proxy.mitm.drain import Drain

logs.configure()
_offscope = OffscopeAddon()
# Drain first: on stop, in-flight flows are recorded before the sinks close.
addons = [Drain(_offscope), _offscope]
