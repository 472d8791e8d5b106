"""The mitmproxy adapter: the only part of offscope that imports mitmproxy.

`addon.py` turns mitmproxy's flow hooks into engine calls (transport-neutral, in
offscope/proxy/engine.py and its handlers), `server.py` runs a mitmproxy Master
with it (`offscope proxy`), `drain.py` stops it gracefully, `ca.py` makes the CA,
and `mitmdump_addon.py` is the script a stock `mitmdump -s` loads.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys


def _bare_addons_package() -> None:
    """Import `mitmproxy.addons` without running its `__init__`, which imports all ~35
    of mitmproxy's addons (Flask for onboarding, ldap3 and passlib for proxy auth, the
    flow filter grammar...): about 0.14 s of CPU at every `offscope proxy` start, and
    the sidecar loads 7 of them (server.py, `sidecar_addons`). Submodules import as
    usual; the first access to anything else the package defines (`default_addons`,
    as mitmdump uses it) runs the real `__init__` then, so nothing is lost. A no-op when
    the package is already imported (in mitmdump, before it loads offscope's script)."""
    name = "mitmproxy.addons"
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return
    package = importlib.util.module_from_spec(spec)
    loader = spec.loader
    locations = list(spec.submodule_search_locations)

    def __getattr__(attr: str) -> object:
        # A submodule not imported yet (`from mitmproxy.addons import core` asks first),
        # or a dunder: not here, so the import system imports the submodule.
        if attr.startswith("__") or importlib.machinery.PathFinder.find_spec(
            f"{name}.{attr}", locations
        ):
            raise AttributeError(attr)
        del package.__dict__["__getattr__"]
        loader.exec_module(package)  # the real __init__: every addon, default_addons
        return getattr(package, attr)

    vars(package)["__getattr__"] = __getattr__  # PEP 562: asked for what the module lacks
    sys.modules[name] = package
    parent = sys.modules.get("mitmproxy")
    if parent is not None:
        vars(parent)["addons"] = package  # as the import system sets a submodule


_bare_addons_package()
