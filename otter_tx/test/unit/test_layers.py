"""
The layer rules of docs/architecture.md, checked on the source:

- ``otter_tx/amqp/`` (the wire) imports nothing from Twisted and nothing of
  the broker: only the standard library and its own modules;
- ``otter_tx/stream/`` (the stream protocol's wire) likewise, plus otter_tx.amqp;
- ``otter_tx/broker/`` and ``otter_tx/store/`` never import the global
  reactor (time and threads come from an injected reactor);
- ``otter_tx/cluster/etcd.py`` (the etcd client) imports only the standard library, Twisted, treq and itself;
- the unit tests import without any AMQP client library installed.

Imports are read with :mod:`ast`, so imports inside functions count too.
"""

import ast
import os
import subprocess
import sys

from twisted.trial.unittest import SkipTest, SynchronousTestCase

import otter_tx

PACKAGE = os.path.dirname(os.path.abspath(otter_tx.__file__))

#: the client libraries the interop tests drive; unit tests must not need them
CLIENT_LIBRARIES = ("pika", "aio_pika", "aiormq", "kombu", "amqp", "rabbitpy", "txamqp", "pamqp")


def _modules(sub):
    """Paths of the ``.py`` files under ``otter_tx/<sub>``."""
    top = os.path.join(PACKAGE, sub)
    for dirpath, _, files in os.walk(top):
        for f in sorted(files):
            if f.endswith(".py"):
                yield os.path.join(dirpath, f)


def _imports(path):
    """
    Every import in the file at ``path``, as ``(module, names)`` with the
    absolute module name (``""`` for a relative import's own package is
    resolved against otter_tx's layout) and the imported names (tuple).
    """
    with open(path, "rb") as f:
        tree = ast.parse(f.read(), path)
    rel = os.path.relpath(path, os.path.dirname(PACKAGE))[: -len(".py")].split(os.sep)
    package = rel[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([module] if module else []))
            yield module, tuple(a.name for a in node.names)


def _isStandardLibrary(top):
    """Whether ``top`` (a top-level module name) belongs to the standard library (PyPy 3.9 too)."""
    names = getattr(sys, "stdlib_module_names", None)
    if names is not None:
        return top in names
    if top in sys.builtin_module_names:
        return True
    import importlib.util
    import sysconfig
    spec = importlib.util.find_spec(top)
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    return bool(spec and spec.origin and os.path.realpath(spec.origin).startswith(stdlib + os.sep)
                and "site-packages" not in spec.origin)


class LayerTests(SynchronousTestCase):
    """The dependency direction of the layers."""

    def test_wireImportsNoTwistedNoBroker(self):
        """No module of otter_tx/amqp imports Twisted or any otter_tx module outside otter_tx.amqp."""
        bad = []
        for path in _modules("amqp"):
            for module, _ in _imports(path):
                top = module.split(".")[0]
                if top in ("twisted", "zope", "klein", "treq", "txaio"):
                    bad.append((os.path.basename(path), module))
                elif top == "otter_tx" and not (module + ".").startswith("otter_tx.amqp."):
                    bad.append((os.path.basename(path), module))
        self.assertEqual(bad, [])

    def test_streamWireImportsNoTwistedNoBroker(self):
        """
        No module of otter_tx/stream (the stream protocol's wire) imports Twisted or any
        otter_tx module outside otter_tx.stream and otter_tx.amqp (the field-table types).
        """
        bad = []
        for path in _modules("stream"):
            for module, _ in _imports(path):
                top = module.split(".")[0]
                if top in ("twisted", "zope", "klein", "treq", "txaio"):
                    bad.append((os.path.basename(path), module))
                elif top == "otter_tx" and not (
                    (module + ".").startswith("otter_tx.stream.") or (module + ".").startswith("otter_tx.amqp.")
                ):
                    bad.append((os.path.basename(path), module))
        self.assertEqual(bad, [])

    def test_coreNeverImportsTheGlobalReactor(self):
        """No module of otter_tx/broker or otter_tx/store imports twisted.internet.reactor."""
        bad = []
        for sub in ("broker", "store"):
            for path in _modules(sub):
                for module, names in _imports(path):
                    if module == "twisted.internet.reactor" or (
                        module == "twisted.internet" and "reactor" in names
                    ):
                        bad.append(os.path.relpath(path, PACKAGE))
        self.assertEqual(bad, [])

    def test_roomsImportOnlyDownward(self):
        """
        Each package imports only from the floors below it (docs/architecture.md, "Layer rules"):
        amqp (with stream, the stream protocol's wire, over it), store and resources at the bottom; broker
        over them; the two doors (door, web) and the cluster over the broker; service, which assembles
        everything, on top.  No arrow runs back up.
        """
        below = {
            "amqp": {"amqp"},
            "stream": {"stream", "amqp"},
            "store": {"store"},
            "resources": {"resources"},
            "broker": {"broker", "amqp", "stream", "store", "resources"},
            "door": {"door", "broker", "amqp", "stream", "store", "resources"},
            "web": {"web", "broker", "amqp", "stream", "store", "resources"},
            "cluster": {"cluster", "broker", "amqp", "stream", "store", "resources"},
            "service": {"service", "cluster", "door", "web", "broker", "amqp", "stream", "store", "resources"},
        }
        bad = []
        for room, allowed in sorted(below.items()):
            for path in _modules(room):
                for module, _ in _imports(path):
                    parts = module.split(".")
                    if parts[0] == "otter_tx" and len(parts) > 1 and parts[1] not in allowed | {"__version__"}:
                        if os.path.exists(os.path.join(PACKAGE, parts[1])) or parts[1] == "testing":
                            bad.append((os.path.relpath(path, PACKAGE), module))
        self.assertEqual(bad, [])

    def test_etcdClientImportsOnlyTwistedAndTreq(self):
        """
        The etcd client (otter_tx/cluster/etcd.py and its test fixture etcdtest.py) imports only
        the standard library, Twisted (and zope), treq and itself: it stands alone, usable
        before the broker knows of a cluster.
        """
        bad = []
        for path in _modules("cluster"):
            if os.path.basename(path) not in ("etcd.py", "etcdtest.py"):
                continue
            for module, _ in _imports(path):
                top = module.split(".")[0]
                if top == "otter_tx":
                    if not (module + ".").startswith("otter_tx.cluster."):
                        bad.append((os.path.basename(path), module))
                elif not _isStandardLibrary(top) and top not in ("twisted", "zope", "treq"):
                    bad.append((os.path.basename(path), module))
        self.assertEqual(bad, [])

    def test_rulesSeeAViolation(self):
        """The import reader finds a global reactor import, relative imports resolved."""
        path = os.path.join(self.mktemp() + ".py")
        with open(path, "w") as f:
            f.write("def f():\n    from twisted.internet import reactor\nfrom . import codec\n")
        found = list(_imports(path))
        self.assertIn(("twisted.internet", ("reactor",)), found)
        self.assertEqual(len(found), 2)

    def test_unitTestsNeedNoClientLibrary(self):
        """Every otter_tx.test.unit module imports with the AMQP client libraries made unimportable."""
        unit = os.path.join(PACKAGE, "test", "unit")
        if not os.path.isdir(unit):
            self.fail("otter_tx/test/unit is missing")
        names = sorted(
            "otter_tx.test.unit." + f[: -len(".py")]
            for f in os.listdir(unit) if f.startswith("test_") and f.endswith(".py")
        )
        self.assertTrue(names)
        code = (
            "import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in %r:\n"
            "            raise ImportError('client library ' + name + ' is blocked')\n"
            "sys.meta_path.insert(0, Block())\n"
            "import importlib\n"
            "for n in %r:\n"
            "    importlib.import_module(n)\n"
            "print('ok', len(%r))\n" % (CLIENT_LIBRARIES, names, names)
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
            cwd=os.path.dirname(PACKAGE),
        )
        self.assertEqual((out.returncode, out.stderr[-2000:]), (0, ""))
        self.assertEqual(out.stdout.strip(), "ok %d" % (len(names),))


class ArchitectureDocTests(SynchronousTestCase):
    """docs/architecture.md's layout names every module there is (it is the map of the rooms)."""

    def layout(self):
        """The ``## Layout`` block of docs/architecture.md (skipped where the docs are not shipped)."""
        path = os.path.join(os.path.dirname(PACKAGE), "docs", "architecture.md")
        if not os.path.exists(path):
            raise SkipTest("docs/architecture.md is not beside the package")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        start = text.index("## Layout")
        start = text.index("```text", start)
        return text[start:text.index("```", start + len("```text"))]

    def test_everyModuleNamed(self):
        """Each ``.py`` of otter_tx (tests and ``__init__`` aside) and of twisted/plugins is in the layout."""
        layout = self.layout()
        missing = []
        for dirpath, dirs, files in os.walk(PACKAGE):
            dirs[:] = sorted(d for d in dirs if d not in ("test", "__pycache__"))
            for f in sorted(files):
                if f.endswith(".py") and f != "__init__.py" and f not in layout:
                    missing.append(os.path.relpath(os.path.join(dirpath, f), os.path.dirname(PACKAGE)))
        plugins = os.path.join(os.path.dirname(PACKAGE), "twisted", "plugins")
        for f in sorted(os.listdir(plugins)) if os.path.isdir(plugins) else ():
            if f.endswith(".py") and "twisted/plugins/" + f not in layout:
                missing.append("twisted/plugins/" + f)
        self.assertEqual(missing, [])

    def test_everyPackageNamed(self):
        """Each package of otter_tx (a room) has its line in the layout."""
        layout = self.layout()
        rooms = sorted(d for d in os.listdir(PACKAGE)
                       if os.path.isfile(os.path.join(PACKAGE, d, "__init__.py")) and d != "test")
        self.assertIn("cluster", rooms)
        self.assertIn("stream", rooms)
        self.assertEqual([d for d in rooms if "  %s/" % (d,) not in layout], [])
