"""The mitmproxy adapter: the only part of offscope that imports mitmproxy.

`addon.py` turns mitmproxy's flow hooks into engine calls (transport-neutral, in
offscope/proxy/engine.py and its handlers), `server.py` runs a mitmproxy Master
with it (`offscope proxy`), `drain.py` stops it gracefully, `ca.py` makes the CA,
and `mitmdump_addon.py` is the script a stock `mitmdump -s` loads.
"""
